"""asapmpi: decentralized data-parallel training on one-sided MPI RMA.

Each rank keeps a full replica and mixes it with a few neighbours through per-sender
receive slots in MPI windows, with version checks that prove every reduce read whole
updates.  Start with :class:`Exchange`.
"""
from . import errors
from .errors import (
                     AsapError,
                     ConfigError,
                     FreedError,
                     MPIError,
                     MPIMismatchError,
                     NeighbourTimeoutError,
                     NonFiniteError,
                     ProtocolError,
)
from .exchange import Exchange
from .faults import abort_job
from .rc import rc
from .reduce import Graph, graph, graph_from, spectral_gap
from .slowdown import Slowdown

__version__ = "0.1.0"

__all__ = [
    "AsapError", "ConfigError", "Exchange", "FreedError", "Graph", "MPIError",
    "MPIMismatchError", "NeighbourTimeoutError", "NonFiniteError", "ProtocolError",
    "Slowdown", "__version__", "abort_job", "errors", "graph", "graph_from", "rc",
    "spectral_gap",
]
