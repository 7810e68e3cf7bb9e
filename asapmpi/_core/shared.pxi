# The shared transport (included by slotwin.pyx): every rank writes its update once,
# into its own slots in a shared-memory segment (asapmpi/_core/segments.py) that its
# out-neighbours map and reduce from in place; notifies and acks stay window words
# (docs/PROTOCOL.md section 2b).  One host only.


cdef class SharedWindow(SlotWindow):
    """The shared-memory transport: an update is one copy into this rank's own slot,
    read in place by every out-neighbour (zero copy); notify and ack are window words.

    outboxes=(own, [in-neighbours']): buffers over this rank's segment and every
    in-neighbour's (asapmpi._core.segments), held until free().

    double_buffered (an Exchange(double_buffer=True), with waits_for_release and depth
    2): version k is computed in own slot k % 2, the payload deliver(k) is given; the
    neighbours may still read k - 1 from the other slot, so deliver waits for no
    release, and await_(k) waits, after the notifies of k, for the releases of k - 1
    (at least: a neighbour may have released k already) and marks slot (k + 1) % 2,
    which the reduce writes next, as being rewritten: what it holds (k - 1) stops
    verifying."""

    cdef object _outboxes
    cdef char *out_slots
    cdef char **in_slots
    cdef Py_buffer _own_segment
    cdef Py_buffer *_in_segments
    cdef int _segments_held
    cdef readonly bint double_buffered

    def __cinit__(self):
        self.transport = "shared"

    def __init__(self, *args, outboxes=None, bint double_buffered=False, **kwargs):
        self._outboxes = outboxes
        self.double_buffered = double_buffered
        SlotWindow.__init__(self, *args, **kwargs)

    def __dealloc__(self):
        self._release_segments()

    cdef int _prepare(self, layout) except -1:
        outboxes = self._outboxes
        self._outboxes = None
        if not layout.outbox:
            raise ConfigError("the shared transport needs an outbox layout "
                              "(Layout(..., outbox=True))")
        if outboxes is None or len(outboxes) != 2 or len(outboxes[1]) != self.n_in:
            raise ConfigError("an outbox layout needs this rank's segment and every "
                              "in-neighbour's: outboxes=(own, [in-neighbours'])")
        if self.double_buffered and self.depth != 2:
            raise ConfigError(f"a double-buffered shared window has two slots per "
                              f"sender (depth 2), got depth {self.depth}")
        self._hold_segments(outboxes[0], outboxes[1], layout.segment_bytes)
        return 0

    cdef void _release(self) noexcept:
        self._release_segments()

    def deliver(self, buf, int64_t version, double timeout, bint checksum=False,
                bint copy=True, int64_t skip_released=0):
        """Verb: one copy of `buf` into this rank's own slot of `version` (none when
        `buf` is that slot's payload: double-buffered), then the notifies, leaving out
        the out-neighbours that released `skip_released` (> 0); single buffered, first
        wait until every out-neighbour released version - 1."""
        self._check_alive()
        if self.waits_for_release and not self.double_buffered:
            self.waits.acks(version - 1, timeout, False)
        self._put_buffer(buf, version, version, True, checksum, self.notifies,
                         skip_released)

    def await_(self, int64_t version, double timeout, int mode=AWAIT_EXACT,
               int count=0):
        """Verb: as SlotWindow.await_; double-buffered, EXACT then waits for the
        releases of version - 1 and marks the slot of version + 1 (see the class)."""
        if mode != AWAIT_EXACT:
            return SlotWindow.await_(self, version, timeout, mode, count)
        self._check_alive()
        self.waits.notifies(version, timeout, False)
        if self.double_buffered:
            self.waits.acks(version - 1, timeout, True)
            self._begin_rewrite(version + 1)

    cdef int _begin_rewrite(self, int64_t version) except -1:
        # This rank's own slot of `version` is about to be rewritten in place (a
        # double-buffered Exchange reduces into it what it will send as `version`, while
        # the slot still holds version - 2, released by every reader): mark its header
        # so that a reader that ignores acks, or reads late, finds header != footer
        # (TORN) instead of a stable header == footer over bytes that change.  The
        # deliver of `version` then writes header, payload and footer in the seqlock
        # order.
        cdef char *hdr
        _check_version(version)
        hdr = self.out_slots + (version % self.depth) * self.slot_stride
        with nogil:
            asap_store_i64(hdr, -version)
            asap_fence()        # the mark is visible before any byte of the payload
        return 0

    cdef char *_slot(self, int i, Py_ssize_t slot) noexcept nogil:
        return self.in_slots[i] + slot * self.slot_stride

    def slot_offset(self, int in_index, int64_t version):
        """Refused: a neighbour's slot is in its own shared-memory segment."""
        raise ConfigError("with the shared-memory transport a neighbour's slot is in "
                          "its own shared-memory segment, not in this window; create "
                          "the Exchange with transport='put'")

    cdef int _send(self, const char *src, int64_t version, int64_t iteration, bint seqlock,
                   bint checksum, bint notify, int64_t suppress_if_acked) except -1:
        with nogil:
            self._mark_suppressed(suppress_if_acked)
            self._put_outbox(src, version, iteration, checksum, notify)
        return 0

    cdef _hold_segments(self, own, ins, Py_ssize_t nbytes):
        # Views held until free(): the segments cannot be unmapped under the kernels.
        cdef int i
        self._in_segments = <Py_buffer *>calloc(max(self.n_in, 1), sizeof(Py_buffer))
        self.in_slots = <char **>calloc(max(self.n_in, 1), sizeof(char *))
        if self._in_segments == NULL or self.in_slots == NULL:
            raise MemoryError()
        PyObject_GetBuffer(own, &self._own_segment, PyBUF_SIMPLE | PyBUF_WRITABLE)
        self._segments_held = 1
        for i in range(self.n_in):
            PyObject_GetBuffer(ins[i], &self._in_segments[i], PyBUF_SIMPLE)
            self._segments_held += 1
        if self._own_segment.len < nbytes or any(
                self._in_segments[i].len < nbytes for i in range(self.n_in)):
            self._release_segments()
            raise ConfigError(f"outbox segments must hold {nbytes} bytes each")
        self.out_slots = <char *>self._own_segment.buf
        for i in range(self.n_in):
            self.in_slots[i] = <char *>self._in_segments[i].buf

    cdef void _release_segments(self) noexcept:
        cdef int i
        if self._segments_held:
            PyBuffer_Release(&self._own_segment)
            for i in range(self._segments_held - 1):
                PyBuffer_Release(&self._in_segments[i])
            self._segments_held = 0
        free(self._in_segments)
        self._in_segments = NULL
        free(self.in_slots)
        self.in_slots = NULL
        self.out_slots = NULL

    cdef int _put_outbox(self, const char *src, int64_t version, int64_t iteration,
                         bint checksum, bint notify) except -1 nogil:
        # One copy into this rank's own slot, which every out-neighbour reduces from in
        # place, then the notifies.  Written in the seqlock order (header, payload,
        # footer, fences between), so a reader checking header == footer == version
        # never takes a partial write for a whole one.  A source that IS the slot's
        # payload (a double-buffered Exchange computes in its slots) is not copied at
        # all: only the header, footer and notifies.
        cdef Py_ssize_t slot = version % self.depth
        cdef char *hdr = self.out_slots + slot * self.slot_stride
        cdef char *ftr = hdr + HEADER_BYTES + self.payload_stride
        asap_store_i64(hdr + 8, iteration)
        asap_store_i64(hdr + 16, self.rank)
        asap_store_i64(hdr + 24, self.nbytes)
        asap_store_i64(hdr, version)
        asap_fence()
        if src != hdr + HEADER_BYTES:
            asap_copy_out(hdr + HEADER_BYTES, src, self.nbytes)
        asap_fence()
        self.bytes_put += self.nbytes * self.n_out
        asap_store_i64(ftr + 8, <int64_t>asap_checksum(src, self.nbytes) if checksum else 0)
        asap_store_i64(ftr, version)
        # The footer is in this rank's segment, not in window memory: MPI_Win_sync
        # promises nothing for it (and is progress only on Open MPI's osc rdma).  The
        # fence orders the footer before the notify's atomic, whichever CPU or NIC
        # performs it (_sync: MPI_Win_sync, then the fence).
        self._sync()
        if notify:
            self.words.notify(version, slot)
        return 0
