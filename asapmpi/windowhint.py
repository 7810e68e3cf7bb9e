"""Why MPI_Win_allocate failed, where Open MPI's usual reasons explain it: for every
window asapmpi makes (an exchange's, the transport probe's, a board's)."""
from __future__ import annotations

from mpi4py import MPI

from .errors import MPIError


def window_hint() -> str:
    """Why MPI_Win_allocate may have failed, for Open MPI's usual reasons ("" on other
    MPIs): its RMA over TCP (osc pt2pt, 4.x) refuses MPI_THREAD_MULTIPLE, which mpi4py
    asks for by default, and Debian's openmpi-mca-params.conf excludes osc pt2pt and
    ucx, which leaves no one-sided component between hosts without RDMA."""
    if "Open MPI" not in MPI.Get_library_version():
        return ""
    if MPI.Query_thread() == MPI.THREAD_MULTIPLE:
        return ("; Open MPI's RMA over TCP (osc pt2pt) refuses MPI_THREAD_MULTIPLE, "
                "mpi4py's default: set MPI4PY_RC_THREAD_LEVEL=serialized")
    return ("; Open MPI found no one-sided (osc) component for these ranks: between hosts "
            "without RDMA allow osc pt2pt (OMPI_MCA_osc=^ucx; Debian's "
            "openmpi-mca-params.conf excludes it) or use UCX (OMPI_MCA_pml=ucx "
            "OMPI_MCA_osc=ucx)")


def explained(exc: MPIError) -> MPIError:
    """`exc`, with Open MPI's usual reason appended when it is a failed window
    allocation (window_hint)."""
    hint = window_hint() if exc.call == "MPI_Win_allocate" else ""
    return MPIError(exc.code, exc.call, exc.mpi_message + hint) if hint else exc
