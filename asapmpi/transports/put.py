"""The put transport: MPI_Put into each out-neighbour's slot (any MPI path)."""
from __future__ import annotations

from .base import Transport


class PutTransport(Transport):
    """Header, payload and footer by MPI_Put, one flush, then the notify word; the
    reader's ack is a word in this rank's window (docs/PROTOCOL.md section 2)."""

    name = "put"

    def send(self, buf, version: int, timeout: float, checksum: bool,
             copy: bool = True) -> None:
        """Wait for the acks of version - 1, then put and notify `version`."""
        self.window.wait_acks(version - 1, timeout)
        self.window.put(buf, version, version, checksum=checksum)

    def wait(self, version: int, timeout: float) -> None:
        """Wait for the notifies of `version` from every in-neighbour."""
        self.window.wait_notifies(version, timeout)

    def release(self, version: int, checksum: bool) -> None:
        """Ack `version` to every in-neighbour."""
        self.window.ack(version)
