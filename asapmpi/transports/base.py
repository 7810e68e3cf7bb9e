"""The interface every transport implements (see asapmpi.transports)."""
from __future__ import annotations

from typing import Any


class Transport:
    """Moves whole versions of a buffer into the out-neighbours' slots of a SlotWindow.

    A NOTIFY-ACK step is send(k), wait(k), the window's verified reduce of version k,
    release(k).  Waits time out (NeighbourTimeoutError naming the late neighbours) and
    drive MPI progress while they back off.
    """

    #: the name Exchange(transport=...) takes
    name = "transport"

    def __init__(self, window: Any):
        self.window = window

    def start(self, checksum: bool) -> None:
        """Before version 1: make every slot ready to receive it."""

    def send(self, buf: Any, version: int, timeout: float, checksum: bool,
             copy: bool = True) -> None:
        """Deliver `buf` as `version` to every out-neighbour's slot, once the slot is
        free (its reader released version - 1).  copy=False: the caller writes `buf`
        only after wait() (a whole step), so a transport whose delivery completes
        there may send from `buf` itself instead of a copy."""
        raise NotImplementedError

    def wait(self, version: int, timeout: float) -> None:
        """Return once every in-neighbour's slot holds `version` whole."""
        raise NotImplementedError

    def release(self, version: int, checksum: bool) -> None:
        """This rank has reduced `version`: its writers may reuse the slots."""
        raise NotImplementedError

    def free(self) -> None:
        """Collective: complete what is in flight and free the window."""
        self.window.free()
