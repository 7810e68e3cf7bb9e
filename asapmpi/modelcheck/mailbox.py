"""Hop and BSP on the mailbox (asapmpi/_core/mailbox.pxi, MailboxWindow; docs/PROTOCOL.md
section 2d), and free()'s drain (_drain) or a window dropped without it (_leave): the
slots and words of a window, fed by two-sided messages that the reader's own waits
complete ("pump").

Writer s, put(k) (_send):
  SEND   _wait_stage: stage = mb_stage_next; wait (pumping) until every send from it
         completed; _mark_suppressed (backup / staleness: skip an out-neighbour whose
         ack word says it cannot use k); _fill_stage: the payload copied into the stage
  POST   the trailer {k} copied after it, then MPI_Isend(stage, tag k mod depth) to
         every out-neighbour not skipped; the next stage.  (SEND and POST are one action
         unless the variant refills a stage in flight: only then can a send read a
         stage between the two copies; the property `stage` checks that it never does)
Reader r:
  _open  per in-neighbour and slot d: _post_slot (notify, header, footer := 0, then
         MPI_Irecv(slot, tag d)); per out-neighbour a token receive
  pump   (every wait: Waits.local, Waits._count, newest_versions, the reduce's first
         statement, _wait_stage and the barrier's polls): every receive MPI completed
         is stamped (_arrived: footer, header and notify := the trailer's version);
         every token that arrived raises the ack word (max) and its receive is
         reposted; then send_tokens (below)
Hop, iteration k of rank r (asapmpi/sync/hop.py):
  RECV   standard: wait_notifies(k), then reduce(require_all); backup b: wait until
         n_in - b notifies == k, then reduce(only_notified): the slots whose notify is
         not k are not read; staleness s: wait_newest(k, max(k - s, 1)) (newest notify
         <= k over the slots), then reduce_versions of those.  One action: the wait's
         last pump, the reduce's pump, its loads of footer and header
  READ   the reduce's end (header loaded again; the payload read must be the version)
  ENTER  wait_acks(k - max_gap, at least) (pumping), then ack(k): tok_next := k for
         every in-neighbour, send_tokens, _repost(k - retain) (every slot holding a
         version <= k - retain: its receive is posted again, words zeroed)
  send_tokens: per in-neighbour, tok_next leaves (MPI_Isend) only when the token sent
         before it completed (one in flight per neighbour; tokens are counters); else
         it is held back
BSP, step k (asapmpi/sync/baselines.py): SEND, POST (put(k, seqlock, no notify)),
  BARRIER (MPI_Ibarrier, polled: pumps), WAIT (wait_delivered(k) = wait_notifies(k)),
  READ0/READ (reduce(k, seqlock, renormalize): loads every in-neighbour's slot), then
  RELEASE (release(k): _repost(k)).
After the last iteration, Exchange.free(): SETTLE (collectives.arrive begins with
  settle_all: a mailbox's _settle sends the tokens it holds back, as the variant says),
  ARRIVE (a barrier of all ranks, polled: MPI progresses, receives are matched; no pump
  of the window).  With tail="free" SlotWindow.free() follows: FREE (settle_all again),
  ALLREDUCE (a blocking collective), DRAIN (_drain: send_tokens; the MPI_Alltoall of
  how many updates per tag and tokens each rank sent each other; per slot and token
  receive, `missing` = sent - received: the posted receive takes the first still to
  come, a scratch receive each of the rest, a receive nothing will match is
  cancelled), WAITALL (MPI_Wait on every receive, scratch receive and send), RELEASE
  (MPI_Comm_free, MPI_Free_mem).
A dropped window (option drop=(rank, iteration): that rank raises before iteration
  `iteration` and its window is collected; the others go on): _leave cancels its
  receives (a receive MPI already matched completes instead), keeps its sends, and its
  memory is freed only once every request completed (the leftovers).

MPI: a slot's posted receive is matched with the oldest message of its tag from its
sender (a message's contents are the stage's when it is matched: an MPI may read a
send buffer until the send completes); a send completes when matched (the worst case:
what rendezvous and synchronous modes do; an eager MPI completes it earlier, which only
lets the writer go on sooner); a token receive likewise.  Matching on demand (below).

Variants:
  correct              tokens held back leave from any wait of the rank, the
                       collective's polls included (every wait pumps every live
                       mailbox's tokens held back): the code since the collectives'
                       polls call slotwin.release_all()
  tokens-own-pump      before a407441: they leave only on their own window's pump or
                       ack; a rank that waits elsewhere (free()'s collective) keeps them
  tokens-settle-once   settle_all sends them if the token before has left, once
  tokens-settle-waits  the code from 29bc8eb until then: settle_all's _settle pumps until they
                       left, for a second at most, then goes on (a forced give-up)
  refill-in-flight     _send skips _wait_stage: a stage is refilled while in flight
                       (option stages: fewer staging buffers than max(2, depth))
  release-before-reduce  (BSP) release(k) before the reduce
  token-ahead          ack(k) sends k + 1: a token that counts the iteration entered,
                       not the one completed
  no-drain             (tail free) free() releases the memory without _drain
  destructor           (drop) before a407441: the destructor frees the stages and token
                       buffers while their requests are in flight (the window's own
                       memory, MPI_Alloc_mem'd, leaked)
"""
from __future__ import annotations

from itertools import product
from typing import List, Optional

from ..reduce.graphs import Graph
from .model import Model, Violation
from .onesided import ModelError

(SEND, POST, RECV, READ, ENTER, BARRIER, WAIT, RELEASE, READ0, SETTLE, ARRIVE, FREE,
 ALLREDUCE, ALLTOALL, WAITALL, DROPPED, EXIT) = range(17)
PHASES = {SEND: "waits for a free stage to send", POST: "fills its stage with",
          RECV: "waits for the updates of", READ: "reduces", ENTER: "waits for the tokens after",
          BARRIER: "waits in the barrier of", WAIT: "waits for the updates of",
          RELEASE: "releases", READ0: "starts the reduce of",
          SETTLE: "settles before free()'s collective after",
          ARRIVE: "waits in free()'s collective after", FREE: "settles in free() after",
          ALLREDUCE: "waits in free()'s MPI_Allreduce after",
          ALLTOALL: "waits in the drain's MPI_Alltoall after",
          WAITALL: "waits for its requests in the drain after",
          DROPPED: "dropped its window in", EXIT: "has left after"}
VARIANTS = ("correct", "tokens-own-pump", "tokens-settle-once", "tokens-settle-waits",
            "refill-in-flight", "release-before-reduce", "token-ahead", "no-drain",
            "destructor")
POLICIES = ("hop", "bsp")
#: a slot's receive: posted (MPI may write it), matched (written, complete, not yet
#: pumped: words still 0), held (stamped: notify == header == footer == its version),
#: cancelled (complete, nothing written)
POSTED, MATCHED, HELD, CANCELLED = 0, 1, 2, 3
#: a rank's memory: in use, released (free(), or the leftovers once complete), or its
#: heap buffers (stages, token buffers) released under their requests (destructor)
LIVE, RELEASED, HEAP_FREED = 0, 1, 2


class MailboxModel(Model):
    """Hop (standard, backup, staleness) or BSP over a MailboxWindow."""

    final_pc = EXIT

    def __init__(self, graph: Graph, iterations: int, policy: str = "hop",
                 max_gap: int = 1, backup: int = 0, staleness: Optional[int] = None,
                 suppress_late: bool = True, variant: str = "correct",
                 tail: str = "arrive", drop: Optional[tuple] = None,
                 matching: str = "demand", stages: Optional[int] = None,
                 properties=("overlap", "version", "error", "gap", "stage", "deadlock"),
                 symmetry: bool = True):
        if policy not in POLICIES:
            raise ValueError(f"policy {policy!r} not in {POLICIES}")
        if variant not in VARIANTS:
            raise ValueError(f"variant {variant!r} not in {VARIANTS}")
        if variant == "release-before-reduce" and policy != "bsp":
            raise ValueError("release-before-reduce is a BSP variant")
        if backup and staleness is not None:
            raise ValueError("backup workers or staleness, not both (as hop.py)")
        if matching not in ("demand", "spontaneous"):
            raise ValueError(f"matching {matching!r} not in ('demand', 'spontaneous')")
        if tail not in ("arrive", "free"):
            raise ValueError(f"tail {tail!r} not in ('arrive', 'free')")
        if variant == "no-drain" and tail != "free":
            raise ValueError("no-drain needs tail='free'")
        if variant == "destructor" and drop is None:
            raise ValueError("destructor needs a dropped window (drop=(rank, iteration))")
        if drop is not None and not (0 <= drop[0] < graph.n and 1 <= drop[1] <= iterations):
            raise ValueError(f"drop {drop}: a rank and an iteration of the run")
        if backup and backup >= min(graph.in_degree(r) for r in range(graph.n)):
            raise ValueError("backup must be smaller than every in-degree")
        super().__init__(graph, iterations, properties, symmetry)
        self.name = "drain" if tail == "free" or drop is not None else f"{policy}-messages"
        self.policy, self.variant = policy, variant
        self.hop = policy == "hop"
        self.max_gap, self.backup, self.staleness = max_gap, backup, staleness
        self.useless = None         # hop.py _useless_after (None: never suppressed)
        if self.hop and suppress_late and backup:
            self.useless = 0
        elif self.hop and suppress_late and staleness is not None:
            self.useless = staleness
        # hop.py: depth max_gap + 1 + s, retain s; BSP: depth 1, retain 0
        self.depth = max_gap + 1 + (staleness or 0) if self.hop else 1
        self.retain = (staleness or 0) if self.hop else 0
        # mailbox.pxi _prepare: max(2, depth) staging buffers (the option: fewer)
        self.stages = stages if stages is not None else max(2, self.depth)
        if self.stages < 1:
            raise ValueError(f"stages must be at least 1, got {stages}")
        self.split_fill = variant == "refill-in-flight"
        # where tokens held back leave besides the window's own pump and ack
        self.tokens = {"tokens-own-pump": "own-pump", "tokens-settle-once": "settle-once",
                       "tokens-settle-waits": "settle-waits"}.get(variant, "any-wait")
        self.tail, self.drop, self.matching = tail, drop, matching
        self.drain = tail == "free" or drop is not None
        if self.drain and symmetry and drop is not None:
            self.symmetry = False       # the dropped rank is not like the others
        c = self.cells
        self.pc = [c.add("pc", (r,)) for r in range(self.n)]
        self.k = [c.add("k", (r,), default=1) for r in range(self.n)]
        self.stnext = [c.add("stage next", (r,)) for r in range(self.n)]
        # per stage: (payload version, trailer version) as the stage holds them now
        self.stage = {(r, st): c.add("stage", (r,), (st,), default=(0, 0))
                      for r in range(self.n) for st in range(self.stages)}
        self.bar = [c.add("barriers", (r,)) for r in range(self.n)] if not self.hop else []
        self.slot, self.msgs, self.use = {}, {}, {}
        self.tokflight, self.toknext, self.tokin, self.ack = {}, {}, {}, {}
        for s, r in self.edges:
            self.use[s, r] = c.add("use", (s, r), default=())
            for d in range(self.depth):
                # r's slot d for s: (receive state, payload version, trailer version)
                self.slot[s, r, d] = c.add("slot", (s, r), (d,), default=(POSTED, 0, 0))
                # s's messages of tag d to r not yet matched: their stages, oldest first
                self.msgs[s, r, d] = c.add("messages", (s, r), (d,), default=())
            if self.hop:
                # tokens go from r to its in-neighbour s
                self.tokflight[s, r] = c.add("token in flight", (s, r))
                self.toknext[s, r] = c.add("token held back", (s, r))
                # s's token receive for r: 0 posted, v matched (not yet pumped), -1
                # cancelled
                self.tokin[s, r] = c.add("token matched", (s, r))
                self.ack[s, r] = c.add("ack word", (s, r))
        # free()'s drain: messages sent and received (pumped) per edge and tag (tag
        # depth: tokens, counted on the edge they go against), scratch receives posted
        self.sent, self.got, self.scratch = {}, {}, {}
        self.freed = []
        if self.drain:
            self.freed = [c.add("memory", (r,)) for r in range(self.n)]
            for s, r in self.edges:
                for d in range(self.depth + self.hop):
                    self.sent[s, r, d] = c.add("sent", (s, r), (d,))
                    self.got[s, r, d] = c.add("got", (s, r), (d,))
                    self.scratch[s, r, d] = c.add("scratch", (s, r), (d,))

    # ------------------------------------------------------------------ helpers

    def notify(self, state, s: int, r: int, d: int) -> int:
        """The notify word (and header, footer) of r's slot d for s."""
        st, _, version = state[self.slot[s, r, d]]
        return version if st == HELD else 0

    def stage_busy(self, state, r: int, st: int) -> bool:
        """Whether a send from r's stage st is in flight (not matched yet)."""
        return any(st in state[self.msgs[r, j, d]] for j in self.outs[r]
                   for d in range(self.depth))

    def pump(self, state, s: list, r: int) -> bool:
        """_pump of rank r into the next state s: stamp the receives MPI completed,
        raise the ack words by the tokens that arrived and repost their receives, then
        send_tokens.  Returns whether anything changed."""
        changed = False
        for i in self.ins[r]:
            for d in range(self.depth):
                st, payload, version = s[self.slot[i, r, d]]
                if st == MATCHED:
                    s[self.slot[i, r, d]] = (HELD, payload, version)
                    if self.drain:
                        s[self.got[i, r, d]] += 1
                    changed = True
        if self.hop:
            for j in self.outs[r]:
                got = s[self.tokin[r, j]]
                if got > 0:
                    s[self.ack[r, j]] = max(s[self.ack[r, j]], got)
                    s[self.tokin[r, j]] = 0
                    if self.drain:
                        s[self.got[r, j, self.depth]] += 1
                    changed = True
            changed |= self.send_tokens(s, r)
        return changed

    def send_tokens(self, s: list, r: int) -> bool:
        """send_tokens: every token held back whose channel is free leaves."""
        changed = False
        for i in self.ins[r]:
            if s[self.toknext[i, r]] and not s[self.tokflight[i, r]]:
                s[self.tokflight[i, r]] = s[self.toknext[i, r]]
                s[self.toknext[i, r]] = 0
                if self.drain:
                    s[self.sent[i, r, self.depth]] += 1
                changed = True
        return changed

    def repost(self, s: list, r: int, upto: int) -> None:
        """_repost(upto): every slot holding a version in 1..upto is posted again."""
        for i in self.ins[r]:
            for d in range(self.depth):
                st, _, version = s[self.slot[i, r, d]]
                if st == HELD and 0 < version <= upto:
                    s[self.slot[i, r, d]] = (POSTED, 0, 0)

    # ------------------------------------------------------------------ properties

    def violation(self, state) -> Optional[Violation]:
        if "overlap" in self.properties:
            for (s, r), use in self.use.items():
                if state[use]:
                    v, d, _ = state[use]
                    if state[self.slot[s, r, d]][0] != HELD:
                        return ("overlap", f"rank {r} reads version {v} in its slot {d} for "
                                           f"rank {s} while a receive into it is posted")
        bad = super().violation(state)
        if bad:
            return bad
        if self.hop:
            return self.gap_violation(state, self.k, self.max_gap)
        return self.gap_violation(state, self.k, 1, both_ways=True)

    def measure(self, state) -> dict:
        """The widest gap, the most messages of one edge unmatched, the most tokens
        held back at once."""
        out = {"gap": max(state[self.k[i]] - state[self.k[j]] for i, j in self.edges),
               "unmatched": max(sum(len(state[self.msgs[s, r, d]])
                                    for d in range(self.depth)) for s, r in self.edges)}
        if self.hop:
            out["held back"] = sum(1 for c in self.toknext.values() if state[c])
        return out

    def waiting(self, state, r: int) -> str:
        pc, k = state[self.pc[r]], state[self.k[r]]
        shown = min(k, self.iterations) if pc >= SETTLE else k
        what = f"rank {r} {PHASES[pc]} {'iteration' if self.hop else 'step'} {shown}"
        if pc in (RECV, WAIT):
            what += " (notifies: " + ", ".join(
                f"rank {i} = {self.notify(state, i, r, k % self.depth)}"
                for i in self.ins[r]) + ")"
        elif pc == ENTER:
            what += (f" (needs >= {k - self.max_gap}; ack words: " + ", ".join(
                f"rank {j} = {state[self.ack[r, j]]}" for j in self.outs[r]) + ")")
        elif pc == SEND:
            what += f" (stage {state[self.stnext[r]]} in flight)"
        if self.hop:
            held = [f"{state[self.toknext[i, r]]} for rank {i}" for i in self.ins[r]
                    if state[self.toknext[i, r]]]
            if held:
                what += ", tokens held back: " + ", ".join(held)
        return what

    # ------------------------------------------------------------------ transitions

    def successors(self, state) -> List[tuple]:
        out = []
        if self.matching == "spontaneous":
            for r in range(self.n):
                out.extend(self._rank(state, r))
            return out + self._spontaneous(state)
        for r in range(self.n):
            out.extend(self._on_demand(state, r))
        if self.drain:
            out.extend(self._unobserved(state))
        return out

    def _spontaneous(self, state) -> List[tuple]:
        """matching="spontaneous": every match MPI may make now, a transition of its own
        (forced: a polling rank's MPI makes it), to cross-check matching on demand."""
        keys = [("u", w, r, d) for w, r in self.edges for d in range(self.depth)
                if self._can_u(state, w, r, d)]
        if self.hop:
            keys += [("t", i, r) for i, r in self.edges if self._can_t(state, i, r)]
        out = []
        for key in keys:
            s = list(state)
            label = self._match(s, key)
            out.append((label, tuple(s), True))
        return out

    # Matching on demand: a message (or token) whose receive is posted may be matched
    # by MPI at any moment.  A match commutes with every action that neither reads its
    # slot nor the sender's stage and request, so it is taken as part of the first
    # action that does: the reader's pump, the writer's stage wait (its send
    # completed), the sender's send_tokens; that action is explored once for every
    # choice of which of the matchable messages were matched by then.  Every choice
    # is a real run; the one matching all of them is forced (MPI matches a posted
    # receive of a polling rank), and matching more never disables what matching less
    # enabled (checked: ModelError).  A match that touches released memory, or a rank
    # whose window was dropped, is also a transition of its own (nobody may observe
    # it, and it is what the property `freed` is about).

    def _can_u(self, state, w: int, r: int, d: int) -> bool:
        return bool(state[self.msgs[w, r, d]]) and (
            state[self.slot[w, r, d]][0] == POSTED
            or (self.drain and state[self.scratch[w, r, d]] > 0))

    def _can_t(self, state, i: int, r: int) -> bool:
        return bool(state[self.tokflight[i, r]]) and (
            state[self.tokin[i, r]] == 0
            or (self.drain and state[self.scratch[i, r, self.depth]] > 0))

    def _keys(self, state, r: int) -> List[tuple]:
        """The matches rank r's next statement observes: those whose timing its
        outcome depends on (a match no statement observes yet is taken later)."""
        pc, k = state[self.pc[r]], state[self.k[r]]
        keys: List[tuple] = []
        dropping = self.drop == (r, k) and pc == SEND
        leftover = pc == DROPPED and self.freed and state[self.freed[r]] == LIVE
        if pc in (SEND, POST) and not dropping:     # the stage's sends complete
            st = state[self.stnext[r]]
            keys += [("u", r, j, d) for j in self.outs[r] for d in range(self.depth)
                     if state[self.msgs[r, j, d]][:1] == (st,) and self._can_u(state, r, j, d)]
        if pc in (WAITALL,) or leftover:            # every send completes
            keys += [("u", r, j, d) for j in self.outs[r] for d in range(self.depth)
                     if self._can_u(state, r, j, d)]
        # the updates a pump stamps for this statement: the slots its wait or reduce
        # reads (all of them before ack's repost, which reads every slot; a dropped
        # window's cancel races with MPI's matches; the drain waits for all)
        if pc in (ENTER, WAITALL) or dropping or (pc == RECV and self.staleness is not None):
            slots = range(self.depth)
        elif pc == RECV:
            slots = (k % self.depth,)
        elif pc in (WAIT, READ0):
            slots = (0,)
        else:
            slots = ()
        keys += [("u", i, r, d) for i in self.ins[r] for d in slots
                 if self._can_u(state, i, r, d)]
        if self.hop:
            if pc in (ENTER, WAITALL) or dropping:  # the tokens it waits for
                keys += [("t", r, j) for j in self.outs[r] if self._can_t(state, r, j)]
            # send_tokens (every pump, ack, and the collective's settle and polls):
            # whether the token before one held back has left; the drain's and a
            # dropped window's sends complete
            keys += [("t", i, r) for i in self.ins[r] if self._can_t(state, i, r)
                     and ((state[self.toknext[i, r]]
                           and pc in (SEND, RECV, SETTLE, ARRIVE, FREE, ALLREDUCE))
                          or pc in (ENTER, WAITALL) or leftover)]
        return keys

    def _match(self, s: list, key: tuple) -> str:
        """Apply match `key` to the state under construction; its label."""
        if key[0] == "u":
            _, w, r, d = key
            queue = s[self.msgs[w, r, d]]
            payload, version = s[self.stage[w, queue[0]]]
            s[self.msgs[w, r, d]] = queue[1:]
            if self.drain and s[self.freed[w]] != LIVE:
                self.note(s, "freed", f"MPI reads rank {w}'s stage {queue[0]} for its send "
                                      f"to rank {r} after rank {w} released it")
            if s[self.slot[w, r, d]][0] != POSTED:
                s[self.scratch[w, r, d]] -= 1
                return (f"MPI matches rank {r}'s scratch receive (tag {d}) with rank {w}'s "
                        f"message from stage {queue[0]} (version {version})")
            s[self.slot[w, r, d]] = (MATCHED, payload, version)
            if self.drain and s[self.freed[r]] == RELEASED:
                self.note(s, "freed", f"MPI writes rank {w}'s update {version} into rank "
                                      f"{r}'s slot {d} after rank {r} released it")
            return (f"MPI matches rank {r}'s receive of slot {d} with rank {w}'s message "
                    f"from stage {queue[0]} (trailer {version}" +
                    (f", payload {payload})" if payload != version else ")"))
        _, i, r = key
        value = s[self.tokflight[i, r]]
        s[self.tokflight[i, r]] = 0
        if self.drain and s[self.freed[r]] != LIVE:
            self.note(s, "freed", f"MPI reads rank {r}'s token buffer for rank {i} after "
                                  f"rank {r} released it")
        if s[self.tokin[i, r]] != 0:
            s[self.scratch[i, r, self.depth]] -= 1
            return f"MPI matches rank {i}'s scratch token receive with rank {r}'s token {value}"
        s[self.tokin[i, r]] = value
        if self.drain and s[self.freed[i]] != LIVE:
            self.note(s, "freed", f"MPI writes rank {r}'s token {value} into rank {i}'s "
                                  f"token buffer after rank {i} released it")
        return f"MPI matches rank {i}'s token receive with rank {r}'s token {value}"

    def _unobserved(self, state) -> List[tuple]:
        """Matches that touch a dropped window or released memory, on their own."""
        gone = [r for r in range(self.n)
                if state[self.pc[r]] in (DROPPED, EXIT) or state[self.freed[r]] != LIVE]
        if not gone:
            return []
        out = []
        keys = [("u", w, r, d) for w, r in self.edges for d in range(self.depth)
                if (w in gone or r in gone) and self._can_u(state, w, r, d)]
        if self.hop:
            keys += [("t", i, r) for i, r in self.edges
                     if (i in gone or r in gone) and self._can_t(state, i, r)]
        for key in keys:
            s = list(state)
            label = self._match(s, key)
            out.append((label, tuple(s), False))
        return out

    def _on_demand(self, state, r: int) -> List[tuple]:
        keys = self._keys(state, r)
        if not keys:
            return self._rank(state, r)
        out, enabled = [], False
        for choice in product((False, True), repeat=len(keys)):
            s = list(state)
            labels = [self._match(s, key) for key, on in zip(keys, choice) if on]
            got = self._rank(tuple(s), r)
            full = all(choice)
            if full and enabled and not got:
                raise ModelError(f"{self.name}: matching more disables rank {r}'s next "
                                 f"statement")
            enabled = enabled or bool(got)
            prefix = "; ".join(labels) + "; " if labels else ""
            out.extend((prefix + label, nxt, forced and full) for label, nxt, forced in got)
        return out

    def _waits(self, state, s: list, r: int, satisfied: bool, what: str) -> List[tuple]:
        """An unsatisfied wait: a pump, if it changes anything."""
        if satisfied:
            return []
        if self.pump(state, s, r):
            return [(f"rank {r}: waiting for {what}, pumps", tuple(s), True)]
        return []

    def _rank(self, state, r: int) -> List[tuple]:
        pc, k = state[self.pc[r]], state[self.k[r]]
        s = list(state)
        if pc == SEND and self.drop == (r, k):
            return [self._drop(state, s, r, k)]
        if pc == SEND:
            st = state[self.stnext[r]]
            if self.variant != "refill-in-flight" and self.stage_busy(state, r, st):
                return self._waits(state, s, r, False, f"the sends from stage {st}")
            if self.stage_busy(state, r, st):
                self.note(s, "stage", f"rank {r} refills stage {st} with version "
                                                f"{k} while a send from it is in flight")
            skipped = []
            for j in self.outs[r]:
                if self.useless is not None and state[self.ack[r, j]] >= k + self.useless:
                    skipped.append(j)
            s[self.stage[r, st]] = (k, state[self.stage[r, st]][1])
            if self.split_fill:
                s[self.pc[r]] = POST
                return [(f"rank {r}: put {k}: the payload into stage {st}", tuple(s), True)]
            return [self._post(state, s, r, k, st, skipped)]
        if pc == POST:
            st = state[self.stnext[r]]
            skipped = [j for j in self.outs[r] if self.useless is not None
                       and state[self.ack[r, j]] >= k + self.useless]
            return [self._post(state, s, r, k, st, skipped)]
        if pc == RECV:
            return self._hop_recv(state, s, r, k)
        if pc == READ:
            return [self._end(state, s, r, k)]
        if pc == ENTER:
            self.pump(state, s, r)
            if not all(s[self.ack[r, j]] >= k - self.max_gap for j in self.outs[r]):
                return self._waits(state, list(state), r, False,
                                   f"tokens >= {k - self.max_gap}")
            token = k + 1 if self.variant == "token-ahead" else k
            for i in self.ins[r]:
                s[self.toknext[i, r]] = max(s[self.toknext[i, r]], token)
            self.send_tokens(s, r)
            self.repost(s, r, k - self.retain)
            label = (f"rank {r}: tokens >= {k - self.max_gap} seen; ack({k}): token "
                     f"{token} to ranks {_names(self.ins[r])}")
            held = [i for i in self.ins[r] if s[self.toknext[i, r]]]
            if held:
                label += f" (held back for {_names(held)}: one in flight)"
            return [self._next(s, r, k, label + f", repost slots <= {k - self.retain}")]
        if pc == BARRIER:
            if all(b >= k for b in (state[x] for x in self.bar)):
                s[self.pc[r]] = WAIT
                return [(f"rank {r}: barrier {k} complete", tuple(s), True)]
            return self._waits(state, s, r, False, f"the barrier of step {k}")
        if pc == WAIT:
            self.pump(state, s, r)
            if not all(self.notify(s, i, r, 0) == k for i in self.ins[r]):
                return self._waits(state, list(state), r, False, f"the updates of {k}")
            s[self.pc[r]] = RELEASE if self.variant == "release-before-reduce" else READ0
            return [(f"rank {r}: wait_delivered({k}) complete", tuple(s), True)]
        if pc == RELEASE:
            self.repost(s, r, k)
            if self.variant == "release-before-reduce":
                s[self.pc[r]] = READ0
                return [(f"rank {r}: release({k}) (before its reduce): repost its slots",
                         tuple(s), True)]
            return [self._next(s, r, k, f"rank {r}: release({k}): repost its slots")]
        if pc == READ0:
            self.pump(state, s, r)
            return [self._begin(state, s, r, k, self.ins[r], dict.fromkeys(self.ins[r], k),
                                "reduce")]
        if pc in (SETTLE, FREE):
            return self._settle(state, s, r, ARRIVE if pc == SETTLE else ALLREDUCE)
        if pc == ARRIVE:
            return self._arrive(state, s, r)
        if pc == ALLREDUCE:
            if not self._all_past(state, ALLREDUCE):
                return self._poll_tokens(state, s, r, "free()'s MPI_Allreduce")
            if self.variant == "no-drain":
                return [self._release(state, s, r, "MPI_Allreduce done; no drain")]
            # _drain: _forget_mailbox, the tokens still held back go (send_tokens)
            if self.hop:
                self.send_tokens(s, r)
            s[self.pc[r]] = ALLTOALL
            return [(f"rank {r}: MPI_Allreduce done; _drain: send_tokens", tuple(s), True)]
        if pc == ALLTOALL:
            if not self._all_past(state, ALLTOALL):
                return []
            return [self._drain_plan(state, s, r)]
        if pc == WAITALL:
            if not self._drained(state, r):
                return []
            return [self._release(state, s, r, "every request complete")]
        if pc == DROPPED:
            if self.variant == "destructor" or state[self.freed[r]] != LIVE:
                return []
            if any(state[self.msgs[r, j, d]] for j in self.outs[r] for d in range(self.depth)) \
                    or (self.hop and any(state[self.tokflight[i, r]] for i in self.ins[r])):
                return []
            s[self.freed[r]] = RELEASED
            return [(f"rank {r}: its leftovers' requests complete: their memory is freed",
                     tuple(s), False)]
        return []

    # ------------------------------------------------------------------ free()

    def _settle(self, state, s: list, r: int, then: int) -> List[tuple]:
        """settle_all (collectives.arrive's, free()'s): a mailbox's _settle sends the
        tokens it holds back, as the variant says."""
        s[self.pc[r]] = then
        what = "collectives.arrive: settle_all" if then == ARRIVE else "free(): settle_all"
        if not self.hop or self.tokens == "own-pump":
            return [(f"rank {r}: {what} (nothing of the mailbox)", tuple(s), True)]
        self.pump(state, s, r)
        held = [i for i in self.ins[r] if s[self.toknext[i, r]]]
        if not held or self.tokens != "settle-waits":
            return [(f"rank {r}: {what}" + (" sends the tokens held back" if held else ""),
                     tuple(s), True)]
        # _settle: pumps until they left, a second at most (the give-up, forced: the
        # second passes)
        x = list(state)
        self.pump(state, x, r)
        out = [(f"rank {r}: {what}: a token still held back for ranks {_names(held)} after "
                f"a second, goes on", tuple(s), True)]
        if tuple(x) != state:
            out.append((f"rank {r}: {what}: waits for the token before the one held back, "
                        f"pumps", tuple(x), True))
        return out

    def _all_past(self, state, pc: int) -> bool:
        order = (FREE, ALLREDUCE, ALLTOALL, WAITALL, EXIT)
        return all(state[p] in order[order.index(pc):] for p in self.pc)

    def _poll_tokens(self, state, s: list, r: int, where: str) -> List[tuple]:
        if self.hop and self.tokens == "any-wait" and self.send_tokens(s, r):
            return [(f"rank {r}: waiting in {where}, sends the tokens held back",
                     tuple(s), True)]
        return []

    def _drain_plan(self, state, s: list, r: int) -> tuple:
        """After the MPI_Alltoall of the counts: per slot (and token receive) the posted
        receive takes the first message still to come, a scratch receive each of the
        rest; a receive nothing will match is cancelled."""
        notes = []
        for i in self.ins[r]:
            for d in range(self.depth):
                missing = state[self.sent[i, r, d]] - state[self.got[i, r, d]]
                st = state[self.slot[i, r, d]][0]
                if st in (POSTED, MATCHED):         # mb_held == 0: its receive posted
                    if missing > 0:
                        missing -= 1
                    elif st == POSTED:
                        s[self.slot[i, r, d]] = (CANCELLED, 0, 0)
                        notes.append(f"cancels slot {d} of rank {i}")
                s[self.scratch[i, r, d]] = missing
                if missing:
                    notes.append(f"{missing} scratch receive(s) for tag {d} of rank {i}")
        if self.hop:
            for j in self.outs[r]:
                missing = state[self.sent[r, j, self.depth]] - state[self.got[r, j, self.depth]]
                if missing > 0:
                    missing -= 1
                elif state[self.tokin[r, j]] == 0:
                    s[self.tokin[r, j]] = -1
                    notes.append(f"cancels the token receive of rank {j}")
                s[self.scratch[r, j, self.depth]] = missing
                if missing:
                    notes.append(f"{missing} scratch token receive(s) for rank {j}")
        s[self.pc[r]] = WAITALL
        return (f"rank {r}: MPI_Alltoall of the counts done"
                + (": " + "; ".join(notes) if notes else ""), tuple(s), True)

    def _drained(self, state, r: int) -> bool:
        """Every MPI_Wait of the drain returned: receives, scratch receives, sends."""
        for i in self.ins[r]:
            for d in range(self.depth):
                if state[self.slot[i, r, d]][0] == POSTED or state[self.scratch[i, r, d]]:
                    return False
        for j in self.outs[r]:
            if any(state[self.msgs[r, j, d]] for d in range(self.depth)):
                return False
            if self.hop and (state[self.tokin[r, j]] == 0
                             or state[self.scratch[r, j, self.depth]]):
                return False
        return not (self.hop and any(state[self.tokflight[i, r]] for i in self.ins[r]))

    def _release(self, state, s: list, r: int, why: str) -> tuple:
        """MPI_Comm_free and MPI_Free_mem: nothing may be in flight any more."""
        left = [f"its receive of slot {d} for rank {i}" for i in self.ins[r]
                for d in range(self.depth) if state[self.slot[i, r, d]][0] == POSTED]
        left += [f"its message to rank {j} (tag {d})" for j in self.outs[r]
                 for d in range(self.depth) if state[self.msgs[r, j, d]]]
        if self.hop:
            left += [f"its token receive for rank {j}" for j in self.outs[r]
                     if state[self.tokin[r, j]] == 0]
            left += [f"its token to rank {i}" for i in self.ins[r]
                     if state[self.tokflight[i, r]]]
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
                    f"its stages and token buffers", tuple(s), True)
        for i in self.ins[r]:
            for d in range(self.depth):
                if s[self.slot[i, r, d]][0] == POSTED:
                    s[self.slot[i, r, d]] = (CANCELLED, 0, 0)
        for j in self.outs[r]:
            if self.hop and s[self.tokin[r, j]] == 0:
                s[self.tokin[r, j]] = -1
        return (f"rank {r}: raises before iteration {k}; its window's destructor cancels "
                f"its receives and leaves its requests and memory to the leftovers",
                tuple(s), True)

    def _post(self, state, s: list, r: int, k: int, st: int, skipped) -> tuple:
        s[self.stage[r, st]] = (state[self.stage[r, st]][0] if self.split_fill else k, k)
        sent = [j for j in self.outs[r] if j not in skipped]
        for j in sent:
            s[self.msgs[r, j, k % self.depth]] = (*state[self.msgs[r, j, k % self.depth]], st)
            if self.drain:
                s[self.sent[r, j, k % self.depth]] += 1
        s[self.stnext[r]] = (st + 1) % self.stages
        if self.hop:
            s[self.pc[r]] = RECV
        else:
            s[self.bar[r]] = k
            s[self.pc[r]] = BARRIER
        label = (f"rank {r}: put {k}: {'the trailer into ' if self.split_fill else ''}stage "
                 f"{st}, MPI_Isend (tag {k % self.depth}) to ranks {_names(sent)}")
        if skipped:
            label += f" (suppressed: {_names(skipped)})"
        if not self.hop:
            label += f"; MPI_Ibarrier {k}"
        return (label, tuple(s), True)

    def _hop_recv(self, state, s: list, r: int, k: int) -> List[tuple]:
        self.pump(state, s, r)
        d = k % self.depth
        if self.staleness is not None:
            low = max(k - self.staleness, 1)
            versions = {}
            for i in self.ins[r]:
                got = [self.notify(s, i, r, e) for e in range(self.depth)]
                versions[i] = max([v for v in got if v <= k] or [0])
            if min(versions.values(), default=k) < low:
                return self._waits(state, list(state), r, False,
                                   f"updates >= {low} (wait_newest)")
            return [self._begin(state, s, r, k, self.ins[r], versions, "reduce_versions")]
        arrived = [i for i in self.ins[r] if self.notify(s, i, r, d) == k]
        if len(arrived) < len(self.ins[r]) - self.backup:
            return self._waits(state, list(state), r, False, f"the notifies of {k}")
        inputs = arrived if self.backup else self.ins[r]
        return [self._begin(state, s, r, k, inputs, dict.fromkeys(inputs, k), "reduce")]

    def _begin(self, state, s: list, r: int, k: int, inputs, versions, how: str) -> tuple:
        """The reduce's first pump (done by the caller) and its loads: footer and
        header of every input it reads.  Records per input what it read."""
        refused = []
        for i in inputs:
            v = versions[i]
            d = v % self.depth
            st, payload, version = s[self.slot[i, r, d]]
            s[self.use[i, r]] = (v, d, payload)
            if st != HELD or version != v:
                refused.append(f"rank {i}: slot {d} "
                               + ("has a receive posted" if st != HELD else f"holds {version}"))
        if refused:
            self.flag(s, self.BAD, "error", f"rank {r}: version(s) {versions} not whole "
                                            "after its wait: " + "; ".join(refused))
        s[self.pc[r]] = READ
        return (f"rank {r}: {how} of {k} begins, inputs "
                + ", ".join(f"{versions[i]} of rank {i}" for i in inputs), tuple(s), True)

    def _end(self, state, s: list, r: int, k: int) -> tuple:
        for i in self.ins[r]:
            if not state[self.use[i, r]]:
                continue
            v, d, payload = state[self.use[i, r]]
            s[self.use[i, r]] = ()
            st, now, version = state[self.slot[i, r, d]]
            if st == HELD and version == v and (payload != v or now != v):
                self.note(s, "version",
                          f"rank {r} reduced rank {i}'s slot {d} as version {v} (header == "
                          f"footer == {v}) but its payload was version {payload}: silently "
                          f"reduced")
        if self.hop:
            s[self.pc[r]] = ENTER
        elif self.variant == "release-before-reduce":
            return self._next(s, r, k, f"rank {r}: reduce of {k} ends")
        else:
            s[self.pc[r]] = RELEASE
        return (f"rank {r}: reduce of {k} ends", tuple(s), True)

    def _next(self, s: list, r: int, k: int, label: str) -> tuple:
        """The next iteration, or free() after the last."""
        s[self.k[r]] = k + 1
        if k < self.iterations:
            s[self.pc[r]] = SEND
        else:
            s[self.pc[r]] = SETTLE if self.hop else ARRIVE
            label += "; free(): collectives.arrive"
        return (label, tuple(s), True)

    def _arrive(self, state, s: list, r: int) -> List[tuple]:
        # the barrier's polls (the variant's token release)
        if all(state[p] in (ARRIVE, FREE, ALLREDUCE, ALLTOALL, WAITALL, EXIT)
               for p in self.pc):
            s[self.pc[r]] = FREE if self.tail == "free" else EXIT
            return [(f"rank {r}: every rank arrived, free() goes on", tuple(s), True)]
        return self._poll_tokens(state, s, r, "free()'s collective")


def _names(ranks) -> str:
    return ", ".join(str(r) for r in sorted(ranks)) or "none"
