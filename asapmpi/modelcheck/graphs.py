"""The small graphs the scenarios run on, named by a short spec.

    ring:3            directed ring i -> i+1 (asapmpi.reduce.graphs.ring)
    complete:4        every rank to every other
    offsets:6:1,4     i -> i+1 and i -> i+4 (mod 6): the 6-rank graph of issue 15
    NAME:N            any other graph of asapmpi.reduce.graphs (bidirectional-ring:4, ...)
"""
from __future__ import annotations

from ..errors import ConfigError
from ..reduce import graphs as catalogue
from ..reduce.graphs import Graph

#: the most ranks a model is built for (states grow exponentially with them)
MAX_RANKS = 8


def make_graph(spec: str) -> Graph:
    """The graph named by `spec` (see the module docstring); ConfigError if the spec is
    malformed, the graph unknown or outside 2..MAX_RANKS ranks."""
    parts = spec.split(":")
    name = parts[0]
    try:
        n = int(parts[1])
    except (IndexError, ValueError):
        raise ConfigError(f"graph {spec!r}: write NAME:RANKS, e.g. ring:3, complete:4 or "
                          f"offsets:6:1,4") from None
    if not 2 <= n <= MAX_RANKS:
        raise ConfigError(f"graph {spec!r}: the model checker takes 2 to {MAX_RANKS} ranks, "
                          f"not {n}")
    if name == "offsets":
        try:
            offsets = [int(x) for x in parts[2].split(",")]
        except (IndexError, ValueError):
            raise ConfigError(f"graph {spec!r}: offsets:RANKS:A,B,... (e.g. offsets:6:1,4)"
                              ) from None
        g = Graph(n, [sorted({(i + a) % n for a in offsets} - {i}) for i in range(n)],
                  spec)
    elif len(parts) == 2:
        try:
            g = catalogue.graph(name, n)
        except ConfigError as exc:
            raise ConfigError(f"graph {spec!r}: {exc}") from None
        g.name = spec
    else:
        raise ConfigError(f"graph {spec!r}: only offsets takes a third field")
    if not g.is_strongly_connected():
        raise ConfigError(f"graph {spec!r} is not strongly connected")
    return g
