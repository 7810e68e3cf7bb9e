"""A board by messages: every rank's few int64 words, for an exchange with no MPI window.

asapmpi.board's Board writes words into every rank's MPI window.  An exchange on the
messages channel makes no window, and must not get one from its board: on Open MPI
with UCX a window makes every MPI call progress a worker of its own (docs/PROTOCOL.md),
and the allreduce policy uses no window at all.  A MessageBoard gives the same reads
(read, peek, peeker) from words sent as 16-byte messages (index, value) on the
board's communicator, each rank keeping the newest word it received from every rank:

- a *synchronous* word (`synchronous`: the join board's joined-at words) goes to every
  other rank by MPI_Issend into a receive each rank keeps posted for each rank, and
  publish() returns once every one of them was matched (a deadline names the ranks
  that did not take it).  As with the window board's flush, the word is then complete
  at every reader before the writer's next step: a reader's next test of that receive
  completes it (docs/PROTOCOL.md A13: a matched 16-byte message is delivered), so
  peek() sees it.  One such word a rank is in flight at a time, per the caller's
  protocol (the join board: one a round, and a round's agreement needs every rank),
  so the posted receive is free for it: each one is re-posted when tested complete.
- any other word (the join board's entered counts, read by joined ranks to catch up)
  goes by MPI_Issend to every other rank and is taken
  from the unexpected messages by read() and peek(), and by every LOOK_EVERY-th
  look() (the join board's test on every exchange step): eventually, in the order
  sent (MPI's non-overtaking rule for one sender, tag and communicator).  At
  most MAX_UNTAKEN of a rank's words wait unreceived at one reader: past that the
  writer holds the newest of each word back and sends it once the reader took some
  (the next publish, read or peek sends it), since on MPICH's network path
  (libfabric's tcp provider) the 65th unexpected message from one sender stops every
  later message from it, on any tag or communicator, until the reader receives them
  (measured: 64 pass, 65 block; docs/PROTOCOL.md).  The synchronous send is what
  tells the writer that its reader took one.  free() receives the last of them by
  counts the ranks exchange there, so no message is left unmatched.

The words keep the window board's rule: a word only grows (the caller's encoding), and
a reader keeps the newest it received.  mpi4py and NumPy only.
"""
from __future__ import annotations

import time
from typing import Iterable, List, Tuple

import numpy as np

from . import collectives
from .errors import NeighbourTimeoutError

#: the tags of the board's messages on its communicator (the join board's leaving
#: messages use 71 there)
WORD_TAG, SYNC_TAG = 72, 73
#: a writer's eventual words that may wait unreceived at one reader (module docstring:
#: MPICH's network path stalls a sender past 64)
MAX_UNTAKEN = 32
#: a training rank takes the eventual words every this many steps (each look costs an
#: MPI_Iprobe, a poll of the network); a joined writer sends one a step and is at most
#: the graph's diameter steps ahead under lockstep policies, so fewer than MAX_UNTAKEN
#: pile up between two takes
LOOK_EVERY = 8


class MessagePeek:
    """Board.peeker's counterpart: seen() tests the synchronous words' receives (one
    MPI_Testsome) and compares the largest word `index` of any rank with `threshold`."""

    def __init__(self, board: "MessageBoard", index: int):
        self.board, self.index = board, index
        #: what seen() compares the largest word with
        self.threshold = 0

    def seen(self) -> bool:
        """Whether some rank's word is at least `threshold`."""
        self.board.look()
        return self.board.top[self.index] >= self.threshold


class MessageBoard:
    """`words` int64 words per rank, kept by every rank from the messages the others send
    (module docstring); `synchronous` the indices of the words publish() delivers before
    it returns.  Collective to create and to free.  `what` names the board in errors."""

    #: loads see what peek() returns: every synchronous word complete at publish
    unified = True

    def __init__(self, comm, words: int, timeout: float, what: str,
                 synchronous: Iterable[int] = ()):
        from mpi4py import MPI

        self.MPI = MPI
        self.comm, self.timeout, self.what = comm, timeout, what
        self.rank, self.n = comm.Get_rank(), comm.Get_size()
        self.words = words
        self.synchronous = frozenset(synchronous)
        self._table = np.zeros((self.n, words), dtype=np.int64)
        #: per index the largest word of any rank (words only grow): the peeker's test
        self.top = [0] * words
        self._looks = 0
        self._others = [r for r in range(self.n) if r != self.rank]
        # the posted receive of each other rank's next synchronous word
        self._sync_in = np.zeros((self.n, 2), dtype=np.int64)
        self._sync_recvs = [self._post(r) for r in self._others]
        # eventual words: per reader the sends it has not taken yet (request, buffer)
        # and the words held back meanwhile ({index: value}); counts per rank
        self._untaken: List[List[Tuple[object, np.ndarray]]] = [[] for _ in range(self.n)]
        self._held: List[dict] = [{} for _ in range(self.n)]
        self._holding = False
        self._sent = [0] * self.n
        self._taken = [0] * self.n
        self._got = np.zeros(2, dtype=np.int64)
        #: False once free() ran
        self.live = True

    def _post(self, source: int):
        return self.comm.Irecv([self._sync_in[source], self.MPI.INT64_T], source=source,
                               tag=SYNC_TAG)

    def _take_sync(self) -> None:
        # every synchronous word that arrived, its receive posted again
        done = collectives.testsome(self._sync_recvs, f"MPI_Testsome (the {self.what}'s "
                                                       f"words)")
        for i in done:
            source = self._others[i]
            self._keep(source, *self._sync_in[source])
            self._sync_recvs[i] = self._post(source)

    def _keep(self, source: int, index: int, value: int) -> None:
        index, value = int(index), int(value)
        if value > self._table[source, index]:
            self._table[source, index] = value
            self.top[index] = max(self.top[index], value)

    def look(self) -> None:
        """The look of every exchange step: the synchronous words that arrived (one
        MPI_Testsome); every LOOK_EVERY-th look also takes the eventual ones, which
        only keeps them from piling up (MAX_UNTAKEN) while this rank trains, and sends
        those held back."""
        self._take_sync()
        self._looks += 1
        if self._looks % LOOK_EVERY == 0:
            self._take_words()
            if self._holding:
                self._send_held()

    def _take_words(self) -> None:
        # every eventual word that arrived, in the order each rank sent them
        status = self.MPI.Status()
        while self.comm.Iprobe(source=self.MPI.ANY_SOURCE, tag=WORD_TAG, status=status):
            source = status.Get_source()
            self.comm.Recv([self._got, self.MPI.INT64_T], source=source, tag=WORD_TAG)
            self._taken[source] += 1
            self._keep(source, *self._got)

    def _send_word(self, target: int, index: int, value: int) -> None:
        # an eventual word to `target`, or held back while MAX_UNTAKEN wait there
        untaken = self._untaken[target]
        untaken[:] = [s for s in untaken if not s[0].Test()]
        if len(untaken) >= MAX_UNTAKEN:
            self._held[target][index] = value
            self._holding = True
            return
        word = np.array([index, value], dtype=np.int64)
        untaken.append((self.comm.Issend([word, self.MPI.INT64_T], dest=target,
                                         tag=WORD_TAG), word))
        self._sent[target] += 1

    def _send_held(self) -> None:
        # the words held back, to the readers that took some since
        self._holding = False
        for target in self._others:
            held, self._held[target] = self._held[target], {}
            for index, value in held.items():
                self._send_word(target, index, value)

    def progress(self) -> None:
        """Take the words that arrived; send those held back where there is room."""
        self._take_sync()
        self._take_words()
        if self._holding:
            self._send_held()

    def publish(self, index: int, value: int) -> None:
        """Write `value` as this rank's word `index` on every rank's board: delivered
        before returning for a synchronous word, eventually otherwise."""
        self._keep(self.rank, index, value)
        if index not in self.synchronous:
            for target in self._others:
                self._send_word(target, index, value)
            return
        word = np.array([index, value], dtype=np.int64)
        sends = [self.comm.Issend([word, self.MPI.INT64_T], dest=target, tag=SYNC_TAG)
                 for target in self._others]
        # this rank's own posted receives stay served meanwhile: a rank publishing to it
        # at the same time waits for them.  An exception out of the wait (a process
        # failure, Ctrl-C) hands the sends to the leftovers with their word
        try:
            late = collectives.wait_polled(sends, time.monotonic() + self.timeout,
                                           between=self._take_sync)
        except BaseException:
            for send in sends:
                collectives.leave(send, word)
            raise
        if late:
            for i in late:
                collectives.leave(sends[i], word)
            raise NeighbourTimeoutError(
                self.rank, f"the {self.what}'s word {index} to be received",
                [self._others[i] for i in late], [], [], self.timeout)

    def read(self) -> np.ndarray:
        """This rank's board with every word received so far: row r holds rank r's
        words (a copy)."""
        self.progress()
        return self._table.copy()

    def peek(self) -> np.ndarray:
        """read() without the copy: the array is the board's own, updated by the next
        call."""
        self.progress()
        return self._table

    def peeker(self, index: int) -> MessagePeek:
        """A peek of word `index` of every rank (Board.peeker's counterpart)."""
        return MessagePeek(self, index)

    def __del__(self):
        # dropped without free() (an Exchange never freed, an error before free()): a
        # posted receive may still take a word, an untaken send still reads its own:
        # both go to the leftovers with their memory (no MPI call here)
        if getattr(self, "live", False):
            for req in getattr(self, "_sync_recvs", ()):
                collectives.leave(req, self._sync_in)
            for untaken in getattr(self, "_untaken", ()):
                for req, word in untaken:
                    collectives.leave(req, word)

    def free(self, meet: bool = True) -> None:
        """Collective: cancel the posted receives, receive every eventual word sent to
        this rank (the ranks exchange how many each sent each), complete the sends;
        safe twice."""
        if not self.live:
            return
        deadline = time.monotonic() + self.timeout
        if meet:
            collectives.barrier(self.comm, self.timeout, f"the end of the {self.what}")
        collectives.cancel(self._sync_recvs)
        self._sync_recvs = []
        sent = collectives.allgather(self.comm, self._sent, self.timeout,
                                     f"the counts of the {self.what}'s messages")
        owed = [sent[r][self.rank] - self._taken[r] for r in range(self.n)]
        while any(owed) and time.monotonic() < deadline:
            self._take_words()
            owed = [sent[r][self.rank] - self._taken[r] for r in range(self.n)]
            if any(owed):
                time.sleep(1e-4)
        sends = [(t, s) for t in self._others for s in self._untaken[t]]
        late = collectives.wait_polled([s[0] for _, s in sends], deadline)
        for i in late:
            collectives.leave(*sends[i][1])
        unsent = sorted({sends[i][0] for i in late})
        self._untaken = [[] for _ in range(self.n)]
        self.live = False
        missing = [r for r, o in enumerate(owed) if o]
        if missing or unsent:
            raise NeighbourTimeoutError(
                self.rank, f"the last messages of the {self.what}",
                sorted(set(missing) | set(unsent)), [], [], self.timeout)
