"""The all-reduce baseline: the same averaging as a complete graph, by MPI_Allreduce."""
from __future__ import annotations

import time

from .base import Policy, Reads, StepContext


class Allreduce(Policy):
    """buffer <- mean of every rank's buffer, with MPI_Allreduce (sum) and one division."""

    name = "allreduce"
    lockstep = True
    #: no window: MPI_Allreduce over ctx.comm
    reads = Reads.NOTHING

    def __init__(self):
        self.calls = 0          # Allreduce calls, and seconds spent in them
        self.seconds = 0.0

    def send(self, win, buf, version: int, ctx: StepContext) -> None:
        """Nothing to publish ahead: the collective moves the data in receive()."""

    def receive(self, win, buf, version: int, ctx: StepContext) -> None:
        """Average the buffer over all ranks."""
        # imported here, not with the module: importing asapmpi.sync starts no MPI
        from mpi4py import MPI

        t = time.perf_counter()
        ctx.comm.Allreduce(MPI.IN_PLACE, ctx.array, op=MPI.SUM)
        self.seconds += time.perf_counter() - t
        ctx.array /= ctx.comm.Get_size()
        self.calls += 1
