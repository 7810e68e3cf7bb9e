"""Draw a directed communication graph as a PNG: ranks on a circle, arrows sender -> receiver.

    draw_graph(6, [(0, 1), (1, 2), (2, 0)], "ring.png", title="ring")

The picture is laid out in pixels (y downwards, as in the PNG) and drawn with matplotlib
collections, so graphs of thousands of ranks and edges stay fast.
"""
from __future__ import annotations

import math
from typing import Iterable, List, Set, Tuple

import numpy as np
from matplotlib.collections import EllipseCollection, LineCollection, PolyCollection

from .style import DPI, Path, figure

NODE_COLOR = (31, 119, 180)
EDGE_COLOR = (80, 80, 80)
LABEL_COLOR = (255, 255, 255)
TITLE_COLOR = (0, 0, 0)

_MARGIN = 10  # pixels kept clear around the picture and under the title
_NODE_FRACTION = 0.27  # node radius / distance between neighbouring centres
_MIN_LABEL_PX = 6  # rank numbers smaller than this are not drawn


def _rgb(color: Tuple[int, int, int]) -> str:
    return "#{:02x}{:02x}{:02x}".format(*color)


def _points(pixels: float) -> float:
    """A length in pixels as matplotlib points (font sizes, line widths)."""
    return pixels * 72.0 / DPI


def _title_px(title: str, size: int) -> float:
    """The title's font size in pixels: 16 (11 on small pictures), less if it is long
    (a character is about 0.6 of the font size wide)."""
    base = 16.0 if size >= 400 else 11.0
    return min(base, (size - 2 * _MARGIN) / (0.6 * max(len(title), 1)))


def _label_px(n: int, node_r: float) -> float:
    """Font size in pixels at which the widest rank number fits inside a node, leaving a
    rim of node colour; 0 when it would be too small to read."""
    digits = len(str(n - 1))
    px = min(1.3 * node_r / (0.6 * digits), 1.2 * node_r / 0.75, 30.0)
    return px if px >= _MIN_LABEL_PX else 0.0


def node_layout(n: int, size: int = 640, title: str = "") -> Tuple[np.ndarray, float, float]:
    """Return node centres (n, 2) in pixels, the node radius in pixels and the label font
    size in pixels (0: no labels).

    Node 0 is at the top and the ranks go clockwise; a single node sits in the middle.
    """
    top = _MARGIN + (_title_px(title, size) + _MARGIN if title else 0)
    cx, cy = size / 2, top + (size - top) / 2
    room = (size - top) / 2 - _MARGIN  # from the centre to the edge of the drawing area
    if n == 1:
        node_r = min(0.06 * size, room)
        return np.array([[cx, cy]]), node_r, _label_px(n, node_r)
    # Neighbouring centres are 2*pi*ring/n apart with ring = room - node_r; the radius
    # takes a fixed fraction of that spacing (solved for node_r), leaving room for the
    # arrows between neighbours, and is capped so that small graphs get no huge blobs.
    c = _NODE_FRACTION * 2 * math.pi / n
    node_r = max(1.5, min(0.06 * size, c * room / (1 + c)))
    ring = room - node_r
    angles = -math.pi / 2 + 2 * math.pi * np.arange(n) / n  # y points down: clockwise
    centres = np.stack([cx + ring * np.cos(angles), cy + ring * np.sin(angles)], axis=1)
    return centres, node_r, _label_px(n, node_r)


def _check_edges(n: int, edges: Iterable[Tuple[int, int]]) -> Set[Tuple[int, int]]:
    """Validate the (sender, receiver) pairs and return them as a set without self-loops."""
    out = set()
    for edge in edges:
        i, j = (int(v) for v in edge)
        if not (0 <= i < n and 0 <= j < n):
            raise ValueError(f"edge {tuple(edge)} names a rank outside 0..{n - 1}")
        if i != j:  # a rank mixing with itself is not drawn
            out.add((i, j))
    return out


def _pair_edges(edges: Set[Tuple[int, int]]) -> List[Tuple[int, int, bool]]:
    """(sender, receiver, both_ways) in a stable order, one entry per mutual pair."""
    drawn = []
    for i, j in sorted(edges):
        mutual = (j, i) in edges
        if mutual and i > j:
            continue  # already drawn from the smaller rank
        drawn.append((i, j, mutual))
    return drawn


def arrow_geometry(centres: np.ndarray, pairs: List[Tuple[int, int, bool]],
                   node_r: float) -> Tuple[np.ndarray, np.ndarray]:
    """Shafts (m, 2, 2) and arrow-head triangles (k, 3, 2) in pixels: each arrow stops a
    small gap short of both circles; a mutual pair gets a head at each end."""
    if not pairs:
        return np.zeros((0, 2, 2)), np.zeros((0, 3, 2))
    i, j, mutual = (np.array(col) for col in zip(*pairs))
    a, b = centres[i], centres[j]
    length = np.hypot(*(b - a).T)[:, None]
    u = (b - a) / length
    # A small gap, narrower for the tiny nodes of big graphs so that arrows between
    # neighbours keep some length; heads no longer than a third of what is left.
    gap = min(2.0, 0.3 * node_r)
    start, end = a + u * (node_r + gap), b - u * (node_r + gap)
    head = np.minimum(min(12.0, max(4.0, 0.8 * node_r)), (length - 2 * (node_r + gap)) / 3)
    normal = np.stack([-u[:, 1], u[:, 0]], axis=1) * 0.45 * head

    def triangles(tip, direction):
        base = tip - direction * head
        return np.stack([tip, base + normal, base - normal], axis=1)

    heads = [triangles(end, u), triangles(start, -u)[mutual]]
    # The shaft ends inside the head, so that the two meet without a seam.
    shaft_start = np.where(mutual[:, None], start + u * 0.8 * head, start)
    shafts = np.stack([shaft_start, end - u * 0.8 * head], axis=1)
    return shafts, np.concatenate(heads)


def draw_graph(n: int, edges: Iterable[Tuple[int, int]], path: Path, title: str = "",
               size: int = 640) -> Path:
    """Draw `n` ranks on a circle and the directed `edges` between them into a PNG at `path`.

    `edges` are (sender, receiver) pairs.  Each arrow points at the receiver; a pair
    connected both ways is one line with a head at each end.  Rank numbers are printed in
    the nodes while they fit (up to about 100 ranks at the default size).  Returns `path`.
    """
    if not 1 <= n <= 4096:
        raise ValueError(f"n must be between 1 and 4096, got {n}")
    if size < 64:
        raise ValueError(f"size must be at least 64 pixels, got {size}")
    pairs = _pair_edges(_check_edges(n, edges))
    centres, node_r, label_px = node_layout(n, size, title)
    shafts, heads = arrow_geometry(centres, pairs, node_r)
    edge = _rgb(EDGE_COLOR)
    with figure(path, size, size, layout="none") as fig:
        ax = fig.add_axes((0, 0, 1, 1))
        ax.set_xlim(0, size)
        ax.set_ylim(size, 0)  # pixel rows grow downwards
        ax.axis("off")
        ax.add_collection(LineCollection(shafts, colors=edge,
                                         linewidths=_points(1.5 if node_r >= 6 else 1.0)))
        ax.add_collection(PolyCollection(heads, facecolors=edge, edgecolors="none"))
        ax.add_collection(EllipseCollection(2 * node_r, 2 * node_r, 0, units="xy",
                                            offsets=centres, offset_transform=ax.transData,
                                            facecolors=_rgb(NODE_COLOR), edgecolors="none"))
        if label_px:
            for rank, (x, y) in enumerate(centres):
                ax.text(x, y, str(rank), color=_rgb(LABEL_COLOR), fontsize=_points(label_px),
                        ha="center", va="center_baseline")
        if title:
            ax.text(size / 2, _MARGIN, title, color=_rgb(TITLE_COLOR), ha="center", va="top",
                    fontsize=_points(_title_px(title, size)))
    return path
