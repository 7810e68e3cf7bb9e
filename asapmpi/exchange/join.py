"""Join: a rank that ran out of data keeps its neighbours going until every rank has.

With uneven inputs (shards of 11 and 10 batches) a rank that stops stepping leaves its
neighbours waiting for a version it never sends: a timeout, though nobody died.  As with
torch DDP's `Join`, a rank that has finished calls `Exchange.join()` (the optimizer's
`with opt.join():`) and takes part in the exchange with no update of its own ("shadow"
steps: its buffer is mixed, nothing is added to it) until every rank has joined; then
every rank steps to the same final version, so that free() meets as after equal loops.

The ranks share, on a board (asapmpi.board, one word per rank), the number of exchange
steps each joined rank has entered (its count), published *before* it enters one.  A
rank that has not joined writes nothing: training costs nothing more.  A joined rank

1. steps along while some rank still trains: at once under a lockstep policy (its step
   waits for the training neighbours anyway), at its own measured pace otherwise (Hop,
   gossip, async: it must not run far ahead, since every rank catches up at the end);
2. once every rank has joined, stops stepping ahead but still catches up to any count
   it sees on the board above its own (a neighbour may be waiting in that step for it),
   and starts a nonblocking MPI_Iallreduce(MAX) of its count;
3. when the allreduce completes, steps until its count is its result J (at least one
   more than the largest count any rank joined at, the same allreduce's second word).

J is at least every count ever entered: a count is entered either before its rank saw
every rank joined (it then contributes that count or more) or as a catch-up to a count
already on the board (entered, hence contributed, by another rank).  So no rank waits in
step 3 for a step another rank will not enter, and every rank ends at J.

A rank that enters free() tells its out-neighbours so, with its count, in a small
message (not on the board: a passive-target write to a dead neighbour may never
return): a neighbour that times out waiting for its next version then tells a rank
that finished its loop without join() (alive, waiting in free()) from one that joined
and stalled or is dead (explain()).

The ranks still training average over each other only (DDP's Join with
divide_by_initial_world_size=False): a joined rank's replica leaves every average from
its second shadow version on.  A rank publishes, once per join, the count it joined at
(c: its versions above c are shadows) as a second board word, before its first shadow
step; every rank entering step s (absent(s)) leaves out the ranks with c + 1 < s.
Successive rounds alternate between two such words: on a directed graph a rank A that
is an in-neighbour of B but far downstream of it can finish a join at J while B has
yet to enter step J (A's step J waits only for versions B sent earlier), and A may join
again at once; its next round's word must not replace the one B reads for step J.  The
lag of one version makes this deterministic under the lockstep policies: a rank enters
step s only after it completed step s - 1, which waited for every in-neighbour's version
s - 1 (allreduce: every rank's), which a rank with c + 1 < s sent after its word was
complete at every reader (MPI_Win_flush).  So every rank leaves out the same ranks at
the same version, found by a peek of its own board (one C call a step while nobody
has joined), and a re-run gives the same result.  Under window policies a left-out
in-neighbour's weight is 0 and the others, the rank's own included, are scaled to sum
to 1 (as Hop renormalizes over its backups; on a complete graph the mean of the
training ranks; a joined rank mixes only with itself and the ranks still training);
allreduce sums the training ranks' buffers (the joined add zeros) and divides by their
number; gossip pulls only from training peers.  Every rank steps at least once past
the last rank's last training step, and the steps after that one leave every replica
as it is (all ranks are left out), so the result does not depend on J.  Policies that
jump versions (Hop with skipping) or count global iterations (parameter servers)
refuse join (Policy.join_refusal).
"""
from __future__ import annotations

import time
from typing import Callable, Optional, Tuple

import numpy as np

from ..board import Board
from ..errors import NeighbourTimeoutError

#: the longest sleep of an idle joined rank's poll (seconds)
MAX_IDLE_SLEEP_S = 0.002
#: a board word is (round + 1) << COUNT_BITS | (count + 1): a join of an earlier epoch
#: does not count as joined in this one
COUNT_BITS = 40
#: the tag of the message a rank entering free() sends its out-neighbours
LEAVING_TAG = 71
#: the board's words: the count entered (catch-ups read it), and the count joined at,
#: one word per parity of the round (JOINED_AT[round % 2]): a rank that finished a join
#: and joins again at once (an epoch with no data) publishes its next round's word
#: while a slower rank may still read this round's (module docstring)
ENTERED, JOINED_AT = 0, (1, 2)
NOBODY = frozenset()


class JoinBoard:
    """The ranks' join counts (module docstring) and the communicator their final
    agreement runs on.  Collective to create and to free.  `messages`: the board's
    words go by messages (asapmpi.board), for an exchange with no MPI window (the
    messages channel, the allreduce policy), else by accumulates into its window."""

    def __init__(self, comm, timeout: float, messages: bool = False):
        #: joins completed (the same on every rank: each join is collective)
        self.round = 0
        self._joined_at = None
        #: where this rank's last join ended (J), and the count it joined this round
        #: at (None: not in a join): what explain() tells a rank one join behind by
        self.ended_at: Optional[int] = None
        self.joining_at: Optional[int] = None
        from mpi4py import MPI

        self.MPI = MPI
        self.comm = comm.Dup()
        self._leaving = np.zeros(1, dtype=np.int64)
        self._sends = []
        self._heard = {}                # rank: the count its leaving message said
        try:
            # the joined-at words order the averages (the lag rule): complete at every
            # reader before the writer's next step; the entered counts only drive
            # catch-ups and the agreement, which poll for them
            self.board = Board(self.comm, 3, timeout, "join board", messages=messages,
                               synchronous=JOINED_AT)
        except BaseException:
            self.comm.Free()
            raise
        # every step looks for a joined rank: one C call while none has
        self._peekers = tuple(self.board.peeker(index) for index in JOINED_AT)
        self._next_round(0)

    def _next_round(self, round_: int) -> None:
        self.round = round_
        self.joining_at = None
        # this round's joined-at words: a word of this round (the slot of its parity
        # holds no later one: a rank is at most one round ahead of any other, since a
        # round's agreement needs every rank)
        self._joined_at = self._peekers[round_ % 2]
        self._joined_at.threshold = (round_ + 1) << COUNT_BITS

    def joined_seen(self) -> bool:
        """Whether a rank may have joined this round (Exchange's test on every step:
        absent() is called only then); False once freed (the peek says so)."""
        return self._joined_at.seen()

    def _word(self, count: int) -> int:
        return ((self.round + 1) << COUNT_BITS) | (count + 1)

    def mark(self, count: int) -> None:
        """Publish that this rank has joined this round and entered `count` exchange
        steps."""
        self.board.publish(ENTERED, self._word(count))

    def mark_joined(self, count: int) -> None:
        """Publish, once per round and before any shadow step, that this rank joined
        after `count` exchange steps entered: its versions above it are shadows."""
        self.board.publish(JOINED_AT[self.round % 2], self._word(count))
        self.joining_at = count

    def absent(self, version: int) -> frozenset:
        """The ranks whose replicas leave the average of step `version` (module
        docstring): joined in this round at a count c with c + 1 < version."""
        first = (self.round + 1) << COUNT_BITS
        if not self.joined_seen():
            return NOBODY           # nobody joined this round: every training step
        words = self.board.peek()[:, JOINED_AT[self.round % 2]]
        at = (words & ((1 << COUNT_BITS) - 1)) - 1
        return frozenset(np.flatnonzero((words >= first) & (at + 1 < version)).tolist())

    def say_leaving(self, count: int, out_neighbours) -> None:
        """Tell the out-neighbours (the ranks that wait for this one's versions) that
        this rank entered free() after `count` exchange steps; free() collects the
        messages.  Nothing once freed (a free() that failed after freeing the board,
        called again)."""
        if not self.board.live:
            return
        self._leaving[0] = count
        rank = self.comm.Get_rank()
        self._sends = [self.comm.Isend([self._leaving, self.MPI.INT64_T], dest=r,
                                       tag=LEAVING_TAG)
                       for r in sorted(set(out_neighbours)) if r != rank]

    def _left(self, ranks) -> dict:
        # {rank: its count} of those of `ranks` whose leaving message has arrived
        left = {}
        for r in ranks:
            if r not in self._heard and self.comm.Iprobe(source=r, tag=LEAVING_TAG):
                got = np.zeros(1, dtype=np.int64)
                self.comm.Recv([got, self.MPI.INT64_T], source=r, tag=LEAVING_TAG)
                self._heard[r] = int(got[0])
            if r in self._heard:
                left[r] = self._heard[r]
        return left

    def explain(self, exc: NeighbourTimeoutError, in_neighbours=(),
                awaited: int = 0) -> NeighbourTimeoutError:
        """`exc` saying which of the ranks it names, or of this rank's in-neighbours
        that stepped fewer than `awaited` times (the version this rank waited to
        complete), entered free() (they finished their steps without join()), and which
        of the ranks it names joined and stopped; unchanged when nothing is known of
        them (dead or stalled)."""
        named = list(exc.ranks)
        left = self._left(named + [r for r in in_neighbours if r not in named])
        joined, counts = self.counts()
        said, behind = [], []
        for r in named:
            if r in left and self._one_join_behind(left[r]):
                behind.append(r)
            elif r in left:
                said.append(f"rank {r} is alive but finished: it entered free() after "
                            f"{left[r]} steps without join()")
            elif joined[r]:
                said.append(f"rank {r} ran out of data and joined (step {counts[r]}) but "
                            f"stopped stepping along: it is stalled")
        for r in sorted(r for r in set(left) - set(named) if left[r] < awaited):
            if self._one_join_behind(left[r]):
                behind.append(r)
            else:
                said.append(f"rank {r} (a neighbour) entered free() after {left[r]} steps "
                            f"without join()")
        if behind:
            said.insert(0, f"rank(s) {behind} entered free() where the last join() ended "
                           f"(step {self.ended_at}) while this rank joined again (step "
                           f"{self.joining_at}): join() was called once more here than "
                           f"there; call it the same number of times on every rank, once "
                           f"per epoch")
        if not said:
            return exc
        if any("without join()" in line for line in said):
            said.append("ranks that step different numbers of times (uneven data) must "
                        "all end their loops in join() (`with opt.join():` around the "
                        "loop, or ex.join() after it)")
        return exc.explained("; ".join(said))

    def _one_join_behind(self, left_at: int) -> bool:
        # a rank that entered free() where the last join ended, while this one is in
        # the next join: it ended its epochs one join() earlier (no rank ends a join
        # before every rank has joined, so it will not join this one)
        return self.joining_at is not None and left_at == self.ended_at

    def counts(self, words: Optional[np.ndarray] = None) -> Tuple[np.ndarray, np.ndarray]:
        """(per rank whether it has joined this round, per rank its count in this
        round or -1).  A rank has joined once its joined-at word of this round is on
        the board (written before its entered count: on a board by messages the counts
        come later, so a joined rank's count is at least the one it joined at).  A rank
        already joined in the next round (it went on without waiting for this one's
        agreement to complete here) has joined this one; its count belongs to the next
        round."""
        words = self.board.read() if words is None else words
        first = self.round + 1
        entered, at = words[:, ENTERED], words[:, JOINED_AT[self.round % 2]]
        rounds = entered >> COUNT_BITS
        joined = (at >> COUNT_BITS) >= first
        counts = np.where(rounds == first, (entered & ((1 << COUNT_BITS) - 1)) - 1,
                          np.where(joined & (rounds < first),
                                   (at & ((1 << COUNT_BITS) - 1)) - 1, -1))
        return joined | (rounds >= first), counts

    def free(self, in_neighbours) -> None:
        """Collective, once the ranks met (Exchange.free's arrival, after every rank's
        say_leaving): collect the in-neighbours' leaving messages, free the board and
        the communicator."""
        if not self.board.live:
            return
        from ..collectives import cancel, wait_polled

        rank = self.comm.Get_rank()
        # every in-neighbour sent its message before the ranks met: it is on its way
        senders = sorted(set(in_neighbours) - set(self._heard) - {rank})
        got = np.zeros(max(len(senders), 1), dtype=np.int64)
        recvs = [self.comm.Irecv([got[i:i + 1], self.MPI.INT64_T], source=r, tag=LEAVING_TAG)
                 for i, r in enumerate(senders)]
        deadline = time.monotonic() + self.board.timeout
        cancel([recvs[i] for i in wait_polled(recvs, deadline)])
        # eager sends of 8 bytes: complete once buffered; a dead receiver's is cancelled
        cancel([self._sends[i] for i in wait_polled(self._sends, deadline)])
        self._sends = []
        self.board.free()
        self.comm.Free()

    def abandon(self) -> None:
        """After a process failure: leave the board without an MPI call that could wait
        on the dead rank (its communicators stay, unused, for the life of the
        process)."""
        self.board.abandon()


def join(board: JoinBoard, entered: Callable[[], int], step: Callable[[], None],
         lockstep: bool, pace_s: float, timeout: float, rank: int,
         settle: Optional[Callable[[], None]] = None) -> int:
    """Run this rank's part of join (module docstring): `entered()` is its count of
    exchange steps, `step()` one shadow step.  Returns the final count J."""
    from mpi4py import MPI

    from ..collectives import start_allreduce

    joined_at = entered()
    board.mark_joined(joined_at)
    board.mark(joined_at)
    # the agreement: the largest count entered, and the largest count joined at
    mine, final = np.zeros(2, dtype=np.int64), np.zeros(2, dtype=np.int64)
    mine[1] = joined_at
    request = None
    idle_since, sleep = time.monotonic(), 0.0
    try:
        while True:
            joined, counts = board.counts()
            # once seen, every rank has joined for good (phase 2 never steps along again)
            everyone = request is not None or bool(joined.all())
            if everyone and request is None:
                mine[0] = entered()
                request = start_allreduce(board.comm, mine, final, MPI.MAX)
            if request is not None and request.test():
                break
            behind = int(counts.max()) > entered()
            if behind or not everyone:
                if not everyone and not behind and not lockstep and pace_s > 0:
                    time.sleep(pace_s)      # keep the pace of a training step, no faster
                board.mark(entered() + 1)
                step()
                idle_since, sleep = time.monotonic(), 0.0
                continue
            # every rank joined, none ahead: the others have yet to see it and agree
            if time.monotonic() - idle_since > timeout:
                # the ranks of this round behind the largest count (-1: a rank already
                # in the next round, ahead); none behind (every rank caught up, the usual
                # state here): the one missing from the agreement is any other rank
                late = [r for r, c in enumerate(counts) if 0 <= c < int(counts.max())] \
                    or [r for r in range(len(counts)) if r != rank]
                raise NeighbourTimeoutError(
                    rank, "the agreement on the last step of join()", late, [], [], timeout)
            if settle is not None:
                settle()
            sleep = min(MAX_IDLE_SLEEP_S, sleep * 2 or 1e-5)
            time.sleep(sleep)
    except BaseException:
        # a timeout here or in a shadow step: the agreement may still complete once a
        # late rank contributes, writing `final`; it and its buffers go to the leftovers
        if request is not None:
            request.leave()
        raise
    # at least one step past the last rank's last training step: that step (its first
    # shadow) still averages its replica, every later one none of the joined ranks',
    # so the result does not depend on how many steps past it the ranks ran
    target = max(int(final[0]), int(final[1]) + 1)
    while entered() < target:
        step()
    board._next_round(board.round + 1)
    board.ended_at = target
    return target
