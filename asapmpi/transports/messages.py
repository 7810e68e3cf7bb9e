"""The message transport: each update one two-sided message per out-neighbour,
received straight into the reader's slot (docs/PROTOCOL.md section 2c)."""
from __future__ import annotations

from .base import Transport


class MessageTransport(Transport):
    """The receive posted for version k is the ack of k - 1, its completion the notify
    of k; the reader stamps the slot's header and footer on arrival, so the verified
    reduce checks it like any other."""

    name = "messages"

    def start(self, checksum: bool) -> None:
        """Post the receives of version 1: every slot is free."""
        self.window.post_receives(1, checksum=checksum)

    def send(self, buf, version: int, timeout: float, checksum: bool,
             copy: bool = True) -> None:
        """Send `version` to every out-neighbour (nonblocking: the sends complete in
        wait()); copy=False sends from `buf` itself (see Transport.send)."""
        self.window.send_update(buf, version, checksum=checksum, copy=copy)

    def wait(self, version: int, timeout: float) -> None:
        """Wait until the messages of `version` from every in-neighbour arrived."""
        self.window.wait_updates(version, timeout)

    def release(self, version: int, checksum: bool) -> None:
        """Post the receives of version + 1 into the slots."""
        self.window.post_receives(version + 1, checksum=checksum)
