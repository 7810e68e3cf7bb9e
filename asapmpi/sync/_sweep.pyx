# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""ZipLine in C: the smallest window that holds a point of each of n sorted rows.

Every row is non-decreasing.  A window [lo, hi] holds a point of row p iff hi reaches
the row's first point >= lo, so the best window starting at lo ends at hi(lo), the
largest of those first points (for lo up to L1, the smallest last point: beyond it a
row has none), and ZipLine wants the smallest hi(lo) - lo over the points lo <= L1.
With a row's gaps, the pairs (a, b) of consecutive points,

    hi(lo) = max(M0, max{b : (a, b) a gap of any row, a < lo}),   M0 the largest first point

(row p's first point >= lo ends its last gap that starts below lo, or is its first
point; the earlier gaps end lower).  hi is a running maximum over the gaps in the order
of their starts: a sort, most of which need not be done.

* Pass 1 drops every gap with a < L1 into one of B buckets (B about nR/8, at most
  2^13) of equal width over [smallest point, L1) by its start; a bucket keeps its
  count, its gaps' largest end, smallest and largest start.  A bucket's index never
  decreases as a grows (also in floating point), so every gap of an earlier bucket
  starts before any of a later one.
* Bounds: for lo in bucket k, hi(lo) is at least F_k, the largest of M0 and the ends of
  the earlier buckets' gaps, and lo is at most the bucket's last start A_k, so F_k - A_k
  bounds the bucket's spreads from below; the window at lo = A_k ends at most at the
  larger of F_k and the bucket's largest end: an upper bound on the optimum, as is the
  exact window at L1.  A bucket whose lower bound is above the smallest upper bound
  holds no optimum.  (Rounding is monotone, so the bounds hold for float64 spreads.)
* A bucket left whose gaps all start at one value a is exact as it is: hi(a) = F_k.
  The others' gaps are gathered (pass 2) and go through the same steps on their own,
  with F_k for M0, in buckets keyed on the top bits of the starts' order-preserving
  integer keys: each level tells at least 8 more of the 64 bits apart, so a bucket of
  one start, or of at most 24 gaps (sorted by insertion), comes within 8 levels.
* When equal widths leave most gaps in a few buckets, pass 1 runs again: from where all
  but a 64th of the gaps start if a few points far below stretched the range (the ones
  below share the first bucket), keyed if that leaves them crowded too or if no such
  points were there (values of very different scales).
* Candidates are offered in increasing lo, L1 last, and replace the best only with a
  strictly smaller spread: of equal spreads the smallest lo wins (then hi = hi(lo)), as
  in the textbook k-way merge with a heap (tests/policies/test_zipline.py); a bucket whose lower
  bound is at least the best spread so far is skipped.

O(nR): pass 1 at most three times and pass 2 once over the matrix, two passes over the
gathered gaps per level, no log factor.  At 1000 x 150, rows of one kind (uniform,
cumulative arrival times) gather a few buckets of 8192; rows in lockstep (every
worker's j-th end before any worker's (j+1)-th: every window about as good) gather
them all, a bucket sort of the gaps.  This replaces the k-way merge of the rows with a
heap (O(nR log n), 18ab137), which popped every point in lockstep.
"""
from libc.math cimport INFINITY
from libc.stdint cimport int64_t, uint64_t
from libc.stdlib cimport free, malloc, qsort
from libc.string cimport memcpy


cdef extern from *:
    int __builtin_clzll(unsigned long long) nogil


cdef enum:
    GAPS_PER_BUCKET = 8     # gaps per bucket aimed at
    MAX_BITS = 13           # at most 2^13 buckets (393 KB: they stay in the L2 cache)
    MIN_BITS = 8            # a keyed level tells at least 8 more bits apart
    SORTED = 24             # a gathered bucket of at most this many gaps is sorted
    LEVELS = 12             # then sorted by qsort (never: 64 bits, 8 a level)


cdef struct Bucket:
    double top              # the largest end of its gaps
    double first            # the smallest start of its gaps
    double last             # the largest start: the bucket's last candidate lo
    double floor            # F_k: hi(lo) >= floor for every lo in the bucket
    Py_ssize_t count        # its gaps
    Py_ssize_t at           # gathered: where its next gap goes (then: where they end);
                            # -1: not gathered


cdef struct Scale:
    # which bucket a start falls in: equal widths from `low` or, keyed, the top bits
    # of its order-preserving integer key above `base`
    bint keyed
    double low
    double factor
    uint64_t base
    int shift
    Py_ssize_t buckets


cdef struct Gap:
    double start
    double end


cdef struct Best:
    double spread
    double lo
    double hi
    bint found


cdef inline void _offer(Best *best, double lo, double hi) noexcept nogil:
    """The window [lo, hi], offered in increasing lo: kept if strictly better."""
    cdef double spread = hi - lo
    if not best.found or spread < best.spread:
        best.found = True
        best.spread = spread
        best.lo = lo
        best.hi = hi


cdef inline int _bits(uint64_t x) noexcept nogil:
    """How many bits x needs (0 for 0)."""
    return 64 - __builtin_clzll(x) if x else 0


cdef inline uint64_t _key(double x) noexcept nogil:
    """An unsigned integer in the order of the finite doubles (-0.0 is 0.0)."""
    cdef double y = x + 0.0
    cdef uint64_t u
    memcpy(&u, &y, sizeof(u))
    return ~u if u >> 63 else u | (<uint64_t>1 << 63)


cdef inline bint _linear(Scale *s, double low, double high, int bits) noexcept nogil:
    """Up to 2^bits buckets of equal width over [low, high); False if the width over- or
    underflows."""
    s.keyed = False
    s.base = 0
    s.shift = 0
    s.buckets = <Py_ssize_t>1 << bits
    s.low = low
    s.factor = s.buckets / (high - low)
    return s.factor > 0.0 and s.factor < INFINITY


cdef inline void _keyed(Scale *s, double low, double high, int bits) noexcept nogil:
    """Up to 2^bits buckets over the keys from low to high: a bucket's keys share all
    but their last `shift` bits above the base, so a level below tells them apart with
    `bits` fewer bits, whatever the values' scale."""
    cdef uint64_t span = _key(high) - _key(low)
    s.keyed = True
    s.low = low
    s.factor = 0.0
    s.base = _key(low)
    s.shift = max(0, _bits(span) - bits)
    s.buckets = <Py_ssize_t>(span >> s.shift) + 1


cdef inline Py_ssize_t _bucket(const Scale *s, double a) noexcept nogil:
    """The bucket of a start a (keyed: a at or above the base): non-decreasing in a,
    also in floating point (equal widths: starts below `low` go to the first bucket)."""
    cdef double t
    cdef uint64_t k
    if s.keyed:
        k = (_key(a) - s.base) >> s.shift
        return <Py_ssize_t>k if k < <uint64_t>s.buckets else s.buckets - 1
    t = (a - s.low) * s.factor
    if not t < s.buckets:
        return s.buckets - 1
    return <Py_ssize_t>t if t > 0.0 else 0


cdef inline int _bits_for(Py_ssize_t gaps) noexcept nogil:
    """log2 of the bucket count for this many gaps."""
    return max(MIN_BITS, min(_bits(<uint64_t>(gaps // GAPS_PER_BUCKET)), MAX_BITS))


cdef inline void _clear(Bucket *bucket, Py_ssize_t buckets) noexcept nogil:
    cdef Py_ssize_t k
    for k in range(buckets):
        bucket[k].top = -INFINITY
        bucket[k].first = INFINITY
        bucket[k].last = -INFINITY
        bucket[k].count = 0


cdef inline void _add(Bucket *b, double start, double end) noexcept nogil:
    # branch-free maxima: the order of the starts is anyone's
    b.top = end if end > b.top else b.top
    b.first = start if start < b.first else b.first
    b.last = start if start > b.last else b.last
    b.count += 1


cdef double _floors(Bucket *bucket, Py_ssize_t buckets, double floor,
                    double *bound) noexcept nogil:
    """Set every bucket's floor F_k (``floor`` before the first), lower ``bound`` to the
    smallest upper bound; return the largest of ``floor`` and every end."""
    cdef Py_ssize_t k
    cdef Bucket *b
    for k in range(buckets):
        b = &bucket[k]
        b.floor = floor
        if b.count:
            floor = max(floor, b.top)
            bound[0] = min(bound[0], floor - b.last)
    return floor


cdef Py_ssize_t _mark(Bucket *bucket, Py_ssize_t buckets, double bound,
                      Py_ssize_t *largest) noexcept nogil:
    """Give every bucket within ``bound`` with more than one start its place among the
    gathered gaps; return how many gaps are gathered, ``largest`` the most in one."""
    cdef Py_ssize_t k, gathered = 0
    cdef Bucket *b
    largest[0] = 0
    for k in range(buckets):
        b = &bucket[k]
        b.at = -1
        if b.count and b.floor - b.last <= bound and b.first < b.last:
            b.at = gathered
            gathered += b.count
            largest[0] = max(largest[0], b.count)
    return gathered


cdef int _by_start(const void *x, const void *y) noexcept nogil:
    cdef double a = (<const Gap *>x).start, b = (<const Gap *>y).start
    return (a > b) - (a < b)


cdef void _scan_sorted(Gap *gaps, Py_ssize_t m, double floor, Best *best) noexcept nogil:
    """Offer every distinct start of gaps[:m], sorted here, with its hi."""
    cdef Py_ssize_t i, j
    cdef Gap g
    cdef double a
    if m > SORTED:
        qsort(gaps, m, sizeof(Gap), _by_start)
    else:
        for i in range(1, m):
            g = gaps[i]
            j = i - 1
            while j >= 0 and gaps[j].start > g.start:
                gaps[j + 1] = gaps[j]
                j -= 1
            gaps[j + 1] = g
    i = 0
    while i < m:
        a = gaps[i].start
        _offer(best, a, floor)
        while i < m and gaps[i].start == a:
            floor = max(floor, gaps[i].end)
            i += 1


cdef int _scan(Gap *gaps, Py_ssize_t m, double floor, double bound, int level,
               Best *best) noexcept nogil:
    """Offer, in increasing lo, the candidates among the starts of gaps[:m] (a bucket's
    gaps: no other gap starts among them), their hi the running maximum from ``floor``,
    unless a bound rules them out: keyed buckets, then the same steps as the top level.
    -1: out of memory."""
    cdef Py_ssize_t i, gathered, largest
    cdef double first = INFINITY, last = -INFINITY
    cdef Scale s
    cdef Bucket *bucket
    cdef Bucket *b
    cdef Gap *kept
    cdef int failed = -1
    if m <= SORTED or level >= LEVELS:
        _scan_sorted(gaps, m, floor, best)
        return 0
    for i in range(m):
        first = min(first, gaps[i].start)
        last = max(last, gaps[i].start)
    _keyed(&s, first, last, _bits_for(m))
    bucket = <Bucket *>malloc(s.buckets * sizeof(Bucket))
    kept = <Gap *>malloc(m * sizeof(Gap))
    if bucket != NULL and kept != NULL:
        _clear(bucket, s.buckets)
        for i in range(m):
            _add(&bucket[_bucket(&s, gaps[i].start)], gaps[i].start, gaps[i].end)
        _floors(bucket, s.buckets, floor, &bound)
        gathered = _mark(bucket, s.buckets, bound, &largest)
        if gathered:
            for i in range(m):
                b = &bucket[_bucket(&s, gaps[i].start)]
                if b.at >= 0:
                    kept[b.at] = gaps[i]
                    b.at += 1
        failed = _evaluate(bucket, s.buckets, bound, kept, level + 1, best)
    free(bucket)
    free(kept)
    return failed


cdef int _evaluate(Bucket *bucket, Py_ssize_t buckets, double bound, Gap *gathered,
                   int level, Best *best) noexcept nogil:
    """Offer the buckets' candidates in order: exact for one start, gathered ones
    through _scan.  -1: out of memory."""
    cdef Py_ssize_t k
    cdef double lower
    cdef Bucket *b
    for k in range(buckets):
        b = &bucket[k]
        lower = b.floor - b.last
        if b.count == 0 or lower > bound or (best.found and lower >= best.spread):
            continue                    # no optimum here, or none better than the best
        if b.at < 0:                    # one start a: hi(a) = floor
            _offer(best, b.last, b.floor)
        elif _scan(&gathered[b.at - b.count], b.count, b.floor, bound, level, best):
            return -1
    return 0


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


cdef Py_ssize_t _fill(const double[:, ::1] ends, double l1, const Scale *s,
                      Bucket *bucket) noexcept nogil:
    """Pass 1: every gap that starts below L1 into its bucket; returns how many."""
    cdef Py_ssize_t n = ends.shape[0], r = ends.shape[1], p, j, gaps = 0
    cdef double a
    _clear(bucket, s.buckets)
    for p in range(n):
        j = 0
        while j < r - 1:
            a = ends[p, j]
            if not a < l1:
                break           # the row's later gaps start later
            _add(&bucket[_bucket(s, a)], a, ends[p, j + 1])
            j += 1
        gaps += j
    return gaps


cdef double _dense_start(const Bucket *bucket, Py_ssize_t buckets,
                         Py_ssize_t below) noexcept nogil:
    """The first start of the first bucket before which at most `below` gaps start."""
    cdef Py_ssize_t k, seen = 0
    for k in range(buckets):
        if seen + bucket[k].count > below:
            return bucket[k].first
        seen += bucket[k].count
    return INFINITY


cdef void _gather(const double[:, ::1] ends, const Scale *s, Bucket *bucket,
                  Py_ssize_t buckets, Gap *gaps) noexcept nogil:
    """Pass 2: the gathered buckets' gaps into their places, reading each row from its
    first start at or above the lowest of them."""
    cdef Py_ssize_t n = ends.shape[0], r = ends.shape[1], p, j
    cdef double lowest = INFINITY, highest = -INFINITY
    cdef Bucket *b
    for j in range(buckets):
        if bucket[j].at >= 0:
            lowest = min(lowest, bucket[j].first)
            highest = max(highest, bucket[j].last)
    for p in range(n):
        j = _first_at_least(ends, p, 0, r - 1, lowest)
        while j < r - 1 and ends[p, j] <= highest:
            b = &bucket[_bucket(s, ends[p, j])]
            if b.at >= 0:
                gaps[b.at].start = ends[p, j]
                gaps[b.at].end = ends[p, j + 1]
                b.at += 1
            j += 1


def first_at_least(const double[:, ::1] ends, double x, int64_t[::1] out):
    """out[p] = the index of row p's first point >= x (the row's length if none)."""
    cdef Py_ssize_t n = ends.shape[0], r = ends.shape[1], p
    if out.shape[0] != n:
        raise ValueError(f"out has {out.shape[0]} entries for {n} rows")
    with nogil:
        for p in range(n):
            out[p] = _first_at_least(ends, p, 0, r, x)


def covering_window(const double[:, ::1] ends):
    """(lo, hi) of the window [lo, hi] with the smallest hi - lo (as computed in float64)
    that holds a point of every row of `ends` (n x R, rows non-decreasing, finite); of
    equal spreads, the one with the smallest lo (and hi = hi(lo), the smallest).  The
    module docstring says how."""
    cdef Py_ssize_t n = ends.shape[0], r = ends.shape[1], p, gaps, gathered, largest
    if n < 1 or r < 1:
        raise ValueError(f"covering_window needs at least one row and one column, "
                         f"got {n} x {r}")
    cdef double first_max = -INFINITY, low = INFINITY, l1 = INFINITY
    for p in range(n):
        first_max = max(first_max, ends[p, 0])
        low = min(low, ends[p, 0])
        l1 = min(l1, ends[p, r - 1])
    if not low < l1:            # no gap starts below L1: L1 is the only candidate
        return l1, first_max
    cdef Scale s
    cdef int bits = _bits_for(n * (r - 1))
    if not _linear(&s, low, l1, bits):
        _keyed(&s, low, l1, bits)       # a range too wide or too narrow for doubles
    cdef Bucket *bucket = <Bucket *>malloc((<Py_ssize_t>1 << bits) * sizeof(Bucket))
    if bucket == NULL:
        raise MemoryError()
    cdef Gap *gathered_gaps = NULL
    cdef double high, bound
    cdef Best best
    cdef int failed = 0
    cdef bint zoomed = False
    cdef double zoom
    best.found = False
    with nogil:
        while True:
            gaps = _fill(ends, l1, &s, bucket)
            bound = INFINITY
            high = _floors(bucket, s.buckets, first_max, &bound)
            bound = min(bound, high - l1)       # the window at L1: hi(L1) = high
            gathered = _mark(bucket, s.buckets, bound, &largest)
            if s.keyed or largest <= max(gaps // 16, <Py_ssize_t>SORTED):
                break
            # equal widths left most gaps in a few buckets: once more from where all
            # but a 64th of the gaps start, if a few far below stretched the range,
            # else (values of very different scales) on the keys
            zoom = _dense_start(bucket, s.buckets, gaps // 64) if not zoomed else low
            zoomed = True
            if not (zoom > low and _linear(&s, zoom, l1, bits)):
                _keyed(&s, low, l1, bits)
        if gathered:
            gathered_gaps = <Gap *>malloc(gathered * sizeof(Gap))
            failed = gathered_gaps == NULL
            if not failed:
                _gather(ends, &s, bucket, s.buckets, gathered_gaps)
        if not failed:
            failed = _evaluate(bucket, s.buckets, bound, gathered_gaps, 1, &best)
        _offer(&best, l1, high)
    free(bucket)
    free(gathered_gaps)
    if failed:
        raise MemoryError()
    return best.lo, best.hi
