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
from .launch.faults import abort_job
from .launch.slowdown import Slowdown
from .rc import rc
from .reduce import Graph, graph, graph_from, spectral_gap

__version__ = "0.1.0"


def __getattr__(name):
    # Exchange imports mpi4py.MPI, which initializes MPI: a process that only launches
    # ranks (asapmpi-run, `asapmpi train -n 8` outside a job, doctor) must not.  Open
    # MPI's singleton start would also put its PMIx variables into the environment of
    # every process it starts, and an mpiexec started with those exits 1 (issue 14).
    if name == "Exchange":
        from .exchange import Exchange

        return Exchange
    # a submodule used as an attribute (asapmpi.sync.Hop), as when importing Exchange
    # imported them all
    import importlib

    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{name}":
            raise
    raise AttributeError(f"module 'asapmpi' has no attribute {name!r}")

__all__ = [
    "AsapError", "ConfigError", "Exchange", "FreedError", "Graph", "MPIError",
    "MPIMismatchError", "NeighbourTimeoutError", "NonFiniteError", "ProtocolError",
    "Slowdown", "__version__", "abort_job", "errors", "graph", "graph_from", "rc",
    "spectral_gap",
]
