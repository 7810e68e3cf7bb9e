"""ASAP's baselines (section 6.2): BSP and ASYNC over the slot windows.

Both write with the seqlock sequence (header, flush, payload, flush, footer, flush) so
that a read overlapping a write is detected; both reduce only inputs that are whole
versions, averaging over those (the weights of the inputs left out are spread over the
rest).  What they cannot promise is that the inputs are the current version: that is
what the consistency benchmark measures.
"""
from __future__ import annotations

from .base import Await, Policy, Reads, StepContext

NEWEST = 1 << 62


class BSP(Policy):
    """Put, global barrier, reduce what is in the slots: only version k is reduced.  On
    messages (a mailbox window) the reduce first waits for the version-k updates the
    barrier proved sent, and a writer's next version waits until its reader released
    this one (docs/PROTOCOL.md 2d)."""

    name = "bsp"
    lockstep = True
    barrier_per_step = True
    reduces_last = True
    #: its slots after the barrier, by their notify words
    reads = Reads.WORDS
    #: on the channel verbs: deliver (the seqlock sequence, no notify: the barrier
    #: tells the readers), await_(k, BARRIER), the reduce, release
    delivers = True
    awaits = frozenset({Await.BARRIER})

    def send(self, win, buf, version: int, ctx: StepContext) -> None:
        """Deliver version k (the seqlock sequence: its writers wait for no reader)."""
        win.deliver(buf, version, ctx.timeout, ctx.checksum)

    def receive(self, win, buf, version: int, ctx: StepContext) -> None:
        """Barrier, then reduce the version-k inputs found whole."""
        win.await_(version, ctx.timeout, Await.BARRIER)
        win.reduce(buf, ctx.w_self, ctx.weights, version, version, version, seqlock=True,
                   checksum=ctx.checksum, renormalize=True)
        win.release(version)


class Async(Policy):
    """Put and reduce without waiting for anybody: any whole version is reduced.  On
    messages (a mailbox of newest versions) a put never waits for a reader either: a
    reader still taking the previous update gets the newest one after it, and each slot
    holds the newest whole version that arrived (docs/PROTOCOL.md 2e)."""

    name = "async"
    reduces_last = True
    #: any whole version in each slot, the newest that arrived; puts never wait
    reads = Reads.NEWEST
    writer_runs_ahead = True
    #: on the channel verbs: deliver (never waiting, in the seqlock order, without a
    #: notify: nobody awaits), then the reduce of what the slots hold
    delivers = True

    def send(self, win, buf, version: int, ctx: StepContext) -> None:
        """Deliver version k (the seqlock sequence: its writers wait for no reader)."""
        win.deliver(buf, version, ctx.timeout, ctx.checksum)

    def receive(self, win, buf, version: int, ctx: StepContext) -> None:
        """Reduce whatever whole versions the slots hold, without waiting."""
        win.reduce(buf, ctx.w_self, ctx.weights, version, 1, NEWEST, seqlock=True,
                   checksum=ctx.checksum, renormalize=True)
