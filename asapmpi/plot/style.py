"""The one look of asapmpi's plots: sizes in pixels, a colour cycle, light grids, ticks
at round numbers, and a figure on the Agg canvas that never needs a display.

    with figure("out.png", 800, 480) as fig:
        ax = fig.add_subplot()
        ...            # saved as an 800x480 PNG when the block ends
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator, List, Union

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_hex
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

DPI = 100  # pixels per inch: a size in pixels / DPI is matplotlib's size in inches

#: the series colours, in order (Tableau 10)
COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
          "#7f7f7f", "#bcbd22", "#17becf"]

STYLE = {
    "font.size": 10,
    "axes.titlesize": 11,
    "figure.titlesize": 13,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "axes.axisbelow": True,
    "grid.color": "#e5e5e5",
    "grid.linewidth": 0.8,
    "lines.linewidth": 1.6,
    "legend.frameon": False,
    "legend.fontsize": 9,
    # tick labels are the numbers themselves, never "+6.79e1" offsets or "1e6" factors
    "axes.formatter.useoffset": False,
    "axes.formatter.limits": (-5, 9),        # 1000000 steps, not 1e6 under the axis
    "savefig.facecolor": "white",
}

Path = Union[str, os.PathLike]


def colors(n: int) -> List[str]:
    """`n` distinct colours: the cycle above, or evenly spaced viridis for more series."""
    if n <= len(COLORS):
        return COLORS[:n]
    cmap = matplotlib.colormaps["viridis"]
    return [to_hex(cmap(i / max(n - 1, 1))) for i in range(n)]


def round_ticks(ax) -> None:
    """At most about 7 ticks per axis, at multiples of 1, 2, 2.5 or 5 times a power of
    ten (so an axis reads 0, 20, 40 and not 22.64, 45.28)."""
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(MaxNLocator(nbins=7, steps=[1, 2, 2.5, 5, 10]))


@contextmanager
def figure(path: Path, width: int, height: int, layout: str = "constrained") -> Iterator[Figure]:
    """A `width` x `height` pixel figure in the house style, saved to `path` as PNG when
    the block ends without an error."""
    if width < 64 or height < 64:
        raise ValueError(f"a plot needs at least 64x64 pixels, got {width}x{height}")
    with matplotlib.rc_context(STYLE):
        fig = Figure(figsize=(width / DPI, height / DPI), dpi=DPI, layout=layout)
        FigureCanvasAgg(fig)
        yield fig
        fig.savefig(os.fspath(path), format="png", dpi=DPI)
