"""Communication graphs: who sends to whom.

A Graph holds, for every rank, its out-neighbours (the ranks it sends to).  In-neighbours
are derived and kept sorted by rank; that order is the order of the weights and of the
fused reduce.  The full catalogue of graphs is the stochastic-reduce issue's; this module
has the representation and the graphs the core's tests need.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence

import numpy as np

from ..errors import ConfigError


class Graph:
    """A directed graph on ranks 0..n-1 without self-loops."""

    def __init__(self, n: int, out_neighbours: Sequence[Iterable[int]], name: str = "user"):
        if n < 1:
            raise ConfigError(f"a graph needs at least 1 rank, got n={n}")
        if len(out_neighbours) != n:
            raise ConfigError(f"{len(out_neighbours)} neighbour lists for {n} ranks")
        outs: List[List[int]] = []
        for r, given in enumerate(out_neighbours):
            nbrs = [int(j) for j in given]
            for j in nbrs:
                if not 0 <= j < n:
                    raise ConfigError(f"rank {r} sends to rank {j}, outside 0..{n - 1}")
                if j == r:
                    raise ConfigError(f"rank {r} lists itself as a neighbour; self-loops are "
                                      f"implicit (the self weight)")
            if len(set(nbrs)) != len(nbrs):
                raise ConfigError(f"rank {r} lists a neighbour twice: {nbrs}")
            outs.append(sorted(nbrs))
        self.n = n
        self.name = name
        self._out = outs
        ins: List[List[int]] = [[] for _ in range(n)]
        for r, nbrs in enumerate(outs):
            for j in nbrs:
                ins[j].append(r)
        self._in = [sorted(x) for x in ins]

    def out_neighbours(self, rank: int) -> List[int]:
        """Ranks `rank` sends to, ascending."""
        return list(self._out[rank])

    def in_neighbours(self, rank: int) -> List[int]:
        """Ranks `rank` receives from, ascending (the reduce order)."""
        return list(self._in[rank])

    def in_degree(self, rank: int) -> int:
        """Number of in-neighbours of `rank` (self not counted)."""
        return len(self._in[rank])

    def out_degree(self, rank: int) -> int:
        """Number of out-neighbours of `rank`."""
        return len(self._out[rank])

    def is_regular(self) -> bool:
        """True if every rank has the same in-degree and the same out-degree."""
        return len({len(x) for x in self._in}) == 1 and len({len(x) for x in self._out}) == 1

    def is_undirected(self) -> bool:
        """True if every edge i -> j has its reverse j -> i."""
        return all(r in self._out[j] for r in range(self.n) for j in self._out[r])

    def is_weakly_connected(self) -> bool:
        """True if the graph is connected when edge directions are ignored."""
        both = [set(self._out[r]) | set(self._in[r]) for r in range(self.n)]
        return self._reaches_all(both)

    def adjacency(self) -> np.ndarray:
        """n x n array, A[i, j] = 1 if i sends to j."""
        a = np.zeros((self.n, self.n))
        for i, j in self.edges():
            a[i, j] = 1.0
        return a

    def edges(self) -> List[tuple]:
        """All (sender, receiver) pairs."""
        return [(r, j) for r in range(self.n) for j in self._out[r]]

    def is_strongly_connected(self) -> bool:
        """True if every rank reaches every other along directed edges."""
        return self._reaches_all(self._out) and self._reaches_all(self._in)

    def _reaches_all(self, adj) -> bool:
        seen, stack = {0}, [0]
        while stack:
            for j in adj[stack.pop()]:
                if j not in seen:
                    seen.add(j)
                    stack.append(j)
        return len(seen) == self.n

    def __eq__(self, other):
        return isinstance(other, Graph) and self.n == other.n and self._out == other._out

    def __hash__(self):
        return hash((self.n, tuple(map(tuple, self._out))))

    def __repr__(self):
        return f"Graph({self.name!r}, n={self.n}, edges={len(self.edges())})"


def _from_pairs(n: int, pairs, name: str, both_ways: bool = False) -> Graph:
    """A graph with the edges i -> j of `pairs` taken mod n (and j -> i if `both_ways`),
    self pairs dropped."""
    outs = [set() for _ in range(n)]
    for a, b in pairs:
        i, j = a % n, b % n
        if i != j:
            outs[i].add(j)
            if both_ways:
                outs[j].add(i)
    return Graph(n, [sorted(o) for o in outs], name)


def _undirected(n: int, pairs, name: str) -> Graph:
    """A graph with both directions of every pair."""
    return _from_pairs(n, pairs, name, both_ways=True)


def _directed(n: int, pairs, name: str) -> Graph:
    """A graph with the edges i -> j of `pairs`."""
    return _from_pairs(n, pairs, name)


def complete(n: int) -> Graph:
    """Every rank sends to every other: the all-reduce."""
    return Graph(n, [[j for j in range(n) if j != r] for r in range(n)], "complete")


def star(n: int, root: int = 0) -> Graph:
    """Parameter server: `root` exchanges with every other rank (both directions)."""
    if not 0 <= root < n:
        raise ConfigError(f"star root {root} is outside 0..{n - 1}")
    return _undirected(n, [(root, j) for j in range(n)], "star")


def root_expander(n: int) -> Graph:
    """ASAP's root expander: i -> i+1 and i -> i + floor(sqrt(n)) (mod n)."""
    r = math.isqrt(n)
    return _directed(n, [(i, i + 1) for i in range(n)] + [(i, i + r) for i in range(n)],
                     "root-expander")


def chain(n: int) -> Graph:
    """A path 0 - 1 - ... - n-1, both directions (ASAP Figure 2(d))."""
    return _undirected(n, [(i, i + 1) for i in range(n - 1)], "chain")


def ring(n: int) -> Graph:
    """Directed ring: i -> i+1."""
    return _directed(n, [(i, i + 1) for i in range(n)], "ring")


def bidirectional_ring(n: int) -> Graph:
    """i -> i-1 and i -> i+1."""
    return _undirected(n, [(i, i + 1) for i in range(n)], "bidirectional-ring")


def ring_based(n: int) -> Graph:
    """Hop's ring-based graph: the bidirectional ring, plus every rank linked with the
    most distant one, i +- floor(n/2) (Hop Figure 11(2))."""
    half = n // 2
    return _undirected(n, [(i, i + 1) for i in range(n)] + [(i, i + half) for i in range(n)],
                       "ring-based")


def double_ring(n: int) -> Graph:
    """Hop's double ring: two ring-based graphs of n/2 ranks (0..n/2-1 and n/2..n-1),
    rank i of the first linked with rank i of the second (Hop Figure 11(3); the paper's
    text is garbled here, this is our reading of the figure).  n must be even."""
    if n % 2:
        raise ConfigError(f"double-ring needs an even number of ranks, got {n}")
    h = n // 2
    pairs = [(i, i + h) for i in range(h)]
    for base in (0, h):
        pairs += [(base + i, base + (i + 1) % h) for i in range(h)]
        pairs += [(base + i, base + (i + h // 2) % h) for i in range(h)]
    return _undirected(n, pairs, "double-ring")


def exponential(n: int) -> Graph:
    """i -> i + 2^k for every 2^k < n (the exponential graph of decentralized SGD)."""
    pairs, step = [], 1
    while step < n:
        pairs += [(i, i + step) for i in range(n)]
        step *= 2
    return _directed(n, pairs, "exponential")


def hierarchical(n: int, hosts: Optional[Sequence[int]] = None,
                 ranks_per_host: Optional[int] = None) -> Graph:
    """Complete inside each host; between hosts a bidirectional ring through the first
    rank of every host.  Give `hosts` (a host id per rank, e.g. from
    asapmpi.reduce.hosts_of(comm)) or `ranks_per_host` (consecutive blocks)."""
    if hosts is None:
        if ranks_per_host is None or ranks_per_host < 1:
            raise ConfigError("hierarchical needs hosts=[host of each rank] or "
                              "ranks_per_host=K (K >= 1)")
        hosts = [r // ranks_per_host for r in range(n)]
    if len(hosts) != n:
        raise ConfigError(f"hosts names {len(hosts)} ranks for a graph of {n}")
    groups: Dict[Any, List[int]] = {}
    for r, h in enumerate(hosts):
        groups.setdefault(h, []).append(r)
    members = list(groups.values())
    pairs = [(a, b) for g in members for a in g for b in g if a < b]
    leaders = [g[0] for g in members]
    if len(leaders) > 1:
        pairs += [(leaders[k], leaders[(k + 1) % len(leaders)]) for k in range(len(leaders))]
    return _undirected(n, pairs, "hierarchical")


def random_regular(n: int, degree: Optional[int] = None, seed: int = 0,
                   tries: int = 1000) -> Graph:
    """A random directed `degree`-regular expander (default degree min(2, n-1)): the
    union of `degree` random permutations without fixed points or repeated edges, redrawn
    until strongly connected.  The same (n, degree, seed) always gives the same graph."""
    if degree is None:
        degree = min(2, n - 1)
    if n == 1:
        return Graph(1, [[]], "random-regular")
    if not 1 <= degree < n:
        raise ConfigError(f"random-regular needs 1 <= degree < n, got degree={degree}, n={n}")
    rng = np.random.default_rng(seed)
    for _ in range(tries):
        outs: List[set] = [set() for _ in range(n)]
        for _ in range(degree):
            for _ in range(tries):
                perm = rng.permutation(n)
                if all(perm[i] != i and perm[i] not in outs[i] for i in range(n)):
                    break
            else:
                break
            for i in range(n):
                outs[i].add(int(perm[i]))
        else:
            g = Graph(n, [sorted(o) for o in outs], "random-regular")
            if g.is_strongly_connected():
                return g
    raise ConfigError(f"could not draw a strongly connected {degree}-regular graph on {n} "
                      f"ranks; try another seed or degree")


GRAPHS: Dict[str, Callable[..., Graph]] = {
    "complete": complete,
    "star": star,
    "root-expander": root_expander,
    "chain": chain,
    "ring": ring,
    "bidirectional-ring": bidirectional_ring,
    "ring-based": ring_based,
    "double-ring": double_ring,
    "exponential": exponential,
    "hierarchical": hierarchical,
    "random-regular": random_regular,
}

DESCRIPTIONS = {
    "complete": "every rank sends to every other (all-reduce)",
    "star": "parameter server: rank 0 exchanges with every rank",
    "root-expander": "ASAP: i -> i+1 and i -> i+floor(sqrt(n))",
    "chain": "a path 0 - 1 - ... - n-1, both directions",
    "ring": "directed ring i -> i+1",
    "bidirectional-ring": "ring in both directions",
    "ring-based": "Hop: bidirectional ring plus the most distant rank",
    "double-ring": "Hop: two ring-based halves, rank i linked with rank i+n/2",
    "exponential": "i -> i + 2^k for every 2^k < n",
    "hierarchical": "complete inside a host, ring between hosts (hosts=, ranks_per_host=)",
    "random-regular": "random directed d-regular expander (degree=, seed=)",
}


def graph(name: str, n: int, **params) -> Graph:
    """Build the named graph on n ranks (names: GRAPHS; `asapmpi graph --list`)."""
    try:
        make = GRAPHS[name]
    except KeyError:
        raise ConfigError(f"unknown graph {name!r}; choose one of {sorted(GRAPHS)}") from None
    if not isinstance(n, int) or n < 1:
        raise ConfigError(f"a graph needs a positive number of ranks, got n={n!r}")
    try:
        return make(n, **params)
    except TypeError as exc:
        raise ConfigError(f"graph {name!r}: {exc}") from None
