"""Deliberately broken policies, for the tests that show the checks catching what they
break (tests/mpi/scenarios.py's broken_protocol; the model of asapmpi.modelcheck's
notify-ack-put "ignore-acks" variant).  Never train with them.
"""
from __future__ import annotations

from ..sync.base import Reads, StepContext
from ..sync.notify_ack import NotifyAck


class NotifyAckIgnoringAcks(NotifyAck):
    """A DELIBERATELY BROKEN NOTIFY-ACK for the consistency tests: writers do not wait
    for acks, so they may overwrite a slot while it is read.  Readers wait for a notify
    of at least version k, read with the seqlock discipline and reduce the whole
    version-k inputs they find, counting the rest (torn; ahead: already overwritten by
    k+1).  The writes are seqlock writes (header, flush, payload, flush, footer,
    flush, then the notify), so the readers' checks catch an overlapping write on any
    MPI path, not only where header, payload and footer become visible in issue order
    (docs/PROTOCOL.md sections 3 and 5).  Never train with it."""

    name = "notify_ack_ignore_acks"
    setting = None      # no bound holds for a broken protocol
    # it waits on notify words and acks itself, and its writers never wait for a
    # reader: what it shows is what a put that ignores acks overwrites
    reads = Reads.WORDS
    writer_runs_ahead = True

    @property
    def trace(self):
        return {}

    def send(self, win, buf, version: int, ctx: StepContext) -> None:
        win.put(buf, version, version, seqlock=True, checksum=ctx.checksum)

    def receive(self, win, buf, version: int, ctx: StepContext) -> None:
        win.wait_notifies(version, ctx.timeout, at_least=True)
        win.reduce(buf, ctx.w_self, ctx.weights, version, version, version, seqlock=True,
                   checksum=ctx.checksum, renormalize=True)
        win.ack(version)
