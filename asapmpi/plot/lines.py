"""Line charts as PNG: one chart, or panels side by side that share the series' colours
and one legend.

    line_chart({"rank 0": (seconds, iterations)}, "trace.png", title="iterations",
               xlabel="seconds", ylabel="iteration")
    line_panels([(over_time, "time (s)"), (over_iters, "iterations", "loss")], "run.png")
"""
from __future__ import annotations

import textwrap
from typing import Dict, Sequence, Tuple

import numpy as np

from .style import Path, colors, figure, round_ticks

Series = Dict[str, Tuple[Sequence[float], Sequence[float]]]
#: (series, x label) or (series, x label, y label of this panel)
Panel = Tuple

LEGEND_MAX = 20   # more series than this: no legend, it would hide the panels
MARKERS_MAX = 40  # points per series up to which each point is marked
# widths in pixels of the house style's text (DejaVu Sans; a little over the average
# glyph, measured on a legend of 5 entries and a title of 94 characters, so that text
# estimated to fit does): a title character at 13 pt, a legend
# character at 9 pt, and a legend entry's line, gap and padding
TITLE_CHAR_PX = 10.0
LEGEND_CHAR_PX = 6.5
LEGEND_ENTRY_PX = 80


def legend_columns(names: Sequence[str], width: int, most: int = 5) -> int:
    """The most columns (up to `most`) whose entries fit `width` pixels side by side;
    matplotlib sizes every column to its widest entry."""
    for ncols in range(min(most, len(names)), 1, -1):
        # matplotlib fills column by column, the first len % ncols columns one longer
        longer, per = len(names) % ncols, len(names) // ncols
        starts = [i * per + min(i, longer) for i in range(ncols + 1)]
        need = sum(LEGEND_ENTRY_PX + LEGEND_CHAR_PX * max(len(n) for n in
                                                          names[starts[i]:starts[i + 1]])
                   for i in range(ncols))
        if need <= 0.95 * width:
            return ncols
    return 1


def _draw_panel(ax, series: Series, color: Dict[str, str], xlabel: str, ylabel: str) -> None:
    """One line per series, in its colour, on round ticks."""
    for name, (xs, ys) in series.items():
        x, y = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
        if x.shape != y.shape:
            raise ValueError(f"series {name!r}: {len(x)} x values but {len(y)} y values")
        ax.plot(x, y, color=color[name], label=name,
                marker="o" if len(x) <= MARKERS_MAX else None, markersize=3)
    round_ticks(ax)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)


def line_panels(panels: Sequence[Panel], path: Path, title: str = "", ylabel: str = "",
                panel_width: int = 560, height: int = 480) -> Path:
    """Panels side by side, each (series {name: (x, y)}, x label[, y label]), the same
    series name in the same colour everywhere and one legend below.  `ylabel` labels
    the panels that name none.  Returns `path`."""
    if not panels:
        raise ValueError("line_panels needs at least one panel")
    names = list(dict.fromkeys(n for panel in panels for n in panel[0]))
    color = dict(zip(names, colors(len(names))))
    width = panel_width * len(panels)
    with figure(path, width, height) as fig:
        axes = fig.subplots(1, len(panels), squeeze=False)[0]
        for ax, panel in zip(axes, panels):
            series, xlabel = panel[0], panel[1]
            _draw_panel(ax, series, color, xlabel, panel[2] if len(panel) > 2 else ylabel)
        if title:
            # constrained layout does not wrap a title: one wider than the figure is cut
            # at both edges
            fig.suptitle("\n".join(textwrap.wrap(title, int(width / TITLE_CHAR_PX))))
        if 0 < len(names) <= LEGEND_MAX:
            handles = {h.get_label(): h for ax in axes for h in ax.get_lines()}
            fig.legend([handles[n] for n in names], names, loc="outside lower center",
                       ncols=legend_columns(names, width))
    return path


def line_chart(series: Series, path: Path, title: str = "", xlabel: str = "",
               ylabel: str = "", width: int = 800, height: int = 480) -> Path:
    """One line per series {name: (x, y)} on shared axes, with a legend.  Returns `path`."""
    return line_panels([(series, xlabel)], path, title=title, ylabel=ylabel,
                       panel_width=width, height=height)
