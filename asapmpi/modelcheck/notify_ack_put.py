"""NOTIFY-ACK on the put transport (asapmpi/sync/notify_ack.py, transports/put.py,
_core/put.pxi; docs/PROTOCOL.md sections 2, 4 and 5).

Step k of rank r, as the code runs it:

  SEND   wait_acks(k-1): every out-neighbour's ack word == k-1 (k = 1: no wait);
         MPI_Put header, payload, footer of version k into its slot at every
         out-neighbour (parts land in any order)
  FLUSH  MPI_Win_flush_all (completes the puts and every word r issued before), then
         the notify word k at every out-neighbour, lazily
  RECV   wait_notifies(k): every in-neighbour's notify word == k
  READ   the verified reduce (require_all): every input header == footer == k, read,
         header checked again; then ack k to every in-neighbour, lazily
  DONE   after the last step: free() settles the words still in flight

While a wait is unsatisfied the rank may settle its words in flight (Waits.settle_pending
after poll_yields polls), unless the variant is "no-settle" (the defect of a wait that
never flushes them).  "ignore-acks" is NotifyAckIgnoringAcks: no ack wait, a seqlock
write (header, flush, payload, flush, footer, flush: SEQ_H, SEQ_P), notifies waited for
as >= k, a seqlock reduce that drops the inputs whose header moved.
"ignore-acks-ordered" is the same harness with the ordered write it had before
b4bb560 (one flush for the three parts).
"""
from __future__ import annotations

from typing import List, Optional

from ..reduce.graphs import Graph
from . import verify
from .model import Violation
from .onesided import OneSidedModel
from .rma import ALL_PARTS, FOOTER, HALF_A, HALF_B, HEADER, Puts, Words

SEND, FLUSH, RECV, READ, DONE, EXIT, SEQ_H, SEQ_P = range(8)
PHASES = ("waits for the acks of", "flushes the footers of", "waits for the notifies of",
          "reduces", "is done after", "has left after", "flushes the headers of",
          "flushes the payloads of")
VARIANTS = ("correct", "ignore-acks", "ignore-acks-ordered", "no-settle")


class NotifyAckPut(OneSidedModel):
    """NOTIFY-ACK with MPI_Put into the receivers' slots, lazy notify and ack words."""

    final_pc = EXIT

    name = "notify-ack-put"

    def __init__(self, graph: Graph, iterations: int, variant: str = "correct",
                 parts: bool = True,
                 properties=("overlap", "version", "error", "gap", "deadlock"),
                 symmetry: bool = True, landings: str = "demand"):
        if variant not in VARIANTS:
            raise ValueError(f"variant {variant!r} not in {VARIANTS}")
        super().__init__(graph, iterations, properties, symmetry, landings,
                         settle=variant != "no-settle")
        self.variant = variant
        self.ignores_acks = variant.startswith("ignore-acks")
        c = self.cells
        self.pc = [c.add("pc", (r,)) for r in range(self.n)]
        self.k = [c.add("k", (r,), default=1) for r in range(self.n)]
        self.words = Words(c, self.n)
        self.puts = Puts(c, self.n, parts)
        self.notify, self.ack, self.slot, self.use = {}, {}, {}, {}
        for s, r in self.edges:
            # the notify word s writes at r, the ack word r writes at s
            self.notify[s, r] = self.words.add("notify", s, r)
            self.ack[s, r] = self.words.add("ack", r, s)
            self.slot[s, r] = self.puts.add(s, r)
            self.use[s, r] = c.add("use", (s, r), default=())

    # ------------------------------------------------------------------ properties

    def violation(self, state) -> Optional[Violation]:
        if "overlap" in self.properties:
            for (s, r), use in self.use.items():
                if state[use] and state[self.slot[s, r].put]:
                    return ("overlap", f"rank {r} reads the slot of rank {s} (version "
                                       f"{state[use][0]}) while rank {s}'s put of version "
                                       f"{state[self.slot[s, r].put]} into it is in flight")
        return super().violation(state) or self.gap_violation(state, self.k, 1,
                                                                both_ways=True)

    def waiting(self, state, r: int) -> str:
        pc, k = state[self.pc[r]], state[self.k[r]]
        what = f"rank {r} {PHASES[pc]} version {k - 1 if pc == SEND else k}"
        if pc == SEND:
            what += " (acks seen: " + ", ".join(f"rank {j} = {state[self.ack[r, j][0]]}"
                                                for j in self.outs[r]) + ")"
        elif pc == RECV:
            what += " (notifies seen: " + ", ".join(
                f"rank {i} = {state[self.notify[i, r][0]]}" for i in self.ins[r]) + ")"
        if self.words.pending(state, r):
            what += ", its own words still in flight"
        return what

    # ------------------------------------------------------------------ transitions

    def reads(self, state, r: int):
        pc = state[self.pc[r]]
        if pc == SEND:
            return [self.ack[r, j][0] for j in self.outs[r]], ()
        if pc == RECV:
            return ([self.notify[i, r][0] for i in self.ins[r]],
                    [self.slot[i, r] for i in self.ins[r]])
        if pc == READ:
            return (), [self.slot[i, r] for i in self.ins[r]]
        return (), ()

    def waiting_for(self, state, r: int) -> Optional[str]:
        pc, k = state[self.pc[r]], state[self.k[r]]
        if pc == SEND:
            return f"the acks of version {k - 1}"
        if pc == RECV:
            return f"the notifies of version {k}"
        return None

    def step(self, state, r: int) -> List[tuple]:
        pc, k = state[self.pc[r]], state[self.k[r]]
        if pc == SEND:
            ready = self.ignores_acks or k == 1 or all(
                state[self.ack[r, j][0]] == k - 1 for j in self.outs[r])
            if not ready:
                return []
            s = list(state)
            seqlock = self.variant == "ignore-acks"
            for j in self.outs[r]:
                self.puts.issue(s, self.slot[r, j], k, HEADER if seqlock else ALL_PARTS)
            s[self.pc[r]] = SEQ_H if seqlock else FLUSH
            return [(f"rank {r}: MPI_Put " + ("the header of " if seqlock else "")
                     + f"version {k} into the slots at ranks {_names(self.outs[r])}",
                     tuple(s), True)]
        if pc in (SEQ_H, SEQ_P):
            # the seqlock write: each part complete before the next is issued (the
            # flush_all completes r's lazy words too)
            s = list(state)
            self.puts.flush(s, r, HEADER if pc == SEQ_H else HALF_A | HALF_B, done=False)
            self.words.settle(s, r)
            for j in self.outs[r]:
                self.puts.issue(s, self.slot[r, j], k,
                                HALF_A | HALF_B if pc == SEQ_H else FOOTER)
            s[self.pc[r]] = SEQ_P if pc == SEQ_H else FLUSH
            what = ("the header, MPI_Put the payload" if pc == SEQ_H
                    else "the payload, MPI_Put the footer")
            return [(f"rank {r}: MPI_Win_flush_all of {what} of version {k}", tuple(s),
                     True)]
        if pc == FLUSH:
            s = list(state)
            self.puts.flush(s, r)
            self.words.settle(s, r)
            for j in self.outs[r]:
                self.words.issue(s, self.notify[r, j][1], k)
            s[self.pc[r]] = RECV
            return [(f"rank {r}: MPI_Win_flush_all, notify version {k} to ranks "
                     f"{_names(self.outs[r])} (lazy)", tuple(s), True)]
        if pc == RECV:
            if self.ignores_acks:
                ready = all(state[self.notify[i, r][0]] >= k for i in self.ins[r])
            else:
                ready = all(state[self.notify[i, r][0]] == k for i in self.ins[r])
            return [self._begin_reduce(state, r, k)] if ready else []
        if pc == READ:
            return [self._end_reduce(state, r, k)]
        if pc == DONE:
            s = list(state)
            self.words.settle(s, r)
            s[self.pc[r]] = EXIT
            return [(f"rank {r}: free() settles its words and leaves", tuple(s), True)]
        return []

    def _begin_reduce(self, state, r: int, k: int) -> tuple:
        s = list(state)
        refused = []
        for i in self.ins[r]:
            ok, why = verify.begin(state, s, self.slot[i, r], self.use[i, r], k)
            if not ok:
                refused.append(f"rank {i}: {why}")
        if refused and not self.ignores_acks:
            # require_all: ProtocolError before the buffer is touched
            self.flag(s, self.BAD, "error", f"rank {r}: ProtocolError, version {k} not "
                                            f"usable from " + "; ".join(refused))
        s[self.pc[r]] = READ
        return (f"rank {r}: reduce version {k} begins (footers and headers of ranks "
                f"{_names(self.ins[r])} loaded)", tuple(s), True)

    def _end_reduce(self, state, r: int, k: int) -> tuple:
        s = list(state)
        for i in self.ins[r]:
            if not state[self.use[i, r]]:
                continue
            found = verify.end(state, s, self.slot[i, r], self.use[i, r], f"rank {i}", r)
            # detected: ProtocolError; seqlock mode (ignore-acks) drops the input
            if found and not (found[0] and self.ignores_acks):
                self.flag(s, self.BAD, "error" if found[0] else "version", found[1])
        for i in self.ins[r]:
            self.words.issue(s, self.ack[i, r][1], k)
        if k == self.iterations:
            s[self.pc[r]] = DONE
        else:
            s[self.pc[r]] = SEND
            s[self.k[r]] = k + 1
        return (f"rank {r}: reduce version {k} ends, ack {k} to ranks "
                f"{_names(self.ins[r])} (lazy)", tuple(s), True)


def _names(ranks) -> str:
    return ", ".join(str(r) for r in ranks) or "none"
