"""Line charts as PNG, on the dependency-free canvas."""
from __future__ import annotations

import os
from typing import Dict, Sequence, Tuple, Union

import numpy as np

from .bars import PALETTE
from .canvas import Canvas


def line_chart(series: Dict[str, Tuple[Sequence[float], Sequence[float]]],
               path: Union[str, os.PathLike], title: str = "", xlabel: str = "",
               ylabel: str = "", width: int = 800, height: int = 480):
    """One polyline per series {name: (x, y)}, shared axes with 5 ticks, a legend."""
    c = Canvas(width, height)
    left, right, top, bottom = 70, 20, 50, 80
    xs = np.concatenate([np.asarray(x, float) for x, _ in series.values()] + [np.zeros(1)])
    ys = np.concatenate([np.asarray(y, float) for _, y in series.values()] + [np.zeros(1)])
    x0, x1 = float(xs.min()), float(xs.max()) or 1.0
    y0, y1 = float(ys.min()), float(ys.max()) or 1.0
    pw, ph = width - left - right, height - top - bottom

    def px(x, y):
        return (left + pw * (x - x0) / (x1 - x0 or 1.0),
                top + ph * (1 - (y - y0) / (y1 - y0 or 1.0)))

    if title:
        c.text(width / 2, 12, title, (0, 0, 0), scale=2, anchor="center")
    for frac in np.linspace(0, 1, 5):
        _, y = px(x0, y0 + frac * (y1 - y0))
        c.line(left, y, width - right, y, (225, 225, 225))
        c.text(left - 6, y - 4, f"{y0 + frac * (y1 - y0):.4g}", (60, 60, 60), scale=1,
               anchor="right")
        x, _ = px(x0 + frac * (x1 - x0), y0)
        c.text(x, top + ph + 6, f"{x0 + frac * (x1 - x0):.3g}", (60, 60, 60), scale=1,
               anchor="center")
    c.line(left, top, left, top + ph, (0, 0, 0))
    c.line(left, top + ph, width - right, top + ph, (0, 0, 0))
    for s, (name, (x, y)) in enumerate(series.items()):
        color = PALETTE[s % len(PALETTE)]
        pts = [px(a, b) for a, b in zip(np.asarray(x, float), np.asarray(y, float))]
        for (ax, ay), (bx, by) in zip(pts, pts[1:]):
            c.line(ax, ay, bx, by, color, width=1.5)
        lx = left + (s % 6) * (pw / 6)
        ly = height - 40 + 14 * (s // 6)
        c.rect(lx, ly, lx + 12, ly + 8, color)
        c.text(lx + 16, ly, name, (0, 0, 0), scale=1)
    if xlabel:
        c.text(left + pw / 2, top + ph + 22, xlabel, (0, 0, 0), scale=1, anchor="center")
    if ylabel:
        c.text(8, top - 20, ylabel, (0, 0, 0), scale=1)
    c.save_png(path)
    return path
