# The slot store: what a rank knows about its inputs, and the verified fused reduce over
# them.  No MPI call is made here (tests/store/test_slotstore.py keeps it so): a channel points
# the store at the slots to read (hdr[i], exp_v[i]) and hands it the barrier that makes
# its memory visible (sync), so every channel reduces and checks alike.

ctypedef int (*sync_fn)(void *ctx) except -1 nogil


cdef int _fence_only(void *ctx) except -1 nogil:
    # memory outside any MPI window (a shared segment, message buffers): the fence
    # is the whole barrier
    asap_fence()
    return 0


cdef inline void stamp_slot(char *hdr, Py_ssize_t payload_stride, int64_t version,
                            int64_t checksum, int64_t iteration, int64_t sender,
                            int64_t nbytes) noexcept nogil:
    """Mark the slot at `hdr`, whose payload a message just delivered, as the whole
    `version`, as a put would have written it: footer (checksum, then version) before
    header (iteration, sender, size, then version), fences around, so a reader that
    checks header == footer sees a whole version or none."""
    cdef char *ftr = hdr + HEADER_BYTES + payload_stride
    asap_fence()
    asap_store_i64(ftr + 8, checksum)
    asap_store_i64(ftr, version)
    asap_store_i64(hdr + 8, iteration)
    asap_store_i64(hdr + 16, sender)
    asap_store_i64(hdr + 24, nbytes)
    asap_store_i64(hdr, version)
    asap_fence()


# element type -> (bytes, kernel): 0 float32, 1 float64, 2 bfloat16 and 3 float16 (both
# reduced in float32 and rounded once, asap_wsum_bf16/asap_wsum_f16)
ELEMENTS = {"float32": (4, 0), "float64": (8, 1), "bfloat16": (2, 2), "float16": (2, 3)}


def element(dtype):
    """(bytes, kernel) of element type `dtype`, one of ELEMENTS."""
    if dtype not in ELEMENTS:
        raise ConfigError(f"element type must be one of {', '.join(ELEMENTS)}, got {dtype!r}")
    return ELEMENTS[dtype]


cdef class SlotStore:
    """One rank's inputs and the verified reduce over them, with no MPI.

    A slot is a 64-byte header (its first word the version), the payload (`nbytes`,
    padded to `payload_stride`) and a footer (version, checksum) right after it
    (layout.py).  For each reduce a channel says where in-neighbour i's slot is
    (`hdr[i]`, NULL: do not read it, it may be being written) and which version it
    expects (`exp_v[i]`); the store reads each footer then header (a seqlock reader),
    sums the usable inputs with the own buffer in one fused pass (kernels.h), reads
    every header again after the pass, and counts each input's status (CONSISTENT,
    TORN, STALE, AHEAD) per sender.  `sync` orders this process's loads with what
    others wrote into the slots' memory (a channel's barrier: MPI_Win_sync and a
    fence for window memory, a fence alone otherwise).
    """
    cdef readonly int n_in, itemsize, kernel
    cdef readonly object dtype
    cdef readonly Py_ssize_t nbytes, payload_stride
    cdef const char **hdr
    cdef int64_t *exp_v
    cdef const void **ins
    cdef double *ws_f64
    cdef float *ws_f32
    cdef asap_cksum_t *cks
    cdef int64_t *seen_footer
    cdef uint64_t *seen_cksum
    cdef int *used
    cdef int *status
    cdef char *own_copy             # the reader's buffer before a pass that may be undone
    cdef float *wide                # 16-bit buffers: where the float32 sums also go, or NULL
    cdef object _wide_ref           # the array `wide` points into (kept alive)
    #: reduces that wrote their float32 sums to the set_wide() array
    cdef readonly int64_t wide_count
    cdef sync_fn sync
    cdef void *sync_ctx
    cdef int64_t[:, ::1] _stats
    cdef int64_t[::1] _last_version
    cdef object _stats_array, _last_array

    def __cinit__(self, int n_in, Py_ssize_t nbytes, Py_ssize_t payload_stride,
                  dtype):
        cdef int n = max(n_in, 1)
        if n_in < 0:
            raise ConfigError(f"n_in must be >= 0, got {n_in}")
        itemsize, self.kernel = element(dtype)
        if nbytes % itemsize:
            raise ConfigError(f"{dtype} elements of {itemsize} bytes do not divide "
                              f"{nbytes} bytes")
        self.dtype = dtype
        if payload_stride < nbytes:
            raise ConfigError(f"payload_stride {payload_stride} is smaller than the "
                              f"payload's {nbytes} bytes")
        self.n_in = n_in
        self.nbytes = nbytes
        self.payload_stride = payload_stride
        self.itemsize = itemsize
        self.sync = _fence_only
        self.sync_ctx = NULL
        self.hdr = <const char **>calloc(n, sizeof(char *))
        self.exp_v = <int64_t *>calloc(n, sizeof(int64_t))
        self.ins = <const void **>calloc(n, sizeof(void *))
        self.ws_f64 = <double *>calloc(n, sizeof(double))
        self.ws_f32 = <float *>calloc(n, sizeof(float))
        self.cks = <asap_cksum_t *>calloc(n, sizeof(asap_cksum_t))
        self.seen_footer = <int64_t *>calloc(n, sizeof(int64_t))
        self.seen_cksum = <uint64_t *>calloc(n, sizeof(uint64_t))
        self.used = <int *>calloc(n, sizeof(int))
        self.status = <int *>calloc(n, sizeof(int))
        if (self.hdr == NULL or self.exp_v == NULL or self.ins == NULL
                or self.ws_f64 == NULL or self.ws_f32 == NULL or self.cks == NULL
                or self.seen_footer == NULL or self.seen_cksum == NULL
                or self.used == NULL or self.status == NULL):
            raise MemoryError()
        self._stats_array = np.zeros((n, N_STATUS), dtype=np.int64)
        self._last_array = np.zeros(n, dtype=np.int64)
        self._stats = self._stats_array
        self._last_version = self._last_array

    def __dealloc__(self):
        free(self.hdr)
        free(self.exp_v)
        free(self.ins)
        free(self.ws_f64)
        free(self.ws_f32)
        free(self.cks)
        free(self.seen_footer)
        free(self.seen_cksum)
        free(self.used)
        free(self.status)
        free(self.own_copy)

    def set_wide(self, wide):
        """From now on every reduce of this 16-bit store also writes its float32 sums,
        before they are rounded, into `wide` (a C-contiguous float32 array of one value
        per element; None stops it); wide_count counts the reduces that did."""
        cdef float[::1] view
        if wide is None:
            self.wide, self._wide_ref = NULL, None
            return
        if self.kernel not in (2, 3):
            raise ConfigError(f"set_wide keeps the float32 sums of a bfloat16 or float16 "
                              f"reduce; this store reduces {self.dtype}")
        view = wide
        if view.shape[0] != self.nbytes // self.itemsize:
            raise ConfigError(f"set_wide takes one float32 per element "
                              f"({self.nbytes // self.itemsize}), got {view.shape[0]}")
        self._wide_ref = view
        self.wide = &view[0] if view.shape[0] else NULL

    cdef int keep_copies(self) except -1:
        """Before a reduce that may have to undo its pass (seqlock, checksum, or
        per-input versions): room for a copy of the reader's buffer."""
        if self.own_copy == NULL:
            self.own_copy = <char *>malloc(max(self.nbytes, 1))
            if self.own_copy == NULL:
                raise MemoryError()
        return 0

    cdef int reduce(self, char *out, double w_self, const double *weights,
                    int64_t min_version, int64_t max_version, bint exact_each,
                    bint seqlock, bint checksum, bint renormalize, bint require_all,
                    const char *own_in) except -2 nogil:
        """out = w_self*own_in + sum of weights[i] * the payload at hdr[i], over the
        usable inputs, in one fused pass; own_in == out for an in-place reduce.

        An input is usable when its header and footer agree on a version: exactly
        exp_v[i] > 0 with `exact_each`, else any in [min_version, max_version].
        Returns the number of inputs reduced; -1 when a slot changed during the read
        and neither seqlock nor checksum allows dropping it; -3 with `require_all`
        when an input is not usable (out as it was).  The caller ran `sync` before
        filling hdr[] (a channel may read its notify words to decide which to point
        at) and, with seqlock, checksum or exact_each, keep_copies() beforehand."""
        cdef int i, n_used
        cdef bint changed
        cdef const char *own = own_in
        if self.check(min_version, max_version, exact_each, require_all) < 0:
            return -3
        # A failure found after the fused pass (a slot that changed, a bad checksum) can
        # only be undone from a copy of the reader's own buffer; keep one when the mode
        # can find such failures.
        if (seqlock or checksum) and own_in == out:
            memcpy(self.own_copy, out, self.nbytes)
            own = self.own_copy
        while True:
            asap_fence()
            n_used = self._fused_pass(out, own, w_self, weights, checksum, renormalize)
            asap_fence()
            self.sync(self.sync_ctx)
            changed = False
            for i in range(self.n_in):
                if not self.used[i]:
                    continue
                if (asap_load_i64(self.hdr[i]) != self.seen_footer[i]
                        or (checksum and self.seen_cksum[i] != 0
                            and asap_cksum_final(&self.cks[i], self.nbytes)
                            != self.seen_cksum[i])):
                    self.status[i] = TORN
                    self.used[i] = 0
                    changed = True
            if not changed:
                break
            if not (seqlock or checksum):
                self._count()
                return -1
            if require_all:
                # every input was promised: one that failed after the pass (it changed,
                # or its checksum) is a broken protocol, not an input to leave out of a
                # sum whose weights would no longer add up
                if own_in == out:
                    memcpy(out, self.own_copy, self.nbytes)
                self._count()
                return -3
        self._count()
        if self.wide != NULL:
            self.wide_count += 1
        return n_used

    cdef int check(self, int64_t min_version, int64_t max_version, bint exact_each,
                   bint require_all) except -2 nogil:
        """Before any payload is read: each input's status from its footer and header,
        and whether it is to be used (`used[i]`).  Returns the inputs usable, or -3 with
        `require_all` when one is not (statuses counted)."""
        cdef int64_t expected, h, f
        cdef int i, n = 0
        cdef const char *hdr
        for i in range(self.n_in):
            expected = self.exp_v[i]
            hdr = self.hdr[i]
            if hdr == NULL or (exact_each and expected <= 0):
                # late: not complete, possibly being written; never read it
                self.status[i] = STALE
                self.used[i] = 0
                self.seen_footer[i] = -1
                continue
            # seqlock reader: footer first, payload, header last (fences between).
            f = asap_load_i64(hdr + HEADER_BYTES + self.payload_stride)
            h = asap_load_i64(hdr)
            self.seen_footer[i] = f
            self.seen_cksum[i] = <uint64_t>asap_load_i64(hdr + HEADER_BYTES
                                                         + self.payload_stride + 8)
            if h != f:
                self.status[i] = TORN
            elif f == expected:
                self.status[i] = CONSISTENT
            elif f < expected:
                self.status[i] = STALE
            else:
                self.status[i] = AHEAD
            if exact_each:
                self.used[i] = h == f and f == expected
            else:
                self.used[i] = h == f and min_version <= f <= max_version
            n += self.used[i]
        if require_all:
            for i in range(self.n_in):
                if not self.used[i]:
                    self._count()
                    return -3
        return n

    cdef int recheck(self) except -1 nogil:
        """After the payloads of the used inputs were read elsewhere (copied to a
        device): the barrier, then each used slot's header again; a slot whose header
        moved since check() is dropped (TORN).  Counts the statuses; returns the
        inputs dropped."""
        cdef int i, dropped = 0
        asap_fence()
        self.sync(self.sync_ctx)
        for i in range(self.n_in):
            if self.used[i] and asap_load_i64(self.hdr[i]) != self.seen_footer[i]:
                self.status[i] = TORN
                self.used[i] = 0
                dropped += 1
        self._count()
        return dropped

    cdef int _fused_pass(self, char *out, const char *own, double w_self,
                         const double *weights, bint checksum,
                         bint renormalize) noexcept nogil:
        cdef int i, k = 0
        cdef double total_all = w_self, total_used = w_self, scale = 1.0
        for i in range(self.n_in):
            total_all += weights[i]
            if self.used[i]:
                total_used += weights[i]
        if renormalize and total_used > 0.0:
            scale = total_all / total_used
        for i in range(self.n_in):
            if self.used[i]:
                self.ins[k] = self.hdr[i] + HEADER_BYTES
                self.ws_f64[k] = weights[i] * scale
                self.ws_f32[k] = <float>(weights[i] * scale)
                k += 1
        # checksums are fed per used input in order; map them back below
        if self.kernel == 0:
            asap_wsum_f32(<float *>out, <const float *>own, <float>(w_self * scale),
                          <const float *const *>self.ins, self.ws_f32, k,
                          self.nbytes // 4, self._cks_compact(checksum, k))
        elif self.kernel == 2:
            asap_wsum_bf16(<uint16_t *>out, <const uint16_t *>own, <float>(w_self * scale),
                           <const uint16_t *const *>self.ins, self.ws_f32, k,
                           self.nbytes // 2, self._cks_compact(checksum, k), self.wide)
        elif self.kernel == 3:
            asap_wsum_f16(<uint16_t *>out, <const uint16_t *>own, <float>(w_self * scale),
                          <const uint16_t *const *>self.ins, self.ws_f32, k,
                          self.nbytes // 2, self._cks_compact(checksum, k), self.wide)
        else:
            asap_wsum_f64(<double *>out, <const double *>own, w_self * scale,
                          <const double *const *>self.ins, self.ws_f64, k,
                          self.nbytes // 8, self._cks_compact(checksum, k))
        if checksum:
            self._cks_expand()
        return k

    cdef asap_cksum_t *_cks_compact(self, bint checksum, int k) noexcept nogil:
        # The kernel feeds cks[0..k-1] for the k used inputs; they are spread back to the
        # in-neighbour index by _cks_expand (walking backwards, so nothing is overwritten).
        if not checksum:
            return NULL
        cdef int i
        for i in range(k):
            asap_cksum_init(&self.cks[i])
        return self.cks

    cdef void _cks_expand(self) noexcept nogil:
        cdef int i, k = 0
        for i in range(self.n_in):
            if self.used[i]:
                k += 1
        for i in range(self.n_in - 1, -1, -1):
            if self.used[i]:
                k -= 1
                if k != i:
                    self.cks[i] = self.cks[k]

    cdef void _count(self) noexcept nogil:
        cdef int i
        for i in range(self.n_in):
            self._stats[i, self.status[i]] += 1
            if self.status[i] != TORN and self.seen_footer[i] >= 0:
                self._last_version[i] = self.seen_footer[i]

    # ------------------------------------------------------------------ from Python

    def reduce_slots(self, buf, double w_self, double[::1] weights not None, memory,
                     offsets, versions, int64_t min_version=0, int64_t max_version=-1,
                     bint exact_each=False, bint seqlock=False, bint checksum=False,
                     bint renormalize=False, bint require_all=False):
        """The verified reduce over slots in any writable buffer `memory`: input i's
        header at byte offsets[i] (negative: not read), expected version versions[i].
        max_version < 0 means no upper bound.  Returns what the C reduce returns (the
        inputs reduced, -1 torn, -3 not all usable); stats and statuses as for a
        window's reduce.  For host memory a channel did not bring (tests, staging)."""
        cdef Py_buffer view, mem
        cdef int i, r
        cdef Py_ssize_t off
        if weights.shape[0] != self.n_in or len(offsets) != self.n_in \
                or len(versions) != self.n_in:
            raise ConfigError(f"need {self.n_in} weights, offsets and versions")
        if max_version < 0:
            max_version = (<int64_t>1) << 62
        PyObject_GetBuffer(buf, &view, PyBUF_ANY_CONTIGUOUS | PyBUF_WRITABLE)
        try:
            PyObject_GetBuffer(memory, &mem, PyBUF_ANY_CONTIGUOUS)
            try:
                if view.len != self.nbytes:
                    raise ConfigError(f"buffer has {view.len} bytes, the slots hold "
                                      f"{self.nbytes}")
                for i in range(self.n_in):
                    off = offsets[i]
                    if off >= 0 and (off % 8 or off + 2 * HEADER_BYTES
                                     + self.payload_stride > mem.len):
                        raise ConfigError(f"slot offset {off} of input {i} is not an "
                                          f"aligned slot inside {mem.len} bytes")
                    self.hdr[i] = (<const char *>mem.buf) + off if off >= 0 else NULL
                    self.exp_v[i] = versions[i]
                if seqlock or checksum or exact_each:
                    self.keep_copies()
                with nogil:
                    self.sync(self.sync_ctx)
                    r = self.reduce(<char *>view.buf, w_self,
                                    &weights[0] if self.n_in else NULL, min_version,
                                    max_version, exact_each, seqlock, checksum,
                                    renormalize, require_all, <const char *>view.buf)
            finally:
                PyBuffer_Release(&mem)
        finally:
            PyBuffer_Release(&view)
        return r

    @property
    def stats(self):
        """int64 array (n_in, 4): per in-neighbour counts of consistent, torn, stale, ahead."""
        return self._stats_array[:self.n_in].copy()

    @property
    def last_versions(self):
        """int64 array (n_in,): last untorn version read from each in-neighbour."""
        return self._last_array[:self.n_in].copy()

    def last_status(self):
        """Status of each input in the last reduce (CONSISTENT, TORN, STALE or AHEAD)."""
        return [self.status[i] for i in range(self.n_in)]

    def record_reduced(self, int64_t[::1] row not None, int64_t iteration):
        """Write the trace of the last reduce into `row` (n_in + 1 int64): the
        iteration, then the footer version it verified and used from each in-neighbour
        (0: not used), without temporaries (a policy's hot path)."""
        self._record(row, iteration)

    cdef int _record(self, int64_t[::1] row, int64_t iteration) except -1:
        cdef int i
        if row is None:
            raise ConfigError("record_reduced needs a row")
        if row.shape[0] != self.n_in + 1:
            raise ConfigError(f"the trace row of a reduce has {self.n_in + 1} cells "
                              f"(iteration and one per in-neighbour), not {row.shape[0]}")
        row[0] = iteration
        for i in range(self.n_in):
            row[1 + i] = self._last_version[i] if self.status[i] == CONSISTENT else 0
