"""Failing clearly: a multi-rank job whose rank hits an uncaught error ends, non-zero.

An exception that unwinds out of a rank's script would otherwise reach MPI_Finalize,
which waits for the other ranks, while they wait for this one in a one-sided wait or a
collective: a hang.  The hook installed here (once, by the first Exchange of a job of
more than one rank; asapmpi.rc.abort_on_error = False or ASAPMPI_ABORT_ON_ERROR=0 turns
it off) prints the error, one line for asapmpi's own errors, and calls MPI_Abort.
"""
from __future__ import annotations

import sys
import traceback

_state = {"installed": False}


def abort_job(exc: BaseException, code: int = 1) -> None:
    """Report `exc` on this rank and end the whole job with MPI_Abort."""
    from mpi4py import MPI

    from .errors import AsapError

    rank = MPI.COMM_WORLD.Get_rank()
    if isinstance(exc, AsapError):
        print(f"asapmpi: rank {rank}: {type(exc).__name__}: {exc}", file=sys.stderr)
    else:
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        print(f"asapmpi: rank {rank} failed:\n{text}", file=sys.stderr)
    sys.stderr.flush()
    MPI.COMM_WORLD.Abort(code)


def install_abort_hook() -> None:
    """Make an uncaught exception end the whole MPI job (idempotent)."""
    if _state["installed"]:
        return
    previous = sys.excepthook

    def hook(kind, exc, tb):
        from mpi4py import MPI

        if MPI.Is_initialized() and not MPI.Is_finalized() and MPI.COMM_WORLD.Get_size() > 1 \
                and not issubclass(kind, KeyboardInterrupt):
            abort_job(exc)
        previous(kind, exc, tb)

    sys.excepthook = hook
    _state["installed"] = True
