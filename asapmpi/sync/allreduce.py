"""The all-reduce baseline: the same averaging as a complete graph, by MPI_Iallreduce."""
from __future__ import annotations

import time

import numpy as np

from ..dtypes import HALF, f32_to_half, half_to_f32
from .base import Policy, Reads, StepContext


class Allreduce(Policy):
    """buffer <- mean of every rank's buffer, with MPI_Allreduce (sum) and one division."""

    name = "allreduce"
    lockstep = True
    #: no window: MPI_Allreduce over ctx.comm
    reads = Reads.NOTHING

    def __init__(self, **options):
        super().__init__(**options)
        self.calls = 0          # Allreduce calls, and seconds spent in them
        self.seconds = 0.0
        self._wide = None       # bfloat16, float16: the float32 buffer summed (made once)

    def send(self, win, buf, version: int, ctx: StepContext) -> None:
        """Nothing to publish ahead: the collective moves the data in receive()."""

    def receive(self, win, buf, version: int, ctx: StepContext) -> None:
        """Average the buffer over all ranks.  MPI_Iallreduce, waited for by polling with
        backoff (collectives.wait_polled) rather than a blocking MPI_Allreduce, which
        spins in the MPI's progress loop: a rank waiting there for a slow rank that
        shares its cores (or its host's CPU budget) would take their cycles."""
        # imported here, not with the module: importing asapmpi.sync starts no MPI
        from mpi4py import MPI

        from ..collectives import allreduce

        t = time.perf_counter()
        summed = ctx.array
        if ctx.dtype in HALF:
            # MPI has no 16-bit floats: sum in float32, round once (as the slot reduce)
            if self._wide is None:
                self._wide = np.empty(ctx.array.shape, dtype=np.float32)
            wide = self._wide if ctx.wide is None else ctx.wide
            summed = half_to_f32(ctx.array, ctx.dtype, out=wide)
        size = ctx.comm.Get_size()
        # ranks that joined (Exchange.join) add zeros, and the sum is divided by the
        # ranks still training: every rank leaves out the same ones at the same version
        training = size - len(ctx.absent) if len(ctx.absent) < size else size
        if training < size and ctx.comm.Get_rank() in ctx.absent:
            summed[...] = 0
        # a collective request can be neither cancelled nor freed while the others may
        # still take part: past the deadline it goes, with the buffer, to the leftovers
        allreduce(ctx.comm, MPI.IN_PLACE, summed, MPI.SUM, ctx.timeout,
                  f"the allreduce of version {version}")
        self.seconds += time.perf_counter() - t
        summed /= training
        if summed is not ctx.array:
            f32_to_half(summed, ctx.dtype, out=ctx.array)
            if summed is ctx.wide:
                ctx.wide_count += 1
        self.calls += 1
