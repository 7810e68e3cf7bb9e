"""asapmpi.reduce: communication graphs, mixing weights and spectral gaps."""
from .graphs import DESCRIPTIONS, GRAPHS, Graph, graph
from .spectral import second_singular_value, spectral_gap
from .user import from_adjacency, from_edges, graph_from, hosts_of, load, save
from .weights import check_stochastic, mixing_matrix, uniform_weights

__all__ = [
    "DESCRIPTIONS",
    "GRAPHS",
    "Graph",
    "check_stochastic",
    "from_adjacency",
    "from_edges",
    "graph",
    "graph_from",
    "hosts_of",
    "load",
    "mixing_matrix",
    "save",
    "second_singular_value",
    "spectral_gap",
    "uniform_weights",
]
