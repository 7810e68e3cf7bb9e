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
counters, BSP's slots after its barrier) run on messages through a mailbox window
instead (asapmpi._core.MailboxWindow, asapmpi/_core/mailbox.pxi): the window's own put,
waits and ack move the messages.  Policies that read each sender's newest version
(async, backup_ps, elastic) run on a mailbox of newest versions (NewestWindow,
newest.pxi), whose writers never wait for a reader.

Each transport is one window class of asapmpi._core (a SlotWindow subclass in its own
.pxi file: put, shared, messages, mailbox, newest) with one hook per job (send an
update, where a slot is, progress, drain at free), and NOTIFY-ACK's step over it is one
Transport class here.  `window_class` says which window a transport and a policy take.
`asapmpi.transport_probe` times the window words against messages and
`Exchange(transport="auto")` takes the faster.  A new transport (GPU memory, say) is one
more window class and one more module with a Transport subclass, registered in
TRANSPORT_CLASSES.
"""
from __future__ import annotations

from .base import Transport
from .messages import MessageTransport
from .put import PutTransport
from .shared import SharedTransport

TRANSPORT_CLASSES = {cls.name: cls for cls in (PutTransport, SharedTransport,
                                               MessageTransport)}
#: what Exchange(transport=...) takes
TRANSPORTS = ("auto", *TRANSPORT_CLASSES)


def window_class(name: str, policy) -> type:
    """The asapmpi._core window class of transport `name` ("put", "shared",
    "messages") for `policy`: on messages, NOTIFY-ACK's versions (MessageWindow), a
    mailbox of window words (MailboxWindow) or of newest versions (NewestWindow)."""
    from .. import _core
    if name == "shared":
        return _core.SharedWindow
    if name != "messages":
        return _core.PutWindow
    if policy.newest:
        return _core.NewestWindow
    return _core.MailboxWindow if policy.mailbox else _core.MessageWindow


def make_transport(name: str, window, double_buffered: bool = False) -> Transport:
    """The transport `name` ("put", "shared", "messages") over `window`."""
    if name == "shared":
        return SharedTransport(window, double_buffered)
    return TRANSPORT_CLASSES[name](window)


__all__ = ["TRANSPORTS", "TRANSPORT_CLASSES", "MessageTransport", "PutTransport",
           "SharedTransport", "Transport", "make_transport", "window_class"]
