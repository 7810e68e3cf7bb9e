# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""ZipLine's sweep: the smallest window that holds a point of every one of n sorted rows.

A k-way merge of the rows with a binary min-heap of their current points, in C without
the GIL: O(nR log n) and no global sort (the argsort of the nR points took 7-8 of the
13 ms ZipLine needed for 1000 workers x 150 random ends on this project's machine).
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


def covering_window(const double[:, ::1] ends):
    """(lo, hi) of the window [lo, hi] with the smallest hi - lo (as computed in float64)
    that holds a point of every row of `ends` (n x R, rows non-decreasing, finite); of
    equal spreads, the one with the smallest lo, then the smallest hi.

    Sweep: lo runs through the points in increasing order (a heap of every row's first
    point not yet passed); when lo is the first copy of its value, every row's current
    point is its first point >= lo, so the best window starting at lo ends at their
    maximum hi, a running maximum.  The sweep ends when a row has no point left."""
    cdef Py_ssize_t n = ends.shape[0], r = ends.shape[1], i, row, k
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
            _replace_top(heap, n, e)
    free(heap)
    free(at)
    return best_lo, best_hi
