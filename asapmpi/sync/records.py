"""Bounded per-iteration records of the policies (iteration traces, reduced versions,
pulls, supersteps), optionally streamed to HDF5.

A policy appends one row per iteration (or per reduce) to a `Table`.  A table keeps the
last `keep` rows in a preallocated ring (asapmpi.rc.trace_iterations), so a run of
millions of steps holds a fixed amount of memory; `array()` returns the rows kept and
`first` the index of the oldest of them.  When the Exchange was created with a trace
file, every row also goes to this rank's part file in chunks before the ring can
overwrite it, so the file holds the whole run (asapmpi.trace merges the parts).
"""
from __future__ import annotations

import os
from typing import Dict, Optional

import numpy as np

from ..errors import ConfigError

#: rows written to a part file at a time (at most the ring's size)
CHUNK_ROWS = 4096


def part_path(path: str, rank: int) -> str:
    """The file rank `rank` streams its records to while a trace file is being written."""
    return f"{path}.rank{rank:05d}.part"


class Table:
    """One kind of row (fixed width and dtype, set by the first row) in a ring of `keep`
    rows, optionally streamed to a dataset of an open HDF5 file."""

    def __init__(self, name: str, dtype, keep: int, sink=None):
        self.name = name
        self.dtype = np.dtype(dtype)
        self.keep = int(keep)
        self.count = 0                 # rows appended since the start
        self._rows: Optional[np.ndarray] = None
        self._sink = sink              # an h5py.File, or None
        self._written = 0              # rows already in the sink

    @property
    def first(self) -> int:
        """Index (from 0) of the oldest row still kept in memory."""
        return max(0, self.count - self.keep)

    def append(self, row) -> None:
        """Add a row (a sequence of numbers, always of the same length)."""
        self.next_row(len(row))[:] = row

    def next_row(self, width: int) -> np.ndarray:
        """The next row, counted as appended, as a writable view: a hot loop writes its
        cells in place instead of building a tuple for append().  Rows are streamed
        here, before a row is handed out: the earlier ones are complete by then, and
        the ring never overwrites a row not yet in the part file."""
        if self._rows is None:
            self._rows = np.zeros((self.keep, width), dtype=self.dtype)
        if self._sink is not None and self.count - self._written >= self._chunk:
            self.flush()
        row = self._rows[self.count % self.keep]
        self.count += 1
        return row

    @property
    def _chunk(self) -> int:
        return min(CHUNK_ROWS, self.keep)

    def array(self) -> np.ndarray:
        """The rows kept, oldest first (a copy); shape (0, 0) before the first row."""
        if self._rows is None:
            return np.zeros((0, 0), dtype=self.dtype)
        return self._ordered(self.first, self.count)

    def last(self, n: int) -> np.ndarray:
        """The newest `n` rows (n <= keep), oldest first."""
        if n > min(self.count, self.keep):
            raise ConfigError(f"{self.name}: {n} rows asked for, {min(self.count, self.keep)} "
                              f"kept (asapmpi.rc.trace_iterations)")
        if n == 0 or self._rows is None:
            return np.zeros((0, 0 if self._rows is None else self._rows.shape[1]),
                            dtype=self.dtype)
        return self._ordered(self.count - n, self.count)

    def __len__(self) -> int:
        return self.count

    def _ordered(self, start: int, stop: int) -> np.ndarray:
        # rows start..stop-1 (global indices), all still in the ring
        lo, hi = start % self.keep, stop % self.keep
        if stop - start == self.keep or (hi <= lo and stop > start):
            return np.concatenate([self._rows[lo:], self._rows[:hi]])
        return self._rows[lo:hi].copy()

    def flush(self) -> None:
        """Write the rows not yet in the part file (no-op without one)."""
        if self._sink is None or self._rows is None or self._written == self.count:
            return
        rows = self._ordered(self._written, self.count)
        if self.name not in self._sink:
            self._sink.create_dataset(self.name, shape=(0, rows.shape[1]),
                                      maxshape=(None, rows.shape[1]), dtype=self.dtype,
                                      chunks=(self._chunk, rows.shape[1]))
        ds = self._sink[self.name]
        ds.resize(self.count, axis=0)
        ds[self._written:self.count] = rows
        self._written = self.count


class Records:
    """The tables of one policy on one rank: bounded rings, streamed to
    `part_path(path, rank)` when `path` is given."""

    def __init__(self, keep: Optional[int] = None, path: Optional[str] = None,
                 rank: int = 0):
        from ..rc import rc

        keep = rc.trace_iterations if keep is None else keep
        if isinstance(keep, bool) or not isinstance(keep, (int, np.integer)) or keep < 1:
            raise ConfigError(f"the trace ring needs at least one row, got {keep!r}; "
                              f"set asapmpi.rc.trace_iterations >= 1")
        self.keep = int(keep)
        self.path = path
        self.rank = rank
        self._tables: Dict[str, Table] = {}
        self._file = None
        if path is not None:
            import h5py

            self._file = h5py.File(part_path(path, rank), "w")

    def table(self, name: str, dtype=np.float64) -> Table:
        """The table `name`, created empty on first use."""
        if name not in self._tables:
            self._tables[name] = Table(name, dtype, self.keep, self._file)
        return self._tables[name]

    @property
    def tables(self) -> Dict[str, Table]:
        """Every table, by name."""
        return dict(self._tables)

    def close(self) -> None:
        """Write what is pending and close the part file (safe to call twice)."""
        if self._file is None:
            return
        for t in self._tables.values():
            t.flush()
            t._sink = None
        self._file.close()
        self._file = None

    def discard(self) -> None:
        """Close and delete the part file (a run that will not be merged)."""
        self.close()
        if self.path is not None:
            try:
                os.unlink(part_path(self.path, self.rank))
            except FileNotFoundError:
                pass


def entry_trace(entries: Table, reduced: Table) -> Dict[str, np.ndarray]:
    """The trace asapmpi.trace checks, from a table of iteration entries (lo, hi; row i
    is iteration i + 1) and one of reduces (k, then the version used from each
    in-neighbour): lo, hi, `first` (the iteration of lo[0] and hi[0]) and reduced."""
    rows = entries.array()
    done = reduced.array() if reduced.count else np.zeros((0, 1), dtype=np.int64)
    return {"lo": rows[:, 0] if len(rows) else np.zeros(0),
            "hi": rows[:, 1] if len(rows) else np.zeros(0),
            "first": np.int64(entries.first + 1), "reduced": done}
