"""NOTIFY-ACK on the shared-memory transport (transports/shared.py, _core/shared.pxi;
docs/PROTOCOL.md section 2b): every rank writes its update into its OWN slot, which its
out-neighbours read in place; notify and ack stay lazy window words.  The put has no
MPI_Win_flush_all, so words in flight land only when MPI completes them on its own, in
a wait's settle, or at free().

Single buffering, step k of rank r:

  SEND    wait_acks(k-1) (== k-1), then store header.version = k, fence
  COPY    copy the buffer into the slot (the two payload halves in either order), fence
  FOOTER  store footer k, _sync() (MPI_Win_sync, full fence), notify k to every
          out-neighbour (lazy)
  RECV    wait_notifies(k)
  READ    verified reduce reading every in-neighbour's slot in place; ack k (lazy)

Double buffering (Exchange(double_buffer=True)): the buffer is slot k % 2.  Step k:

  PUT_H   store header k of slot k % 2 (its payload was computed there), fence
  PUT_F   store footer k, _sync(), notify k (lazy)
  RECV_N  wait_notifies(k)
  RECV_A  wait_acks(k-1, at_least): out-neighbours are done with slot (k+1) % 2
  INVAL   begin_rewrite(k+1): header of slot (k+1) % 2 := -(k+1), fence: nobody may
          take it for whole any more (invalidate=False: no mark, as before 7cfbf52)
  BEGIN   the reduce loads its inputs (the in-neighbours' slots k % 2) and starts
          writing slot (k+1) % 2 (the two halves, in either order)
  END     the reduce checks its inputs again; ack k (lazy); then the caller computes on
          slot (k+1) % 2 until PUT_H of step k+1
A slot is "being written" from its invalidation (or header store) to its footer store.
Variant "no-ack-wait" skips RECV_A (a deliberately broken double buffering).
"""
from __future__ import annotations

from typing import List, Optional

from ..reduce.graphs import Graph
from . import verify
from .model import Violation
from .onesided import OneSidedModel
from .rma import Slot, Words

# single buffering
SEND, COPY, FOOTER, RECV, READ, DONE, EXIT = range(7)
# double buffering
PUT_H, PUT_F, RECV_N, RECV_A, INVAL, BEGIN, WRITE, END = range(7, 15)
PHASES = {SEND: "waits for the acks of", COPY: "copies", FOOTER: "stores the footer of",
          RECV: "waits for the notifies of", READ: "reduces", DONE: "is done after",
          EXIT: "has left after", PUT_H: "stores the header of",
          PUT_F: "stores the footer of", RECV_N: "waits for the notifies of",
          RECV_A: "waits for the acks (>= k-1) in step", INVAL: "invalidates in step",
          BEGIN: "begins the reduce of", WRITE: "writes the reduce of",
          END: "ends the reduce of"}
VARIANTS = ("correct", "no-settle", "no-ack-wait")


class NotifyAckShared(OneSidedModel):
    """NOTIFY-ACK with outbox slots in shared memory, single or double buffered."""

    final_pc = EXIT

    def __init__(self, graph: Graph, iterations: int, double_buffer: bool = False,
                 variant: str = "correct", parts: bool = True, invalidate: bool = True,
                 properties=("overlap", "version", "error", "gap", "deadlock"),
                 symmetry: bool = True, landings: str = "demand"):
        if variant not in VARIANTS or (variant == "no-ack-wait" and not double_buffer):
            raise ValueError(f"variant {variant!r}: not one of {VARIANTS} for this model")
        super().__init__(graph, iterations, properties, symmetry, landings,
                         settle=variant != "no-settle")
        self.name = "notify-ack-shared-db" if double_buffer else "notify-ack-shared"
        self.db, self.variant, self.parts, self.invalidate = (double_buffer, variant, parts,
                                                               invalidate)
        c = self.cells
        self.pc = [c.add("pc", (r,), default=PUT_H if double_buffer else SEND)
                   for r in range(self.n)]
        self.k = [c.add("k", (r,), default=1) for r in range(self.n)]
        # the halves of the payload still to write (parts mode), per rank
        self.todo = [c.add("todo", (r,)) for r in range(self.n)]
        self.depth = depth = 2 if double_buffer else 1
        # the own slots; `put` is the version being written into it (0: none)
        self.slots = [[Slot(c.add("header", (r,), (d,)), c.add("half a", (r,), (d,)),
                            c.add("half b", (r,), (d,)), c.add("footer", (r,), (d,)),
                            c.add("writing", (r,), (d,)), -1) for d in range(depth)]
                      for r in range(self.n)]
        if double_buffer:
            # the caller's buffer before step 1 is slot 1's payload: version 1
            for r in range(self.n):
                c.defaults[self.slots[r][1].half_a] = c.defaults[self.slots[r][1].half_b] = 1
        self.words = Words(c, self.n)
        self.notify, self.ack, self.use = {}, {}, {}
        for s, r in self.edges:
            # one notify word per slot (Layout depth 2 when double buffered)
            for d in range(depth):
                self.notify[s, r, d] = self.words.add("notify", s, r, (d,),
                                                      f"notify {d} at rank {r}")
            self.ack[s, r] = self.words.add("ack", r, s, label=f"ack at rank {s}")
            self.use[s, r] = c.add("use", (s, r), default=())

    # ------------------------------------------------------------------ properties

    def violation(self, state) -> Optional[Violation]:
        if "overlap" in self.properties:
            for (s, r), use in self.use.items():
                if not state[use]:
                    continue
                slot = self.slots[s][state[use][0] % len(self.slots[s])]
                if state[slot.put]:
                    return ("overlap", f"rank {r} reads rank {s}'s slot as version "
                                       f"{state[use][0]} while rank {s} writes version "
                                       f"{state[slot.put]} into it")
        return super().violation(state) or self.gap_violation(state, self.k, 1,
                                                                both_ways=True)

    def waiting(self, state, r: int) -> str:
        pc, k = state[self.pc[r]], state[self.k[r]]
        what = f"rank {r} {PHASES[pc]} version {k}"
        if pc in (SEND, RECV_A):
            what += " (acks seen: " + ", ".join(
                f"rank {j} = {state[self.ack[r, j][0]]}" for j in self.outs[r]) + ")"
        elif pc in (RECV, RECV_N):
            what += " (notifies seen: " + ", ".join(
                f"rank {i} = {state[self.notify[i, r, k % self.depth][0]]}"
                for i in self.ins[r]) + ")"
        if self.words.pending(state, r):
            what += ", its own words still in flight"
        return what

    # ------------------------------------------------------------------ transitions

    def reads(self, state, r: int):
        pc, k = state[self.pc[r]], state[self.k[r]]
        if pc in (SEND, RECV_A):
            return [self.ack[r, j][0] for j in self.outs[r]], ()
        if pc in (RECV, RECV_N):
            return [self.notify[i, r, k % self.depth][0] for i in self.ins[r]], ()
        return (), ()

    def waiting_for(self, state, r: int) -> Optional[str]:
        pc, k = state[self.pc[r]], state[self.k[r]]
        if pc == SEND:
            return f"the acks of version {k - 1}"
        if pc == RECV_A:
            return f"the acks >= {k - 1}"
        if pc in (RECV, RECV_N):
            return f"the notifies of version {k}"
        return None

    def step(self, state, r: int) -> List[tuple]:
        pc = state[self.pc[r]]
        if pc == DONE:
            s = list(state)
            self.words.settle(s, r)
            s[self.pc[r]] = EXIT
            return [(f"rank {r}: free() settles its words and leaves", tuple(s), True)]
        if pc == EXIT:
            return []
        if self.db:
            return self._double(state, r, pc, state[self.k[r]])
        return self._single(state, r, pc, state[self.k[r]])

    def _step(self, s: list, r: int, pc: int, label: str) -> tuple:
        s[self.pc[r]] = pc
        return (f"rank {r}: {label}", tuple(s), True)

    def _single(self, state, r: int, pc: int, k: int) -> List[tuple]:
        slot = self.slots[r][0]
        s = list(state)
        if pc == SEND:
            if k > 1 and not all(state[self.ack[r, j][0]] == k - 1 for j in self.outs[r]):
                return []
            s[slot.put] = k
            if self.parts:
                s[slot.header] = k
                s[self.todo[r]] = 3
                return [self._step(s, r, COPY, f"store header {k} of its slot, fence")]
            return [self._step(s, r, COPY, f"starts writing version {k} into its slot")]
        if pc == COPY:
            return self._copy(state, r, slot, k, FOOTER)
        if pc == FOOTER:
            s[slot.footer] = k
            s[slot.put] = 0
            for j in self.outs[r]:
                self.words.issue(s, self.notify[r, j, k % self.depth][1], k)
            return [self._step(s, r, RECV, f"store footer {k}, MPI_Win_sync, notify {k} "
                                           f"to ranks {_names(self.outs[r])} (lazy)")]
        if pc == RECV:
            if not self._notified(state, r, k):
                return []
            self._begin(state, s, r, k)
            return [self._step(s, r, READ, f"reduce version {k} begins, reading the slots of "
                                           f"ranks {_names(self.ins[r])} in place")]
        # READ
        return [self._end(state, s, r, k)]

    def _double(self, state, r: int, pc: int, k: int) -> List[tuple]:
        mine, target = self.slots[r][k % 2], self.slots[r][(k + 1) % 2]
        s = list(state)
        if pc == PUT_H:
            s[mine.header] = k
            s[mine.put] = k
            return [self._step(s, r, PUT_F, f"store header {k} of its slot {k % 2}, fence")]
        if pc == PUT_F:
            s[mine.footer] = k
            s[mine.put] = 0
            for j in self.outs[r]:
                self.words.issue(s, self.notify[r, j, k % self.depth][1], k)
            return [self._step(s, r, RECV_N, f"store footer {k} of slot {k % 2}, "
                                             f"MPI_Win_sync, notify {k} to ranks "
                                             f"{_names(self.outs[r])} (lazy)")]
        if pc == RECV_N:
            if not self._notified(state, r, k):
                return []
            return [self._step(s, r, RECV_A, f"has the notifies of version {k}")]
        if pc == RECV_A:
            if self.variant == "no-ack-wait":
                return [self._step(s, r, INVAL, "skips the wait for the acks")]
            if k > 1 and not all(state[self.ack[r, j][0]] >= k - 1 for j in self.outs[r]):
                return []
            return [self._step(s, r, INVAL, f"has the acks >= {k - 1}")]
        if pc == INVAL:
            s[target.put] = k + 1
            if self.invalidate:
                s[target.header] = -(k + 1)
                return [self._step(s, r, BEGIN, f"invalidate slot {(k + 1) % 2} (header "
                                                f"{-(k + 1)}), fence")]
            return [self._step(s, r, BEGIN, f"starts reducing into slot {(k + 1) % 2}")]
        if pc == BEGIN:
            self._begin(state, s, r, k)
            s[self.todo[r]] = 3
            return [self._step(s, r, WRITE, f"reduce version {k} into slot {(k + 1) % 2} "
                                            f"begins, reading slot {k % 2} of ranks "
                                            f"{_names(self.ins[r])} in place")]
        if pc == WRITE:
            return self._copy(state, r, target, k + 1, END)
        # END: the caller then computes on the slot (still being written) until PUT_H
        return [self._end(state, s, r, k)]

    def _copy(self, state, r: int, slot: Slot, v: int, then: int) -> List[tuple]:
        """The payload written (parts: each half on its own, either first)."""
        if not self.parts:
            s = list(state)
            s[slot.half_a] = s[slot.half_b] = v
            if not self.db:
                s[slot.header] = v
            return [self._step(s, r, then, f"writes the payload of version {v}")]
        out = []
        todo = state[self.todo[r]]
        for bit, cell, half in ((1, slot.half_a, "a"), (2, slot.half_b, "b")):
            if todo & bit:
                s = list(state)
                s[cell] = v
                s[self.todo[r]] = todo & ~bit
                out.append(self._step(s, r, then if todo == bit else state[self.pc[r]],
                                      f"writes payload half {half} of version {v}"))
        return out

    def _notified(self, state, r: int, k: int) -> bool:
        return all(state[self.notify[i, r, k % self.depth][0]] == k for i in self.ins[r])

    def _begin(self, state, s: list, r: int, k: int) -> None:
        refused = []
        for i in self.ins[r]:
            slot = self.slots[i][k % len(self.slots[i])]
            ok, why = verify.begin(state, s, slot, self.use[i, r], k)
            if not ok:
                refused.append(f"rank {i}: {why}")
        if refused:
            self.flag(s, self.BAD, "error", f"rank {r}: ProtocolError, version {k} not "
                                            f"usable from " + "; ".join(refused))

    def _end(self, state, s: list, r: int, k: int) -> tuple:
        for i in self.ins[r]:
            if state[self.use[i, r]]:
                slot = self.slots[i][k % len(self.slots[i])]
                found = verify.end(state, s, slot, self.use[i, r], f"rank {i}", r)
                if found:
                    self.flag(s, self.BAD, "error" if found[0] else "version", found[1])
        for i in self.ins[r]:
            self.words.issue(s, self.ack[i, r][1], k)
        if k == self.iterations:
            s[self.pc[r]] = DONE
        else:
            s[self.pc[r]] = PUT_H if self.db else SEND
            s[self.k[r]] = k + 1
        return (f"rank {r}: reduce version {k} ends, ack {k} to ranks "
                f"{_names(self.ins[r])} (lazy)", tuple(s), True)


def _names(ranks) -> str:
    return ", ".join(str(r) for r in ranks) or "none"
