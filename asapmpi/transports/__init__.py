"""How NOTIFY-ACK's updates reach the slots: one class per transport, one interface.

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

Policies that wait on window words rather than steps (Hop's rotating slots and token
counters, BSP's slots after its barrier) drive the window themselves; on "messages"
their window is a mailbox (asapmpi._core.MailboxWindow, asapmpi/_core/mailbox.pxi)
whose own put, waits and ack move the messages.  Policies that read each sender's newest
version (async, backup_ps, elastic) get a mailbox of newest versions there
(NewestWindow, newest.pxi), whose writers never wait for a reader; gossip pushes there
(PushWindow, push.pxi: each rank sends its model to the peer its schedule chose).

Which of these a policy gets is decided in one place, asapmpi.transports.channels: every
window class of asapmpi._core (put, shared, messages, mailbox, newest, push: a SlotWindow
subclass in its own .pxi file, with one hook per job: send an update, where a slot is,
progress, drain at free) advertises the needs it serves and what it can do, a policy
declares what it needs (Policy.reads, Policy.writer_runs_ahead, Policy.retain), and
`channels.resolve(family, policy)` gives the channel.  NOTIFY-ACK's step over a channel
is one Transport class here.  `asapmpi.exchange.probe` times the window words against
messages and `Exchange(transport="auto")` takes the faster among the families that fit.
A new channel (GPU memory, say) is one more window class, one more row in
channels.CHANNELS and, for NOTIFY-ACK, one more module with a Transport subclass,
registered in TRANSPORT_CLASSES.
"""
from __future__ import annotations

from .base import Transport
from .channels import CHANNELS, FAMILIES, Channel, families, resolve
from .messages import MessageTransport
from .put import PutTransport
from .shared import SharedTransport

#: NOTIFY-ACK's step over each family's channel (Reads.EXACT)
TRANSPORT_CLASSES = {cls.name: cls for cls in (PutTransport, SharedTransport,
                                               MessageTransport)}
#: what Exchange(transport=...) takes
TRANSPORTS = ("auto", *FAMILIES)


def make_transport(name: str, window, double_buffered: bool = False) -> Transport:
    """The transport `name` ("put", "shared", "messages") over `window`."""
    if name == "shared":
        return SharedTransport(window, double_buffered)
    return TRANSPORT_CLASSES[name](window)


__all__ = ["CHANNELS", "FAMILIES", "TRANSPORTS", "TRANSPORT_CLASSES", "Channel",
           "MessageTransport", "PutTransport", "SharedTransport", "Transport", "families",
           "make_transport", "resolve"]
