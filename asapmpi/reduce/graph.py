"""Communication graphs: who sends to whom.

A Graph holds, for every rank, its out-neighbours (the ranks it sends to).  In-neighbours
are derived and kept sorted by rank; that order is the order of the weights and of the
fused reduce.  The full catalogue of graphs is the stochastic-reduce issue's; this module
has the representation and the graphs the core's tests need.
"""
from __future__ import annotations

from typing import Callable, Dict, Iterable, List, Sequence

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

    def edges(self) -> List[tuple]:
        """All (sender, receiver) pairs."""
        return [(r, j) for r in range(self.n) for j in self._out[r]]

    def is_strongly_connected(self) -> bool:
        """True if every rank reaches every other along directed edges."""
        def reach(adj):
            seen, stack = {0}, [0]
            while stack:
                for j in adj[stack.pop()]:
                    if j not in seen:
                        seen.add(j)
                        stack.append(j)
            return len(seen) == self.n
        return reach(self._out) and reach(self._in)

    def __eq__(self, other):
        return isinstance(other, Graph) and self.n == other.n and self._out == other._out

    def __hash__(self):
        return hash((self.n, tuple(map(tuple, self._out))))

    def __repr__(self):
        return f"Graph({self.name!r}, n={self.n}, edges={len(self.edges())})"


def complete(n: int) -> Graph:
    """Every rank sends to every other (all-reduce)."""
    return Graph(n, [[j for j in range(n) if j != r] for r in range(n)], "complete")


def ring(n: int) -> Graph:
    """Directed ring: i -> i+1."""
    return Graph(n, [[(r + 1) % n] if n > 1 else [] for r in range(n)], "ring")


def bidirectional_ring(n: int) -> Graph:
    """i -> i-1 and i -> i+1."""
    return Graph(n, [sorted({(r + 1) % n, (r - 1) % n} - {r}) for r in range(n)],
                 "bidirectional-ring")


GRAPHS: Dict[str, Callable[..., Graph]] = {
    "complete": complete,
    "ring": ring,
    "bidirectional-ring": bidirectional_ring,
}


def graph(name: str, n: int, **params) -> Graph:
    """Build the named graph on n ranks."""
    try:
        make = GRAPHS[name]
    except KeyError:
        raise ConfigError(f"unknown graph {name!r}; choose one of {sorted(GRAPHS)}") from None
    return make(n, **params)
