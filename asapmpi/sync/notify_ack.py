"""NOTIFY-ACK (ASAP section 4): send only into a slot the receiver has released.

Step k on every rank:
  1. wait until every out-neighbour acknowledged version k-1 (its slot is free);
  2. put version k into every out-neighbour's slot, complete it, then notify;
  3. wait for the notify of version k from every in-neighbour;
  4. reduce all in-neighbours' version k (verified) into the buffer;
  5. acknowledge version k to every in-neighbour (issued lazily: completed by the next
     put, by a wait that lasts poll_yields polls, or by a collective or free()).
No wait deadlocks, on any graph, although step 1 waits before step 2 sends: every wait
of step k needs only what every rank issues in step k-1 (the acks of k-1) or what it
issues in step k after waiting only on those (the notifies of k), so by induction on k
every rank completes step k (docs/PROTOCOL.md section 5).

Double buffering (the shared transport with Exchange(double_buffer=True)): version k
is computed in own slot k % 2 and the reduce writes slot (k+1) % 2, so the step's
order becomes: notify k (nothing to copy, nothing to wait for: slot k % 2 was last read
as version k-2, acknowledged before the reduce of step k-1 wrote it), wait for the
notifies of k, wait for acks >= k-1 (the out-neighbours are done reading slot
(k+1) % 2; having notified k, this rank may see an ack of k already), mark slot
(k+1) % 2 as being rewritten (header -(k+1): a late reader finds it torn), reduce into
it, acknowledge k.  Here the send precedes every wait of the step.

The message transport (Exchange(transport="messages"); "auto" measures it against the
window words and takes it where it is faster, as on network paths without RDMA):
send is one synchronous message (MPI_Issend) of version k per out-neighbour; receive
waits until the messages of k arrived in the slots and its own sends completed (each
matched by its reader's receive of k, so no writer runs more than one version ahead),
reduces, and posts the receives of k+1, which is the ack: a sender's message can only
land in a receive its reader posted after it reduced k.  Every rank posts its receives
of k before it sends k, so no send waits on a receive that needs that send.
"""
from __future__ import annotations

import time

import numpy as np

from .base import Await, Policy, Reads, StepContext
from .records import entry_trace


class NotifyAck(Policy):
    """ASAP's NOTIFY-ACK: every reduce uses every in-neighbour's current version."""

    name = "notify_ack"
    lockstep = True
    depth = 1
    reduces_last = True
    # exactly version k from every in-neighbour; a slot is rewritten only after every
    # out-neighbour acknowledged it (so it may also be read in place)
    reads = Reads.EXACT
    # it steps through the channel verbs: deliver(k), await_(k, EXACT), release(k)
    awaits = frozenset({Await.EXACT})
    delivers = True
    # what asapmpi.trace needs to pick the bound of Hop's Table 1 for NOTIFY-ACK
    setting = "notify_ack"
    max_gap = 1
    backup = 0
    staleness = None

    def start(self) -> None:
        """Iteration 1 is entered when the exchange is created."""
        self.entries = self.table("entries")                # lo, hi per iteration
        self.reduced = self.table("reduced", np.int64)      # k, version per in-neighbour
        self.entries.append((float("-inf"), time.monotonic()))

    @property
    def trace(self):
        """Entry times of the iterations kept (asapmpi.trace) and the versions reduced."""
        return entry_trace(self.entries, self.reduced)

    #: inside step(): the buffer is written only by the reduce, after the wait that
    #: completes the deliveries, so a channel may send from it without a copy
    _whole_step = False

    def step(self, win, buf, version: int, ctx: StepContext) -> None:
        """send() then receive(), the send without a copy of the buffer where the
        channel can (nothing writes the buffer before the reduce)."""
        self._whole_step = True
        try:
            self.send(win, buf, version, ctx)
        finally:
            self._whole_step = False
        return self.receive(win, buf, version, ctx)

    def send(self, win, buf, version: int, ctx: StepContext) -> None:
        """Steps 1-2: once the slots are free (the releases of version-1), deliver
        `version`, on whichever channel the exchange resolved (asapmpi.transports)."""
        self._started = time.monotonic()
        win.deliver(buf, version, ctx.timeout, ctx.checksum, not self._whole_step)

    def receive(self, win, buf, version: int, ctx: StepContext) -> None:
        """Steps 3-5: wait for `version` from every in-neighbour, reduce, acknowledge."""
        win.await_(version, ctx.timeout)
        out, own = buf, None
        if ctx.buffers:
            out, own = ctx.buffers[(version + 1) % 2], buf
        # every in-neighbour's version k, or ProtocolError before the buffer is touched
        win.reduce(out, ctx.w_self, ctx.weights, version, version, version,
                   checksum=ctx.checksum, require_all=True, own=own)
        win.release(version, ctx.checksum)
        # iteration k+1 cannot have begun before step k started, and has begun by now
        row = self.entries.next_row(2)
        row[0], row[1] = self._started, time.monotonic()
        self.reduced.next_row(win.n_in + 1)[:] = version

