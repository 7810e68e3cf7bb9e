"""Mixing weights of the reduce.

W is n x n with rows = receivers: rank j's reduce is  x_j <- sum_i W[j, i] x_i, W[j, j]
its self weight.  Every row must sum to 1 (an average); the columns must too (W doubly
stochastic) for the replicas to agree on the true mean (ASAP appendix A, Hop section 3.1).

- "uniform": 1/(in-degree + 1) for self and each in-neighbour.  This is ASAP's
  P = (A + I)/d_in and, identically, Hop's eq. (1) W_ij = 1/|N_in(j)| with the self-loop
  counted in N_in.  Doubly stochastic on regular graphs.
- "metropolis": Metropolis-Hastings, W[j, i] = 1/(1 + max(d_i, d_j)) on every edge,
  the rest on the diagonal.  Doubly stochastic on any undirected graph (star, chain,
  hierarchical).
- "auto" (default): uniform on regular graphs, metropolis on other undirected graphs.
- a user matrix (rows receivers), or a per-rank {rank: weight} mapping in Exchange.
"""
from __future__ import annotations

import math
from typing import Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from ..errors import ConfigError
from .graphs import Graph

TOLERANCE = 1e-9
WeightSpec = Union[str, np.ndarray, Sequence[Sequence[float]]]


def uniform_weights(n_in: int) -> Tuple[float, list]:
    """ASAP's weights for one rank: 1/(in-degree + 1) for self and each in-neighbour."""
    w = 1.0 / (n_in + 1)
    return w, [w] * n_in


def uniform_matrix(g: Graph) -> np.ndarray:
    """W with 1/(in-degree + 1) on the diagonal and on every in-edge (rows receivers)."""
    w = np.eye(g.n)
    for j in range(g.n):
        ins = g.in_neighbours(j)
        w[j, j] = 1.0 / (len(ins) + 1)
        w[j, ins] = 1.0 / (len(ins) + 1)
    return w


def metropolis_matrix(g: Graph) -> np.ndarray:
    """Metropolis-Hastings weights of an undirected graph (doubly stochastic)."""
    if not g.is_undirected():
        raise ConfigError(f"metropolis weights need an undirected graph; {g.name} has one-way "
                          f"edges: use weights='uniform' on a regular graph, or your own")
    w = np.zeros((g.n, g.n))
    for j in range(g.n):
        for i in g.in_neighbours(j):
            w[j, i] = 1.0 / (1 + max(g.in_degree(i), g.in_degree(j)))
        w[j, j] = 1.0 - w[j].sum()
    return w


def mixing_matrix(g: Graph, weights: WeightSpec = "auto") -> np.ndarray:
    """The n x n mixing matrix for `weights` ("auto", "uniform", "metropolis", a matrix)."""
    if isinstance(weights, str):
        if weights == "auto":
            if g.is_regular():
                return uniform_matrix(g)
            if g.is_undirected():
                return metropolis_matrix(g)
            raise ConfigError(f"graph {g.name} is neither regular nor undirected, so no "
                              f"built-in weights average it exactly; pass weights= yourself")
        if weights == "uniform":
            return uniform_matrix(g)
        if weights == "metropolis":
            return metropolis_matrix(g)
        raise ConfigError(f"unknown weights {weights!r}; choose auto, uniform, metropolis or "
                          f"pass a matrix")
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != (g.n, g.n):
        raise ConfigError(f"a weight matrix for {g.n} ranks must be {g.n}x{g.n}, got {w.shape}")
    off_graph = (w != 0) & (g.adjacency().T + np.eye(g.n) == 0)
    if off_graph.any():
        j, i = map(int, np.argwhere(off_graph)[0])
        raise ConfigError(f"weight W[{j}, {i}] is nonzero but rank {i} does not send to {j}")
    return w


def check_stochastic(w: np.ndarray, columns: bool = True) -> None:
    """Raise ConfigError unless every row (and column) of w sums to 1, entries >= 0."""
    if not np.all(np.isfinite(w)) or (w < -TOLERANCE).any():
        raise ConfigError("weights must be finite and >= 0")
    rows = w.sum(axis=1)
    bad = np.flatnonzero(np.abs(rows - 1) > TOLERANCE)
    if bad.size:
        raise ConfigError(f"rank {bad[0]}'s weights sum to {rows[bad[0]]:.6g}; each rank's "
                          f"weights must sum to 1")
    if columns:
        cols = w.sum(axis=0)
        bad = np.flatnonzero(np.abs(cols - 1) > TOLERANCE)
        if bad.size:
            raise ConfigError(f"the weights given to rank {bad[0]}'s updates sum to "
                              f"{cols[bad[0]]:.6g}, not 1, so the replicas would not agree on "
                              f"the mean; use weights='metropolis' (undirected graphs) or "
                              f"doubly stochastic weights")


def resolve_weights(rank: int, in_neighbours: Sequence[int],
                    weights: Optional[Mapping[int, float]]) -> Tuple[float, list]:
    """Return (self weight, in-neighbour weights in in-neighbour order) for one rank.

    `weights` maps rank -> weight and must name this rank and every in-neighbour, with
    finite non-negative values that sum to 1.  None means uniform.
    """
    if weights is None:
        return uniform_weights(len(in_neighbours))
    wanted = {rank, *in_neighbours}
    try:
        given = {int(k) for k in weights}
    except (TypeError, ValueError):
        raise ConfigError(f"rank {rank}: weights must be keyed by rank numbers, got "
                          f"{list(weights)!r}") from None
    if given != wanted:
        raise ConfigError(f"rank {rank}: weights must name exactly this rank and its "
                          f"in-neighbours {sorted(wanted)}, got {sorted(given)}")
    try:
        values = {int(k): float(v) for k, v in weights.items()}
    except (TypeError, ValueError):
        raise ConfigError(f"rank {rank}: weights must map ranks to numbers, got "
                          f"{dict(weights)!r}") from None
    if any(not math.isfinite(v) or v < 0 for v in values.values()):
        raise ConfigError(f"rank {rank}: weights must be finite and >= 0, got {values}")
    total = sum(values.values())
    if abs(total - 1.0) > TOLERANCE:
        raise ConfigError(f"rank {rank}: weights sum to {total!r}; they must sum to 1")
    return values[rank], [values[r] for r in in_neighbours]
