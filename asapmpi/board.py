"""A board: every rank's few int64 words, readable by every rank without a collective.

Each rank owns `words` words of every rank's board (an MPI window of n * words int64 on
every rank) and writes them into every target's board with passive-target RMA, in one
MPI_Win_lock_all epoch held from creation to free(); a rank reads its own board:

- write: MPI_Accumulate(word, REPLACE); MPI_Win_flush(target), under the watchdog
  (collectives.flush: a flush to a dead rank ends the job naming it, never a hang);
- read:  MPI_Get_accumulate(NO_OP) of the whole board; MPI_Win_flush(self);
- peek:  a fence, then one 8-byte atomic load per word of its memory
  (`_core.kernels.load_words`, or `peeker()` for the largest of one word per rank:
  about 0.1 us against 15 us for a read), for a word read on every exchange step (the
  join board's joined-at words).

Accumulates of one basic datatype on one location are atomic with each other (MPI-3.1
section 11.7.1), so a reader sees a word either before or after a concurrent write,
never torn; Flush returns once the accumulate is complete at the target.  A peek
relies on the unified memory model (MPI-4.0 12.4: updates by accumulate calls are
eventually observed by loads without additional RMA calls; `unified`, docs/PROTOCOL.md
A1) and on an 8-byte accumulate of one int64 being seen whole by an 8-byte atomic load
(A12); it is used only for words whose writes completed before the reader looks for
them (the join board's lag rule).  The board's initial zeros are written under an
exclusive self-lock before the collective that shares it.

Load balancing's speed board and the Exchange's join board are boards.  mpi4py and
NumPy only; mpi4py.MPI is imported when a board is made.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from .errors import MPIError
from .errors import mpi_error as _classified


def mpi_error(call: str, exc) -> MPIError:
    """MPIError of an mpi4py MPI.Exception."""
    return _classified(exc.Get_error_code(), call, exc.Get_error_string())


class Board:
    """`words` int64 words per rank on every rank's board (module docstring).  Collective
    to create and to free; `with` frees it on a normal exit only (a collective after an
    error could wait on a dead rank).  `what` names the board in errors."""

    def __init__(self, comm, words: int, timeout: float, what: str,
                 readers: Optional[Sequence[bool]] = None):
        from mpi4py import MPI

        from . import collectives

        self.MPI, self.collectives = MPI, collectives
        self.comm, self.timeout, self.what = comm, timeout, what
        self.rank, self.n = comm.Get_rank(), comm.Get_size()
        self.words = words
        #: the ranks whose boards are written (the others never read theirs)
        self.readers = [True] * self.n if readers is None else [bool(r) for r in readers]
        self._words = np.zeros(words * self.n, dtype=np.int64)
        self._one = np.zeros(1, dtype=np.int64)
        self.win = None
        try:
            self.win = MPI.Win.Allocate(self._words.nbytes, 8, comm=comm)
            self.win.Set_errhandler(MPI.ERRORS_RETURN)
            self.win.Lock(self.rank, MPI.LOCK_EXCLUSIVE)
            np.frombuffer(self.win.tomemory(), dtype=np.int64)[:] = 0
            self.win.Unlock(self.rank)
        except MPI.Exception as exc:
            raise mpi_error(f"MPI_Win_allocate ({what})", exc) from None
        self._memory = np.frombuffer(self.win.tomemory(), dtype=np.int64)
        #: loads of the memory see completed accumulates (peek); else only read() does
        self.unified = self.win.Get_attr(MPI.WIN_MODEL) == MPI.WIN_UNIFIED
        self._peeked = np.zeros_like(self._words)
        # nobody writes into a board before its owner zeroed it
        collectives.barrier(comm, timeout, what)
        try:
            self.win.Lock_all()
        except MPI.Exception as exc:
            raise mpi_error(f"MPI_Win_lock_all ({what})", exc) from None

    @property
    def live(self) -> bool:
        """False once free() ran."""
        return self.win is not None

    def publish(self, index: int, value: int) -> None:
        """Write `value` as this rank's word `index` into every reader's board."""
        MPI = self.MPI
        self._one[0] = value
        where = (self.words * self.rank + index, 1, MPI.INT64_T)
        target = self.rank
        try:
            for target in range(self.n):
                if not self.readers[target]:
                    continue
                self.win.Accumulate([self._one, MPI.INT64_T], target, where, MPI.REPLACE)
                # a flush to a dead rank may never return (on network paths it waits
                # for the target's progress): the watchdog ends the job naming it
                self.collectives.flush(self.win, target, self.timeout,
                                       f"MPI_Win_flush of rank {self.rank}'s word {index} "
                                       f"of the {self.what}")
        except MPI.Exception as exc:
            raise mpi_error(f"MPI_Accumulate (rank {self.rank}'s word {index} of the "
                            f"{self.what} to rank {target})", exc) from None

    def read(self) -> np.ndarray:
        """This rank's board, read atomically word by word: row r holds rank r's words."""
        MPI = self.MPI
        try:
            self.win.Get_accumulate([np.zeros_like(self._words), MPI.INT64_T],
                                    [self._words, MPI.INT64_T], self.rank,
                                    (0, len(self._words), MPI.INT64_T), MPI.NO_OP)
            self.collectives.flush(self.win, self.rank, self.timeout,
                                   f"MPI_Win_flush of the read of the {self.what}")
        except MPI.Exception as exc:
            raise mpi_error(f"MPI_Get_accumulate (rank {self.rank}'s {self.what})",
                            exc) from None
        return self._words.reshape(self.n, self.words).copy()

    def peeker(self, index: int):
        """A `_core.kernels.WordPeek` of word `index` of every rank on this rank's board
        (module docstring: valid until free())."""
        from ._core.kernels import WordPeek

        return WordPeek(self._memory, self.words, index)

    def peek(self) -> np.ndarray:
        """This rank's board by atomic loads of its memory (module docstring: only for
        words whose writes completed before the caller looks); the array returned is
        reused by the next peek."""
        from ._core.kernels import load_words

        load_words(self._memory, self._peeked)
        return self._peeked.reshape(self.n, self.words)

    def free(self, meet: bool = True) -> None:
        """Collective: free the window (after a barrier with a deadline unless the ranks
        just met: `meet=False`); safe twice."""
        if self.win is None:
            return
        if meet:
            self.collectives.barrier(self.comm, self.timeout, f"the end of the {self.what}")
        self._memory = None         # no view of the window's memory outlives it
        try:
            self.win.Unlock_all()
            self.win.Free()
        except self.MPI.Exception as exc:
            raise mpi_error(f"MPI_Win_unlock_all/MPI_Win_free ({self.what})", exc) from None
        self.win = None

    def __enter__(self) -> "Board":
        return self

    def __exit__(self, kind, value, traceback) -> None:
        if kind is None:
            self.free()
