"""ElasticBSP barrier selection (Zhao et al., "Elastic Bulk Synchronous Parallel", ICDM'19).

ElasticBSP lets every worker run freely and imposes the next synchronization barrier at
the moment when the workers' iterations end closest together.  Given, for each of n
workers, its next R predicted iteration end timestamps (an n x R matrix ``ends``, row p
non-decreasing), pick one timestamp per row so that the spread
``d_Z = max(Z) - min(Z)`` (the fastest worker's wait for the slowest, Sec. III) is
minimal.  Worker p then synchronizes after ``index[p] + 1`` more iterations, and the
barrier is at ``max(Z)``.

Algorithms (Sec. IV, Table I and II of the paper):

* :func:`zipline`: exact.  The paper's sweep (Algorithm 2) is O(R n^2); this one solves
  the "smallest range covering n sorted lists" problem in C with buckets and bounds:
  O(nR), no global sort or merge (see the function's docstring).
* :func:`gridscan`: the paper's heuristic (Algorithm 1), O(R^2 n) in the paper, one
  vectorized pass here.  It can miss the optimum: that is the point of the comparison.
* :func:`full_gridscan`: GridScan with every row designated in turn (the paper's
  "optimized brute force"), O(R^2 n^2).  It is NOT always optimal, see its docstring.
* :func:`predict_ends`: the paper's predictor of future iteration ends.

Choices where the paper is silent or ambiguous (each is tested in tests/policies/test_zipline.py):

* Ties between optimal sets: the earliest barrier (smallest max) wins, then the
  smallest index of every worker.  This agrees with the paper's Fig. 3 ("the first
  minimum d_Z is selected", scanning the timeline from the left).  Since an optimal
  set's window [barrier - spread, barrier] is then fixed, taking every worker's first
  timestamp in that window gives the index vector that is smallest in every component,
  hence also lexicographically.
* Spreads are compared as computed in float64 (``max - min``); a brute force doing the
  same arithmetic finds the same set.
* GridScan's "closest point" of a row to a designated timestamp e: of e's two
  neighbours in the row (the last point < e and the first point >= e) the nearer one,
  the earlier one if both are equally near; among equal timestamps in a row the first.
  This is ``argmin |row - e|`` (first index on ties) up to float rounding of the
  distances.
* GridScan's designated row is the one with the earliest first timestamp (line 4 of
  Algorithm 1), the lowest worker index on ties.  Among the R (GridScan) or nR
  (FullGridScan) candidate sets the same rule as above picks one: the smallest spread,
  then the earliest barrier, then the earliest designated timestamp.  Algorithm 1's
  lines 12-14 look nested in the per-worker loop in the extracted text, which would
  score incomplete sets; only complete sets (one point per worker) are scored here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from ..errors import ConfigError

__all__ = ["Choice", "full_gridscan", "gridscan", "predict_ends", "zipline"]


@dataclass(frozen=True, eq=False)
class Choice:
    """A barrier choice: one predicted iteration end per worker.

    ``index[p]``: 0-based index into worker p's row (it synchronizes after ``index[p] + 1``
    more iterations); ``times[p] = ends[p, index[p]]``; ``spread = max(times) -
    min(times)``, the waiting spread d_Z the paper minimizes; ``barrier = max(times)``,
    when every worker has reached the barrier.  The arrays are read-only; choices do
    not define ``==`` (compare their fields).
    """

    index: np.ndarray
    times: np.ndarray
    spread: float
    barrier: float


def _choice(ends: np.ndarray, index: np.ndarray) -> Choice:
    index = np.asarray(index, dtype=np.int64)
    times = ends[np.arange(ends.shape[0]), index]
    index.setflags(write=False)
    times.setflags(write=False)
    hi = float(times.max())
    return Choice(index=index, times=times, spread=hi - float(times.min()), barrier=hi)


def _validate_ends(ends) -> np.ndarray:
    """``ends`` as a C-contiguous float64 n x R array, or ConfigError saying what to fix.
    NumPy's vectorized passes: a scalar C loop measured slower (0.12 ms against 0.11 at
    1000 x 150)."""
    try:
        m = np.ascontiguousarray(ends, dtype=np.float64)      # no copy if it is one
    except (TypeError, ValueError):
        raise ConfigError("ends must be an n x R array of numbers (one row of predicted "
                          "iteration end times per worker)") from None
    if m.ndim != 2:
        raise ConfigError(f"ends must be 2-D, n workers x R predicted ends; got shape "
                          f"{m.shape}")
    if m.shape[0] < 1 or m.shape[1] < 1:
        raise ConfigError(f"ends needs at least 1 worker and 1 predicted end; got shape "
                          f"{m.shape}")
    if not np.isfinite(m).all():
        raise ConfigError("ends must be finite; remove NaN/inf predictions (worker "
                          f"{int(np.flatnonzero(~np.isfinite(m).all(axis=1))[0])})")
    bad = m[:, 1:] < m[:, :-1]
    if bad.any():
        p = int(np.flatnonzero(bad.any(axis=1))[0])
        raise ConfigError(f"each row of ends must be non-decreasing; sort worker {p}'s "
                          "predicted end times")
    return m


# --------------------------------------------------------------------------- ZipLine


def zipline(ends) -> Choice:
    """ZipLine (Algorithm 2): the optimal barrier, one predicted end per worker with the
    smallest spread max - min; ties: earliest barrier, then smallest indices.

    Method (exact, in C: asapmpi.sync._sweep, whose docstring has the details): the best
    window starting at a point lo ends at hi(lo), the largest over rows of the row's
    first point >= lo, and hi(lo) is a running maximum over the rows' gaps (pairs of
    consecutive points) in the order of their starts.  One pass puts the gaps into
    buckets by start; per bucket, a lower bound of its spreads and an upper bound of the
    optimum rule out all but a few buckets (2 or 3 of 8192 at 1000 x 150 on rows of one
    kind), whose gaps alone are sorted and scanned, the same way one level down.  The
    candidates are scanned in increasing lo and a window replaces the best one only if
    its spread is strictly smaller: the first minimal spread wins, which also has the
    earliest barrier, and every worker's first point >= lo gives the smallest indices.
    O(nR), no global sort or merge; at n=1000, R=150 it stays under the 3 ms of issue
    48 on every input family of `asapmpi bench zipline`, rows in lockstep (every window
    about as good) the slowest (docs/BENCHMARKS.md); the paper reports 2.38 s for its
    O(R n^2) version.
    """
    # compiled (no MPI): imported where it runs, so that importing asapmpi.sync loads
    # no extension module
    from ._sweep import covering_window, first_at_least

    m = _validate_ends(ends)
    lo, _ = covering_window(m)
    # every worker's first point >= lo: componentwise the smallest optimal indices
    index = np.empty(m.shape[0], dtype=np.int64)
    first_at_least(m, lo, index)
    return _choice(m, index)


# --------------------------------------------------------------- GridScan, FullGridScan


def _closest_index(m: np.ndarray, e: float) -> np.ndarray:
    """Per row, the index of the point closest to ``e`` (the module's tie rules)."""
    n, r = m.shape
    rows = np.arange(n)
    k = (m < e).sum(axis=1)                     # first point >= e (first of its value)
    left = m[rows, np.maximum(k - 1, 0)]
    right = m[rows, np.minimum(k, r - 1)]
    use_left = (k == r) | ((k > 0) & (e - left <= right - e))
    left_first = (m < left[:, None]).sum(axis=1)        # first of equal timestamps
    return np.where(use_left, left_first, k)


def _closest_extremes(m: np.ndarray, queries: np.ndarray, cells: int = 1_000_000):
    """For each query e (``queries`` sorted), max and min over rows of the row's closest
    point to e: the barrier and the first arrival of the set built around e.

    No Python loop over rows: for a chunk of C sorted queries, t = searchsorted(chunk,
    point, 'right') says that point < e_j iff j >= t, so a per-row histogram of t,
    cumulated, gives k[q, j] = #{points of row q < e_j} for all rows at once (n x C).
    Chunks keep n x C near ``cells``.
    """
    n, r = m.shape
    flat = m.ravel()
    row_base = np.repeat(np.arange(n, dtype=np.intp), r)
    chunk = max(1, cells // n)
    highs = np.empty(queries.size)
    lows = np.empty(queries.size)
    for start in range(0, queries.size, chunk):
        e = queries[start:start + chunk]
        c = e.size
        t = np.searchsorted(e, flat, side="right")
        hist = np.bincount(row_base * (c + 1) + t, minlength=n * (c + 1)).reshape(n, c + 1)
        k = np.cumsum(hist[:, :c], axis=1)
        left = np.take_along_axis(m, np.maximum(k - 1, 0), axis=1)
        right = np.take_along_axis(m, np.minimum(k, r - 1), axis=1)
        use_left = (k == r) | ((k > 0) & (e - left <= right - e))
        closest = np.where(use_left, left, right)
        highs[start:start + c] = closest.max(axis=0)
        lows[start:start + c] = closest.min(axis=0)
    return highs, lows


def _best_designated(m: np.ndarray, queries: np.ndarray) -> Choice:
    """The best set built around one of ``queries`` (sorted): smallest spread, then
    earliest barrier, then earliest query."""
    highs, lows = _closest_extremes(m, queries)
    spread = highs - lows
    tied = spread == spread.min()
    best = int(np.flatnonzero(tied & (highs == highs[tied].min()))[0])
    return _choice(m, _closest_index(m, float(queries[best])))


def gridscan(ends) -> Choice:
    """GridScan (Algorithm 1), the paper's heuristic: designate the row with the earliest
    first timestamp; for each of its R points, build the set of every other row's closest
    point to it; return the set with the smallest spread (ties: earliest barrier, then
    earliest designated point).

    Not optimal: it only builds sets around the designated row's points, and a row's
    closest point to e may lie on the wrong side of e.  Example: rows [0, 1], [7, 9],
    [0, 4]; the first row is designated (earliest first timestamp, lowest index on the
    tie with the third); around 0 the set is {0, 7, 0}, around 1 it is {1, 7, 0}
    (|0 - 1| < |4 - 1|): spread 7 both (the first is returned), while {1, 7, 4} has
    spread 6.  Vectorized: one pass, no loop over rows.
    """
    m = _validate_ends(ends)
    designated = int(np.argmin(m[:, 0]))        # line 4 of Algorithm 1; first on ties
    return _best_designated(m, m[designated])


def full_gridscan(ends) -> Choice:
    """FullGridScan: GridScan with every row designated in turn (Algorithm 1 without line
    4), the best of the nR sets (ties: smallest spread, earliest barrier, earliest
    designated timestamp).  O(R^2 n^2) in the paper; here the set built around a point
    depends only on its timestamp, so each distinct timestamp is scanned once, in chunks
    (O(n^2 R log R) work, memory bounded).

    The paper calls it an optimized brute force, but it is NOT always optimal: around
    each point it takes every row's closest point, which may lie on the far side from
    the rest of the optimal set.  A smallest counterexample (exhaustive search over
    4 x 2 integer matrices): rows [0, 1], [0, 3], [1, 4], [3, 4].
    The optimum is {1, 3, 1, 3}, spread 2; the sets built around 0, 1, 3, 4 are
    {0, 0, 1, 3}, {1, 0, 1, 3} (0 is nearer 1 than 3 is), {1, 3, 4, 3} (4 is nearer 3
    than 1 is), {1, 3, 4, 4}: spread 3 each.  It is optimal for n <= 3: around the
    middle point b of an optimal set a <= b <= c, the other rows' closest points lie in
    [a, 2b - a] and [2b - c, c], so the set's spread is at most c - a.
    """
    m = _validate_ends(ends)
    return _best_designated(m, np.unique(m))


# ------------------------------------------------------------------------- prediction


def predict_ends(history: Sequence, R: int, now: Optional[float] = None,
                 window: int = 5) -> np.ndarray:
    """Predict every worker's next ``R`` iteration end times (an n x R array for
    :func:`zipline`) from its recent end timestamps.

    ``history[p]``: worker p's most recent iteration end timestamps, oldest first, at
    least 2.  The paper predicts "future intervals ... based on their most recent
    intervals, assuming a stable environment" (Sec. II, III) without a formula; here a
    worker's interval is the mean of its last ``window`` intervals (fewer if the history
    is shorter; ``window=1`` is "the most recent interval"), and its predicted ends are
    ``last_end + interval * (1, ..., R)``.  With ``now`` given, a worker whose next
    predicted end is already past (it is late) is assumed to end its current iteration
    at ``now``, and the later ones follow at its interval: a prediction never lies in
    the past.
    """
    if isinstance(R, bool) or not isinstance(R, (int, np.integer)) or R < 1:
        raise ConfigError(f"R (predicted iterations per worker) must be an integer >= 1, "
                          f"got {R!r}")
    if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 1:
        raise ConfigError(f"window (intervals averaged) must be an integer >= 1, "
                          f"got {window!r}")
    if now is not None and not np.isfinite(now):
        raise ConfigError(f"now must be a finite timestamp or None, got {now!r}")
    if len(history) < 1:
        raise ConfigError("history needs at least one worker's end timestamps")
    last = np.empty(len(history))
    interval = np.empty(len(history))
    for p, times in enumerate(history):
        try:
            h = np.asarray(times, dtype=np.float64)
        except (TypeError, ValueError):
            raise ConfigError(f"history[{p}] must be a 1-D array of timestamps") from None
        if h.ndim != 1 or h.size < 2:
            raise ConfigError(f"history[{p}] needs at least 2 end timestamps (a 1-D array) "
                              f"to measure an interval; got shape {h.shape}")
        if not np.isfinite(h).all() or (np.diff(h) < 0).any():
            raise ConfigError(f"history[{p}] must be finite and non-decreasing (oldest "
                              "first)")
        w = min(int(window), h.size - 1)
        last[p] = h[-1]
        interval[p] = (h[-1] - h[-1 - w]) / w   # mean of the last w intervals
    first = last + interval
    if now is not None:
        first = np.maximum(first, float(now))
    return first[:, None] + interval[:, None] * np.arange(R)
