"""The mailbox of newest versions (asapmpi/_core/newest.pxi, NewestWindow; docs/PROTOCOL.md
section 2e): async, backup_ps and elastic on messages.  One slot per sender that always
holds the newest whole version that arrived; writers never wait for a reader.

Reader r, per in-neighbour w: the slot is a pointer (mb_cur) to one of three buffers
(0: the window's slot, 1 and 2: spares); two receives are posted, into the two buffers
that are not the slot (_post_all, _post_newest), matched by MPI in posting order.
  pump   (every wait and the reduce's first statement, _pump): the writer side first
         (its sends that readers took are freed: _sent), then each receive that MPI
         completed, in any order (MPI_Testsome's order is the requests', not the
         arrivals'): _arrived: _fill stamps the buffer from its trailer; if its
         version > notify[w]: the buffer becomes the slot, the old slot takes the
         receive's place, notify[w] := version; the receive is posted again into
         that place.  Then _pumped: every waiting channel whose two sends are free
         gets the newest stage (MPI_Issend)
Writer w, put(k) (_send): _complete_sends (MPI_Testsome over its sends); the first stage
         that no send reads and is not the newest (2 n_out + 2 stages); the payload
         and trailer {k} copied into it (FILL); it becomes the newest; per
         out-neighbour: a send in flight (first or second request): mark it waiting;
         else MPI_Issend(newest stage) as its first request
The policy (async, asapmpi/sync/baselines.py; the shape of every policy on this window):
  PUT    put(k)
  READ0  reduce(k, any version >= 1, seqlock): the pump, then per in-neighbour the
         slot's footer and header loaded (its version), the pass begins
  READ   the pass ends (header loaded again)
  SETTLE (option settle_after=m: after iteration m, Exchange.settle() or a collective:
         _settle_all(deliver)) _settle: a pump, then every waiting channel gets the
         newest stage on its first request if free, else on its second; both busy: it
         stays waiting
After the last iteration: FINAL (option final_wait: a reader that still steps, e.g. a
  backup_ps worker waiting for theta >= N: it waits, pumping, until every in-neighbour's
  slot holds version N: the writers' last versions must reach it), then free():
  SETTLE (deliver), ARRIVE (the collective: no pump of the window; MPI matches).

MPI: a channel's oldest message is matched with the reader's earliest posted receive
(a transition of its own, forced); its contents are the stage's at that moment (an MPI
may read a send buffer until the send completes); MPI_Issend completes once matched,
and the writer sees it at its next MPI_Testsome.

Variants:
  correct            what waits leaves from any wait of the rank: settle_all before the
                     collective, and its polls after (every wait pumps every live
                     mailbox of newest versions and delivers what waits): the code since
                     the collectives' polls call slotwin.release_all()
  settle-once        the code before that: _settle once, before the collective; a channel
                     whose two requests are both in flight keeps its newest version
                     waiting, and nothing sends it later (newest.pxi _settle)
  refill-in-flight   the stage search ignores the sends in flight (mb_refs): the first
                     stage that is not the newest is refilled while a reader takes it
  repost-slot        after a swap the receive is posted again into the buffer that just
                     became the slot (mb_posted[r] not moved to the old slot)
  no-version-check   _arrived swaps without comparing versions: two completions taken
                     in the other order make the slot go back
  isend              MPI_Isend (eager: complete at once) instead of MPI_Issend
  no-deliver         _settle only pumps: the waiting channels get nothing
"""
from __future__ import annotations

from itertools import permutations, product
from typing import List, Optional

from ..reduce.graphs import Graph
from .model import Model, Violation
from .onesided import ModelError

(PUT, FILL, READ0, READ, MID, FINAL, SETTLE, ARRIVE, FREE, ALLREDUCE, ALLTOALL, WAITALL,
 DROPPED, EXIT) = range(14)
PHASES = {PUT: "puts", FILL: "fills its stage with", READ0: "starts the reduce of",
          READ: "reduces", MID: "settles after", FINAL: "waits for the last versions after",
          SETTLE: "settles before free() after", ARRIVE: "waits in free()'s collective after",
          FREE: "settles in free() after", ALLREDUCE: "waits in free()'s MPI_Allreduce after",
          ALLTOALL: "waits in the drain's MPI_Alltoall after",
          WAITALL: "waits for its requests in the drain after",
          DROPPED: "dropped its window in", EXIT: "has left after"}
VARIANTS = ("correct", "settle-once", "refill-in-flight", "repost-slot", "no-version-check",
            "isend", "no-deliver", "no-drain", "destructor")
LIVE, RELEASED, HEAP_FREED = 0, 1, 2
NONE = -1


class NewestModel(Model):
    """Writers and readers of a NewestWindow (async's loop)."""

    final_pc = EXIT
    name = "newest"

    def __init__(self, graph: Graph, iterations: int, variant: str = "correct",
                 settle_after: Optional[int] = None, final_wait: bool = True,
                 matching: str = "demand", rename: bool = True,
                 tail: str = "arrive", drop: Optional[tuple] = None,
                 properties=("overlap", "version", "stage", "monotone", "inflight",
                             "deadlock"),
                 symmetry: bool = True):
        if variant not in VARIANTS:
            raise ValueError(f"variant {variant!r} not in {VARIANTS}")
        super().__init__(graph, iterations, properties, symmetry)
        if matching not in ("demand", "spontaneous"):
            raise ValueError(f"matching {matching!r} not in ('demand', 'spontaneous')")
        self.variant, self.settle_after, self.final_wait = variant, settle_after, final_wait
        if tail not in ("arrive", "free"):
            raise ValueError(f"tail {tail!r} not in ('arrive', 'free')")
        if variant == "no-drain" and tail != "free":
            raise ValueError("no-drain needs tail='free'")
        if variant == "destructor" and drop is None:
            raise ValueError("destructor needs a dropped window (drop=(rank, iteration))")
        if drop is not None and not (0 <= drop[0] < graph.n and 1 <= drop[1] <= iterations):
            raise ValueError(f"drop {drop}: a rank and an iteration of the run")
        self.tail, self.drop = tail, drop
        self.drain = tail == "free" or drop is not None
        # which buffer is the window's own slot (0) matters once a destructor frees
        # the spares (1, 2): no renaming then
        self.rename = rename and variant != "destructor"
        self.matching = matching
        if drop is not None:
            self.symmetry = False       # the dropped rank is not like the others
        if self.drain:
            self.name = "drain"
        self.stages = 2 * max(len(o) for o in self.outs) + 2
        c = self.cells
        self.pc = [c.add("pc", (r,)) for r in range(self.n)]
        self.k = [c.add("k", (r,), default=1) for r in range(self.n)]
        self.newest = [c.add("newest stage", (r,), default=NONE) for r in range(self.n)]
        self.stage = {(r, st): c.add("stage", (r,), (st,), default=(0, 0))
                      for r in range(self.n) for st in range(self.stages)}
        self.busy, self.pending, self.chan = {}, {}, {}
        self.cur, self.notify, self.recvs, self.done, self.buf = {}, {}, {}, {}, {}
        self.use = {}
        for w, r in self.edges:
            # w's requests to r: the stage each sends from (NONE: free); a request is
            # complete once its message left the channel
            self.busy[w, r] = c.add("busy", (w, r), default=(NONE, NONE))
            self.pending[w, r] = c.add("waiting", (w, r))
            # messages unmatched, oldest first: (request 0 or 1, stage)
            self.chan[w, r] = c.add("channel", (w, r), default=())
            self.cur[w, r] = c.add("slot buffer", (w, r))
            self.notify[w, r] = c.add("notify", (w, r))
            # r's receives posted for w (buffers, in posting order), and the buffers of
            # those MPI completed but no pump took yet
            self.recvs[w, r] = c.add("receives", (w, r), default=(1, 2))
            self.done[w, r] = c.add("completed", (w, r), default=())
            # each buffer's contents: (payload version, trailer version)
            for b in range(3):
                self.buf[w, r, b] = c.add("buffer", (w, r), (b,), default=(0, 0))
            # a reduce's read of the slot: (buffer, version, payload)
            self.use[w, r] = c.add("use", (w, r), default=())
        # free()'s drain: messages sent and received (pumped) per edge, scratch receives
        self.sent, self.got, self.scratch, self.freed = {}, {}, {}, []
        if self.drain:
            self.freed = [c.add("memory", (r,)) for r in range(self.n)]
            for w, r in self.edges:
                self.sent[w, r] = c.add("sent", (w, r))
                self.got[w, r] = c.add("got", (w, r))
                self.scratch[w, r] = c.add("scratch", (w, r))

    # ------------------------------------------------------------------ properties

    def violation(self, state) -> Optional[Violation]:
        props = self.properties
        for (w, r), use in self.use.items():
            if "overlap" in props and state[use]:
                b = state[use][0]
                if b in state[self.recvs[w, r]] or b in state[self.done[w, r]]:
                    return ("overlap", f"rank {r} reads its slot for rank {w} (buffer {b}) "
                                       f"while a receive into it is posted")
            if "inflight" in props and len(state[self.chan[w, r]]) > 2:
                return ("inflight", f"{len(state[self.chan[w, r]])} messages from rank {w} "
                                    f"to rank {r} are unmatched")
        return super().violation(state)

    def measure(self, state) -> dict:
        return {"unmatched": max(len(state[c]) for c in self.chan.values()),
                "requests": max(sum(x != NONE for x in state[c]) for c in self.busy.values())}

    def waiting(self, state, r: int) -> str:
        pc, k = state[self.pc[r]], state[self.k[r]]
        what = f"rank {r} {PHASES[pc]} iteration {min(k, self.iterations)}"
        if pc == FINAL:
            what += " (slots: " + ", ".join(f"rank {w} = {state[self.notify[w, r]]}"
                                            for w in self.ins[r]) + ")"
        held = [f"{state[self.stage[r, state[self.newest[r]]]][1]} for rank {j}"
                for j in self.outs[r] if state[self.pending[r, j]]]
        if held:
            what += ", newest version waiting: " + ", ".join(held)
        return what

    # ------------------------------------------------------------------ helpers

    def _complete(self, s: list, r: int) -> None:
        """_complete_sends / the pump's _sent: free the requests whose message a reader
        took (eager sends are complete at once)."""
        for j in self.outs[r]:
            busy = s[self.busy[r, j]]
            if busy == (NONE, NONE):
                continue
            flying = {req for req, _ in s[self.chan[r, j]]}
            s[self.busy[r, j]] = tuple(NONE if (q not in flying or self.variant == "isend")
                                       else st for q, st in enumerate(busy))

    def _send(self, s: list, r: int, j: int, second: int) -> None:
        """_send_newest(j, second)."""
        st = s[self.newest[r]]
        busy = list(s[self.busy[r, j]])
        busy[second] = st
        s[self.busy[r, j]] = tuple(busy)
        s[self.chan[r, j]] = (*s[self.chan[r, j]], (second, st))
        s[self.pending[r, j]] = 0
        if self.drain:
            s[self.sent[r, j]] += 1

    def _refs(self, s, r: int, st: int) -> int:
        return sum(st == x for j in self.outs[r] for x in s[self.busy[r, j]])

    def _pump(self, state, r: int) -> List[tuple]:
        """_pump: the pump's states, one per order of taking the completed receives;
        each (state list, what changed)."""
        base = list(state)
        self._complete(base, r)
        per_sender = []
        for w in self.ins[r]:
            done = state[self.done[w, r]]
            per_sender.append([(w, order) for order in (permutations(done) if done else [()])])
        out = []
        for choice in product(*per_sender):
            s = list(base)
            notes = []
            for w, order in choice:
                s[self.done[w, r]] = ()
                for b in order:
                    notes.append(self._arrived(s, w, r, b, *s[self.buf[w, r, b]]))
            for j in self.outs[r]:
                if s[self.pending[r, j]] and s[self.busy[r, j]] == (NONE, NONE):
                    self._send(s, r, j, 0)
                    notes.append(f"sends the newest to rank {j}")
            out.append((s, notes))
        return out

    def _arrived(self, s: list, w: int, r: int, b: int, payload: int, version: int) -> str:
        cur = s[self.cur[w, r]]
        if version > s[self.notify[w, r]] or self.variant == "no-version-check":
            if version < s[self.notify[w, r]]:
                self.note(s, "monotone",
                          f"rank {r}'s slot for rank {w} goes from version "
                          f"{s[self.notify[w, r]]} back to {version}")
            s[self.cur[w, r]] = b
            s[self.notify[w, r]] = version
            again = b if self.variant == "repost-slot" else cur
            if again != b:
                s[self.buf[w, r, again]] = (0, 0)   # its contents matter no more
            s[self.recvs[w, r]] = (*s[self.recvs[w, r]], again)
            if self.drain:
                s[self.got[w, r]] += 1
            return f"version {version} from rank {w} becomes the slot (buffer {b})"
        s[self.recvs[w, r]] = (*s[self.recvs[w, r]], b)
        if self.drain:
            s[self.got[w, r]] += 1
        return f"version {version} from rank {w} is not newer"

    # ------------------------------------------------------------------ transitions

    def successors(self, state) -> List[tuple]:
        out = []
        for r in range(self.n):
            got = (self._rank(state, r) if self.matching == "spontaneous"
                   else self._on_demand(state, r))
            out.extend((label, self._rename(nxt), forced) for label, nxt, forced in got)
        if self.matching == "spontaneous":
            # every match MPI may make now, a transition of its own (forced), to
            # cross-check matching on demand
            for w, r in self.chan:
                if self._can(state, w, r):
                    s = list(state)
                    label = self._match(s, w, r)
                    out.append((label, self._rename(tuple(s)), True))
        elif self.drain:
            out.extend(self._unobserved(state))
        return out

    def _rename(self, state) -> tuple:
        """The state with each reader's three buffers per sender renamed: the slot 0,
        then the completed receives (by contents: a pump takes them in any order), then
        the posted ones in posting order.  Which buffer is which is no part of the
        protocol's behaviour (a symmetry of the buffers, as the ranks' relabelling)."""
        if not self.rename:
            return state
        s = None
        for (w, r), cur in self.cur.items():
            b = [state[self.buf[w, r, x]] for x in range(3)]
            done = tuple(sorted(state[self.done[w, r]], key=lambda x: b[x]))
            order = [state[cur], *done, *state[self.recvs[w, r]]]
            use = state[self.use[w, r]]
            if use:
                order.append(use[0])
            new = {}
            for x in [*order, 0, 1, 2]:
                if x not in new:
                    new[x] = len(new)
            if all(new[x] == x for x in range(3)) and done == state[self.done[w, r]]:
                continue
            if s is None:
                s = list(state)
            s[cur] = new[state[cur]]
            s[self.done[w, r]] = tuple(new[x] for x in done)
            s[self.recvs[w, r]] = tuple(new[x] for x in state[self.recvs[w, r]])
            if use:
                s[self.use[w, r]] = (new[use[0]], *use[1:])
            for x in range(3):
                s[self.buf[w, r, new[x]]] = b[x]
        return state if s is None else tuple(s)

    # Matching on demand (as in mailbox.py): a match is taken as part of the first
    # action that observes it, the reader's pump (its receives completed) or the
    # writer's MPI_Testsome (its sends completed), once per choice of how many of a
    # channel's oldest messages MPI matched by then.

    def _can(self, state, w: int, r: int) -> int:
        """How many of channel w -> r's oldest messages MPI may match now."""
        room = len(state[self.recvs[w, r]]) + (state[self.scratch[w, r]] if self.drain else 0)
        return min(len(state[self.chan[w, r]]), room)

    def _channels(self, state, r: int) -> List[tuple]:
        pc, k = state[self.pc[r]], state[self.k[r]]
        dropping = self.drop == (r, k) and pc == PUT
        leftover = pc == DROPPED and self.freed and state[self.freed[r]] == LIVE
        chans = []
        if pc in (READ0, FINAL, MID, SETTLE, ARRIVE, FREE, WAITALL) or dropping:
            chans += [(w, r) for w in self.ins[r]]      # a pump: receives completed
        if (pc in (PUT, FILL, READ0, FINAL, MID, SETTLE, ARRIVE, FREE, WAITALL)
                and not dropping) or leftover:
            chans += [(r, j) for j in self.outs[r]]     # sends completed
        return [c for c in chans if self._can(state, *c)]

    def _match(self, s: list, w: int, r: int) -> str:
        queue, posted = s[self.chan[w, r]], s[self.recvs[w, r]]
        _, st = queue[0]
        payload, version = s[self.stage[w, st]]
        s[self.chan[w, r]] = queue[1:]
        if self.drain and s[self.freed[w]] != LIVE:
            self.note(s, "freed", f"MPI reads rank {w}'s stage {st} for its send to rank "
                                  f"{r} after rank {w} released it")
        if not posted:
            s[self.scratch[w, r]] -= 1
            return (f"MPI matches rank {r}'s scratch receive with rank {w}'s message from "
                    f"stage {st} (version {version})")
        s[self.recvs[w, r]] = posted[1:]
        s[self.done[w, r]] = (*s[self.done[w, r]], posted[0])
        s[self.buf[w, r, posted[0]]] = (payload, version)
        if self.drain and (s[self.freed[r]] == RELEASED
                           or (s[self.freed[r]] == HEAP_FREED and posted[0])):
            self.note(s, "freed", f"MPI writes rank {w}'s update {version} into rank {r}'s "
                                  f"buffer {posted[0]} after rank {r} released it")
        return (f"MPI matches rank {r}'s receive into buffer {posted[0]} with rank {w}'s "
                f"message from stage {st} (version {version}"
                + (f", payload {payload})" if payload != version else ")"))

    def _unobserved(self, state) -> List[tuple]:
        """Matches that touch a dropped window or released memory, on their own."""
        gone = [r for r in range(self.n)
                if state[self.pc[r]] in (DROPPED, EXIT) or state[self.freed[r]] != LIVE]
        out = []
        for w, r in self.edges:
            if (w in gone or r in gone) and self._can(state, w, r):
                s = list(state)
                label = self._match(s, w, r)
                out.append((label, self._rename(tuple(s)), False))
        return out

    def _on_demand(self, state, r: int) -> List[tuple]:
        chans = self._channels(state, r)
        if not chans:
            return self._rank(state, r)
        ranges = [range(self._can(state, *c) + 1) for c in chans]
        out, enabled = [], False
        for choice in product(*ranges):
            s = list(state)
            labels = [self._match(s, *c) for c, m in zip(chans, choice) for _ in range(m)]
            got = self._rank(tuple(s), r)
            full = all(m == len(rng) - 1 for m, rng in zip(choice, ranges))
            if full and enabled and not got:
                raise ModelError(f"{self.name}: matching more disables rank {r}'s next "
                                 f"statement")
            enabled = enabled or bool(got)
            prefix = "; ".join(labels) + "; " if labels else ""
            out.extend((prefix + label, nxt, forced and full) for label, nxt, forced in got)
        return out

    def _rank(self, state, r: int) -> List[tuple]:
        pc, k = state[self.pc[r]], state[self.k[r]]
        if pc == PUT and self.drop == (r, k):
            return [self._drop(state, list(state), r, k)]
        if pc == PUT:
            s = list(state)
            self._complete(s, r)
            st = 0
            # the first stage no send reads that is not the newest (refill-in-flight:
            # the first that is not the newest)
            while (self._refs(s, r, st) and self.variant != "refill-in-flight") \
                    or st == s[self.newest[r]]:
                st += 1
            if self._refs(s, r, st):
                self.note(s, "stage", f"rank {r} refills stage {st} with version "
                                                f"{k} while a send from it is in flight")
            if self.variant == "refill-in-flight":
                s[self.stage[r, st]] = (k, s[self.stage[r, st]][1])
                s[self.newest[r]] = st
                s[self.pc[r]] = FILL
                return [(f"rank {r}: put {k}: the payload into stage {st}", tuple(s), True)]
            s[self.stage[r, st]] = (k, k)
            s[self.newest[r]] = st
            return [self._sends(s, r, k, st)]
        if pc == FILL:
            s = list(state)
            st = state[self.newest[r]]
            s[self.stage[r, st]] = (k, k)
            return [self._sends(s, r, k, st)]
        if pc == READ0:
            out = []
            for s, notes in self._pump(state, r):
                for w in self.ins[r]:
                    b = s[self.cur[w, r]]
                    payload, version = s[self.buf[w, r, b]]
                    s[self.use[w, r]] = (b, version, payload)
                s[self.pc[r]] = READ
                out.append((f"rank {r}: reduce {k} begins" + _notes(notes) + ", reads "
                            + ", ".join(f"version {s[self.use[w, r]][1]} of rank {w}"
                                        for w in self.ins[r]), tuple(s), True))
            return out
        if pc == READ:
            s = list(state)
            for w in self.ins[r]:
                b, version, payload = state[self.use[w, r]]
                s[self.use[w, r]] = ()
                now = state[self.buf[w, r, b]]
                if version and (payload != version or now != (payload, version)):
                    self.note(s, "version",
                              f"rank {r} reduced rank {w}'s slot as version {version} but its "
                              f"payload was version {payload} when the pass began and "
                              f"{now[0]} when it ended: silently reduced")
            if k == self.settle_after:
                s[self.pc[r]] = MID
            elif k < self.iterations:
                s[self.pc[r]] = PUT
                s[self.k[r]] = k + 1
            else:
                s[self.pc[r]] = FINAL if self.final_wait else SETTLE
            return [(f"rank {r}: reduce {k} ends", tuple(s), True)]
        if pc in (MID, SETTLE):
            out = []
            for s, notes in self._pump(state, r):
                self._deliver(s, r, notes)
                if pc == MID:
                    s[self.pc[r]] = PUT if k < self.iterations else (
                        FINAL if self.final_wait else SETTLE)
                    s[self.k[r]] = min(k + 1, self.iterations)
                    what = "Exchange.settle()"
                else:
                    s[self.pc[r]] = ARRIVE
                    what = "free(): settle_all"
                out.append((f"rank {r}: {what}" + _notes(notes), tuple(s), True))
            return out
        if pc == FINAL:
            out = []
            for s, notes in self._pump(state, r):
                if all(s[self.notify[w, r]] >= self.iterations for w in self.ins[r]):
                    s[self.pc[r]] = SETTLE
                    out.append((f"rank {r}: every in-neighbour's version "
                                f"{self.iterations} arrived" + _notes(notes), tuple(s), True))
                elif tuple(s) != state:
                    out.append((f"rank {r}: waiting for the last versions, pumps"
                                + _notes(notes), tuple(s), True))
            return out
        if pc == ARRIVE:
            if all(state[p] in (ARRIVE, FREE, ALLREDUCE, ALLTOALL, WAITALL, EXIT)
                   for p in self.pc):
                s = list(state)
                s[self.pc[r]] = FREE if self.tail == "free" else EXIT
                return [(f"rank {r}: every rank arrived, free() goes on", tuple(s), True)]
            if self.variant == "settle-once" or self.variant == "no-deliver":
                return []
            out = []
            for s, notes in self._pump(state, r):
                self._deliver(s, r, notes)
                if tuple(s) != state:
                    out.append((f"rank {r}: waiting in free()'s collective, pumps"
                                + _notes(notes), tuple(s), True))
            return out
        return self._free(state, r) if self.drain else []

    def _free(self, state, r: int) -> List[tuple]:
        """SlotWindow.free(): settle_all, MPI_Allreduce, _drain, the memory released."""
        pc = state[self.pc[r]]
        if pc == FREE:
            out = []
            for s, notes in self._pump(state, r):
                self._deliver(s, r, notes)
                s[self.pc[r]] = ALLREDUCE
                out.append((f"rank {r}: free(): settle_all" + _notes(notes), tuple(s), True))
            return out
        s = list(state)
        if pc == ALLREDUCE:
            if not self._all_past(state, ALLREDUCE):
                return []
            if self.variant == "no-drain":
                return [self._release(state, s, r, "MPI_Allreduce done; no drain")]
            s[self.pc[r]] = ALLTOALL
            return [(f"rank {r}: MPI_Allreduce done; _drain", tuple(s), True)]
        if pc == ALLTOALL:
            if not self._all_past(state, ALLTOALL):
                return []
            notes = []
            for w in self.ins[r]:
                # _drain_sender: the two posted receives, the earlier posted first (the
                # completed ones were); missing < 2: cancel the second, < 1: the first
                missing = state[self.sent[w, r]] - state[self.got[w, r]]
                order = [("done", b) for b in state[self.done[w, r]]] + \
                    [("posted", b) for b in state[self.recvs[w, r]]]
                cancel = [order[1]] if missing < 2 else []
                if missing < 1:
                    cancel.append(order[0])
                kept = tuple(b for b in state[self.recvs[w, r]] if ("posted", b) not in cancel)
                if kept != state[self.recvs[w, r]]:
                    notes.append(f"cancels {len(state[self.recvs[w, r]]) - len(kept)} "
                                 f"receive(s) for rank {w}")
                s[self.recvs[w, r]] = kept
                s[self.scratch[w, r]] = max(0, missing - 2)
                if missing > 2:
                    notes.append(f"{missing - 2} scratch receive(s) for rank {w}")
            s[self.pc[r]] = WAITALL
            return [(f"rank {r}: MPI_Alltoall of the counts done"
                     + (": " + "; ".join(notes) if notes else ""), tuple(s), True)]
        if pc == WAITALL:
            if any(state[self.recvs[w, r]] or state[self.scratch[w, r]] for w in self.ins[r]) \
                    or any(state[self.chan[r, j]] for j in self.outs[r]):
                return []
            return [self._release(state, s, r, "every request complete")]
        if pc == DROPPED:
            if self.variant == "destructor" or state[self.freed[r]] != LIVE \
                    or any(state[self.chan[r, j]] for j in self.outs[r]):
                return []
            s[self.freed[r]] = RELEASED
            return [(f"rank {r}: its leftovers' requests complete: their memory is freed",
                     tuple(s), False)]
        return []

    def _all_past(self, state, pc: int) -> bool:
        order = (FREE, ALLREDUCE, ALLTOALL, WAITALL, EXIT)
        return all(state[p] in order[order.index(pc):] for p in self.pc)

    def _release(self, state, s: list, r: int, why: str) -> tuple:
        """MPI_Comm_free and MPI_Free_mem: nothing may be in flight any more."""
        left = [f"a receive for rank {w}" for w in self.ins[r] if state[self.recvs[w, r]]]
        left += [f"its message to rank {j}" for j in self.outs[r] if state[self.chan[r, j]]]
        if left:
            self.note(s, "freed", f"rank {r} releases its memory and communicator with "
                                  + ", ".join(left) + " still in flight")
        s[self.freed[r]] = RELEASED
        s[self.pc[r]] = EXIT
        return (f"rank {r}: {why}: MPI_Comm_free, MPI_Free_mem", tuple(s), True)

    def _drop(self, state, s: list, r: int, k: int) -> tuple:
        """An exception leaves the Exchange before iteration k; the window is
        collected without free()."""
        s[self.pc[r]] = DROPPED
        if self.variant == "destructor":
            s[self.freed[r]] = HEAP_FREED
            return (f"rank {r}: raises before iteration {k}; its window's destructor frees "
                    f"its stages and spare buffers", tuple(s), True)
        for w in self.ins[r]:
            s[self.recvs[w, r]] = ()
        return (f"rank {r}: raises before iteration {k}; its window's destructor cancels "
                f"its receives and leaves its requests and memory to the leftovers",
                tuple(s), True)

    def _deliver(self, s: list, r: int, notes: list) -> None:
        """_settle's second half: every waiting channel gets the newest stage on its
        first request if free, else on its second."""
        if self.variant == "no-deliver":
            return
        for j in self.outs[r]:
            if not s[self.pending[r, j]]:
                continue
            busy = s[self.busy[r, j]]
            if busy[0] == NONE:
                self._send(s, r, j, 0)
                notes.append(f"the newest to rank {j} (first request)")
            elif busy[1] == NONE:
                self._send(s, r, j, 1)
                notes.append(f"the newest to rank {j} (second request)")

    def _sends(self, s: list, r: int, k: int, st: int) -> tuple:
        sent, held = [], []
        for j in self.outs[r]:
            s[self.pending[r, j]] = 0
            if s[self.busy[r, j]] != (NONE, NONE):
                s[self.pending[r, j]] = 1
                held.append(j)
            else:
                self._send(s, r, j, 0)
                sent.append(j)
        s[self.pc[r]] = READ0
        how = "MPI_Isend" if self.variant == "isend" else "MPI_Issend"
        where = (f"the trailer of {k} into stage {st}" if self.variant == "refill-in-flight"
                 else f"{k} into stage {st}")
        return (f"rank {r}: put {where}, {how} to ranks {_names(sent)}"
                + (f", waiting: {_names(held)}" if held else ""), tuple(s), True)


def _notes(notes) -> str:
    return (" (pump: " + "; ".join(notes) + ")") if notes else ""


def _names(ranks) -> str:
    return ", ".join(str(r) for r in sorted(ranks)) or "none"
