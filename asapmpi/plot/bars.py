"""Grouped bar charts as PNG, on the dependency-free canvas."""
from __future__ import annotations

import os
from typing import Dict, Optional, Sequence, Union

from .canvas import Canvas

PALETTE = [(44, 105, 176), (237, 102, 93), (103, 191, 92), (255, 158, 74), (173, 139, 201),
           (114, 158, 206), (140, 86, 75), (227, 119, 194), (127, 127, 127), (188, 189, 34)]


def bar_chart(categories: Sequence[str], series: Dict[str, Sequence[float]],
              path: Union[str, os.PathLike], title: str = "", ylabel: str = "",
              xlabel: str = "", ymax: Optional[float] = None, width: int = 800,
              height: int = 480) -> Union[str, os.PathLike]:
    """One group of bars per category, one bar per series (same order in every group),
    a legend, y ticks at 0, 25, 50, 75 and 100 % of ymax.  Returns the path."""
    c = Canvas(width, height)
    left, right, top, bottom = 70, 20, 50, 70
    top_value = ymax if ymax is not None else max(
        [max(v) for v in series.values() if len(v)] + [1e-12])
    plot_w, plot_h = width - left - right, height - top - bottom
    if title:
        c.text(width / 2, 12, title, (0, 0, 0), scale=2, anchor="center")
    for frac in (0, 0.25, 0.5, 0.75, 1.0):
        y = top + plot_h * (1 - frac)
        c.line(left, y, width - right, y, (220, 220, 220))
        c.text(left - 6, y - 4, f"{frac * top_value:g}", (60, 60, 60), scale=1, anchor="right")
    c.line(left, top, left, top + plot_h, (0, 0, 0))
    c.line(left, top + plot_h, width - right, top + plot_h, (0, 0, 0))
    groups, names = len(categories), list(series)
    group_w = plot_w / max(groups, 1)
    bar_w = group_w * 0.8 / max(len(names), 1)
    for g, label in enumerate(categories):
        x0 = left + g * group_w + group_w * 0.1
        for s, name in enumerate(names):
            value = series[name][g]
            h = plot_h * min(value, top_value) / top_value if top_value > 0 else 0
            c.rect(x0 + s * bar_w, top + plot_h - h, x0 + (s + 1) * bar_w - 1, top + plot_h,
                   PALETTE[s % len(PALETTE)])
        c.text(left + (g + 0.5) * group_w, top + plot_h + 6, str(label), (0, 0, 0), scale=1,
               anchor="center")
    if xlabel:
        c.text(left + plot_w / 2, height - 40, xlabel, (0, 0, 0), scale=1, anchor="center")
    if ylabel:
        c.text(8, top - 20, ylabel, (0, 0, 0), scale=1)
    for s, name in enumerate(names):
        x = left + s * (plot_w / max(len(names), 1))
        c.rect(x, height - 22, x + 12, height - 10, PALETTE[s % len(PALETTE)])
        c.text(x + 18, height - 21, name, (0, 0, 0), scale=1)
    c.save_png(path)
    return path
