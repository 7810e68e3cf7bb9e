"""asapmpi.reduce: graphs and weights of the stochastic reduce."""
from .graph import GRAPHS, Graph, bidirectional_ring, complete, graph, ring
from .weights import uniform_weights

__all__ = ["Graph", "GRAPHS", "graph", "complete", "ring", "bidirectional_ring",
           "uniform_weights"]
