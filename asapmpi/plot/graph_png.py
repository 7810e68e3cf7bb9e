"""Draw a directed communication graph as a PNG: ranks on a circle, arrows sender -> receiver.

    draw_graph(6, [(0, 1), (1, 2), (2, 0)], "ring.png", title="ring")
"""
from __future__ import annotations

import math
import os
from typing import Iterable, List, Set, Tuple, Union

import numpy as np

from .canvas import Canvas, text_size

NODE_COLOR = (44, 105, 176)
EDGE_COLOR = (80, 80, 80)
LABEL_COLOR = (255, 255, 255)
TITLE_COLOR = (0, 0, 0)
BACKGROUND = (255, 255, 255)

_MARGIN = 10  # pixels kept clear around the picture and under the title
_NODE_FRACTION = 0.27  # node radius / distance between neighbouring centres


def _title_scale(title: str, size: int) -> int:
    """Largest font scale, at most 2 (1 on small pictures), at which the title fits."""
    scale = 2 if size >= 400 else 1
    while scale > 1 and text_size(title, scale)[0] > size - 2 * _MARGIN:
        scale -= 1
    return scale


def _title_height(title: str, size: int) -> int:
    """Pixels taken at the top by the title and its margins (0 without a title)."""
    if not title:
        return 0
    return text_size(title, _title_scale(title, size))[1] + _MARGIN


def _label_scale(n: int, node_r: float) -> int:
    """Font scale at which the widest rank label fits inside a node; 0 when none does."""
    width, height = text_size(str(n - 1), 1)
    # Leave a rim of node colour around the digits so they stay readable.
    return max(0, min(int(1.6 * node_r / width), int(1.4 * node_r / height), 3))


def node_layout(n: int, size: int = 640, title: str = "") -> Tuple[np.ndarray, float, int]:
    """Return node centres (n, 2), node radius and label font scale (0: no labels).

    Node 0 is at the top and the ranks go clockwise; a single node sits in the middle.
    """
    top = _MARGIN + _title_height(title, size)
    cx, cy = size / 2, top + (size - top) / 2
    room = (size - top) / 2 - _MARGIN  # from the centre to the edge of the drawing area
    if n == 1:
        node_r = min(0.06 * size, room)
        return np.array([[cx, cy]]), node_r, _label_scale(n, node_r)
    # Neighbouring centres are 2*pi*ring/n apart with ring = room - node_r; the radius
    # takes a fixed fraction of that spacing (solved for node_r), leaving room for the
    # arrows between neighbours, and is capped so that small graphs get no huge blobs.
    c = _NODE_FRACTION * 2 * math.pi / n
    node_r = max(1.5, min(0.06 * size, c * room / (1 + c)))
    ring = room - node_r
    angles = -math.pi / 2 + 2 * math.pi * np.arange(n) / n  # y points down: clockwise
    centres = np.stack([cx + ring * np.cos(angles), cy + ring * np.sin(angles)], axis=1)
    return centres, node_r, _label_scale(n, node_r)


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


def draw_graph(n: int, edges: Iterable[Tuple[int, int]], path: Union[str, os.PathLike],
               title: str = "", size: int = 640) -> Union[str, os.PathLike]:
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
    centres, node_r, label_scale = node_layout(n, size, title)
    canvas = Canvas(size, size, BACKGROUND)
    if title:
        canvas.text(size / 2, _MARGIN, title, TITLE_COLOR, scale=_title_scale(title, size),
                    anchor="center")
    _draw_edges(canvas, centres, pairs, node_r)
    _draw_nodes(canvas, centres, node_r, label_scale)
    return canvas.save_png(path)


def _draw_edges(canvas: Canvas, centres: np.ndarray, pairs: List[Tuple[int, int, bool]],
                node_r: float) -> None:
    """Draw the arrows, stopping a small gap short of the node circles."""
    head = min(12.0, max(4.0, 0.8 * node_r))
    width = 1.5 if node_r >= 6 else 1.0
    # A small gap between arrow ends and circles, narrower for the tiny nodes of big
    # graphs so that arrows between neighbours keep some length.
    gap = min(2.0, 0.3 * node_r)
    for i, j, mutual in pairs:
        (x0, y0), (x1, y1) = centres[i], centres[j]
        canvas.arrow(x0, y0, x1, y1, EDGE_COLOR, head=head, shorten=node_r + gap,
                     width=width, both=mutual)


def _draw_nodes(canvas: Canvas, centres: np.ndarray, node_r: float, label_scale: int) -> None:
    """Draw each rank as a filled disc with its number centred in it."""
    for rank, (x, y) in enumerate(centres):
        canvas.disc(x, y, node_r, NODE_COLOR)
        if label_scale:
            canvas.text(x, y, str(rank), LABEL_COLOR, scale=label_scale, anchor="center",
                        valign="middle")
