"""asapmpi.reduce: graphs and weights of the stochastic reduce."""
from .graph import GRAPHS, Graph, bidirectional_ring, complete, graph, ring
from .weights import uniform_weights

__all__ = [
    "GRAPHS", "Graph", "bidirectional_ring", "complete", "graph", "ring", "uniform_weights",
]
