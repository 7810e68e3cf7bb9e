"""Byte layout of a slot window, shared by the window's owner and every sender.

A rank's window (one per exchanged buffer)::

    line 0         window header: magic, layout version, n_in, n_out, depth, nbytes
    notify words   n_in * depth int64: notify[i][s] = last version in-neighbour i
                   fully wrote into its slot s (written remotely, MPI_REPLACE)
    ack words      n_out int64: ack[j] = last version out-neighbour j consumed
                   (written remotely by j, MPI_REPLACE)
    user words     n_user int64 for policies (published iteration, tokens, ...)
    slots          n_in * depth slots of stride `slot_stride`:
                     header  64 B: version, iteration, sender, nbytes (int64)
                     payload nbytes rounded up to 64 B
                     footer  64 B: version, checksum (0 = none)
                   or, with the shared-memory transport (outbox=True), none: the
                   window holds control words only, and `depth` slots of this rank's
                   OWN updates live in a shared-memory segment of `segment_bytes`
                   (asapmpi._core.segments) that its out-neighbours map and reduce
                   from directly: no put, at most one copy per update

Every region starts on a 64-byte boundary.  Version 0 means "never written".
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any, List, Sequence, Tuple

CACHE_LINE = 64
HEADER_BYTES = 64
FOOTER_BYTES = 64
MAGIC = 0x4153415030303031  # "ASAP0001"
LAYOUT_VERSION = 1


def align(n: int, to: int = CACHE_LINE) -> int:
    """Round n up to a multiple of `to`."""
    return (n + to - 1) // to * to


@dataclass(frozen=True)
class Layout:
    """Offsets (bytes from the window base) of every region of one rank's window.
    The derived offsets are computed once (cached_property): policies read them every
    step."""

    n_in: int
    n_out: int
    depth: int
    nbytes: int
    n_user: int = 0
    #: slots a rank publishes for others to pull with MPI_Rget (gossip: 2, taking turns)
    n_publish: int = 0
    #: the slots hold this rank's own updates for its out-neighbours to read in place
    outbox: bool = False

    @cached_property
    def n_slots(self) -> int:
        """Slots inside the window (none with outbox: they are in the segment)."""
        return 0 if self.outbox else self.n_in * self.depth

    @property
    def segment_bytes(self) -> int:
        """Bytes of the shared-memory segment holding this rank's own slots (outbox),
        else 0."""
        return self.depth * self.slot_stride if self.outbox else 0

    def segment_payload(self, slot: int) -> int:
        """Offset of own slot `slot`'s payload in the outbox segment."""
        return slot * self.slot_stride + HEADER_BYTES

    @cached_property
    def off_notify(self) -> int:
        return CACHE_LINE

    @cached_property
    def off_ack(self) -> int:
        return self.off_notify + align(8 * self.n_in * self.depth)

    @cached_property
    def off_user(self) -> int:
        return self.off_ack + align(8 * self.n_out)

    @cached_property
    def off_slots(self) -> int:
        return self.off_user + align(8 * self.n_user)

    @cached_property
    def payload_stride(self) -> int:
        return align(max(self.nbytes, 1))

    @cached_property
    def slot_stride(self) -> int:
        return HEADER_BYTES + self.payload_stride + FOOTER_BYTES

    @cached_property
    def off_publish(self) -> int:
        """Offset of the header of this rank's published slot (pull gossip)."""
        return self.off_slots + self.n_slots * self.slot_stride

    @cached_property
    def total(self) -> int:
        return self.off_publish + self.n_publish * self.slot_stride

    def notify_disp(self, in_index: int, slot: int = 0) -> int:
        """Offset of the notify word in-neighbour `in_index` writes for `slot`."""
        return self.off_notify + 8 * (in_index * self.depth + slot)

    def ack_disp(self, out_index: int) -> int:
        """Offset of the ack word out-neighbour `out_index` writes."""
        return self.off_ack + 8 * out_index

    def user_disp(self, word: int) -> int:
        """Offset of user word `word`."""
        return self.off_user + 8 * word

    def slot_disp(self, in_index: int, slot: int = 0) -> int:
        """Offset of the header of in-neighbour `in_index`'s slot `slot` (with outbox:
        of this rank's own slot `slot` in its segment; in_index is ignored)."""
        if self.outbox:
            return slot * self.slot_stride
        return self.off_slots + (in_index * self.depth + slot) * self.slot_stride


def window_offsets(g: Any, layouts: Sequence[Layout],
                   rank: int) -> Tuple[List[int], List[int], List[int]]:
    """Where `rank` writes in its neighbours' windows, given every rank's layout and the
    graph `g` (asapmpi.Graph): its slot and notify word in each out-neighbour's, its ack
    word in each in-neighbour's."""
    out_slot = [layouts[j].slot_disp(g.in_neighbours(j).index(rank))
                for j in g.out_neighbours(rank)]
    out_notify = [layouts[j].notify_disp(g.in_neighbours(j).index(rank))
                  for j in g.out_neighbours(rank)]
    in_ack = [layouts[i].ack_disp(g.out_neighbours(i).index(rank))
              for i in g.in_neighbours(rank)]
    return out_slot, out_notify, in_ack
