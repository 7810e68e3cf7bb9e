# The put transport (included by slotwin.pyx): MPI_Put of header, payload and footer
# into each out-neighbour's slot in its window, one flush, then the notify word
# (docs/PROTOCOL.md section 2); and gossip's published slots, which others pull with
# one checksum-verified MPI_Rget (section 2f).


cdef class PutWindow(SlotWindow):
    """The put transport: every update is MPI_Put into the out-neighbours' windows,
    every notify and ack an atomic word; a slot is read where the writer put it."""

    cdef int _n_pub                 # published slots (gossip): they take turns
    cdef long long _published       # publishes so far
    cdef char *_pull_buf            # a pull's copy of a target's published slots
    cdef MPI_Request _late_get      # the MPI_Rget a timed-out pull left into _pull_buf
    cdef int64_t hdr[8]             # a put's header and footer, complete at the flush
    cdef int64_t ftr[8]
    cdef WindowMemory wmem          # its memory (mem), typed: the puts name its window

    def __cinit__(self):
        self.transport = "put"
        self.wmem = self.mem            # SlotChannel.__cinit__ made a WindowMemory
        self._late_get = MPI_REQUEST_NULL

    def __dealloc__(self):
        self._leave_behind()
        free(self._pull_buf)
        self._pull_buf = NULL

    cdef int _leave(self, _Leftover lo) except -1:
        if self._late_get != MPI_REQUEST_NULL:
            with nogil:
                lo.add(&self._late_get, False)
            lo.own(self._pull_buf)
            self._pull_buf = NULL
        return SlotWindow._leave(self, lo)

    cdef int _drain(self) except -1:
        # the get a timed-out pull left in flight completes before the window goes (its
        # target is in free() too, and its MPI progress serves the get)
        if self._late_get == MPI_REQUEST_NULL:
            return 0
        with nogil:
            asap_watchdog_arm(self.flush_timeout, b"the MPI_Rget a timed-out pull left, "
                              b"at free()", -1, self.nbr_desc)
            try:
                CHKERR(MPI_Wait(&self._late_get, MPI_STATUS_IGNORE), "MPI_Wait")
            finally:
                asap_watchdog_disarm()
        return 0

    cdef int _pull_buffer_free(self) except -1:
        # A get that a timed-out pull left in flight may still write _pull_buf: such a
        # buffer goes to the leftovers with its get (freed once MPI completes it) and
        # this pull reads into a new one, so that no late get lands in the bytes a pull
        # verifies and copies.
        cdef int flag = 0
        cdef _Leftover lo
        if self._late_get == MPI_REQUEST_NULL:
            return 0
        with nogil:
            CHKERR(MPI_Test(&self._late_get, &flag, MPI_STATUS_IGNORE), "MPI_Test")
        if flag:
            return 0
        lo = _Leftover("put (a timed-out pull)")
        with nogil:
            lo.add(&self._late_get, False)
        lo.own(self._pull_buf)
        self._pull_buf = <char *>malloc(self._n_pub * self.slot_stride)
        _leftovers.append(lo)
        if self._pull_buf == NULL:
            raise MemoryError()
        return 0

    cdef int _prepare(self, layout) except -1:
        SlotWindow._prepare(self, layout)
        self._n_pub = layout.n_publish
        if self._n_pub:
            self._pull_buf = <char *>malloc(self._n_pub * self.slot_stride)
            if self._pull_buf == NULL:
                raise MemoryError()
        return 0

    cdef int _send(self, const char *src, int64_t version, int64_t iteration, bint seqlock,
                   bint checksum, bint notify, int64_t suppress_if_acked) except -1:
        with nogil:
            self._mark_suppressed(suppress_if_acked)
            self._put(src, version, iteration, seqlock, checksum, notify)
        return 0

    cdef int _put(self, const char *src, int64_t version, int64_t iteration, bint seqlock,
                  bint checksum, bint notify) except -1 nogil:
        cdef int j
        cdef Py_ssize_t slot = version % self.depth
        cdef MPI_Aint d
        self.hdr[0] = version
        self.hdr[1] = iteration
        self.hdr[2] = self.rank
        self.hdr[3] = self.nbytes
        self.ftr[0] = version
        self.ftr[1] = <int64_t>asap_checksum(src, self.nbytes) if checksum else 0
        for j in range(self.n_out):
            if self.skip[j]:
                continue
            d = self.out_slot_disp[j] + slot * self.slot_stride
            CHKERR(MPI_Put(self.hdr, 4, MPI_INT64_T, self._out[j], d, 4, MPI_INT64_T,
                           self.wmem.win), "MPI_Put")
        if seqlock:
            self.wmem.flush_all(self.words, b"MPI_Win_flush_all after the header put",
                                version, self.out_desc, self.nbr_desc)
        for j in range(self.n_out):
            if self.skip[j]:
                continue
            d = self.out_slot_disp[j] + slot * self.slot_stride + HEADER_BYTES
            self.wmem.transfer(<char *>src, self.nbytes, self._out[j], d, False,
                               self._max_transfer)
            self.bytes_put += self.nbytes
        if seqlock:
            self.wmem.flush_all(self.words, b"MPI_Win_flush_all after the payload put",
                                version, self.out_desc, self.nbr_desc)
        for j in range(self.n_out):
            if self.skip[j]:
                continue
            d = self.out_slot_disp[j] + slot * self.slot_stride + HEADER_BYTES + self.payload_stride
            CHKERR(MPI_Put(self.ftr, 2, MPI_INT64_T, self._out[j], d, 2, MPI_INT64_T,
                           self.wmem.win), "MPI_Put")
        self.wmem.flush_all(self.words, b"MPI_Win_flush_all after the put", version,
                            self.out_desc, self.nbr_desc)
        if notify:
            self.words.notify(version, slot)
        return 0

    cdef int _get_polled(self, char *local, Py_ssize_t n, int target, MPI_Aint disp,
                         double timeout) except -1 nogil:
        # MPI_Rget in pieces of at most max_transfer bytes, each completed by polling
        # with back-off rather than a blocking MPI_Win_flush: a flush spins inside the
        # MPI, and with ranks oversubscribing the cores that keeps the target, whose
        # MPI progress serves the get on network paths, off the CPU.  1 on timeout: the
        # get still in flight, which may yet write `local`, is left in _late_get.
        cdef MPI_Request req
        cdef Py_ssize_t done = 0
        cdef int chunk
        cdef int flag = 0
        cdef long polls = 0
        cdef double t0 = asap_now()
        while done < n:
            chunk = <int>(n - done if n - done < self._max_transfer else self._max_transfer)
            CHKERR(MPI_Rget(local + done, chunk, MPI_BYTE, target, disp + done, chunk,
                            MPI_BYTE, self.wmem.win, &req), "MPI_Rget")
            while True:
                CHKERR(MPI_Test(&req, &flag, MPI_STATUS_IGNORE), "MPI_Test")
                if flag:
                    break
                if self.waits.idle(&polls, t0, timeout):
                    self._late_get = req
                    return 1
            done += chunk
        return 0

    def publish(self, buf, int64_t version):
        """Write `buf` as `version` into this rank's next published slot (they take
        turns, so a pull reading the newest finds it unchanged while the next publish
        writes the other) for others to pull: header, flush, payload, flush, footer with
        the payload's checksum, flush.  Puts to self: every access stays an MPI RMA
        operation.  The flushes order these writes in this rank's memory, not with
        another rank's concurrent MPI_Rget (MPI orders nothing between them): a pull
        verifies what it read by the checksum instead (docs/PROTOCOL.md 2f)."""
        cdef Py_buffer view
        cdef MPI_Aint d
        self._check_alive()
        if self._n_pub == 0:
            raise ConfigError("this window has no published slot (Layout.n_publish = 0)")
        _check_version(version)
        PyObject_GetBuffer(buf, &view, PyBUF_ANY_CONTIGUOUS)
        try:
            if view.len != self.nbytes:
                raise ConfigError(f"buffer has {view.len} bytes but the published slot "
                                  f"holds {self.nbytes}")
            d = self.off_publish + (self._published % self._n_pub) * self.slot_stride
            with nogil:
                self.hdr[0] = version
                self.hdr[1] = version
                self.hdr[2] = self.rank
                self.hdr[3] = self.nbytes
                self.ftr[0] = version
                self.ftr[1] = <int64_t>asap_checksum(view.buf, self.nbytes)
                CHKERR(MPI_Put(self.hdr, 4, MPI_INT64_T, self.rank, d, 4, MPI_INT64_T,
                               self.wmem.win), "MPI_Put")
                self.wmem.flush(self.rank, b"MPI_Win_flush after the published header")
                self.wmem.transfer(<char *>view.buf, self.nbytes, self.rank,
                                   d + HEADER_BYTES, False, self._max_transfer)
                self.wmem.flush(self.rank, b"MPI_Win_flush after the published payload")
                CHKERR(MPI_Put(self.ftr, 2, MPI_INT64_T, self.rank,
                               d + HEADER_BYTES + self.payload_stride, 2, MPI_INT64_T,
                               self.wmem.win), "MPI_Put")
                self.wmem.flush(self.rank, b"MPI_Win_flush after the published footer")
            self._published += 1
        finally:
            PyBuffer_Release(&view)

    def pull(self, int target, Py_ssize_t disp, out):
        """Read `target`'s published slots (the first header at `disp` in its window)
        into `out`: one MPI_Rget of all of them (in pieces of max_transfer), polled with
        back-off.  No code of the target takes part, but its MPI progress serves the get:
        without RDMA hardware (osc pt2pt, MPICH's active messages, osc ucx over TCP) the
        get completes only when the target next calls MPI.  A slot counts only if it
        verifies: header == footer, its size, and the checksum of the payload as read,
        which a read overlapping a publish of that slot fails but for a 64-bit collision
        (self-verifying, as Pilaf's one-sided reads).  Returns the newest verified
        version (its payload in `out`), or 0 if no slot verified: none published yet, or
        every slot was being written (`out` then unchanged)."""
        cdef Py_buffer view
        cdef Py_ssize_t span = self._n_pub * self.slot_stride
        cdef int s
        cdef int r = 0
        cdef int best = -1
        cdef int64_t best_version = 0
        cdef int64_t *h
        cdef int64_t *f
        self._check_alive()
        if self._n_pub == 0:
            raise ConfigError("this window has no published slot (Layout.n_publish = 0): "
                              "every rank's layout must have the same n_publish")
        self._check_target(target, disp)
        self._check_target(target, disp + span - 8)
        PyObject_GetBuffer(out, &view, PyBUF_ANY_CONTIGUOUS | PyBUF_WRITABLE)
        try:
            if view.len != self.nbytes:
                raise ConfigError(f"buffer has {view.len} bytes but slots hold {self.nbytes}")
            self._pull_buffer_free()
            with nogil:
                r = self._get_polled(self._pull_buf, span, target, disp, self.flush_timeout)
            if r:
                raise NeighbourTimeoutError(
                    self.rank, "the MPI_Rget of its published models (its MPI progress "
                    "serves the get)", [target], [1], [0], self.flush_timeout)
            with nogil:
                self.bytes_got += self._n_pub * self.nbytes
                for s in range(self._n_pub):
                    h = <int64_t *>(self._pull_buf + s * self.slot_stride)
                    f = <int64_t *>(self._pull_buf + s * self.slot_stride + HEADER_BYTES
                                    + self.payload_stride)
                    if (h[0] > best_version and h[0] == f[0] and h[3] == self.nbytes
                            and f[1] == <int64_t>asap_checksum(
                                self._pull_buf + s * self.slot_stride + HEADER_BYTES,
                                self.nbytes)):
                        best = s
                        best_version = h[0]
                if best >= 0:
                    memcpy(view.buf, self._pull_buf + best * self.slot_stride + HEADER_BYTES,
                           self.nbytes)
        finally:
            PyBuffer_Release(&view)
        return best_version
