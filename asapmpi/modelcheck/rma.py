"""One-sided memory as the models see it: lazy window words and unordered puts.

Words (notify, ack, Hop's token counters) are written with MPI_Fetch_and_op(REPLACE)
and not flushed on their own (words.pxi, OneSidedWords._lazy): a word becomes visible at its
target at some point MPI chooses, at the latest when its origin flushes (its next
put's MPI_Win_flush_all, or Waits.settle_pending in a wait that has lasted poll_yields
polls, or free()).  Words from one origin to one word land in the order issued
(accumulate_ordering), words to different places in any order.  So every pending word
is a cell holding the values still in flight, landed one at a time, oldest first.

A put (header, payload, footer into a slot) is issued and then completed by the
origin's MPI_Win_flush_all; until then its parts land in any order, the payload's two
halves separately (MPI orders nothing between two puts nor inside one).  Parts mode
models each part landing; lumped mode leaves the slot's cells unchanged until the
flush, which writes them all.  The two give the same verdicts as long as "overlap" is
checked (docs/MODELCHECK.md): the contents of a slot with a put in flight only matter
to a read of it, and any such read is already an overlap.
"""
from __future__ import annotations

from typing import Dict, List, NamedTuple, Sequence, Tuple

from .model import Cells

#: parts of a put, as bits of a slot's "mask" cell (parts mode)
HEADER, HALF_A, HALF_B, FOOTER = 1, 2, 4, 8
ALL_PARTS = HEADER | HALF_A | HALF_B | FOOTER
PART_NAMES = {HEADER: "header", HALF_A: "payload half a", HALF_B: "payload half b",
              FOOTER: "footer"}


class Words:
    """Window words that complete lazily, per origin rank."""

    def __init__(self, cells: Cells, n: int):
        self.cells = cells
        #: per origin: (lazy cell, word cell, label) of every word it writes
        self.of: List[List[Tuple[int, int, str]]] = [[] for _ in range(n)]
        #: per word cell: (its lazy cell, label)
        self.lazy_of: Dict[int, Tuple[int, str]] = {}

    def add(self, name: str, origin: int, target: int, extra: Sequence[int] = (),
            label: str = "") -> Tuple[int, int]:
        """The word `name` that `origin` writes in `target`'s window: (word cell, lazy
        cell).  The word starts at 0, as the zeroed window."""
        word = self.cells.add(name, (origin, target), extra)
        lazy = self.cells.add("lazy " + name, (origin, target), extra, default=())
        label = f"rank {origin}'s {label or name + ' at rank ' + str(target)}"
        self.of[origin].append((lazy, word, label))
        self.lazy_of[word] = (lazy, label)
        return word, lazy

    @staticmethod
    def issue(s: list, lazy: int, value: int) -> None:
        """MPI_Fetch_and_op(value, REPLACE), not flushed: in flight until it lands."""
        s[lazy] = (*s[lazy], value)

    def pending(self, state, origin: int) -> bool:
        """Whether `origin` has words in flight."""
        return any(state[lazy] for lazy, _, _ in self.of[origin])

    def settle(self, s: list, origin: int) -> None:
        """MPI_Win_flush_all by `origin`: every word it issued lands, in order."""
        for lazy, word, _ in self.of[origin]:
            if s[lazy]:
                s[word] = s[lazy][-1]
                s[lazy] = ()

    def landings(self, state: tuple, origin: int):
        """The oldest word in flight of each place `origin` writes: (lazy, word, value,
        label) - MPI may complete it before any flush."""
        for lazy, word, label in self.of[origin]:
            if state[lazy]:
                yield lazy, word, state[lazy][0], label

    @staticmethod
    def land(s: list, lazy: int, word: int) -> None:
        """The oldest value in flight to `word` lands."""
        s[word] = s[lazy][0]
        s[lazy] = s[lazy][1:]


class Slot(NamedTuple):
    """The cells of one slot: header, the payload's two halves, footer (versions), the
    version of the write in flight into it (0: none; a put not yet completed by its
    writer's flush, or a shared-memory store sequence) and, in parts mode, the parts of
    that put not yet landed."""

    header: int
    half_a: int
    half_b: int
    footer: int
    put: int
    mask: int       # -1 in lumped mode


class Puts:
    """Slots written by MPI_Put and completed by the writer's MPI_Win_flush_all."""

    def __init__(self, cells: Cells, n: int, parts: bool):
        self.cells = cells
        self.parts = parts
        #: per writer: (slot, label) of every slot it puts into
        self.of: List[List[Tuple[Slot, str]]] = [[] for _ in range(n)]
        self.label_of: Dict[Slot, str] = {}

    def add(self, writer: int, reader: int, extra: Sequence[int] = ()) -> Slot:
        """The slot of `writer` at `reader` (extra: the slot index)."""
        ranks = (writer, reader)
        c = self.cells
        slot = Slot(c.add("header", ranks, extra), c.add("half a", ranks, extra),
                    c.add("half b", ranks, extra), c.add("footer", ranks, extra),
                    c.add("put", ranks, extra),
                    c.add("mask", ranks, extra) if self.parts else -1)
        where = f"slot {extra[0]} " if extra else "slot "
        self.of[writer].append((slot, f"{where}at rank {reader}"))
        self.label_of[slot] = f"rank {writer}'s {where}at rank {reader}"
        return slot

    def issue(self, s: list, slot: Slot, version: int, parts: int = ALL_PARTS) -> None:
        """MPI_Put of `parts` of `version` (by default header, payload and footer at
        once; a seqlock write issues them one flush apart): in flight until flushed."""
        if s[slot.put] not in (0, version):
            raise AssertionError("a second put into a slot before the first was flushed")
        s[slot.put] = version
        if self.parts:
            s[slot.mask] |= parts

    def flush(self, s: list, writer: int, parts: int = ALL_PARTS,
              done: bool = True) -> None:
        """MPI_Win_flush_all by `writer`: the `parts` it issued are complete at their
        targets; with `done` the write is over (the slot is no longer being written)."""
        for slot, _ in self.of[writer]:
            v = s[slot.put]
            if not v:
                continue
            for bit, cell in ((HEADER, slot.header), (HALF_A, slot.half_a),
                              (HALF_B, slot.half_b), (FOOTER, slot.footer)):
                if parts & bit:
                    s[cell] = v
            if self.parts:
                s[slot.mask] &= ~parts
            if done:
                s[slot.put] = 0

    def landings(self, state: tuple, writer: int):
        """Parts mode: each part of each put in flight that may land now: (slot, cell,
        bit, version, label)."""
        if not self.parts:
            return
        for slot, label in self.of[writer]:
            mask = state[slot.mask]
            if not mask:
                continue
            for bit, cell in ((HEADER, slot.header), (HALF_A, slot.half_a),
                              (HALF_B, slot.half_b), (FOOTER, slot.footer)):
                if mask & bit:
                    yield slot, cell, bit, state[slot.put], f"{PART_NAMES[bit]} of {label}"
