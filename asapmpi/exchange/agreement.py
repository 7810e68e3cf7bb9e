"""What the ranks of an Exchange agree on: one allgather of what each was given, and
from it the same graph and mixing matrix built on every rank, checked alike."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import numpy as np
from mpi4py import MPI

from .. import collectives
from ..errors import ConfigError
from ..rc import rc
from ..reduce.graphs import Graph
from ..reduce.graphs import graph as make_graph
from ..reduce.user import hosts_of
from ..reduce.weights import check_stochastic, mixing_matrix, resolve_weights


def same_everywhere(meta: List[Dict[str, Any]], key: str, what: str) -> None:
    """ConfigError naming every rank's value when the ranks were given different `what`."""
    values = [m[key] for m in meta]
    if any(v != values[0] for v in values):
        per_rank = ", ".join(f"rank {r}: {v}" for r, v in enumerate(values))
        raise ConfigError(f"every rank must pass the same {what}; got {per_rank}")


def rank_list(ranks: List[int]) -> str:
    """[0, 1, 2, 5] -> "ranks 0-2, 5"; [3] -> "rank 3"."""
    runs: List[List[int]] = []
    for r in ranks:
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    text = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
    return f"rank {text}" if len(ranks) == 1 else f"ranks {text}"


_UNSET = object()


def same_options(meta: List[Dict[str, Any]]) -> None:
    """ConfigError naming only the policy options that differ between ranks, each with
    its values and the ranks that gave them ("max_gap = 1 (ranks 0, 2), 2 (rank 1)")."""
    values = [m["options"] for m in meta]
    if all(v == values[0] for v in values):
        return
    names = sorted({k for v in values for k in v})
    parts = []
    for name in names:
        given = [v.get(name, _UNSET) for v in values]
        if all(g == given[0] for g in given):
            continue
        groups: List[Tuple[Any, List[int]]] = []
        for r, g in enumerate(given):
            for value, ranks in groups:
                if value == g:
                    ranks.append(r)
                    break
            else:
                groups.append((g, [r]))
        parts.append(f"{name} = " + ", ".join(
            f"{'unset' if value is _UNSET else repr(value)} ({rank_list(ranks)})"
            for value, ranks in groups))
    raise ConfigError(f"every rank must pass the same policy options for "
                      f"sync={meta[0]['sync']!r}; {'; '.join(parts)}")


def global_graph(meta: List[Dict[str, Any]], comm: MPI.Comm) -> Graph:
    """The graph every rank agrees on, built identically on every rank."""
    size = comm.Get_size()
    same_everywhere(meta, "graph_kind", "kind of graph argument (name, Graph or lists)")
    kind = meta[0]["graph_kind"]
    if kind == "name":
        same_everywhere(meta, "graph_key", "graph name")
        name = meta[0]["graph_key"]
        if name == "hierarchical":
            # every rank reached this line on the same gathered data: the collective
            # shared-memory split below is entered by all ranks or by none
            return make_graph(name, size, hosts=hosts_of(comm))
        return make_graph(name, size)
    if kind == "graph":
        same_everywhere(meta, "graph_key", "graph (their edges differ)")
    for r, m in enumerate(meta):
        for j in m["out"]:
            if r not in meta[j]["in"]:
                raise ConfigError(f"rank {r} sends to rank {j}, but rank {j} does not list "
                                  f"{r} as an in-neighbour")
        for j in m["in"]:
            if r not in meta[j]["out"]:
                raise ConfigError(f"rank {r} receives from rank {j}, but rank {j} does not "
                                  f"list {r} as an out-neighbour")
    return Graph(size, [m["out"] for m in meta], meta[0]["graph_name"] or "user")


def check_connected(g: Graph) -> None:
    """ConfigError naming the ranks some update never reaches, when `g` is not strongly
    connected."""
    if g.is_strongly_connected():
        return
    seen, stack = {0}, [0]
    while stack:
        for j in g.out_neighbours(stack.pop()):
            if j not in seen:
                seen.add(j)
                stack.append(j)
    missing = sorted(set(range(g.n)) - seen)
    if missing:
        raise ConfigError(f"graph {g.name} is not connected: rank 0's updates never reach "
                          f"rank(s) {missing[:10]}; every rank must reach every other")
    raise ConfigError(f"graph {g.name} is not strongly connected: some rank's updates never "
                      f"reach rank 0; every rank must reach every other")


def global_weights(meta: List[Dict[str, Any]], g: Graph,
                    matrix: Optional[np.ndarray]) -> np.ndarray:
    """The mixing matrix (rows = receivers), identical on every rank, checked.  A user
    matrix travels only as a fingerprint; `matrix` is this rank's copy."""
    same_everywhere(meta, "weights_kind", "kind of weights (name, matrix or per-rank)")
    kind = meta[0]["weights_kind"]
    if kind == "row":
        w = np.zeros((g.n, g.n))
        for r, m in enumerate(meta):
            w_self, w_in = resolve_weights(r, g.in_neighbours(r), m["weights_row"])
            w[r, r] = w_self
            w[r, g.in_neighbours(r)] = w_in
    else:
        same_everywhere(meta, "weights_key", "weights")
        w = mixing_matrix(g, meta[0]["weights_key"] if kind == "name" else matrix)
    check_stochastic(w)
    return w


#: what every rank must be given alike (the meta key, and its name in the error)
SAME_EVERYWHERE = (("dtype", "buffer dtype"), ("nbytes", "buffer size in bytes"),
                   ("sync", "sync policy"), ("checksum", "checksum option"),
                   ("options", "policy options"), ("transport", "transport"),
                   ("double_buffer", "double_buffer option"), ("trace_file", "trace_file"))


def agree(comm: MPI.Comm, local: Dict[str, Any], rank: int
          ) -> Tuple[List[Dict[str, Any]], Graph, np.ndarray]:
    """Share what each rank was given (checks.check_locally's "meta") and build from it
    what every rank agrees on: (every rank's meta, the graph, the mixing matrix), the
    same on every rank, or the same ConfigError on every rank.  Collective; a rank that
    never comes (dead, or stuck before its Exchange) is named, not waited for."""
    meta = collectives.allgather(comm, local["meta"], local["timeout"] or rc.timeout,
                                 "the creation of an Exchange")
    for r, m in enumerate(meta):
        if m["problem"]:
            raise ConfigError(m["problem"] if r == rank
                              else f"rank {r} was given bad input: {m['problem']}")
    for key, what in SAME_EVERYWHERE:
        if key == "options":
            same_options(meta)
        else:
            same_everywhere(meta, key, what)
    g = global_graph(meta, comm)
    check_connected(g)
    local["policy"].validate(g, rank)
    return meta, g, global_weights(meta, g, local["matrix"])
