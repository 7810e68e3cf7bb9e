"""A board: every rank's few int64 words, readable by every rank without a collective.

A board is a channel with user words only (no slots): rank r's row is its `words`
words at r * words in every rank's user words.  Each rank writes its own row into
every reader's copy through the channel's words and reads its own copy of every row;
which channel decides how a word travels (`messages`):

- on a window (the put channel's words, asapmpi._core.PutWindow): an atomic REPLACE
  into each reader's copy, flushed under the watchdog (a flush to a dead rank ends the
  job naming it, never a hang): complete at every reader when publish() returns;
- by messages (a mailbox's words, asapmpi._core.MailboxWindow), for an exchange with
  no MPI window (the messages channel, the allreduce policy: on Open MPI with UCX a
  window makes every MPI call progress a worker of its own, docs/PROTOCOL.md): the
  whole row as one synchronous send to each reader, one in flight per reader, a newer
  row sent once the reader took the one before (so at most one of a rank's row
  messages waits unreceived at a reader: MPICH's network path stalls a sender past
  64).  A `synchronous` word's publish returns once every reader took it (a deadline
  names those that did not), and the reader's next look completes it into its copy
  (A13); any other word arrives eventually.  Every wait of this process that lasts
  past its first polls pumps the board's mailbox too (asapmpi._core: _settle_all), so
  a rank waiting elsewhere still takes the rows sent to it.

Reads: read() is this rank's copy, each word read atomically (an MPI atomic on a
window, atomic loads after a pump by messages); peek() and peeker() are atomic loads
of it after a fence (a window needs the unified model, which every channel checks:
docs/PROTOCOL.md A1, A12), for words whose writes completed before the reader looks
for them (the join board's lag rule): about 0.1 us against 15 us for a read on a
window.  The words only grow (each caller's encoding), so a reader sees a word either
before or after a concurrent write, never torn (accumulates of one int64 are atomic
with each other, MPI-3.1 11.7.1; a row by message is stored word by word with atomic
stores).

Load balancing's speed board and the Exchange's join board are boards.  mpi4py and
NumPy only; the channel is made when a board is.
"""
from __future__ import annotations

from typing import Iterable, Optional, Sequence

import numpy as np

from .errors import ConfigError, MPIError


class Board:
    """`words` (1 to 6) int64 words per rank on every rank's board (module docstring):
    written into the boards of `readers` (per rank a bool; None: every rank), by
    messages if `messages`, where `synchronous` lists the words publish() delivers
    before it returns.  Collective to create and to free; `with` frees it on a normal
    exit only (a collective after an error could wait on a dead rank).  `what` names
    the board in errors."""

    def __init__(self, comm, words: int, timeout: float, what: str,
                 readers: Optional[Sequence[bool]] = None, messages: bool = False,
                 synchronous: Iterable[int] = ()):
        from . import _core
        from .rc import rc
        from .windowhint import explained

        self.rank, self.n = comm.Get_rank(), comm.Get_size()
        self.words, self.timeout, self.what = words, timeout, what
        if not 1 <= words <= _core.ROW_WORDS_MAX:
            raise ConfigError(f"a board has 1 to {_core.ROW_WORDS_MAX} words per rank, "
                              f"got {words}")
        readers = [True] * self.n if readers is None else [bool(r) for r in readers]
        if len(readers) != self.n:
            raise ConfigError(f"readers has {len(readers)} entries for {self.n} ranks")
        #: the words publish() delivers before it returns (on a window: every word)
        self.synchronous = frozenset(range(words)) if not messages else \
            frozenset(synchronous)
        layout = _core.Layout(0, 0, 1, 8, words * self.n)
        self._first = layout.user_disp(0)
        kind = _core.MailboxWindow if messages else _core.PutWindow
        try:
            self.channel = kind(comm, layout, [], [], [], [], [], "float64",
                                poll_yields=rc.poll_yields,
                                poll_max_sleep_us=rc.poll_max_sleep_us,
                                flush_timeout=timeout)
        except MPIError as exc:
            raise explained(exc) from None
        self.channel.set_row(layout.user_disp(words * self.rank), words,
                             [r for r in range(self.n) if readers[r]], what)

    @property
    def messages(self) -> bool:
        """Whether the words go by messages (no MPI window)."""
        return not self.channel.rma

    @property
    def live(self) -> bool:
        """False once free() or abandon() ran."""
        return not self.channel.freed

    def publish(self, index: int, value: int) -> None:
        """Write `value` as this rank's word `index` into every reader's board: complete
        there when this returns for a synchronous word (every word on a window), at a
        later pump otherwise."""
        self.channel.publish_word(index, value, index in self.synchronous)

    def read(self) -> np.ndarray:
        """This rank's board, read atomically word by word: row r holds rank r's words
        (a new array).  One poll of progress first: on Open MPI with UCX over TCP a
        writer's accumulate into this rank's window completes only when this rank
        progresses UCX, which a read of its own window alone does not do."""
        self.channel.progress()
        return self.channel.fetch_words(self.rank, self._first,
                                        self.n * self.words).reshape(self.n, self.words)

    def peek(self) -> np.ndarray:
        """This rank's board by atomic loads (module docstring: only for words whose
        writes completed before the caller looks); a new array."""
        return self.channel.local_words(self._first,
                                        self.n * self.words).reshape(self.n, self.words)

    def peeker(self, index: int):
        """An asapmpi._core.WordPeek of word `index` of every rank on this rank's board
        (seen() is False once the board is freed)."""
        if not 0 <= index < self.words:
            raise ConfigError(f"word {index} is outside the board's {self.words} words")
        return self.channel.word_peek(self._first + 8 * index, self.words, self.n)

    def progress(self) -> None:
        """Take the rows that arrived and send those that waited (by messages)."""
        self.channel.progress()

    def abandon(self) -> None:
        """After a process failure: leave the board without an MPI call that could wait
        on the dead rank (the channel's abandon())."""
        self.channel.abandon()

    def free(self) -> None:
        """Collective: free the board's channel (its free() meets every rank under the
        watchdog and receives every row still on its way); safe twice."""
        self.channel.free()

    def __enter__(self) -> "Board":
        return self

    def __exit__(self, kind, value, traceback) -> None:
        if kind is None:
            self.free()
