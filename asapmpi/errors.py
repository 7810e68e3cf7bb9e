"""The one exception hierarchy of asapmpi.

Every error asapmpi raises derives from :class:`AsapError`.  Each also derives from the
built-in class a caller would naturally catch (ValueError for bad input, TimeoutError for
a silent neighbour, ImportError for a broken installation), so generic handlers keep
working.
"""
from __future__ import annotations

from typing import Sequence


class AsapError(Exception):
    """Base class of every asapmpi error."""


class ConfigError(AsapError, ValueError):
    """Bad input from the user: raised before any communication starts."""


class MPIError(AsapError, RuntimeError):
    """An MPI call returned an error code.

    Attributes: ``code`` (the MPI error code), ``call`` (the MPI function),
    ``mpi_message`` (MPI's error string).
    """

    def __init__(self, code: int, call: str, mpi_message: str):
        self.code = code
        self.call = call
        self.mpi_message = mpi_message
        super().__init__(f"{call} failed with MPI error {code}: {mpi_message}")


class ProcessFailedError(MPIError):
    """An MPI call failed because a process of its communicator died (ULFM's
    MPI_ERR_PROC_FAILED or MPI_ERR_PROC_FAILED_PENDING), or because another rank
    revoked the communicator after it saw one die (MPI_ERR_REVOKED: ``revoked``).  Only
    an MPI with fault tolerance (Open MPI 5 under ``mpiexec --with-ft ulfm``) returns
    these; an Exchange created with ``fault_tolerance=True`` survives them in place
    (docs/FAILURES.md), any other lets them end the job."""

    def __init__(self, code: int, call: str, mpi_message: str, revoked: bool = False):
        super().__init__(code, call, mpi_message)
        self.revoked = revoked


class NeighbourTimeoutError(AsapError, TimeoutError):
    """A wait on other ranks ran out of time.

    Attributes: ``ranks`` (the ranks that had not answered), ``what`` (what was awaited),
    ``expected`` and ``observed`` (per rank, the awaited and last seen values).
    """

    def __init__(self, rank: int, what: str, ranks: Sequence[int], expected: Sequence[int],
                 observed: Sequence[int], timeout: float, why: str = ""):
        self.rank = rank
        self.what = what
        self.ranks = list(ranks)
        self.expected = list(expected)
        self.observed = list(observed)
        self.timeout = timeout
        #: what is known of the ranks that did not answer (empty: nothing; they are
        #: dead or stalled), as explained() set it
        self.why = why
        # a collective has no per-rank value to show: just the ranks that never arrived
        detail = ", ".join(
            f"rank {r} (expected {e}, last seen {o})" for r, e, o in zip(ranks, expected, observed)
        ) if self.expected else ", ".join(f"rank {r}" for r in ranks) or \
            "a rank of the communicator (an MPI collective does not say which)"
        cause = why or ("the neighbour is dead or stalled (raise the timeout with "
                        "ASAPMPI_TIMEOUT if it is only slow)")
        super().__init__(f"rank {rank}: timed out after {timeout:g} s waiting for {what} "
                         f"from {detail}; {cause}")

    def explained(self, why: str) -> "NeighbourTimeoutError":
        """The same timeout, saying `why` the ranks did not answer instead of 'dead or
        stalled'."""
        return NeighbourTimeoutError(self.rank, self.what, self.ranks, self.expected,
                                     self.observed, self.timeout, why)


class ProtocolError(AsapError, RuntimeError):
    """A slot changed while it was read although the protocol promised it would not."""


class FreedError(AsapError, RuntimeError):
    """An object was used after ``free()``."""


class MPIMismatchError(AsapError, ImportError):
    """The compiled core and mpi4py use different MPI libraries or ABIs."""


class NonFiniteError(AsapError, ValueError):
    """A buffer held NaN or Inf when an Exchange created with reject_nonfinite=True was
    asked to send it; nothing was sent."""


def _failure_kind(code: int):
    """True (revoked), False (a process failed) or None (another error) for an MPI error
    code, by its class; None where this MPI has no ULFM error classes (mpi4py then
    gives them MPI_ERR_UNKNOWN's value)."""
    from mpi4py import MPI  # only once an MPI call failed: MPI is initialized

    unknown = MPI.ERR_UNKNOWN
    try:
        cls = MPI.Get_error_class(code)
    except MPI.Exception:
        return None
    if cls == unknown:
        return None
    if cls == MPI.ERR_REVOKED:
        return True
    if cls in (MPI.ERR_PROC_FAILED, MPI.ERR_PROC_FAILED_PENDING):
        return False
    return None


def mpi_error(code: int, call: str, mpi_message: str) -> MPIError:
    """The MPIError of a failed MPI call: a ProcessFailedError when its error class
    says a process failed or the communicator was revoked (ULFM), else an MPIError."""
    kind = _failure_kind(code)
    if kind is None:
        return MPIError(code, call, mpi_message)
    return ProcessFailedError(code, call, mpi_message, revoked=kind)
