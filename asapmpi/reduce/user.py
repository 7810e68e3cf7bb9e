"""User graphs: from an edge list, an adjacency matrix, a file or a networkx graph.

File format (text, what Graph.save writes): an optional header `# asapmpi graph n=N
name=NAME`, then one edge `i j` (i sends to j) per line; `#` starts a comment.  A
`.npy` file holds an adjacency matrix (A[i, j] != 0: i sends to j).
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Iterable, Optional, Tuple, Union

import numpy as np

from ..errors import ConfigError
from .graphs import Graph

PathLike = Union[str, os.PathLike]


def graph_from(obj: Any, n: Optional[int] = None, name: str = "user") -> Graph:
    """A Graph from: a Graph; a file path (edge-list text or .npy matrix); a networkx
    (Di)Graph with nodes 0..n-1; a square NumPy array (adjacency, A[i, j] != 0: i sends
    to j); or any iterable of (sender, receiver) pairs (n defaults to the largest rank +
    1).  For a matrix given as nested lists use from_adjacency()."""
    if isinstance(obj, Graph):
        return obj
    if isinstance(obj, (str, os.PathLike)):
        return load(obj)
    if hasattr(obj, "edges") and hasattr(obj, "number_of_nodes"):
        return _from_networkx(obj, name)
    if isinstance(obj, np.ndarray) and obj.ndim == 2 and obj.shape[0] == obj.shape[1]:
        return from_adjacency(obj, name)
    return from_edges(obj, n, name)


def from_edges(edges: Iterable[Tuple[int, int]], n: Optional[int] = None,
               name: str = "user") -> Graph:
    """A Graph from (sender, receiver) pairs; n defaults to the largest rank + 1."""
    try:
        pairs = [(int(i), int(j)) for i, j in edges]
    except (TypeError, ValueError):
        raise ConfigError("an edge list must hold (sender, receiver) pairs of ranks") from None
    if n is None:
        n = 1 + max((max(p) for p in pairs), default=0)
    outs = [[] for _ in range(n)]
    for i, j in pairs:
        if not (0 <= i < n and 0 <= j < n):
            raise ConfigError(f"edge ({i}, {j}) names a rank outside 0..{n - 1}")
        if j not in outs[i]:
            outs[i].append(j)
    return Graph(n, outs, name)


def from_adjacency(matrix: Any, name: str = "user") -> Graph:
    """A Graph from a square matrix, A[i, j] != 0 meaning i sends to j (diagonal ignored)."""
    a = np.asarray(matrix)
    if a.ndim != 2 or a.shape[0] != a.shape[1]:
        raise ConfigError(f"an adjacency matrix must be square, got shape {a.shape}")
    n = a.shape[0]
    return Graph(n, [[j for j in range(n) if j != i and a[i, j] != 0] for i in range(n)], name)


def _from_networkx(g: Any, name: str) -> Graph:
    n = g.number_of_nodes()
    if sorted(g.nodes) != list(range(n)):
        raise ConfigError("a networkx graph needs nodes 0..n-1 (relabel with "
                          "networkx.convert_node_labels_to_integers)")
    directed = bool(getattr(g, "is_directed", lambda: True)())
    pairs = [(int(i), int(j)) for i, j in g.edges]
    if not directed:
        pairs += [(j, i) for i, j in pairs]
    return from_edges(pairs, n, name)


def save(g: Graph, path: PathLike) -> Path:
    """Write `g` as an edge-list text file that load() reads back equal."""
    path = Path(path)
    lines = [f"# asapmpi graph n={g.n} name={g.name}"] + [f"{i} {j}" for i, j in g.edges()]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def load(path: PathLike) -> Graph:
    """Read a graph file: an edge-list text file, or a .npy adjacency matrix."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"graph file {str(path)!r} does not exist")
    if path.suffix == ".npy":
        return from_adjacency(np.load(path, allow_pickle=False), path.stem)
    n, name, edges = None, path.stem, []
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        header = re.match(r"#\s*asapmpi graph\s+n=(\d+)(?:\s+name=(\S+))?", raw)
        if header:
            n, name = int(header.group(1)), header.group(2) or name
            continue
        line = raw.split("#", 1)[0].split()
        if not line:
            continue
        if len(line) != 2:
            raise ConfigError(f"{path}:{number}: expected 'sender receiver', got {raw!r}")
        try:
            edges.append((int(line[0]), int(line[1])))
        except ValueError:
            raise ConfigError(f"{path}:{number}: ranks must be integers, got {raw!r}") from None
    return from_edges(edges, n, name)


def hosts_of(comm) -> list:
    """Host id of every rank of `comm` (ranks sharing memory share a host), from MPI's
    shared-memory split.  Collective."""
    from mpi4py import MPI

    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        leader = local.bcast(comm.Get_rank(), root=0)
    finally:
        local.Free()
    return comm.allgather(leader)
