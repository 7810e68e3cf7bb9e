"""Join over NOTIFY-ACK (asapmpi/exchange/join.py, Exchange._leave_out_joined;
docs/PROTOCOL.md "Join: uneven inputs").

The data plane is NOTIFY-ACK's step dependencies, as counters: rank r's step s

  ENTER  Exchange.step(): the board's joined-at words read (JoinBoard.absent(s)): the
         ranks r leaves out of step s's average
  SEND   wait_acks(s - 1): every out-neighbour completed step s - 1; then version s is
         sent (put, flush, notify: one action, the slots are not modelled)
  RECV   wait_notifies(s): every in-neighbour sent version s; the reduce; step s
         completes (the rank's count of steps completed is s)

Each epoch (a join's round R, the same on every rank, `iterations` of them in a row)
a rank trains some steps (a fixed plan per rank and epoch, or any number up to
`max_steps`, chosen as it goes: its data may run out before any step), then calls
join():

  JOIN   mark_joined(c), mark(c): the joined-at word JOINED_AT[R % 2] and the entered
         word, c = steps entered (published by MPI_Accumulate and MPI_Win_flush: complete
         at every reader when the action ends; one action, since every reader reads
         one word of the two, JOINED_AT at a step's entry or ENTERED in the loop)
  LOOP   one pass of the loop, on one read of the entered words (JoinBoard.counts):
         until every rank joined, mark(c + 1) and a step ("steps along"); the first
         pass that sees every rank joined posts MPI_Iallreduce(MAX) of (entered, joined
         at); once posted, the request's test may say complete (once every rank posted,
         and none died) or not yet, and then a rank behind the largest count marks and
         steps to catch up, or idles (a wait whose deadline raises NeighbourTimeoutError
         naming the ranks whose counts are below the largest)
  FINAL  J = max(largest entered, largest joined-at + 1); steps without marking until
         its count is J; the round ends (JoinBoard._next_round) and the next epoch
         trains, or the rank is done after the last one

A board word is (round + 1) << SHIFT | (count + 1), as the code writes it (COUNT_BITS is
40 there: the model's counts are small).  The entered words are read as one snapshot
(the code reads each atomically, one after the other): within a round a word only
grows, so "every rank joined" and "a count above mine" read word by word hold at the
end of the read too; a rank's word leaves the round (its count hidden) only once the
round's agreement completed there, when every rank has posted and a reader behind
reaches J in its last phase anyway.

Properties:

  agree      every rank ends round R at the same J (the same allreduce result), and no
             rank of round R enters a step above J (checked when the agreement's last
             contribution arrives, and at every step entered after it): property 1;
             with `deadlock`, every run ends with every rank done
  rule       the leave-out rule: when rank B of round R enters step s, the in-neighbours
             it leaves out are exactly {A : A joined round R at c, c + 1 < s}, computed
             from the history of the joins (each rank's joined-at count per round), not
             from the board.  A decision about a rank that has not joined round R yet is
             kept (per edge) until it joins, then checked against its count: a rank
             that keeps A in step s for lack of a word A publishes later breaks it too
             (its decision depended on timing: another rank, or a re-run, decides
             otherwise)
  dead       a rank that dies (stops for ever: no MPI progress either) in the agreement
             of round `die` (in the pass that would post its request, or with
             `die_posted` also any time after it posted, before its request completed):
             no other rank completes that agreement after the death (the model's MPI:
             see below), and the run ends with every live rank in a wait that has a
             deadline (only their timeouts are enabled, then taken one by one:
             NeighbourTimeoutError, the rank stops)
  named      with such a death, the timeout of some live rank names the dead rank
             (the ranks a wait names: a step's wait_notifies its in-neighbours missing
             version s, wait_acks its out-neighbours that did not complete s - 1, the
             loop's idle wait the ranks whose counts are below the largest)

Abstracted: slots and payloads (NOTIFY-ACK's own models check them), the weights (the
rule's decision is what they follow), the pace of non-lockstep policies (the model is
NOTIFY-ACK: a joined rank steps along at once), send()/receive() split by the caller (a
join with a send still open counts it as entered: the same dependencies), the leaving
messages of free(), and time: a timeout is taken only once no rank can move (a slow
rank's spurious timeout is not a protocol question).  An allreduce completes at no rank
after a rank died before its own request completed: a dead rank sends none of the later
rounds of the reduction's exchanges (on 2 ranks an MPI may complete it at the survivor
if the dead rank's contribution had left; the scenarios use 3 and 4).

Boards (`board`):
  window        the board on a window (asapmpi.board, one-sided words): a word written
                is complete at every reader when the action ends
  messages      the board by messages (asapmpi.board on a mailbox's words), for the
                messages channel and the allreduce policy: JOINED_AT as above (the row
                that carries it, an MPI_Issend, matched by every reader's posted
                receive before mark_joined returns, docs/PROTOCOL.md A13), ENTERED
                eventually: each reader keeps its own view of every other rank's
                ENTERED word, and a delivery action (enabled whenever the view is
                behind, taken in any order with the rest) sets it to the writer's word
                (messages from one writer arrive in order, and a reader taking them in
                one pass sees any later word: a delivery right after each write covers
                the views in between).  A dead writer's deliveries are not forced: its
                last messages may never arrive.  Abstracted: a delivery is taken only
                while the reader is in join()'s loop, where counts are read (a view the
                writer held only while the reader trained or stepped to J is not
                explored), and that a writer's row carries all its words (a row in
                flight while the writer publishes again is followed by the newer one:
                a delivery of the older row is a view behind, which the model has).
                The views multiply the states (ring:3, one join: 515 on the window
                board, 88,262 here; two joins in a row pass 3,000,000): the scenarios
                join once; two rounds in a row are
                the window board's scenarios (JOINED_AT is the same on both boards).

Either way a rank has joined once its JOINED_AT word of the round is on the board, its
count then at least its joined-at count until its ENTERED word of the round arrives
(JoinBoard.counts).

Variants:
  correct       the code today
  one-word      a single JOINED_AT word for every round (the layout before 8d1baef):
                a rank that ends a join and joins again at once replaces the count a
                slower rank still reads for the first round
  j-joined      J = largest joined-at + 1 only, ignoring the counts entered
  no-lag        the rule leaves out ranks with c + 1 <= s (no lag of one version)
  late-only     the loop's idle timeout names only the ranks whose counts are below the
                largest, a rank already in the next round (count -1) among them (join()
                before this model found it): once every rank caught up it names nobody
  eventual-joined  (board messages) JOINED_AT sent like ENTERED, eventually (an Isend
                that mark_joined does not wait for): a reader may enter a step before
                the joined-at word of a rank it must leave out has arrived
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

from ..reduce.graphs import Graph
from .model import Model, Violation

TRAIN, LOOP, FINAL, DONE, DEAD, RAISED = range(6)
#: a rank's step in progress: none, waiting to send (acks), waiting for versions
IDLE, SEND, RECV = range(3)
VARIANTS = ("correct", "one-word", "j-joined", "no-lag", "late-only", "eventual-joined")
BOARDS = ("window", "messages")
#: the model's COUNT_BITS
SHIFT = 8
MASK = (1 << SHIFT) - 1


def word(round_: int, count: int) -> int:
    """A board word: a count of round `round_` (JoinBoard._word)."""
    return ((round_ + 1) << SHIFT) | (count + 1)


def unword(w: int) -> str:
    """A board word in words."""
    return "empty" if not w else f"round {(w >> SHIFT) - 1} count {(w & MASK) - 1}"


class JoinModel(Model):
    """Join's board, loop and agreement over NOTIFY-ACK's step dependencies, for
    `iterations` epochs in a row."""

    final_pc = DONE
    name = "join"

    def __init__(self, graph: Graph, iterations: int, variant: str = "correct",
                 steps: Optional[str] = None, max_steps: int = 1,
                 die: Optional[int] = None, die_posted: bool = False,
                 properties=("agree", "rule", "deadlock"), symmetry: bool = True,
                 board: str = "window"):
        if variant not in VARIANTS:
            raise ValueError(f"variant {variant!r} not in {VARIANTS}")
        if board not in BOARDS:
            raise ValueError(f"board {board!r} not in {BOARDS}")
        if variant == "eventual-joined" and board != "messages":
            raise ValueError(f"variant {variant!r} is of the board by messages: board="
                             f"'messages'")
        super().__init__(graph, iterations, properties, symmetry)
        self.variant = variant
        self.plan = _plan(steps, graph.n, iterations) if steps is not None else None
        if max_steps < 0:
            raise ValueError(f"max_steps must be at least 0, got {max_steps}")
        self.max_steps = max_steps
        if die is not None and not 0 <= die < iterations:
            raise ValueError(f"die: round {die} outside 0..{iterations - 1}")
        self.die = die
        #: the dying rank may also have posted its request (else it dies before)
        self.die_posted = die_posted
        # the rule leaves out ranks with c + lag < s
        self.lag = 0 if variant == "no-lag" else 1
        self.columns = 1 if variant == "one-word" else 2
        c = self.cells
        self.pc = [c.add("pc", (r,)) for r in range(self.n)]
        self.stage = [c.add("stage", (r,)) for r in range(self.n)]
        self.k = [c.add("completed", (r,)) for r in range(self.n)]
        self.round = [c.add("round", (r,)) for r in range(self.n)]
        # the plan travels with its rank under relabelling: a cell that never changes
        self.steps = [c.add("plan", (r,), default=self.plan[r] if self.plan else ())
                      for r in range(self.n)]
        self.trained = [c.add("trained", (r,)) for r in range(self.n)]
        self.posted = [c.add("posted", (r,)) for r in range(self.n)]
        self.target = [c.add("J", (r,)) for r in range(self.n)]
        # the history: the count each rank joined each round at (the rule's truth)
        self.jat = [c.add("joined at", (r,), default=()) for r in range(self.n)]
        # the board: the entered word and the joined-at word(s) of every rank
        self.entered_w = [c.add("ENTERED", (r,)) for r in range(self.n)]
        self.joined_w = [[c.add("JOINED_AT", (r,), (i,)) for i in range(self.columns)]
                         for r in range(self.n)]
        # a board by messages: per reader r and writer a, r's view of a's ENTERED word
        # (and with eventual-joined of its JOINED_AT words)
        self.messages = board == "messages"
        pairs = [(a, r) for a in range(self.n) for r in range(self.n) if a != r]
        self.entered_v = {p: c.add("ENTERED seen", p) for p in pairs} \
            if self.messages else {}
        self.joined_v = {(a, r, i): c.add("JOINED_AT seen", (a, r), (i,))
                         for a, r in pairs for i in range(self.columns)} \
            if variant == "eventual-joined" else {}
        # per edge a -> b: (round, step) at which b kept a in before a joined that round
        self.pending = {(a, b): c.add("kept before joined", (a, b), default=())
                        for a, b in self.edges}
        # the agreement of each round: (largest entered, largest joined at, posts)
        self.agree = c.add("agreement", default=((0, 0, 0),) * iterations)

    # ------------------------------------------------------------------ helpers

    def entered(self, state, r: int) -> int:
        return state[self.k[r]] + (state[self.stage[r]] != IDLE)

    def sent(self, state, r: int) -> int:
        return state[self.k[r]] + (state[self.stage[r]] == RECV)

    def final(self, state, round_: int) -> Optional[int]:
        """J of round `round_` once every rank contributed, else None."""
        top, joined, posts = state[self.agree][round_]
        if posts < self.n:
            return None
        return joined + 1 if self.variant == "j-joined" else max(top, joined + 1)

    def dead(self, state) -> Optional[int]:
        return next((r for r in range(self.n) if state[self.pc[r]] == DEAD), None)

    def entered_word(self, state, a: int, r: int) -> int:
        """Rank a's ENTERED word as rank r's board holds it."""
        return state[self.entered_v[a, r]] if a != r and self.messages \
            else state[self.entered_w[a]]

    def joined_word(self, state, a: int, r: int, col: int) -> int:
        """Rank a's JOINED_AT[col] word as rank r's board holds it."""
        return state[self.joined_v[a, r, col]] if a != r and self.joined_v \
            else state[self.joined_w[a][col]]

    def counts(self, state, r: int) -> Tuple[List[bool], List[int]]:
        """JoinBoard.counts() as rank r reads it in its round."""
        first = state[self.round[r]] + 1
        col = self.column(state[self.round[r]])
        joined, counts = [], []
        for a in range(self.n):
            w = self.entered_word(state, a, r)
            at = self.joined_word(state, a, r, col)
            by_word = (at >> SHIFT) >= first
            joined.append((w >> SHIFT) >= first or by_word)
            counts.append((w & MASK) - 1 if (w >> SHIFT) == first else
                          (at & MASK) - 1 if by_word and (w >> SHIFT) < first else -1)
        return joined, counts

    def column(self, round_: int) -> int:
        return round_ % self.columns

    # ------------------------------------------------------------------ properties

    def finished(self, state) -> bool:
        if all(state[p] == DONE for p in self.pc):
            return True
        # a rank died: the run ends in the others' timeouts
        return self.dead(state) is not None and not self._forced(state)

    def violation(self, state) -> Optional[Violation]:
        found = super().violation(state)
        if found:
            return found
        d = self.dead(state)
        # checked where the run stops (before the first timeout: a rank that raised
        # names nothing any more)
        if d is None or any(state[p] == RAISED for p in self.pc) or self._forced(state):
            return None
        live = [r for r in range(self.n) if state[self.pc[r]] not in (DEAD, RAISED)]
        if "dead" in self.properties:
            for r in live:
                if self.timeout_names(state, r) is None:
                    return ("dead", f"rank {d} died; rank {r} is stuck where no deadline "
                                    f"ends the wait: {self.waiting(state, r)}")
        if "named" in self.properties and live and not any(
                d in self.timeout_names(state, r) for r in live):
            return ("named", f"rank {d} died in the agreement of round {self.die}; no "
                             f"timeout names it: " + "; ".join(
                                 f"{self.waiting(state, r)}, its timeout names "
                                 + _who(self.timeout_names(state, r)) for r in live))
        return None

    def measure(self, state) -> dict:
        """How far a rank is ahead of another in rounds (1: one ended a join the other
        is still in: the reason for the pair of JOINED_AT words), and how far J lies
        past the largest joined-at count (1: the first shadow step only; more: ranks
        stepped along past the last training step, up to the graph's diameter)."""
        rounds = [state[self.round[r]] for r in range(self.n)
                  if state[self.pc[r]] != DEAD]
        past = [self.final(state, rd) - state[self.agree][rd][1]
                for rd in range(self.iterations) if self.final(state, rd) is not None]
        return {"round ahead": max(rounds) - min(rounds), "J past joined": max(past,
                                                                             default=0)}

    def waiting(self, state, r: int) -> str:
        pc, st, k = state[self.pc[r]], state[self.stage[r]], state[self.k[r]]
        rd = state[self.round[r]]
        if pc == DONE:
            return f"rank {r} is done at count {k}"
        if pc == DEAD:
            return f"rank {r} is dead (round {rd}, count {k})"
        if pc == RAISED:
            return f"rank {r} raised NeighbourTimeoutError (round {rd}, count {k})"
        where = ("trains", "is in join()'s loop", "steps to J", "", "", "")[pc]
        what = f"rank {r} {where} (round {rd})"
        if st == SEND:
            return what + f", waits for the acks of version {k} (step {k + 1})"
        if st == RECV:
            return what + f", waits for the versions {k + 1} of its in-neighbours"
        if pc == LOOP:
            return what + (", posted the agreement" if state[self.posted[r]]
                           else ", not posted") + f", at count {k}"
        return what + f", at count {k}"

    def timeout_names(self, state, r: int) -> Optional[List[int]]:
        """The ranks the timeout of rank r's wait names ([]: none, "a rank of the
        communicator"), or None if r is not in a wait that has a deadline."""
        pc, st = state[self.pc[r]], state[self.stage[r]]
        s = state[self.k[r]] + 1
        if st == SEND:
            return [j for j in self.outs[r] if state[self.k[j]] < s - 1]
        if st == RECV:
            return [i for i in self.ins[r] if self.sent(state, i) < s]
        if pc == LOOP and state[self.posted[r]]:
            _, counts = self.counts(state, r)
            if self.variant == "late-only":
                # a rank already in the next round (count -1) counts as late
                return [a for a, c in enumerate(counts) if c < max(counts)]
            # join(): this round's ranks below the largest count, else every other rank
            late = [a for a, c in enumerate(counts) if 0 <= c < max(counts)]
            return late or [a for a in range(self.n) if a != r]
        return None

    # ------------------------------------------------------------------ transitions

    def _forced(self, state) -> bool:
        return any(forced for _, _, forced in self._moves(state))

    def successors(self, state) -> List[tuple]:
        out = self._moves(state)
        if self.dead(state) is not None and not any(f for _, _, f in out):
            # nothing can move: the live ranks' deadlines pass, one after the other
            for r in range(self.n):
                names = self.timeout_names(state, r)
                if state[self.pc[r]] in (DEAD, RAISED, DONE) or names is None:
                    continue
                s = list(state)
                s[self.pc[r]] = RAISED
                out.append((f"{self.waiting(state, r)}: times out, "
                            f"NeighbourTimeoutError naming {_who(names)}", tuple(s),
                            False))
        return out

    def _deliveries(self, state) -> List[tuple]:
        """A board by messages: a writer's word reaches one reader (forced unless the
        writer is dead: its last messages may be lost)."""
        out: List[tuple] = []
        views = [((a, r), self.entered_w[a], cell) for (a, r), cell in self.entered_v.items()]
        views += [((a, r), self.joined_w[a][i], cell)
                  for (a, r, i), cell in self.joined_v.items()]
        for (a, r), src, cell in views:
            # an ENTERED word only while the reader is in join()'s loop, where it reads
            # them (the views a writer held only while the reader trained or stepped to
            # J are not explored); a JOINED_AT word (eventual-joined) while it steps
            if state[cell] == state[src] or state[self.pc[r]] in (DONE, DEAD, RAISED) \
                    or (src == self.entered_w[a] and state[self.pc[r]] != LOOP):
                continue
            s = list(state)
            s[cell] = state[src]
            name = "ENTERED" if src == self.entered_w[a] else "JOINED_AT"
            out.append((f"rank {a}'s {name} word ({unword(state[src])}) reaches rank {r}",
                        tuple(s), state[self.pc[a]] != DEAD))
        return out

    def _moves(self, state) -> List[tuple]:
        out: List[tuple] = self._deliveries(state) if self.messages else []
        for r in range(self.n):
            pc = state[self.pc[r]]
            if pc in (DONE, DEAD, RAISED):
                continue
            st = state[self.stage[r]]
            if st != IDLE and pc == LOOP and state[self.posted[r]] and self.die_posted \
                    and self.die == state[self.round[r]] and self.dead(state) is None:
                out.append(self._death(state, r, "after posting, in a step"))
            if st == SEND:
                out.extend(self._send(state, r))
            elif st == RECV:
                out.extend(self._recv(state, r))
            elif pc == TRAIN:
                out.extend(self._train(state, r))
            elif pc == LOOP:
                out.extend(self._loop(state, r))
            elif pc == FINAL:
                out.extend(self._final(state, r))
        return out

    def _send(self, state, r: int) -> List[tuple]:
        s_ = state[self.k[r]] + 1
        if any(state[self.k[j]] < s_ - 1 for j in self.outs[r]):
            return []
        s = list(state)
        s[self.stage[r]] = RECV
        return [(f"rank {r}: acks of version {s_ - 1} seen, sends version {s_} to ranks "
                 f"{_names(self.outs[r])}", tuple(s), True)]

    def _recv(self, state, r: int) -> List[tuple]:
        s_ = state[self.k[r]] + 1
        if any(self.sent(state, i) < s_ for i in self.ins[r]):
            return []
        s = list(state)
        s[self.k[r]] = s_
        s[self.stage[r]] = IDLE
        label = f"rank {r}: versions {s_} of ranks {_names(self.ins[r])} in, step {s_} done"
        if state[self.pc[r]] == FINAL and s_ == state[self.target[r]]:
            label += self._next_round(s, r)
        return [(label, tuple(s), True)]

    def _train(self, state, r: int) -> List[tuple]:
        rd, done = state[self.round[r]], state[self.trained[r]]
        plan = state[self.steps[r]]
        out = []
        more = done < plan[rd] if plan else done < self.max_steps
        if more:
            s = list(state)
            s[self.trained[r]] = done + 1
            label = self._enter(state, s, r, f"rank {r}: trains, enters step")
            out.append((label, tuple(s), True))
        if not plan or not more:
            out.append(self._join(state, r))
        return out

    def _join(self, state, r: int) -> tuple:
        """Exchange.join(): mark_joined(c), mark(c)."""
        rd, c = state[self.round[r]], state[self.k[r]]
        s = list(state)
        s[self.joined_w[r][self.column(rd)]] = word(rd, c)
        s[self.entered_w[r]] = word(rd, c)
        s[self.jat[r]] = state[self.jat[r]] + (c,)
        s[self.pc[r]] = LOOP
        s[self.posted[r]] = 0
        # the decisions taken about r in this round before it joined, now checkable
        for b in self.outs[r]:
            kept = state[self.pending[r, b]]
            for rd2, v in kept:
                if rd2 == rd and c + self.lag < v:
                    self.note(s, "rule", f"rank {b} entered step {v} of round {rd} "
                                         f"keeping rank {r} in, which then joined round "
                                         f"{rd} at count {c} ({c} + {self.lag} < {v}: out "
                                         f"by the rule): its word was not on the board "
                                         f"yet, so whether rank {r} is left out of step "
                                         f"{v} depends on timing")
            s[self.pending[r, b]] = tuple(e for e in kept if e[0] != rd)
        return (f"rank {r}: join() of round {rd} at count {c}: JOINED_AT[{self.column(rd)}]"
                f" and ENTERED := {c}", tuple(s), True)

    def _loop(self, state, r: int) -> List[tuple]:
        """One pass of join()'s loop, all on one read of the entered words: the post
        (the first pass that sees every rank joined), the request's test (MPI may not
        have completed it yet: the pass goes on), then the step of phase 1 or of a
        rank behind, or nothing (an idle poll: no action while nothing changes)."""
        rd, k = state[self.round[r]], state[self.k[r]]
        joined, counts = self.counts(state, r)
        posted = state[self.posted[r]]
        everyone = bool(posted) or all(joined)
        behind = max(counts) > k
        alive = self.dead(state) is None
        out = []
        s = list(state)
        label = f"rank {r}: "
        if everyone and not posted:
            if self.die == rd and alive:
                out.append(self._death(state, r, "before posting"))
            top, jmax, posts = state[self.agree][rd]
            agree = list(state[self.agree])
            c = state[self.jat[r]][rd]
            agree[rd] = (max(top, k), max(jmax, c), posts + 1)
            s[self.agree] = tuple(agree)
            s[self.posted[r]] = 1
            if posts + 1 == self.n:
                self._check_counts(s, rd)
            label += f"every rank joined: MPI_Iallreduce(MAX) of (entered {k}, joined " \
                     f"at {c})"
            if not behind:      # the test says not yet: the pass ends idle
                out.append((label, tuple(s), True))
            label += "; "
        elif posted and self.die == rd and self.die_posted and alive:
            out.append(self._death(state, r, "after posting"))
        j = self.final(s, rd)
        if everyone and j is not None and alive:
            done = list(s)
            done[self.pc[r]] = FINAL
            done[self.target[r]] = j
            self._forget_views(done, r)
            if k > j:
                self.note(done, "agree", f"rank {r} completed step {k} of round {rd}, "
                                         f"above J = {j}")
            what = f"{label}the agreement of round {rd} completes: J = {j}"
            if k >= j:
                what += self._next_round(done, r)
            out.append((what, tuple(done), True))
        if behind or not everyone:
            s[self.entered_w[r]] = word(rd, k + 1)
            why = f"catches up to count {max(counts)}" if everyone else "steps along"
            out.append((self._enter(state, s, r, f"{label}joined, {why}: ENTERED := "
                                                 f"{k + 1}, enters step"), tuple(s), True))
        return out

    def _forget_views(self, s: list, r: int) -> None:
        """Rank r leaves join()'s loop: its views of the others' ENTERED words are read
        no more in this round, and in the next one a word of this round counts as none
        (its round is below the reader's): they are reset, so that states that differ
        only by them are one."""
        for (_, b), cell in self.entered_v.items():
            if b == r:
                s[cell] = 0

    def _death(self, state, r: int, when: str) -> tuple:
        s = list(state)
        s[self.pc[r]] = DEAD
        return (f"rank {r} dies in the agreement of round {state[self.round[r]]} ({when})",
                tuple(s), False)

    def _final(self, state, r: int) -> List[tuple]:
        s = list(state)
        return [(self._enter(state, s, r, f"rank {r}: steps to J = "
                             f"{state[self.target[r]]}, enters step"), tuple(s), True)]

    def _next_round(self, s: list, r: int) -> str:
        """The round ends at r (count == J): the next epoch trains, or r is done."""
        rd = s[self.round[r]] + 1
        s[self.round[r]] = rd
        s[self.target[r]] = 0
        s[self.posted[r]] = 0
        s[self.trained[r]] = 0
        s[self.pc[r]] = DONE if rd == self.iterations else TRAIN
        return "; join() returns" + ("" if rd == self.iterations else f", epoch {rd}")

    def _check_counts(self, s: list, rd: int) -> None:
        """The last contribution of round rd is in: no rank has entered above J."""
        j = self.final(s, rd)
        for r in range(self.n):
            e = self.entered(s, r)
            if s[self.round[r]] == rd and e > j:
                self.note(s, "agree", f"rank {r} entered step {e} of round {rd}, above "
                                      f"J = {j}, the agreement's result: the ranks that "
                                      f"step to J end the round below it")

    def _enter(self, state, s: list, r: int, label: str) -> str:
        """Rank r enters its next step: JoinBoard.absent(v) (Exchange._leave_out_joined)
        and the rule's truth for each in-neighbour."""
        rd, v = state[self.round[r]], state[self.k[r]] + 1
        s[self.stage[r]] = SEND
        first = (rd + 1) << SHIFT
        col = self.column(rd)
        out = []
        for a in self.ins[r]:
            w = self.joined_word(state, a, r, col)
            left = w >= first and (w & MASK) - 1 + self.lag < v
            if left:
                out.append(a)
            hist = state[self.jat[a]]
            if len(hist) > rd:
                truth = hist[rd] + self.lag < v
                if left != truth:
                    self.note(s, "rule", f"rank {r} enters step {v} of round {rd} and "
                                         f"{'leaves out' if left else 'keeps'} rank {a}, "
                                         f"which joined round {rd} at count {hist[rd]}: "
                                         f"the rule says {'out' if truth else 'in'}; its "
                                         f"JOINED_AT[{col}] reads {unword(w)}")
            elif left:
                self.note(s, "rule", f"rank {r} enters step {v} of round {rd} and leaves "
                                     f"out rank {a}, which has not joined round {rd}; its "
                                     f"JOINED_AT[{col}] reads {unword(w)}")
            else:
                s[self.pending[a, r]] = state[self.pending[a, r]] + ((rd, v),)
        j = self.final(state, rd)
        if j is not None and v > j:
            self.note(s, "agree", f"rank {r} enters step {v} of round {rd}, above J = {j}")
        return f"{label} {v}" + (f" (leaves out ranks {_names(out)})" if out else "")


def _plan(spec: str, n: int, epochs: int) -> Tuple[Tuple[int, ...], ...]:
    """Per rank its training steps per epoch, from "2,1,0/0,0,1" (epoch 0's steps of
    ranks 0, 1, 2, then epoch 1's); ranks and epochs not listed train none, epochs past
    the last one run are dropped (check-protocol --max-iters)."""
    rows = [[int(x) for x in part.split(",")] for part in spec.split("/")][:epochs]
    if any(len(row) > n for row in rows):
        raise ValueError(f"steps {spec!r}: more ranks than the graph's {n}")
    if any(x < 0 for row in rows for x in row):
        raise ValueError(f"steps {spec!r}: negative")
    return tuple(tuple(rows[e][r] if e < len(rows) and r < len(rows[e]) else 0
                       for e in range(epochs)) for r in range(n))


def _names(ranks: Sequence[int]) -> str:
    return ", ".join(str(r) for r in ranks) or "none"


def _who(ranks: Sequence[int]) -> str:
    return ("ranks " + _names(ranks)) if ranks else \
        "nobody ('a rank of the communicator')"
