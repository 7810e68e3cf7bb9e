"""Iteration traces and the bounds of Hop's Theorems 1-2 and Table 1.

A trace gives, per rank, for iterations 1, 2, ...: `lo[k-1]`, a time at or before which
the rank cannot have entered iteration k, and `hi[k-1]`, a time by which it had entered
it, on one monotonic clock shared by the host.  The checker is sound: at every recorded
instant t it compares the iteration rank i had certainly reached (largest k with
hi_i(k) <= t) with the one rank j can at most have reached (largest k with lo_j(k) <= t)
and reports a violation only if their difference exceeds the bound for (i, j).
"""
from __future__ import annotations

from typing import Dict, List, Sequence

import numpy as np

from .errors import ConfigError
from .reduce.graphs import Graph

SETTINGS = ("standard", "notify_ack", "tokens", "backup", "staleness")


def path_lengths(g: Graph) -> np.ndarray:
    """d[a, b] = length of the shortest directed path a -> b (0 on the diagonal)."""
    d = np.full((g.n, g.n), np.inf)
    for a in range(g.n):
        d[a, a], frontier = 0, [a]
        while frontier:
            nxt = []
            for u in frontier:
                for v in g.out_neighbours(u):
                    if d[a, v] == np.inf:
                        d[a, v] = d[a, u] + 1
                        nxt.append(v)
            frontier = nxt
    return d


def gap_bounds(g: Graph, setting: str, max_gap: int = 1, staleness: int = 0) -> np.ndarray:
    """B[i, j]: the upper bound on Iter(i) - Iter(j) of Hop's Table 1.

    standard: len(j->i) (Theorem 1); notify_ack: min(len(j->i), 2 len(i->j)); tokens:
    min(len(j->i), max_gap len(i->j)) (Theorem 2); backup (with tokens):
    max_gap len(i->j); staleness (with tokens): min((s+1) len(j->i), max_gap len(i->j)).
    """
    d = path_lengths(g)
    to_i, from_i = d.T, d          # to_i[i, j] = len(j -> i), from_i[i, j] = len(i -> j)
    if setting == "standard":
        return to_i
    if setting == "notify_ack":
        return np.minimum(to_i, 2 * from_i)
    if setting == "tokens":
        return np.minimum(to_i, max_gap * from_i)
    if setting == "backup":
        return max_gap * from_i
    if setting == "staleness":
        return np.minimum((staleness + 1) * to_i, max_gap * from_i)
    raise ConfigError(f"setting must be one of {SETTINGS}, got {setting!r}")


def check_gaps(traces: Sequence[Dict[str, np.ndarray]], bounds: np.ndarray,
               limit: int = 20) -> List[Dict[str, float]]:
    """Violations of `bounds` in the traces (at most `limit`); empty when the run kept
    every bound."""
    n = len(traces)
    instants = np.unique(np.concatenate([t["hi"] for t in traces]))
    surely = np.stack([np.searchsorted(t["hi"], instants, side="right") for t in traces])
    at_most = np.stack([np.searchsorted(t["lo"], instants, side="right") for t in traces])
    found = []
    for i in range(n):
        for j in range(n):
            if i == j or not np.isfinite(bounds[i, j]):
                continue
            excess = surely[i] - at_most[j] - bounds[i, j]
            bad = np.flatnonzero(excess > 0)
            for x in bad[: max(0, limit - len(found))]:
                found.append({"time": float(instants[x]), "i": i, "j": j,
                              "iter_i": int(surely[i, x]), "iter_j": int(at_most[j, x]),
                              "bound": float(bounds[i, j])})
            if len(found) >= limit:
                return found
    return found


def max_gaps(traces: Sequence[Dict[str, np.ndarray]]) -> np.ndarray:
    """G[i, j]: the largest Iter(i) - Iter(j) seen (surely i, at most j): how close a run
    came to its bounds."""
    instants = np.unique(np.concatenate([t["hi"] for t in traces]))
    surely = np.stack([np.searchsorted(t["hi"], instants, side="right") for t in traces])
    at_most = np.stack([np.searchsorted(t["lo"], instants, side="right") for t in traces])
    return (surely[:, None, :] - at_most[None, :, :]).max(axis=2)
