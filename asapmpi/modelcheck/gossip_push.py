"""Push gossip (asapmpi/_core/push.pxi: PushWindow.push, take, release, _drain;
asapmpi/sync/gossip.py; docs/PROTOCOL.md section 2h): every other rank pushes its
versions 1..N to rank 0 (the schedule's worst case: every sender chose the same
peer), which mixes M times what arrived, then every rank frees the window.

A sender's push of v: a pump first (a send the receiver matched completes), then v
goes at once if no message of this sender is in flight, else waits (replacing a
waiting older one, which is never sent).  The sender's pump sends the waiting one once
its message in flight completed.  MPI_Issend completes once a receive matched it; the
bytes land in the receive's buffer at their own moment after the match (a transition
of MPI's), so two messages of one sender matched in order may land, and be seen by
the pump, in either order.

Rank 0 keeps a pool of B buffers, each posted (an MPI_ANY_SOURCE receive), matched (MPI
writes it), held (a sender's newest version, stamped) or taken (by a mix):

  PUMP     one landed receive at a time, in any order: if older than (or as old as)
           what this sender's mixes already took, repost it (the guard); else if the
           sender has a held buffer, keep the newer and repost the other; else hold it
  TAKE     every held buffer becomes taken (the reduce reads these)
  REDUCE   reads every taken buffer: `overlap` if MPI may write it (a receive is
           posted into it or matched it), `monotone` if a version is older than one
           this sender's mixes already reduced
  RELEASE  every taken buffer receives again

free(): the waiting models dropped; MPI_Alltoall of the messages sent (every rank
arrives); rank 0 cancels each posted receive (one a message already matched completes
instead, counted as received: MPI_Test_cancelled), then receives the messages still to
come into scratch (a blocking receive each); every sender completes its send.  `freed`:
once every rank left free(), nothing is matched and unlanded, unmatched, or posted.

Variants:
  correct              the code
  release-at-take      take() reposts the buffers at once (a reduce then reads memory
                       a posted receive may write): overlap
  no-guard             no check against the version already taken (the "last_v" of
                       push.pxi): an older version landing late is mixed after a newer
                       one: monotone
  cancel-uncounted     the drain counts a cancelled receive as not received even when
                       a message had matched it: a scratch receive waits for a message
                       nobody sends (deadlock)
  isend                MPI_Isend (completes at once, eager) instead of the
                       synchronous MPI_Issend: a sender no longer waits for its reader's
                       receive, so messages pile up unmatched at rank 0: inflight (the
                       correct code has one at most per channel)
"""
from __future__ import annotations

from typing import List

from ..reduce.graphs import Graph
from .model import Model

PUSHING, ALLTOALL, FINISH, DONE = range(4)             # a sender's program counter
LOOP, TAKEN, REDUCED, DRAIN, DRAIN_RECV, RDONE = range(6)    # rank 0's
VARIANTS = ("correct", "release-at-take", "no-guard", "cancel-uncounted", "isend")


class GossipPushModel(Model):
    """Ranks 1..n-1 push N versions each to rank 0, which mixes M times."""

    name = "gossip-push"
    final_pc = DONE

    def __init__(self, graph: Graph, iterations: int, mixes: int = 2, buffers: int = 2,
                 variant: str = "correct",
                 properties=("overlap", "monotone", "inflight", "freed", "deadlock"),
                 symmetry: bool = False):
        if variant not in VARIANTS:
            raise ValueError(f"variant {variant!r} not in {VARIANTS}")
        # cells hold sender numbers (which buffer holds whom): no symmetry reduction
        super().__init__(graph, iterations, properties, False)
        self.mixes, self.nbuf, self.variant = mixes, buffers, variant
        c = self.cells
        self.senders = list(range(1, self.n))
        self.spc = {s: c.add("pc", (s,)) for s in self.senders}
        self.pushed = {s: c.add("pushed", (s,)) for s in self.senders}
        # messages in flight from s: tuple of (version, matched) in send order (the
        # correct code has at most one; isend piles them up)
        self.flight = {s: c.add("in flight", (s,), default=()) for s in self.senders}
        self.wait_v = {s: c.add("waiting", (s,)) for s in self.senders}
        self.sent = {s: c.add("sent", (s,)) for s in self.senders}
        # rank 0: per buffer ("posted",) / ("matched", s, v, landed) / ("held", s, v) /
        # ("taken", s, v) / ("free",) (after the drain)
        self.buf = [c.add("buffer", (0,), (b,), default=("posted",))
                    for b in range(buffers)]
        self.rpc = c.add("pc", (0,), default=LOOP)
        self.k = [c.add("mixes", (0,))]
        self.last = {s: c.add("last taken", (0, s)) for s in self.senders}
        self.mixed = {s: c.add("last mixed", (0, s)) for s in self.senders}
        self.got = c.add("received", (0,))
        # the drain's scratch receive: () none, ("posted",), ("matched", s, v, landed)
        self.scratch = c.add("scratch", (0,), default=())
        self.missing = c.add("missing", (0,))
        self.pc = [self.rpc, *self.spc.values()]

    def finished(self, state) -> bool:
        return state[self.rpc] == RDONE and all(state[self.spc[s]] == DONE
                                                for s in self.senders)

    def drift(self, state) -> int:
        return 0

    def waiting(self, state, r: int) -> str:
        if r == 0:
            what = ("mixes", "has taken", "has reduced", "drains", "receives in the drain",
                    "is done")[state[self.rpc]]
            return f"rank 0 {what} (buffers {[state[b] for b in self.buf]})"
        what = ("pushes", "is in the drain's MPI_Alltoall", "completes its sends",
                "is done")[state[self.spc[r]]]
        return f"rank {r} {what} (in flight {state[self.flight[r]]})"

    def violation(self, state):
        bad = super().violation(state)
        if bad:
            return bad
        if "inflight" in self.properties:
            for s in self.senders:
                unmatched = sum(1 for _, matched in state[self.flight[s]] if not matched)
                if unmatched > 2:
                    return ("inflight", f"rank {s} has {unmatched} messages unmatched at "
                                        f"rank 0")
        if "freed" in self.properties and self.finished(state):
            left = [s for s in self.senders if state[self.flight[s]]]
            posted = [b for b in range(self.nbuf) if state[self.buf[b]][0] in
                      ("posted", "matched")]
            if left or posted:
                return ("freed", f"free() ended with messages of {left} in flight and "
                                 f"receives into buffers {posted} posted")
        return None

    # ------------------------------------------------------------------ transitions

    def successors(self, state) -> List[tuple]:
        out = []
        for s in self.senders:
            out.extend(self._sender(state, s))
            out.extend(self._mpi(state, s))
        out.extend(self._receiver(state))
        return out

    def _send(self, s: list, r: int, v: int) -> None:
        s[self.flight[r]] = (*s[self.flight[r]], (v, False))
        s[self.sent[r]] += 1

    def _sender(self, state, r: int) -> List[tuple]:
        pc, flight = state[self.spc[r]], state[self.flight[r]]
        out = []
        # the oldest message was matched: its MPI_Issend completes (an MPI_Isend
        # completed at once: its message left `flight` when MPI matched it)
        done = bool(flight) and flight[0][1]
        if pc == PUSHING and done:
            # the sender's pump: the send completes; the waiting model goes
            s = list(state)
            s[self.flight[r]] = flight[1:]
            if state[self.wait_v[r]] and not s[self.flight[r]]:
                self._send(s, r, state[self.wait_v[r]])
                s[self.wait_v[r]] = 0
            out.append((f"rank {r}: its pump sees its send complete", tuple(s), True))
        if pc == PUSHING and state[self.pushed[r]] < self.iterations:
            s = list(state)
            v = state[self.pushed[r]] + 1
            s[self.pushed[r]] = v
            busy = bool(flight) and self.variant != "isend"
            if busy:
                s[self.wait_v[r]] = v
            else:
                self._send(s, r, v)
            out.append((f"rank {r}: push {v} to rank 0" + (" (waits)" if busy else ""),
                        tuple(s), True))
        if pc == PUSHING and state[self.pushed[r]] == self.iterations:
            s = list(state)
            s[self.wait_v[r]] = 0
            s[self.spc[r]] = ALLTOALL
            out.append((f"rank {r}: free(): drops its waiting model, enters MPI_Alltoall",
                        tuple(s), True))
        if pc == ALLTOALL and state[self.rpc] in (DRAIN, DRAIN_RECV, RDONE):
            s = list(state)
            s[self.spc[r]] = FINISH
            out.append((f"rank {r}: leaves MPI_Alltoall", tuple(s), True))
        if pc == FINISH:
            if not flight:
                s = list(state)
                s[self.spc[r]] = DONE
                out.append((f"rank {r}: its sends are complete; done", tuple(s), True))
            elif done:
                s = list(state)
                s[self.flight[r]] = flight[1:]
                out.append((f"rank {r}: MPI_Wait: a send completes", tuple(s), True))
        return out

    def _mpi(self, state, r: int) -> List[tuple]:
        """MPI matches sender r's oldest unmatched message to a posted receive, or lands
        the bytes of a matched one."""
        out = []
        flight = state[self.flight[r]]
        pending = [i for i, (_, matched) in enumerate(flight) if not matched]
        if pending:
            i = pending[0]                      # non-overtaking: the oldest first
            v = flight[i][0]
            targets = [b for b in range(self.nbuf) if state[self.buf[b]] == ("posted",)]
            # an MPI_Isend completed at its posting: the matched message leaves
            after = flight[:i] + flight[i + 1:] if self.variant == "isend" else \
                (*flight[:i], (v, True), *flight[i + 1:])
            for b in targets:
                s = list(state)
                s[self.buf[b]] = ("matched", r, v, False)
                s[self.flight[r]] = after
                out.append((f"MPI matches rank {r}'s version {v} to buffer {b}", tuple(s),
                            True))
            if state[self.scratch] == ("posted",):
                s = list(state)
                s[self.scratch] = ("matched", r, v, False)
                s[self.flight[r]] = after
                out.append((f"MPI matches rank {r}'s version {v} to the drain's scratch "
                            f"receive", tuple(s), True))
        for b in range(self.nbuf):
            cell = state[self.buf[b]]
            if cell[0] == "matched" and cell[1] == r and not cell[3]:
                s = list(state)
                s[self.buf[b]] = ("matched", r, cell[2], True)
                out.append((f"MPI lands rank {r}'s version {cell[2]} in buffer {b}",
                            tuple(s), True))
        cell = state[self.scratch]
        if cell and cell[0] == "matched" and cell[1] == r and not cell[3]:
            s = list(state)
            s[self.scratch] = ("matched", r, cell[2], True)
            out.append((f"MPI lands rank {r}'s version {cell[2]} in the scratch buffer",
                        tuple(s), True))
        return out

    def _pump_one(self, state, b: int) -> tuple:
        s = list(state)
        _, r, v, _ = state[self.buf[b]]
        s[self.got] += 1
        if self.variant != "no-guard" and v <= state[self.last[r]]:
            s[self.buf[b]] = ("posted",)
            return (f"rank 0: pumps buffer {b}: rank {r}'s version {v} is not newer than "
                    f"what it took; reposts", tuple(s), True)
        held = [c for c in range(self.nbuf) if state[self.buf[c]][:2] == ("held", r)]
        if held and state[self.buf[held[0]]][2] >= v:
            s[self.buf[b]] = ("posted",)
            return (f"rank 0: pumps buffer {b}: rank {r}'s version {v} is older than the "
                    f"one held; reposts", tuple(s), True)
        if held:
            s[self.buf[held[0]]] = ("posted",)
        s[self.buf[b]] = ("held", r, v)
        return (f"rank 0: pumps buffer {b}: holds rank {r}'s version {v}", tuple(s), True)

    def _receiver(self, state) -> List[tuple]:
        pc = state[self.rpc]
        out = []
        landed = [b for b in range(self.nbuf) if state[self.buf[b]][0] == "matched"
                  and state[self.buf[b]][3]]
        if pc == LOOP:
            for b in landed:
                out.append(self._pump_one(state, b))
            if state[self.k[0]] < self.mixes:
                s = list(state)
                for b in range(self.nbuf):
                    cell = state[self.buf[b]]
                    if cell[0] == "held":
                        s[self.buf[b]] = ("posted",) if self.variant == "release-at-take" \
                            else ("taken", cell[1], cell[2])
                        s[self.last[cell[1]]] = cell[2]
                s[self.rpc] = TAKEN
                if self.variant == "release-at-take":
                    # it still reduces what it took: the versions, from buffers reposted
                    s[self.scratch] = tuple((b, state[self.buf[b]][1], state[self.buf[b]][2])
                                            for b in range(self.nbuf)
                                            if state[self.buf[b]][0] == "held")
                out.append(("rank 0: take()", tuple(s), True))
            elif all(state[self.spc[r]] != PUSHING for r in self.senders):
                # MPI_Alltoall: every rank came to free()
                s = list(state)
                s[self.rpc] = DRAIN
                out.append(("rank 0: free(): MPI_Alltoall of the counts", tuple(s), True))
            return out
        if pc == TAKEN:
            s = list(state)
            reads = [(b, cell[1], cell[2]) for b, cell in
                     ((b, state[self.buf[b]]) for b in range(self.nbuf)) if cell[0] == "taken"]
            if self.variant == "release-at-take":
                reads = list(state[self.scratch])
                s[self.scratch] = ()
            for b, r, v in reads:
                if state[self.buf[b]][0] in ("posted", "matched"):
                    self.note(s, "overlap", f"rank 0 reduces rank {r}'s version {v} from "
                                            f"buffer {b}, into which a receive is posted")
                if v < state[self.mixed[r]]:
                    self.note(s, "monotone", f"rank 0 mixes rank {r}'s version {v} after "
                                             f"its version {state[self.mixed[r]]}")
                s[self.mixed[r]] = max(v, state[self.mixed[r]])
            s[self.rpc] = REDUCED
            return [("rank 0: the verified reduce of what it took", tuple(s), True)]
        if pc == REDUCED:
            s = list(state)
            for b in range(self.nbuf):
                if state[self.buf[b]][0] == "taken":
                    s[self.buf[b]] = ("posted",)
            s[self.k[0]] += 1
            s[self.rpc] = LOOP
            return [("rank 0: release(): the taken buffers receive again", tuple(s), True)]
        if pc == DRAIN:
            # cancel each posted receive; one a message matched completes (once landed)
            for b in range(self.nbuf):
                cell = state[self.buf[b]]
                if cell == ("posted",):
                    s = list(state)
                    s[self.buf[b]] = ("free",)
                    return [(f"rank 0: MPI_Cancel of buffer {b}'s receive: cancelled",
                             tuple(s), True)]
                if cell[0] == "matched":
                    if not cell[3]:
                        return out      # MPI_Wait: the bytes land first
                    s = list(state)
                    s[self.buf[b]] = ("free",)
                    if self.variant != "cancel-uncounted":
                        s[self.got] += 1
                    return [(f"rank 0: MPI_Cancel of buffer {b}'s receive: a message had "
                             f"matched it; completes" + (" (not counted)" if
                                                         self.variant == "cancel-uncounted"
                                                         else ""), tuple(s), True)]
            s = list(state)
            s[self.missing] = sum(state[self.sent[r]] for r in self.senders) - state[self.got]
            s[self.rpc] = DRAIN_RECV
            return [(f"rank 0: {s[self.missing]} message(s) still to come", tuple(s), True)]
        if pc == DRAIN_RECV:
            cell = state[self.scratch]
            s = list(state)
            if state[self.missing] <= 0 and not cell:
                s[self.rpc] = RDONE
                return [("rank 0: done", tuple(s), True)]
            if not cell:
                s[self.scratch] = ("posted",)
                s[self.missing] -= 1
                return [("rank 0: MPI_Recv (any source) into scratch", tuple(s), True)]
            if cell[0] == "matched" and cell[3]:
                s[self.scratch] = ()
                s[self.got] += 1
                return [(f"rank 0: the scratch receive completes (rank {cell[1]}'s "
                         f"version {cell[2]})", tuple(s), True)]
        return out
