"""The all-reduce baseline: the same averaging as a complete graph, by MPI_Allreduce."""
from __future__ import annotations

from mpi4py import MPI

from .base import Policy, StepContext


class Allreduce(Policy):
    """buffer <- mean of every rank's buffer, with MPI_Allreduce (sum) and one division."""

    name = "allreduce"
    uses_window = False

    def step(self, win, buf, version: int, ctx: StepContext) -> None:
        ctx.comm.Allreduce(MPI.IN_PLACE, ctx.array, op=MPI.SUM)
        ctx.array /= ctx.comm.Get_size()
