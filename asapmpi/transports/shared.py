"""The shared transport: one copy into this rank's own slot in shared memory, read in
place by the out-neighbours (every rank on one host; docs/PROTOCOL.md section 2b)."""
from __future__ import annotations

from .put import PutTransport


class SharedTransport(PutTransport):
    """The window's put() copies into the own slot and notifies (a SharedWindow,
    created with outboxes).  Double-buffered, the buffer is the slot itself: version k
    is computed in slot k % 2 while the neighbours may still read k - 1 from the other,
    so the send waits for no ack, and the ack of k - 1 is awaited after the notifies of
    k, before the reduce writes into slot (k + 1) % 2."""

    name = "shared"

    def __init__(self, window, double_buffered: bool = False):
        super().__init__(window)
        self.double_buffered = double_buffered

    def send(self, buf, version: int, timeout: float, checksum: bool,
             copy: bool = True) -> None:
        """Put and notify `version` (single-buffered: once version - 1 is acked)."""
        if self.double_buffered:
            self.window.put(buf, version, version, checksum=checksum)
        else:
            super().send(buf, version, timeout, checksum)

    def wait(self, version: int, timeout: float) -> None:
        """The notifies of `version`; double-buffered, then the acks of version - 1
        (a neighbour may have acknowledged k already, so at least k - 1, read
        atomically, not exactly), and the slot the reduce writes next, (k + 1) % 2, is
        marked as being rewritten: what it holds (version k - 1) stops verifying."""
        self.window.wait_notifies(version, timeout)
        if self.double_buffered:
            self.window.wait_acks(version - 1, timeout, at_least=True)
            self.window.begin_rewrite(version + 1)
