"""Spectral gap of a communication graph, under both papers' definitions.

- "asap" (ASAP appendix A): 1 - sigma_2(P), sigma_2 the second largest singular value of
  P = A/d, A the adjacency with self-loops and d the in-degree with the self-loop.
- "hop" (Hop footnote 2): |lambda_1(W)| - |lambda_2(W)|, the two largest eigenvalue
  moduli of the weighted adjacency W (Hop eq. (1) weights by default).
With self_loops=False the self-loops are left out of A (a graph without self weights).
A disconnected graph has gap 0 under both definitions; complete graphs have gap 1.
Papers' figures, and what these functions give: docs/GRAPHS.md.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from ..errors import ConfigError
from .graphs import Graph
from .weights import WeightSpec, mixing_matrix

DEFINITIONS = ("asap", "hop")


def normalized_adjacency(g: Graph, self_loops: bool = True) -> np.ndarray:
    """P with rows = receivers: (A + I)/d_in, or A/d_in without self-loops."""
    m = g.adjacency().T + (np.eye(g.n) if self_loops else 0)
    d = m.sum(axis=1, keepdims=True)
    return np.divide(m, d, out=np.zeros_like(m), where=d > 0)


def spectral_gap(g: Graph, definition: str = "asap", self_loops: bool = True,
                 weights: Optional[WeightSpec] = None) -> float:
    """The spectral gap of `g` ("asap": 1 - sigma_2(P); "hop": |l1(W)| - |l2(W)|).

    `weights` (hop only) replaces Hop's eq. (1) weights by a WeightSpec.
    """
    if definition not in DEFINITIONS:
        raise ConfigError(f"definition must be one of {DEFINITIONS}, got {definition!r}")
    if g.n == 1:
        return 1.0
    if definition == "asap":
        if weights is not None:
            raise ConfigError("the asap definition uses A/d; weights= applies to 'hop'")
        sigma = np.linalg.svd(normalized_adjacency(g, self_loops), compute_uv=False)
        return float(max(0.0, 1.0 - sigma[1]))
    w = (normalized_adjacency(g, self_loops) if weights is None
         else mixing_matrix(g, weights))
    moduli = np.sort(np.abs(np.linalg.eigvals(w)))[::-1]
    return float(max(0.0, moduli[0] - moduli[1]))


def second_singular_value(w: np.ndarray) -> float:
    """sigma_2 of a doubly stochastic W: the worst-case contraction of the disagreement
    ||x - mean|| per mixing step."""
    n = w.shape[0]
    if n == 1:
        return 0.0
    centred = w - np.full((n, n), 1.0 / n)
    return float(np.linalg.svd(centred, compute_uv=False)[0])
