"""Gossip's pulls (asapmpi/_core/put.pxi: PutWindow.publish, pull, _get_polled;
asapmpi/sync/gossip.py; docs/PROTOCOL.md section 2f): a rank reads the newest model a
peer published, by one MPI_Rget of the peer's two published slots into its pull
buffer, polled with a timeout, then verified (header == footer, the payload's checksum)
and copied out to be averaged.

Rank 0 publishes versions 1..N; version v goes to published slot (v - 1) mod 2
(publish: MPI_Put of the header, flush; of the payload, flush; of the footer {v,
checksum(payload)}, flush: three actions, each complete in rank 0's memory when it
ends).  Every other rank pulls from rank 0, P times (gossip's receive of P
communication iterations), each pull:

  ISSUE    MPI_Rget(both slots -> pull buffer): the get reads each field (header, payload
           halves a and b, footer of each slot) at its own moment until it completes;
           a field's value is one it held at some moment since the issue
  POLL     MPI_Test until complete (a forced transition: the target's MPI serves the
           get, A9): every field lands in the pull buffer; or the timeout passes (not
           forced: a slow target; at most `timeouts` per run): _get_polled returns 1,
           pull raises NeighbourTimeoutError and the caller steps on (a later pull)
  VERIFY   per slot: header == footer (the footer's checksum == the checksum of the
           payload as read, i.e. both halves are the footer's version); the newest such
           slot; none: gossip retries the pull (Gossip._pull)
  COPY     memcpy of that slot's payload out of the pull buffer (a second read of it)
  REDUCE   buf = (buf + pulled) / 2: the property `version` holds when the payload
           reduced is exactly the version the pull returned, whole

Landing on demand: a get's fields land when the pull's poll finds it complete, each
with any value the field held between the issue and then (the publisher's history is
deterministic: its position says what each field held when).  A get abandoned after a
timeout may land any of its fields later, each at most once, at any moment (an
unforced transition), with any value the field held since that get's issue.

A timed-out get, as the variant says: abandoned (its late fields land in the pull
buffer the next pulls use); retired (the code since a407441: _pull_buffer_free hands
the buffer and its get to the leftovers, which free it once the get completed, and the
next pull reads into a fresh buffer); or completed before the buffer is reused.

Variants:
  correct              the code today: retired; verify the pull buffer, then copy
  complete-copy-first  completed before the buffer is reused; the copy is verified
                       (copy first, verify the copy)
  abandon              before a407441: abandoned; verify, then copy: the late get can
                       land between the two reads
  abandon-copy-first   abandoned, but the copy is what is verified
  no-checksum          correct, but a slot verifies on header == footer alone
  retire-free          retired, but the retired buffer freed at once, not by the
                       leftovers once its get completed
"""
from __future__ import annotations

from itertools import permutations, product
from typing import List

from ..reduce.graphs import Graph
from .model import Model

ISSUE, POLL, VERIFY, COPY, DONE = range(5)
FIELDS = ("header", "payload half a", "payload half b", "footer")
# the publish step (1..3) that writes each field of a version
WRITTEN_AT = (1, 2, 2, 3)
VARIANTS = ("correct", "complete-copy-first", "abandon", "abandon-copy-first", "no-checksum",
            "retire-free")


class GossipPullModel(Model):
    """Rank 0 publishes N versions; every other rank pulls it P times."""

    final_pc = DONE
    name = "gossip-pull"

    def __init__(self, graph: Graph, iterations: int, pulls: int = 2, timeouts: int = 1,
                 variant: str = "correct", properties=("version", "freed", "deadlock"),
                 symmetry: bool = True):
        if variant not in VARIANTS:
            raise ValueError(f"variant {variant!r} not in {VARIANTS}")
        super().__init__(graph, iterations, properties, symmetry)
        self.pulls, self.timeouts, self.variant = pulls, timeouts, variant
        self.abandons = variant in ("abandon", "abandon-copy-first")
        self.copy_first = variant in ("complete-copy-first", "abandon-copy-first")
        self.retires = variant in ("correct", "no-checksum", "retire-free")
        self.checksum = variant != "no-checksum"
        self.end = 3 * iterations         # the publisher's last position
        c = self.cells
        # rank 0: publish steps done (3 per version); the pullers' cells
        self.pos = c.add("publisher", (0,))
        self.pullers = list(range(1, self.n))
        self.pc = [c.add("pc", (r,)) for r in self.pullers]
        self.k = [c.add("pulls", (r,)) for r in self.pullers]
        self.issued = [c.add("get issued at", (r,), default=-1) for r in self.pullers]
        self.late = [c.add("abandoned get", (r,), default=()) for r in self.pullers]
        # a retired pull buffer whose get is still in flight: 1 kept (the leftovers),
        # 2 already freed (retire-free)
        self.retired = [c.add("retired buffer", (r,)) for r in self.pullers]
        self.outs_left = [c.add("timeouts left", (r,), default=timeouts)
                          for r in self.pullers]
        self.chosen = [c.add("verified", (r,), default=()) for r in self.pullers]
        self.pbuf = {(r, j, f): c.add("pull buffer", (r,), (j, f))
                     for r in self.pullers for j in range(2) for f in range(4)}

    def _symmetry_perms(self) -> list:
        # the pullers are interchangeable, the publisher is not
        return [p for p in (permutations(range(self.n)) if self.symmetry
                            else [tuple(range(self.n))]) if p[0] == 0]

    def drift(self, state) -> int:
        return 0

    # ------------------------------------------------------------------ the publisher

    def field(self, j: int, f: int, pos: int) -> int:
        """What field f of published slot j holds once the publisher made `pos` steps."""
        best = 0
        for v in range(1, self.iterations + 1):
            if (v - 1) % 2 == j and 3 * (v - 1) + WRITTEN_AT[f] <= pos:
                best = v
        return best

    def held(self, j: int, f: int, since: int, now: int) -> List[int]:
        """The values field f of slot j held from position `since` to `now`."""
        return sorted({self.field(j, f, p) for p in range(since, now + 1)})

    # ------------------------------------------------------------------ properties

    def finished(self, state) -> bool:
        return state[self.pos] == self.end and all(state[p] == DONE for p in self.pc)

    def waiting(self, state, r: int) -> str:
        if r == 0:
            return f"rank 0 published {state[self.pos] // 3} versions"
        x = r - 1
        doing = ("issues a pull", "polls its get", "verifies", "copies",
                 "is done")[state[self.pc[x]]]
        return f"rank {r} ({doing}, {state[self.k[x]]} pulls done)"

    # ------------------------------------------------------------------ transitions

    def successors(self, state) -> List[tuple]:
        out = []
        pos = state[self.pos]
        if pos < self.end:
            s = list(state)
            s[self.pos] = pos + 1
            v, step = pos // 3 + 1, pos % 3
            what = ("the header", "the payload", "the footer")[step]
            out.append((f"rank 0: publish {v}: MPI_Put {what} into published slot "
                        f"{(v - 1) % 2}, MPI_Win_flush", tuple(s), True))
        for x, r in enumerate(self.pullers):
            out.extend(self._puller(state, x, r))
            out.extend(self._late_landings(state, x, r))
            out.extend(self._retired(state, x, r))
        return out

    def _retired(self, state, x: int, r: int) -> List[tuple]:
        """The get a retired buffer waits for: it completes and the leftovers free the
        buffer (kept), or it lands in a buffer already freed (retire-free)."""
        how = state[self.retired[x]]
        if not how:
            return []
        s = list(state)
        s[self.retired[x]] = 0
        if how == 1:
            return [(f"MPI completes rank {r}'s timed-out get; the leftovers free its "
                     f"retired buffer", tuple(s), False)]
        self.note(s, "freed", f"MPI lands rank {r}'s timed-out get in its retired pull "
                              f"buffer, which was freed")
        return [(f"MPI lands rank {r}'s timed-out get in its retired pull buffer",
                 tuple(s), False)]

    def _late_landings(self, state, x: int, r: int) -> List[tuple]:
        # Only an abandoned get lands while the buffer is live (from a completion to
        # the copy): before a completion, which writes every field, a landing is
        # overwritten (as if that field never landed, which is a run too); a get kept
        # to be completed lands before the buffer is reused, into contents that no
        # longer matter
        late = state[self.late[x]]
        if not late or not self.abandons or state[self.pc[x]] not in (VERIFY, COPY):
            return []
        since, left = late
        out = []
        for bit in range(8):
            if not left & (1 << bit):
                continue
            j, f = divmod(bit, 4)
            for v in self.held(j, f, since, state[self.pos]):
                s = list(state)
                s[self.pbuf[r, j, f]] = v
                rest = left & ~(1 << bit)
                s[self.late[x]] = (since, rest) if rest else ()
                out.append((f"MPI lands the timed-out get's {FIELDS[f]} of slot {j} "
                            f"(version {v}) in rank {r}'s pull buffer", tuple(s), False))
        return out

    def _puller(self, state, x: int, r: int) -> List[tuple]:
        pc = state[self.pc[x]]
        pos = state[self.pos]
        if pc == ISSUE:
            if state[self.late[x]] and not self.abandons:
                return self._complete_late(state, x, r)
            s = list(state)
            s[self.issued[x]] = pos
            s[self.pc[x]] = POLL
            return [(f"rank {r}: pull {state[self.k[x]] + 1}: MPI_Rget of rank 0's published "
                     f"slots into its pull buffer", tuple(s), True)]
        if pc == POLL:
            since = state[self.issued[x]]
            out = []
            if not state[self.late[x]]:
                out.extend(self._complete_and_reduce(state, x, r, since))
            options = [self.held(j, f, since, pos) for j in range(2) for f in range(4)]
            for values in (() if out else product(*options)):
                s = list(state)
                for bit, v in enumerate(values):
                    s[self.pbuf[r, bit // 4, bit % 4]] = v
                s[self.issued[x]] = -1
                s[self.pc[x]] = VERIFY
                out.append((f"rank {r}: MPI_Test: the get is complete, its buffer holds "
                            + "; ".join(f"slot {j}: {values[4 * j]}/{values[4 * j + 1]}/"
                                        f"{values[4 * j + 2]}/{values[4 * j + 3]}"
                                        for j in range(2)), tuple(s), True))
            if state[self.outs_left[x]]:
                s = list(state)
                s[self.outs_left[x]] -= 1
                s[self.issued[x]] = -1
                if self.abandons:
                    s[self.late[x]] = (since, 255)
                elif self.retires:
                    s[self.retired[x]] = 2 if self.variant == "retire-free" else 1
                else:
                    s[self.late[x]] = (0, 0)
                s[self.k[x]] += 1
                s[self.pc[x]] = DONE if s[self.k[x]] == self.pulls else ISSUE
                how = ("abandoned" if self.abandons else
                       "and its buffer retired (the next pull reads into a fresh one)"
                       if self.retires else "kept, to be completed before the buffer is "
                                            "reused")
                out.append((f"rank {r}: the pull times out (NeighbourTimeoutError), its "
                            f"MPI_Rget {how}", tuple(s), False))
            return out
        if pc == VERIFY:
            s = list(state)
            fields = [[state[self.pbuf[r, j, f]] for f in range(4)] for j in range(2)]
            if self.copy_first:
                # the copy (a private buffer nothing else writes) is what is verified
                # and reduced: one action
                return [self._reduce(state, s, x, r, fields, fields, "copies the pull "
                                     "buffer, verifies the copy")]
            best = self._verify(fields)
            s[self.chosen[x]] = best
            s[self.pc[x]] = COPY
            return [(f"rank {r}: verifies the pull buffer: "
                     + (f"slot {best[0]}, version {best[1]}" if best else "no slot whole"),
                     tuple(s), True)]
        if pc == COPY:
            s = list(state)
            best = state[self.chosen[x]]
            fields = [[state[self.pbuf[r, j, f]] for f in range(4)] for j in range(2)]
            s[self.chosen[x]] = ()
            return [self._reduce(state, s, x, r, fields, None, "copies the verified slot",
                                 best)]
        return []

    def _complete_and_reduce(self, state, x: int, r: int, since: int) -> List[tuple]:
        """The get complete and, nothing else writing the pull buffer (no abandoned get
        of this rank in flight), its verification, copy and reduce at once: the buffer
        is private from the completion to the copy, so verifying it and copying it
        (either order) read the same bytes and are one action.  One transition per
        distinct outcome (per slot: what verifies, what is copied)."""
        per_slot = []
        for j in range(2):
            seen = {}
            for h, a, b, f in product(*(self.held(j, g, since, state[self.pos])
                                        for g in range(4))):
                whole = h > 0 and h == f and (not self.checksum or a == b == f)
                seen.setdefault((h if whole else 0, (a, b) if whole else None),
                                (h, a, b, f))
            per_slot.append(list(seen.values()))
        out = []
        for f0, f1 in product(*per_slot):
            s = list(state)
            s[self.issued[x]] = -1
            fields = [list(f0), list(f1)]
            label, nxt, forced = self._reduce(state, s, x, r, fields, fields, "")
            out.append((f"rank {r}: MPI_Test: the get is complete (slot 0: "
                        f"{'/'.join(map(str, f0))}; slot 1: {'/'.join(map(str, f1))})"
                        + ("; copies the pull buffer, verifies the copy" if self.copy_first
                           else "; verifies the pull buffer, copies the slot")
                        + label[len(f"rank {r}: "):],
                        nxt, forced))
        return out

    def _verify(self, fields):
        """The newest slot that verifies: (slot, version), or ()."""
        best = ()
        for j, (h, a, b, f) in enumerate(fields):
            whole = h == f and (not self.checksum or a == b == f)
            if h > 0 and whole and (not best or h > best[1]):
                best = (j, h)
        return best

    def _reduce(self, state, s: list, x: int, r: int, copied, verified, how: str,
                best=None) -> tuple:
        if verified is not None:
            best = self._verify(verified)
        for key in self.pbuf:       # the buffer's contents matter no more: the next
            if key[0] == r:         # get's completion writes every field
                s[self.pbuf[key]] = 0
        if not best:        # nothing verified: Gossip._pull retries
            s[self.pc[x]] = ISSUE
            return (f"rank {r}: {how}: no slot whole, pulls again", tuple(s), True)
        j, v = best
        payload = (copied[j][1], copied[j][2])
        if payload != (v, v):
            self.note(s, "version",
                      f"rank {r} reduces the pulled model as version {v} (verified) but "
                      f"the payload it copied holds versions {payload[0]}/{payload[1]}")
        s[self.k[x]] += 1
        s[self.pc[x]] = DONE if s[self.k[x]] == self.pulls else ISSUE
        return (f"rank {r}: {how}: slot {j}, version {v}; reduces payload "
                f"{payload[0]}/{payload[1]}", tuple(s), True)

    def _complete_late(self, state, x: int, r: int) -> List[tuple]:
        """The timed-out get is completed (polled to the end) before the buffer is
        reused: what it still writes lands in contents no pull reads any more."""
        s = list(state)
        s[self.late[x]] = ()
        return [(f"rank {r}: completes the timed-out get before reusing its pull buffer",
                 tuple(s), True)]
