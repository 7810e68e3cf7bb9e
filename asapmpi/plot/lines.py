"""Line charts as PNG, on the dependency-free canvas: one chart, or panels side by side
that share a legend."""
from __future__ import annotations

import os
from typing import Dict, Sequence, Tuple, Union

import numpy as np

from .bars import PALETTE
from .canvas import Canvas

Series = Dict[str, Tuple[Sequence[float], Sequence[float]]]


def _draw_panel(c: Canvas, box: Tuple[float, float, float, float], series: Series,
                xlabel: str) -> None:
    """Axes with 5 ticks and one polyline per series inside box (left, top, w, h)."""
    left, top, pw, ph = box
    xs = np.concatenate([np.asarray(x, float) for x, _ in series.values()] + [np.zeros(1)])
    ys = np.concatenate([np.asarray(y, float) for _, y in series.values()] + [np.zeros(1)])
    x0, x1 = float(xs.min()), float(xs.max()) or 1.0
    y0, y1 = float(ys.min()), float(ys.max()) or 1.0

    def px(x, y):
        return (left + pw * (x - x0) / (x1 - x0 or 1.0),
                top + ph * (1 - (y - y0) / (y1 - y0 or 1.0)))

    for frac in np.linspace(0, 1, 5):
        _, y = px(x0, y0 + frac * (y1 - y0))
        c.line(left, y, left + pw, y, (225, 225, 225))
        c.text(left - 6, y - 4, f"{y0 + frac * (y1 - y0):.4g}", (60, 60, 60), scale=1,
               anchor="right")
        x, _ = px(x0 + frac * (x1 - x0), y0)
        c.text(x, top + ph + 6, f"{x0 + frac * (x1 - x0):.3g}", (60, 60, 60), scale=1,
               anchor="center")
    c.line(left, top, left, top + ph, (0, 0, 0))
    c.line(left, top + ph, left + pw, top + ph, (0, 0, 0))
    for s, (x, y) in enumerate(series.values()):
        pts = [px(a, b) for a, b in zip(np.asarray(x, float), np.asarray(y, float))]
        for (ax, ay), (bx, by) in zip(pts, pts[1:]):
            c.line(ax, ay, bx, by, PALETTE[s % len(PALETTE)], width=1.5)
    if xlabel:
        c.text(left + pw / 2, top + ph + 22, xlabel, (0, 0, 0), scale=1, anchor="center")


def line_panels(panels: Sequence[Tuple[Series, str]], path: Union[str, os.PathLike],
                title: str = "", ylabel: str = "", panel_width: int = 560,
                height: int = 480):
    """Panels side by side, each (series {name: (x, y)}, x label), with the same series
    names in the same colours and one legend below.  Returns the path."""
    names = list(dict.fromkeys(n for series, _ in panels for n in series))
    rows = -(-len(names) // 6)
    width = panel_width * len(panels)
    c = Canvas(width, height + 14 * max(rows - 1, 0))
    top, bottom = 50, 80
    ph = height - top - bottom
    if title:
        c.text(width / 2, 12, title, (0, 0, 0), scale=2, anchor="center")
    for p, (series, xlabel) in enumerate(panels):
        ordered = {n: series[n] for n in names if n in series}
        _draw_panel(c, (panel_width * p + 70, top, panel_width - 90, ph), ordered, xlabel)
    if ylabel:
        c.text(8, top - 20, ylabel, (0, 0, 0), scale=1)
    for s, name in enumerate(names):
        lx = 70 + (s % 6) * ((width - 90) / 6)
        ly = height - 40 + 14 * (s // 6)
        color = PALETTE[s % len(PALETTE)]
        c.rect(lx, ly, lx + 12, ly + 8, color)
        c.text(lx + 16, ly, name, (0, 0, 0), scale=1)
    c.save_png(path)
    return path


def line_chart(series: Series, path: Union[str, os.PathLike], title: str = "",
               xlabel: str = "", ylabel: str = "", width: int = 800, height: int = 480):
    """One polyline per series {name: (x, y)}, shared axes with 5 ticks, a legend."""
    return line_panels([(series, xlabel)], path, title=title, ylabel=ylabel,
                       panel_width=width, height=height)
