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
instead (SlotWindow(mailbox=True), asapmpi/_core/mailbox.pxi): the window's own put,
waits and ack move the messages.  Policies that read each sender's newest version
(async, backup_ps, elastic) run on a mailbox of newest versions (newest=True), whose
writers never wait for a reader.

`asapmpi.transport_probe` times the window words against messages and
`Exchange(transport="auto")` takes the faster.  A new transport (GPU memory, say) is one
more module with a Transport subclass, registered in TRANSPORT_CLASSES.
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


def make_transport(name: str, window, double_buffered: bool = False) -> Transport:
    """The transport `name` ("put", "shared", "messages") over `window`."""
    if name == "shared":
        return SharedTransport(window, double_buffered)
    return TRANSPORT_CLASSES[name](window)


__all__ = ["TRANSPORTS", "TRANSPORT_CLASSES", "MessageTransport", "PutTransport",
           "SharedTransport", "Transport", "make_transport"]
