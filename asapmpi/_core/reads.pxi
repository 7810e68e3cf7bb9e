# The reading side of one channel (included by slotwin.pyx after the waits;
# docs/ARCHITECTURE.md): a reduce points the channel's slot store at the slots it reads
# (the channel says where they are: its _point hook) and turns the store's verdicts
# into errors.  The store verifies and reduces (slotstore.pxi); this knows the
# channel's ranks, so that an error names them.


cdef class SlotReader:
    """The verified reduce of one channel's slots, and its two halves for a reduce made
    elsewhere (on a device)."""

    cdef void *channel              # the SlotChannel that owns this (borrowed)
    cdef SlotStore store
    cdef int rank, n_in
    cdef Py_ssize_t nbytes
    cdef int *_in                   # the channel's (borrowed for its life)

    cdef int _buffer(self, obj, Py_buffer *view, int flags, str name) except -1:
        # a buffer of exactly the slots' size, held in `view` (the caller releases it)
        PyObject_GetBuffer(obj, view, flags)
        if view.len != self.nbytes:
            PyBuffer_Release(view)
            raise ConfigError(f"{name} has {view.len} bytes but the window's slots hold "
                              f"{self.nbytes}")
        return 0

    cdef int reduce(self, buf, double w_self, double[::1] weights, int64_t expected,
                    int64_t min_version, int64_t max_version, bint seqlock,
                    bint checksum, bint renormalize, bint require_all,
                    bint only_notified, own) except -1:
        """buf = w_self*buf + sum_i weights[i]*slot_i, over the usable inputs, in one pass.

        Reads slot `expected % depth` of every in-neighbour.  An input is usable when its
        header and footer agree (and the checksum, if asked), with a version in
        [min_version, max_version]; status CONSISTENT/TORN/STALE/AHEAD is counted per
        sender against `expected`.  With `renormalize` the weights of usable inputs are
        scaled to keep their sum.  seqlock: the slots may be written during the read.
        With seqlock or checksum, an input that changed during the read or fails its
        checksum is dropped and the reduce recomputed from a copy of buf; otherwise a
        slot whose header moved during the read raises ProtocolError (buf then holds
        that input's contribution: in ordered mode that check is best effort; a checksum
        finds a payload torn under an unchanged header, up to 64-bit collisions).
        require_all: if any input is not usable, before the pass or (seqlock, checksum)
        after it, raise ProtocolError with buf as it was (restored from the copy when
        the failure was found after the pass).  only_notified: inputs whose notify word
        for this slot is not `expected` are not read at all (counted stale): their
        sender may be writing them.
        own: this rank's own input, when it is not buf (buf = w_self*own + ...: a
        double-buffered Exchange reduces its current slot into the other one).
        Returns the number of inputs reduced.
        """
        cdef Py_buffer view
        cdef Py_buffer own_view
        cdef const char *own_ptr
        cdef bint own_held = False
        cdef int r, i
        cdef SlotChannel ch = <SlotChannel>self.channel
        _check_version(expected)
        if weights.shape[0] != self.n_in:
            raise ConfigError(f"{weights.shape[0]} weights for {self.n_in} in-neighbours")
        with nogil:
            ch._pump()          # a reduce that never waits (async's) sees what arrived
        self._buffer(buf, &view, PyBUF_ANY_CONTIGUOUS | PyBUF_WRITABLE, "buffer")
        try:
            own_ptr = <const char *>view.buf
            if own is not None:
                self._buffer(own, &own_view, PyBUF_ANY_CONTIGUOUS, "own")
                own_held = True
                own_ptr = <const char *>own_view.buf
            if (seqlock or checksum) and own_ptr == <const char *>view.buf:
                self.store.keep_copies()
            for i in range(self.n_in):
                self.store.exp_v[i] = expected
            with nogil:
                ch._point(only_notified)
                r = self.store.reduce(<char *>view.buf, w_self,
                                      &weights[0] if self.n_in else NULL, min_version,
                                      max_version, False, seqlock, checksum, renormalize,
                                      require_all, own_ptr)
        finally:
            PyBuffer_Release(&view)
            if own_held:
                PyBuffer_Release(&own_view)
        if r == -1:
            torn = [self._in[i] for i in range(self.n_in) if self.store.status[i] == TORN]
            raise ProtocolError(f"rank {self.rank}: the slot(s) of rank(s) {torn} changed while "
                                f"version {expected} was read; a writer did not wait for its "
                                f"ack (the reduced buffer is not valid)")
        if r == -3:
            self._not_usable(f"version {expected}")
        return r

    cdef _not_usable(self, str versions):
        bad = {self._in[i]: STATUS_NAMES[self.store.status[i]] for i in range(self.n_in)
               if not self.store.used[i]}
        raise ProtocolError(f"rank {self.rank}: {versions} from rank(s) {sorted(bad)}: "
                            f"not usable ({bad}); nothing was reduced, the buffer is "
                            f"unchanged (a peer broke the protocol)")

    cdef int reduce_versions(self, buf, double w_self, double[::1] weights,
                             int64_t[::1] versions, bint checksum,
                             bint renormalize) except -1:
        """buf = w_self*buf + sum_i weights[i]*(version versions[i] of in-neighbour i),
        each input verified (header == footer == its version); versions[i] <= 0 skips
        input i.  Inputs that fail are dropped and the reduce recomputed (a copy of buf is
        kept), with the weights of the rest renormalized unless renormalize is false.
        Returns the number of inputs reduced."""
        cdef Py_buffer view
        cdef int r, i
        cdef SlotChannel ch = <SlotChannel>self.channel
        if weights.shape[0] != self.n_in or versions.shape[0] != self.n_in:
            raise ConfigError(f"need {self.n_in} weights and versions, got "
                              f"{weights.shape[0]} and {versions.shape[0]}")
        with nogil:
            ch._pump()          # a reduce that never waits (async's) sees what arrived
        self._buffer(buf, &view, PyBUF_ANY_CONTIGUOUS | PyBUF_WRITABLE, "buffer")
        try:
            self.store.keep_copies()
            for i in range(self.n_in):
                self.store.exp_v[i] = versions[i]
            with nogil:
                ch._point(False)
                r = self.store.reduce(<char *>view.buf, w_self,
                                      &weights[0] if self.n_in else NULL, 0, 0, True,
                                      True, checksum, renormalize, False,
                                      <const char *>view.buf)
        finally:
            PyBuffer_Release(&view)
        return r

    cdef object read_begin(self, int64_t[::1] versions, int64_t min_version,
                           int64_t max_version, bint exact_each, bint require_all,
                           bint only_notified):
        """The first half of a reduce made elsewhere (on a device: asapmpi.device):
        the checks a reduce makes before it reads any payload, on the slot of
        version versions[i] of each in-neighbour (usable as in reduce(), or exactly
        versions[i] > 0 with exact_each).  Returns each input's payload address to
        read (uint64; 0: not to be read); ProtocolError with require_all when an input
        is not usable.  Copy the payloads out, then call read_end() before using them."""
        cdef int i, r
        cdef SlotChannel ch = <SlotChannel>self.channel
        if versions.shape[0] != self.n_in:
            raise ConfigError(f"need {self.n_in} versions, got {versions.shape[0]}")
        with nogil:
            ch._pump()          # a reduce that never waits (async's) sees what arrived
        for i in range(self.n_in):
            self.store.exp_v[i] = versions[i]
        with nogil:
            ch._point(only_notified)
            r = self.store.check(min_version, max_version, exact_each, require_all)
        if r == -3:
            self._not_usable(f"version(s) {list(versions)}")
        addresses = np.zeros(self.n_in, dtype=np.uint64)
        for i in range(self.n_in):
            if self.store.used[i]:
                addresses[i] = <uint64_t>(<uintptr_t>(self.store.hdr[i] + HEADER_BYTES))
        return addresses

    cdef object read_end(self):
        """The second half of a reduce made elsewhere, once the payloads read_begin
        named were copied out: the barrier, then each read slot's header again.
        Returns the indices of the inputs whose slot changed during the copy (dropped,
        counted torn: their copies must not be used); the statuses are counted."""
        before = [i for i in range(self.n_in) if self.store.used[i]]
        with nogil:
            self.store.recheck()
        return [i for i in before if not self.store.used[i]]
