# The put transport (included by slotwin.pyx): MPI_Put of header, payload and footer
# into each out-neighbour's slot in its window, one flush, then the notify word
# (docs/PROTOCOL.md section 2); and gossip's one-sided pull, a published slot that
# others read with MPI_Get (asapmpi/sync/gossip.py).


cdef class PutWindow(SlotWindow):
    """The put transport: every update is MPI_Put into the out-neighbours' windows,
    every notify and ack an atomic word; a slot is read where the writer put it."""

    def __cinit__(self):
        self.transport = "put"

    cdef int _send(self, const char *src, int64_t version, int64_t iteration, bint seqlock,
                   bint checksum, bint notify, double tear,
                   int64_t suppress_if_acked) except -1:
        with nogil:
            self._mark_suppressed(suppress_if_acked)
            self._put(src, version, iteration, seqlock, checksum, notify, tear)
        return 0

    cdef int _put(self, const char *src, int64_t version, int64_t iteration, bint seqlock,
                  bint checksum, bint notify, double tear) except -1 nogil:
        cdef int j
        cdef Py_ssize_t slot = version % self.depth
        cdef Py_ssize_t payload = self.nbytes
        cdef MPI_Aint d
        if tear > 0.0:
            payload = <Py_ssize_t>(self.nbytes * tear)
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
                           self.win), "MPI_Put")
        if seqlock or tear > 0.0:
            self._flush_all(b"MPI_Win_flush_all after the header put", version, self.out_desc)
        for j in range(self.n_out):
            if self.skip[j]:
                continue
            d = self.out_slot_disp[j] + slot * self.slot_stride + HEADER_BYTES
            self._transfer(<char *>src, payload, self._out[j], d, False)
            self.bytes_put += payload
        if seqlock or tear > 0.0:
            self._flush_all(b"MPI_Win_flush_all after the payload put", version, self.out_desc)
        if tear > 0.0:
            return 0
        for j in range(self.n_out):
            if self.skip[j]:
                continue
            d = self.out_slot_disp[j] + slot * self.slot_stride + HEADER_BYTES + self.payload_stride
            CHKERR(MPI_Put(self.ftr, 2, MPI_INT64_T, self._out[j], d, 2, MPI_INT64_T,
                           self.win), "MPI_Put")
        self._flush_all(b"MPI_Win_flush_all after the put", version, self.out_desc)
        if notify:
            self._notify(version, slot)
        return 0

    def publish(self, buf, int64_t version):
        """Write `buf` as `version` into this rank's own published slot for others to
        pull: header, flush, payload, flush, footer, flush (the seqlock order, so that a
        pull overlapping this write sees header != footer).  Puts to self: every access
        stays an MPI RMA operation."""
        cdef Py_buffer view
        cdef MPI_Aint d = self.off_publish
        self._check_alive()
        if not self.has_publish:
            raise ConfigError("this window has no published slot (Layout.n_publish = 0)")
        self._check_version(version)
        PyObject_GetBuffer(buf, &view, PyBUF_ANY_CONTIGUOUS)
        try:
            if view.len != self.nbytes:
                raise ConfigError(f"buffer has {view.len} bytes but the published slot "
                                  f"holds {self.nbytes}")
            with nogil:
                self.hdr[0] = version
                self.hdr[1] = version
                self.hdr[2] = self.rank
                self.hdr[3] = self.nbytes
                self.ftr[0] = version
                self.ftr[1] = 0
                CHKERR(MPI_Put(self.hdr, 4, MPI_INT64_T, self.rank, d, 4, MPI_INT64_T,
                               self.win), "MPI_Put")
                self._flush(self.rank, b"MPI_Win_flush after the published header")
                self._transfer(<char *>view.buf, self.nbytes, self.rank, d + HEADER_BYTES,
                               False)
                self._flush(self.rank, b"MPI_Win_flush after the published payload")
                CHKERR(MPI_Put(self.ftr, 2, MPI_INT64_T, self.rank,
                               d + HEADER_BYTES + self.payload_stride, 2, MPI_INT64_T,
                               self.win), "MPI_Put")
                self._flush(self.rank, b"MPI_Win_flush after the published footer")
        finally:
            PyBuffer_Release(&view)

    def pull(self, int target, Py_ssize_t disp, out):
        """Read `target`'s published slot (header at `disp` in its window) into `out`
        with MPI_Get, no work by the target's CPU: footer, flush, payload, flush, header,
        flush, the reverse of publish's order.  Returns the version read, or 0 if the
        slot is empty or a publish overlapped the read (`out` then holds garbage)."""
        cdef Py_buffer view
        cdef int64_t got_hdr[4]
        cdef int64_t got_ftr[2]
        self._check_alive()
        self._check_target(target, disp)
        self._check_target(target, disp + HEADER_BYTES + self.payload_stride + 8)
        PyObject_GetBuffer(out, &view, PyBUF_ANY_CONTIGUOUS | PyBUF_WRITABLE)
        try:
            if view.len != self.nbytes:
                raise ConfigError(f"buffer has {view.len} bytes but slots hold {self.nbytes}")
            with nogil:
                CHKERR(MPI_Get(got_ftr, 2, MPI_INT64_T, target,
                               disp + HEADER_BYTES + self.payload_stride, 2, MPI_INT64_T,
                               self.win), "MPI_Get")
                self._flush(target, b"MPI_Win_flush after getting a footer")
                self._transfer(<char *>view.buf, self.nbytes, target, disp + HEADER_BYTES,
                               True)
                self._flush(target, b"MPI_Win_flush after getting a payload")
                CHKERR(MPI_Get(got_hdr, 4, MPI_INT64_T, target, disp, 4, MPI_INT64_T,
                               self.win), "MPI_Get")
                self._flush(target, b"MPI_Win_flush after getting a header")
                self.bytes_got += self.nbytes
        finally:
            PyBuffer_Release(&view)
        if got_hdr[0] > 0 and got_hdr[0] == got_ftr[0] and got_hdr[3] == self.nbytes:
            return got_hdr[0]
        return 0
