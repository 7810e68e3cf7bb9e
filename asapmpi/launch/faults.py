"""Failing clearly: a multi-rank job whose rank hits an uncaught error ends, non-zero.

An exception that unwinds out of a rank's script would otherwise reach MPI_Finalize,
which waits for the other ranks, while they wait for this one in a one-sided wait or a
collective: a hang.  The hook installed here (once, by the first Exchange of a job of
more than one rank; asapmpi.rc.abort_on_error = False or ASAPMPI_ABORT_ON_ERROR=0 turns
it off) prints the error, one line for asapmpi's own errors, and calls MPI_Abort.
"""
from __future__ import annotations

import os
import sys
import time
import traceback

_state = {"installed": False}

# MPI_Abort makes hydra (and Slurm, Flux) tear the job down at once; what the aborting
# rank wrote to stderr just before can be lost if the launcher's I/O forwarder has not
# read it yet (seen in a loaded CI run: a timeout error with no output at all).  Failing
# clearly is worth half a second.
ABORT_GRACE_S = 0.5


def abort_world(code: int = 1) -> None:
    """Flush this rank's output, give the launcher time to forward it, then MPI_Abort."""
    from mpi4py import MPI

    sys.stdout.flush()
    sys.stderr.flush()
    time.sleep(ABORT_GRACE_S)
    MPI.COMM_WORLD.Abort(code)
    os._exit(code)      # MPI_Abort does not return; should an MPI let it, do not go on


def report_error(exc: BaseException) -> None:
    """Print `exc` on stderr, prefixed with this rank: one line for asapmpi's own errors,
    the traceback for anything else."""
    from mpi4py import MPI

    from ..errors import AsapError

    rank = MPI.COMM_WORLD.Get_rank()
    if isinstance(exc, AsapError):
        print(f"asapmpi: rank {rank}: {type(exc).__name__}: {exc}", file=sys.stderr)
    else:
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        print(f"asapmpi: rank {rank} failed:\n{text}", file=sys.stderr)


def abort_job(exc: BaseException, code: int = 1) -> None:
    """Report `exc` on this rank and end the whole job with MPI_Abort."""
    report_error(exc)
    abort_world(code)


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
