# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""ZipLine's sweep: the smallest window that holds a point of every one of n sorted rows.

A k-way merge of the rows with a binary min-heap of their current points, in C without
the GIL: O(nR log n) and no global sort (the argsort of the nR points took 7-8 of the
13 ms ZipLine needed for 1000 workers x 150 random ends on this project's machine).

Plateaus are jumped: while the window's end hi stays the same, each popped point only
moves the start lo up, and the best window of the plateau is its last one, at X, the
smallest over rows of the last point <= hi.  After n pops without hi changing the sweep
goes to X at once (each row to its first point >= X, by binary search, and the heap
rebuilt: O(n log R), paid for by the n pops before it), the state a pop-by-pop sweep
would reach there.  A row pinned far above the others (one slow worker) made every point
of the other rows a pop of one long plateau: 150,000 pops at 1000 x 150, now one jump.
"""
from libc.math cimport INFINITY
from libc.stdlib cimport free, malloc


cdef struct Entry:
    double value
    Py_ssize_t row


cdef inline void _sift_up(Entry *heap, Py_ssize_t i, Entry e) noexcept nogil:
    """Put `e` into the hole at `i`, moving it towards the root past larger parents."""
    cdef Py_ssize_t parent
    while i > 0:
        parent = (i - 1) >> 1
        if not e.value < heap[parent].value:
            break
        heap[i] = heap[parent]
        i = parent
    heap[i] = e


cdef inline void _replace_top(Entry *heap, Py_ssize_t n, Entry e) noexcept nogil:
    """Replace the root by `e` and sift it down: at each level the smaller child is
    picked without a branch (heap[n] is a +inf sentinel, so every node below n has two
    children to compare), and the descent stops where `e` is no larger.  (Floyd's
    variant, down to a leaf and back up, and a 4-ary heap measured no faster here.)"""
    cdef Py_ssize_t i = 0, c = 1
    while c < n:
        c += heap[c + 1].value < heap[c].value
        if not heap[c].value < e.value:
            break
        heap[i] = heap[c]
        i = c
        c = 2 * i + 1
    heap[i] = e


cdef inline Py_ssize_t _first_at_least(const double[:, ::1] ends, Py_ssize_t row,
                                       Py_ssize_t lo, Py_ssize_t hi, double x) noexcept nogil:
    """The first index in [lo, hi) of `row` whose point is >= x (hi if none)."""
    cdef Py_ssize_t mid
    while lo < hi:
        mid = (lo + hi) >> 1
        if ends[row, mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo


cdef inline Py_ssize_t _first_above(const double[:, ::1] ends, Py_ssize_t row,
                                    Py_ssize_t lo, Py_ssize_t hi, double x) noexcept nogil:
    """The first index in [lo, hi) of `row` whose point is > x (hi if none)."""
    cdef Py_ssize_t mid
    while lo < hi:
        mid = (lo + hi) >> 1
        if ends[row, mid] <= x:
            lo = mid + 1
        else:
            hi = mid
    return lo


def covering_window(const double[:, ::1] ends):
    """(lo, hi) of the window [lo, hi] with the smallest hi - lo (as computed in float64)
    that holds a point of every row of `ends` (n x R, rows non-decreasing, finite); of
    equal spreads, the one with the smallest lo, then the smallest hi.

    Sweep: lo runs through the points in increasing order (a heap of every row's first
    point not yet passed); when lo is the first copy of its value, every row's current
    point is its first point >= lo, so the best window starting at lo ends at their
    maximum hi, a running maximum.  The sweep ends when a row has no point left."""
    cdef Py_ssize_t n = ends.shape[0], r = ends.shape[1], i, row, k
    cdef Py_ssize_t flat = 0         # pops since hi last changed (a plateau)
    cdef double x
    if n < 1 or r < 1:
        raise ValueError(f"covering_window needs at least one row and one column, "
                         f"got {n} x {r}")
    cdef Entry *heap = <Entry *>malloc((n + 1) * sizeof(Entry))
    cdef Py_ssize_t *at = <Py_ssize_t *>malloc(n * sizeof(Py_ssize_t))
    cdef double hi = -INFINITY, lo, best = INFINITY, best_lo = 0.0, best_hi = 0.0
    cdef Entry e
    if heap == NULL or at == NULL:
        free(heap)
        free(at)
        raise MemoryError()
    with nogil:
        for i in range(n):
            e.value = ends[i, 0]
            e.row = i
            _sift_up(heap, i, e)
            at[i] = 0
            if e.value > hi:
                hi = e.value
        heap[n].value = INFINITY
        heap[n].row = -1
        # the first window is a result even if every spread overflows to inf
        best_lo = heap[0].value
        best_hi = hi
        best = hi - best_lo
        while True:
            lo = heap[0].value
            if hi - lo < best:      # strict: the first (smallest lo, then hi) wins ties
                best = hi - lo
                best_lo = lo
                best_hi = hi
            if flat >= n:
                # a long plateau: go to its last window at once (module docstring);
                # every row's current point is <= hi, and X is <= every row's last
                # point <= hi, so each row has a first point >= X below its first > hi
                x = INFINITY
                for i in range(n):
                    k = _first_above(ends, i, at[i], r, hi) - 1
                    if ends[i, k] < x:
                        x = ends[i, k]
                if x > lo:
                    for i in range(n):
                        at[i] = _first_at_least(ends, i, at[i], r, x)
                        e.value = ends[i, at[i]]
                        e.row = i
                        _sift_up(heap, i, e)
                    flat = 0
                    continue
                flat = 0
            row = heap[0].row
            k = at[row] + 1
            # Skip the row's points x with hi - x >= best: hi only grows, so no window
            # starting at x is strictly better, and a window that is starts after x.
            while k < r and hi - ends[row, k] >= best:
                k += 1
            if k == r:              # no better window starting later holds this row
                break
            at[row] = k
            e.value = ends[row, k]
            e.row = row
            if e.value > hi:
                hi = e.value
                flat = 0
            else:
                flat += 1
            _replace_top(heap, n, e)
    free(heap)
    free(at)
    return best_lo, best_hi
