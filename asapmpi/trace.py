"""Iteration traces and the bounds of Hop's Theorems 1-2 and Table 1.

A trace gives, per rank, for iterations first, first + 1, ... (`first` is 1 unless the
policy kept only the newest asapmpi.rc.trace_iterations of them): `lo[k-first]`, a time
at or before which the rank cannot have entered iteration k, and `hi[k-first]`, a time by
which it had entered it, on one monotonic clock shared by the host.  The checker is
sound: at every recorded instant t it compares the iteration rank i had certainly
reached (largest k with hi_i(k) <= t) with the one rank j can at most have reached
(largest k with lo_j(k) <= t) and reports a violation only if their difference exceeds
the bound for (i, j).
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence

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


def _reached(traces: Sequence[Dict[str, np.ndarray]]):
    """The instants to check and, at each, the iteration every rank had surely reached
    (hi) and could at most have reached (lo).  A trace that starts at iteration first > 1
    says nothing about the times before its hi[0]: only instants at or after every such
    start are checked (lo and hi never decrease, so the counts are exact there)."""
    firsts = [int(t.get("first", 1)) for t in traces]
    instants = np.unique(np.concatenate([t["hi"] for t in traces]))
    starts = [float(t["hi"][0]) for t, f in zip(traces, firsts) if f > 1 and len(t["hi"])]
    if starts:
        instants = instants[instants >= max(starts)]
    surely = np.stack([f - 1 + np.searchsorted(t["hi"], instants, side="right")
                       for t, f in zip(traces, firsts)])
    at_most = np.stack([f - 1 + np.searchsorted(t["lo"], instants, side="right")
                        for t, f in zip(traces, firsts)])
    return instants, surely, at_most


def check_gaps(traces: Sequence[Dict[str, np.ndarray]], bounds: np.ndarray,
               limit: int = 20) -> List[Dict[str, float]]:
    """Violations of `bounds` in the traces (at most `limit`); empty when the run kept
    every bound."""
    n = len(traces)
    instants, surely, at_most = _reached(traces)
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
    _, surely, at_most = _reached(traces)
    if surely.shape[1] == 0:
        return np.zeros((len(traces), len(traces)), dtype=np.int64)
    return (surely[:, None, :] - at_most[None, :, :]).max(axis=2)


# ---------------------------------------------------------------------- files

FORMAT = "asapmpi-trace-2"
#: files of the first format (datasets lo and hi instead of entries) still load
OLD_FORMATS = ("asapmpi-trace-1",)


def _header(f, exchange, ranks: int, attrs) -> None:
    policy = exchange._policy
    f.attrs.update({"format": FORMAT, "ranks": ranks, "sync": policy.name,
                    "setting": getattr(policy, "setting", None) or "",
                    "max_gap": getattr(policy, "max_gap", 0),
                    "staleness": -1 if getattr(policy, "staleness", None) is None
                    else policy.staleness,
                    "backup": getattr(policy, "backup", 0), **attrs})
    f.create_dataset("graph_edges", data=np.array(exchange.graph.edges(), dtype=np.int64)
                     .reshape(-1, 2))
    # the times come from each host's monotonic clock: record where each rank ran
    f.attrs["hosts"] = ",".join(exchange.hosts)


def save(path, exchange, comm=None, **attrs) -> None:
    """Write every rank's trace of an exchange, as kept in memory (the newest
    asapmpi.rc.trace_iterations iterations), to one HDF5 file (collective; rank 0
    writes): per rank `entries` (lo, hi: iteration entry times, from iteration `first`),
    `reduced` (per reduce: the iteration, then the version used from each in-neighbour,
    0 = none) and in_neighbours; the graph and the policy's setting as attributes.  For
    the whole of a long run, create the Exchange with trace_file= instead."""
    from . import collectives

    if getattr(exchange, "trace_file", None) == path:
        raise ConfigError(f"this Exchange streams its whole trace to {path}; free() writes "
                          f"that file, do not save() over it")
    comm = exchange.comm if comm is None else comm
    gathered = collectives.gather(comm, exchange.trace, exchange.timeout,
                                  f"the trace of {path}")
    if comm.Get_rank() != 0:
        return
    import h5py

    with h5py.File(path, "w") as f:
        _header(f, exchange, len(gathered), attrs)
        for r, t in enumerate(gathered):
            g = f.create_group(f"rank_{r}")
            g.attrs["first"] = int(t.get("first", 1))
            g.create_dataset("entries", data=np.column_stack([t["lo"], t["hi"]]))
            for key in ("reduced", "in_neighbours"):
                g.create_dataset(key, data=t[key])


def merge_parts(path, exchange, **attrs) -> None:
    """Rank 0, once every rank closed its part file (asapmpi.sync.records): write the
    trace file `path` from the parts, whole runs, and delete them."""
    import os

    import h5py

    from .sync.records import part_path

    tmp = f"{path}.merging"
    with h5py.File(tmp, "w") as f:
        _header(f, exchange, exchange.size, attrs)
        for r in range(exchange.size):
            g = f.create_group(f"rank_{r}")
            g.attrs["first"] = 1
            g.create_dataset("in_neighbours", data=np.array(
                exchange.graph.in_neighbours(r), dtype=np.int64))
            with h5py.File(part_path(path, r), "r") as part:
                for name in part:
                    part.copy(part[name], g, name=name)
    os.replace(tmp, path)
    for r in range(exchange.size):
        os.unlink(part_path(path, r))


def load(path) -> Dict:
    """Read a trace file written by save() or by an Exchange with trace_file=."""
    import h5py

    from .reduce.user import from_edges

    with h5py.File(path, "r") as f:
        if f.attrs.get("format") not in (FORMAT, *OLD_FORMATS):
            raise ConfigError(f"{path} is not an asapmpi trace file")
        n = int(f.attrs["ranks"])
        traces = [_rank_trace(f[f"rank_{r}"]) for r in range(n)]
        staleness = int(f.attrs["staleness"])
        hosts = set(str(f.attrs.get("hosts", "")).split(","))
        if len(hosts) > 1:
            raise ConfigError(f"{path} spans {len(hosts)} hosts; iteration times come from "
                              f"each host's own monotonic clock and cannot be compared "
                              f"across hosts")
        return {"traces": traces, "graph": from_edges(f["graph_edges"][()].tolist(), n),
                "setting": str(f.attrs["setting"]), "max_gap": int(f.attrs["max_gap"]),
                "staleness": None if staleness < 0 else staleness}


def _rank_trace(g) -> Dict[str, np.ndarray]:
    if "entries" in g:
        entries = g["entries"][()].reshape(-1, 2)
        lo, hi = entries[:, 0], entries[:, 1]
    else:
        lo, hi = g["lo"][()], g["hi"][()]
    reduced = g["reduced"][()] if "reduced" in g else np.zeros((0, 1), dtype=np.int64)
    return {"lo": lo, "hi": hi, "first": int(g.attrs.get("first", 1)), "reduced": reduced,
            "in_neighbours": g["in_neighbours"][()]}


def window_violations(traces, setting: str, staleness: Optional[int] = None,
                      limit: int = 20) -> List[Dict]:
    """Updates reduced outside their allowed window: iteration k may use version k only
    (tokens, backup), or any version in [k - s, k] (staleness)."""
    found = []
    for rank, t in enumerate(traces):
        for row in np.asarray(t["reduced"]):
            k, versions = int(row[0]), row[1:]
            low = k - staleness if setting == "staleness" else k
            for sender, v in zip(t["in_neighbours"], versions):
                if v != 0 and not low <= v <= k:
                    found.append({"rank": rank, "iteration": k, "sender": int(sender),
                                  "version": int(v), "allowed": [low, k]})
                    if len(found) >= limit:
                        return found
    return found


def check_file(path) -> Dict:
    """Check a trace file: the gap bounds of its setting, and the reduce windows."""
    data = load(path)
    bounds = gap_bounds(data["graph"], data["setting"], data["max_gap"],
                        data["staleness"] or 0)
    gaps = max_gaps(data["traces"])
    g = data["graph"]
    return {
        "setting": data["setting"], "ranks": g.n,
        "iterations": [t["first"] - 1 + len(t["hi"]) for t in data["traces"]],
        "gap_violations": check_gaps(data["traces"], bounds),
        "window_violations": window_violations(data["traces"], data["setting"],
                                               data["staleness"]),
        "max_gap_to_out_neighbours": int(max(
            (gaps[i, j] for i in range(g.n) for j in g.out_neighbours(i)), default=0)),
    }


def plot(path, png) -> None:
    """Draw iterations over time, one line per rank, from a trace file."""
    from .plot.lines import line_chart

    data = load(path)
    start = min(float(t["hi"][0]) for t in data["traces"])
    series = {f"rank {r}": (np.asarray(t["hi"]) - start, np.arange(1, len(t["hi"]) + 1))
              for r, t in enumerate(data["traces"])}
    line_chart(series, png, title=f"iterations over time ({data['setting']}, "
                                  f"max_gap {data['max_gap']})",
               xlabel="seconds", ylabel="iteration")
