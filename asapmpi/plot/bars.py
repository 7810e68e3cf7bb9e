"""Grouped bar charts as PNG: one group per category, one bar per series."""
from __future__ import annotations

from typing import Dict, Optional, Sequence

import numpy as np

from .style import Path, colors, figure, round_ticks


def bar_chart(categories: Sequence[str], series: Dict[str, Sequence[float]], path: Path,
              title: str = "", ylabel: str = "", xlabel: str = "",
              ymax: Optional[float] = None, width: int = 800, height: int = 480) -> Path:
    """One group of bars per category, one bar per series (same order and colour in every
    group), a legend, the y axis from 0 to `ymax` (default: the data's).  Returns the
    path."""
    names = list(series)
    for name in names:
        if len(series[name]) != len(categories):
            raise ValueError(f"series {name!r} has {len(series[name])} values for "
                             f"{len(categories)} categories")
    x = np.arange(len(categories))
    bar_w = 0.8 / max(len(names), 1)
    with figure(path, width, height) as fig:
        ax = fig.add_subplot()
        for s, (name, color) in enumerate(zip(names, colors(len(names)))):
            ax.bar(x - 0.4 + (s + 0.5) * bar_w, np.asarray(series[name], dtype=float),
                   width=bar_w, color=color, label=name)
        round_ticks(ax)
        ax.set_xticks(x, [str(c) for c in categories])
        ax.grid(False, axis="x")
        ax.set_ylim(0, ymax)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        if title:
            ax.set_title(title)
        if names:
            fig.legend(loc="outside lower center", ncols=min(len(names), 5))
    return path
