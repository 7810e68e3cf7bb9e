"""How the policies' updates reach the slots: one channel per window class, one verb set.

Every transport moves version k of this rank's buffer into its out-neighbours' slots
for that sender, and tells a reader when all of its slots hold version k; the slot
layout and the verified reduce (asapmpi._core.SlotWindow) are the same for all of
them, so a policy reduces and checks alike whichever moved the bytes.

=========  ======================================  ==================================
transport  an update                               its ack (the slot is free again)
=========  ======================================  ==================================
put        MPI_Put into each out-neighbour's       a window word the reader writes
           slot, flush, notify word                 into the writer's window
shared     one copy into this rank's own slot in   as put
           shared memory, read in place
messages   one two-sided message per               the reader's next receive, posted
           out-neighbour, received into the slot
=========  ======================================  ==================================

Every window class of asapmpi._core (put, shared, messages, mailbox, newest, push: a
SlotWindow subclass in its own .pxi file) implements the same channel verbs, each one
call into the core: deliver(k) (the update to every out-neighbour's slot: a put, one
copy into the own shared slot, a message, a mailbox's staged message), await_(k, mode)
(asapmpi.sync.Await: exact, at least, a count of, or the newest versions from the
in-neighbours), release(k) (this rank is done with k: an ack word, the next receive, a
repost), progress() (one poll of its progress) and drain() (complete the lazily issued
words and the tokens held back).  Its writer's discipline is fixed when the window is
made (Channel.window_options): waits_for_release (a policy that reads exact versions,
NOTIFY-ACK) makes deliver(k) wait for the releases of k - 1 and release(k) the ack its
writers wait for, else deliver writes in the seqlock order; notifies=False (a policy
on the verbs that never awaits: async, BSP) leaves out the notify.

Which channel a policy gets is decided in one place, asapmpi.transports.channels: every
window class advertises the needs it serves and what it can do (including the verbs
that mean something on it: Channel.delivers, Channel.awaits), a policy declares what it
needs (Policy.reads, Policy.writer_runs_ahead, Policy.retain, Policy.awaits,
Policy.delivers), and `channels.resolve(family, policy)` gives the channel.
NOTIFY-ACK and async step through the verbs alone, BSP but for its barrier, backup_ps
but for its workers' ordered put; the other policies still call window methods of their
own besides (tests/channels/test_channels.py lists them).  `asapmpi.exchange.probe`
times the channels the resolver gives the policy in each family, and
`Exchange(transport="auto")` takes the faster among the families that fit.  A new
channel (GPU memory, say) is one more window class with the verbs and one more row in
channels.CHANNELS.
"""
from __future__ import annotations

from .channels import CHANNELS, FAMILIES, Channel, families, resolve

#: what Exchange(transport=...) takes
TRANSPORTS = ("auto", *FAMILIES)

__all__ = ["CHANNELS", "FAMILIES", "TRANSPORTS", "Channel", "families", "resolve"]
