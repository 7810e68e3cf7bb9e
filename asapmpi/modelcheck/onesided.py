"""The base of the models over one-sided memory (put and shared NOTIFY-ACK, Hop): the
ranks' steps, the settles of their waits, and when lazy words and put parts land.

Two ways to let MPI complete words and parts on its own (docs/MODELCHECK.md):

spontaneous  every word in flight and every part of a put in flight may land at any
             moment, as a transition of its own (unforced: MPI need not do it before
             a flush).  Exact, and the state space grows with every combination of
             landed and not-yet-landed words.
demand       a word or part lands as part of the first action that reads it: each
             action that reads cells with something in flight is explored once for
             every choice of how much of it has landed by then.  A landing commutes
             with every action that neither reads nor writes its cell, so every run of
             the spontaneous model can be reordered into one of these with the same
             states at every action that could tell the difference; deadlocks are
             kept as long as landing more never disables an action that landing less
             enabled, which is checked on every such action (ModelError otherwise).
"""
from __future__ import annotations

from itertools import product
from typing import List, Optional, Sequence, Tuple

from ..reduce.graphs import Graph
from .model import Model
from .rma import FOOTER, HALF_A, HALF_B, HEADER, PART_NAMES, Puts, Slot, Words

LANDINGS = ("demand", "spontaneous")


class ModelError(RuntimeError):
    """A model was asked something its reduction cannot answer exactly."""


class OneSidedModel(Model):
    """Ranks that wait on lazy window words.  Subclasses define step(state, r) (the
    transitions of rank r's next statement, [] while it waits), reads(state, r) (the
    word cells and slots that statement reads) and waiting_for(state, r) (what an
    unsatisfied wait waits for, or None), and create self.words and self.puts."""

    words: Words
    puts: Optional[Puts] = None

    def __init__(self, graph: Graph, iterations: int, properties: Sequence[str],
                 symmetry: bool, landings: str, settle: bool):
        if landings not in LANDINGS:
            raise ValueError(f"landings {landings!r} not in {LANDINGS}")
        super().__init__(graph, iterations, properties, symmetry)
        self.landings = landings
        #: whether a wait settles its words in flight (Waits.settle_pending); False is the
        #: defect of a wait that never flushes them
        self.settles = settle

    # ------------------------------------------------------------------ to define

    def step(self, state: tuple, r: int) -> List[tuple]:
        """The transitions of rank r's next statement ([] while it waits)."""
        raise NotImplementedError

    def reads(self, state: tuple, r: int) -> Tuple[Sequence[int], Sequence[Slot]]:
        """The lazy word cells and the put slots rank r's next statement reads."""
        return (), ()

    def waiting_for(self, state: tuple, r: int) -> Optional[str]:
        """What rank r waits for, if its next statement is a wait."""
        return None

    # ------------------------------------------------------------------ transitions

    def successors(self, state: tuple) -> List[tuple]:
        out: List[tuple] = []
        late: List[tuple] = []
        for r in range(self.n):
            if self.landings == "demand":
                got = self._on_demand(state, r)
            else:
                got = self.step(state, r) or self._settle(state, r)
            (late if r == self.straggler else out).extend(got)
        if self.landings == "spontaneous":
            out.extend(self._spontaneous(state))
        # the straggler moves only when no other rank can (see Model.straggler)
        if not any(forced for _, _, forced in out):
            out.extend(late)
        return out

    def _settle(self, state: tuple, r: int) -> List[tuple]:
        # Waits.settle_pending: a wait that has lasted poll_yields polls flushes r's words
        what = self.waiting_for(state, r)
        if what is None or not self.settles or not self.words.pending(state, r):
            return []
        s = list(state)
        self.words.settle(s, r)
        return [(f"rank {r}: waiting for {what}, MPI_Win_flush_all of its words in flight",
                 tuple(s), True)]

    def _spontaneous(self, state: tuple) -> List[tuple]:
        out = []
        for r in range(self.n):
            for lazy, word, value, label in self.words.landings(state, r):
                s = list(state)
                self.words.land(s, lazy, word)
                out.append((f"MPI completes {label} = {value}", tuple(s), False))
            if self.puts is not None:
                for slot, cell, bit, v, label in self.puts.landings(state, r):
                    s = list(state)
                    s[cell] = v
                    s[slot.mask] &= ~bit
                    out.append((f"MPI lands the {label} of rank {r}'s put of version {v}",
                                tuple(s), False))
        return out

    def _on_demand(self, state: tuple, r: int) -> List[tuple]:
        words, slots = self.reads(state, r)
        options = []        # per cell in flight: the ways it may have landed
        for word in words:
            lazy, label = self.words.lazy_of[word]
            queue = state[lazy]
            if queue:
                options.append([(word, lazy, m, f"MPI completes {label} = {queue[m - 1]}")
                                for m in range(len(queue) + 1)])
        if self.puts is not None and self.puts.parts:
            for slot in slots:
                mask = state[slot.mask]
                if mask:
                    options.append([(slot, None, sub, _parts_label(
                        sub, state[slot.put], self.puts.label_of[slot]))
                                    for sub in range(16) if sub & mask == sub])
        now = self.step(state, r)
        if not options:
            return now or self._settle(state, r)
        out = list(now) if now else self._settle(state, r)
        enabled = bool(now)
        for choice in product(*options):
            if all(m == 0 for _, _, m, _ in choice):
                continue        # nothing landed: `now`
            s = list(state)
            labels = []
            for cell, lazy, m, label in choice:
                if not m:
                    continue
                labels.append(label)
                if lazy is None:        # parts `m` of the put into slot `cell`
                    for bit, part in ((HEADER, cell.header), (HALF_A, cell.half_a),
                                      (HALF_B, cell.half_b), (FOOTER, cell.footer)):
                        if m & bit:
                            s[part] = s[cell.put]
                    s[cell.mask] &= ~m
                else:
                    s[cell] = state[lazy][m - 1]
                    s[lazy] = state[lazy][m:]
            got = self.step(tuple(s), r)
            full = all(m == len(opts) - 1 if lazy is not None else
                       m == state[cell.mask] for (cell, lazy, m, _), opts in
                       zip(choice, options))
            if full and enabled and not got:
                raise ModelError(f"{self.name}: landing more words disables rank {r}'s "
                                 f"next statement; explore with landings='spontaneous'")
            enabled = enabled or bool(got)
            prefix = "; ".join(labels) + "; "
            out.extend((prefix + label, nxt, False) for label, nxt, _ in got)
        return out


def _parts_label(parts: int, version: int, where: str) -> str:
    names = [PART_NAMES[bit] for bit in (HEADER, HALF_A, HALF_B, FOOTER) if parts & bit]
    return f"MPI lands the {', '.join(names)} of version {version} in {where}"
