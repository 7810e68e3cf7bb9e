# The message transport (included by slotwin.pyx): NOTIFY-ACK on network paths
# (docs/PROTOCOL.md section 2c).  Version k of an update is one message per
# out-neighbour, received straight into the reader's slot.  The receive posted for k is
# the ack of k-1 (the slot is free again), its completion the notify of k; on arrival
# the reader stamps the slot's header and footer with k, so the verified reduce checks
# it like any other.  MPI matching keeps versions apart: a receive takes only the tag of
# the version it expects.


cdef class MessageWindow(SlotWindow):
    """The message channel of NOTIFY-ACK: the channel verbs as messages.  release(k)
    posts the receives of k + 1 (release(0): of version 1), deliver(buf, k) sends k,
    await_(k) waits until k arrived and this rank's own sends of k were matched; its
    writers always wait for their readers (a synchronous send), so waits_for_release
    changes nothing here.  Only await_'s EXACT mode (Channel.awaits)."""

    cdef MPI_Comm msg_comm
    # Every request in one array, so that a poll of await_ is one MPI_Testsome:
    # one progress call (on UCX a worker progress, on MPICH's TCP path a poll of the
    # sockets), not one per request, which a waiting rank's CPU would pay on cores it
    # shares with the ranks it waits for.
    cdef MPI_Request *reqs          # the receives, then the sends
    cdef int *req_index             # MPI_Testsome's indices
    cdef MPI_Status *req_status     # and statuses (a failed request's error: CHKSOME)
    cdef MPI_Request *recv_reqs     # per in-neighbour: payload, checksum (into reqs)
    cdef MPI_Request *send_reqs     # per out-neighbour: payload, checksum (into reqs)
    cdef int64_t *recv_cksum
    # The update is sent from a copy: deliver() returns with the caller's buffer
    # free to write, as put() and the shared transport leave it (a synchronous send
    # from the buffer itself would read it until await_, and a write meanwhile
    # would reach the readers torn).  The checksum message follows the copy (8-aligned).
    cdef char *stage
    # deliver(copy=False) sends from the caller's buffer: its view is held until
    # the sends complete (await_, the drain at free), or handed to the leftovers
    cdef object _lent               # a memoryview of it, or None
    cdef bint _sending              # a deliver() whose await_() is to come
    cdef bint _msg_checksum
    cdef int64_t _posted            # version the receives are posted for (0: none)
    cdef int64_t _last_posted       # the newest version whose receives were posted
    cdef int64_t *_sent_to          # per out-neighbour: the last version whose send
                                    # was posted (0: none), for the drain

    def __cinit__(self):
        self.transport = "messages"
        self.mem = MessageMemory()    # messages only: no MPI window
        self.msg_comm = MPI_COMM_NULL

    def __dealloc__(self):
        self._leave_behind()
        free(self.reqs); self.reqs = self.recv_reqs = self.send_reqs = NULL
        free(self.req_index); self.req_index = NULL
        free(self.req_status); self.req_status = NULL
        free(self.recv_cksum); self.recv_cksum = NULL
        free(self.stage); self.stage = NULL
        free(self._sent_to); self._sent_to = NULL

    cdef int _leave(self, _Leftover lo) except -1:
        with nogil:
            lo.add_all(self.recv_reqs, 2 * self.n_in, True)
            lo.add_all(self.send_reqs, 2 * self.n_out, False)
        lo.own(self.recv_cksum); self.recv_cksum = NULL
        lo.own(self.stage); self.stage = NULL
        if self._lent is not None:
            lo.keep(self._lent)
            self._lent = None
        return SlotWindow._leave(self, lo)

    cdef int _prepare(self, layout) except -1:
        cdef int i
        cdef int n = max(self.n_in, 1)
        cdef int m = max(self.n_out, 1)
        SlotWindow._prepare(self, layout)
        if self.nbytes > 0x7fffffff:
            raise ConfigError(f"the message transport sends at most 2 GiB per update, not "
                              f"{self.nbytes} bytes; use transport='put'")
        self.reqs = <MPI_Request *>calloc(2 * (n + m), sizeof(MPI_Request))
        self.req_index = <int *>calloc(2 * (n + m), sizeof(int))
        self.req_status = <MPI_Status *>calloc(2 * (n + m), sizeof(MPI_Status))
        self.recv_cksum = <int64_t *>calloc(n, sizeof(int64_t))
        self.stage = <char *>malloc((self.nbytes + 7) // 8 * 8 + 8)
        self._sent_to = <int64_t *>calloc(m, sizeof(int64_t))
        if (self.reqs == NULL or self.req_index == NULL or self.req_status == NULL
                or self.recv_cksum == NULL
                or self.stage == NULL or self._sent_to == NULL):
            raise MemoryError()
        for i in range(2 * (n + m)):
            self.reqs[i] = MPI_REQUEST_NULL
        self.recv_reqs = self.reqs
        self.send_reqs = self.reqs + 2 * n
        return 0

    cdef int _open(self) except -1:
        with nogil:
            self._dup_comm(&self.msg_comm)
        return 0

    cdef int _drain(self) except -1:
        # the last version each rank posted a send of to this one, then each receive
        # completed or cancelled
        cdef int64_t *sent
        cdef int64_t *mine
        cdef int j
        if self.msg_comm == MPI_COMM_NULL:
            return 0
        sent = <int64_t *>calloc(self.size, sizeof(int64_t))
        mine = <int64_t *>calloc(self.size, sizeof(int64_t))
        if sent == NULL or mine == NULL:
            free(sent)
            free(mine)
            raise MemoryError()
        try:
            with nogil:
                for j in range(self.n_out):
                    mine[self._out[j]] = self._sent_to[j]
                # every rank came to free(); one that dies now ends the job (the
                # watchdog) instead of hanging the others here
                asap_watchdog_arm(self.flush_timeout, b"the message drain at free()",
                                  -1, self.nbr_desc)
                try:
                    CHKERR(MPI_Alltoall(mine, 1, MPI_INT64_T, sent, 1, MPI_INT64_T,
                                        self.comm), "MPI_Alltoall")
                    self._drain_messages(sent)
                finally:
                    asap_watchdog_disarm()
                CHKERR(MPI_Comm_free(&self.msg_comm), "MPI_Comm_free")
        finally:
            free(sent)
            free(mine)
        return 0

    def release(self, int64_t version, bint checksum=False):
        """Verb: this rank reduced `version` (0: none yet): post the receives of
        version + 1 into every in-neighbour's slot (version + 1) % depth, which is the
        ack its writers wait for (the slots must not be read again until
        await_(version + 1)); `checksum`: each update is followed by its checksum."""
        self._check_alive()
        self._post_receives(version + 1, checksum)

    cdef int _post_receives(self, int64_t version, bint checksum) except -1:
        cdef int i
        cdef char *hdr
        _check_version(version)
        if self._posted:
            raise ConfigError(f"the receives of version {self._posted} are still posted")
        with nogil:
            for i in range(self.n_in):
                hdr = self._slot(i, version % self.depth)
                # the slot is about to change: no reader may take it for a whole version
                asap_store_i64(hdr, -version)
                CHKERR(MPI_Irecv(hdr + HEADER_BYTES, <int>self.nbytes, MPI_BYTE, self._in[i],
                                 <int>(version % TAG_MODULUS), self.msg_comm,
                                 &self.recv_reqs[2 * i]), "MPI_Irecv")
                if checksum:
                    CHKERR(MPI_Irecv(&self.recv_cksum[i], 1, MPI_INT64_T, self._in[i],
                                     <int>(version % TAG_MODULUS), self.msg_comm,
                                     &self.recv_reqs[2 * i + 1]), "MPI_Irecv")
        self._posted = self._last_posted = version
        self._msg_checksum = checksum
        return 0

    def deliver(self, buf, int64_t version, double timeout, bint checksum=False,
                bint copy=True, int64_t skip_released=0):
        """Verb: send `buf` as `version` to every out-neighbour (never waits: `timeout`
        is await_'s); the sends complete in await_(version).  From a copy: `buf` may
        be written as soon as this returns.  copy=False (a whole step: the caller
        writes `buf` only after await_) sends from `buf` itself, one copy of the
        update fewer; its view is held until the sends complete.  skip_released is
        refused: every reader's receive of `version` waits for its send."""
        cdef int j
        cdef Py_buffer view
        cdef const char *src = self.stage
        cdef int64_t *cksum = <int64_t *>(self.stage + (self.nbytes + 7) // 8 * 8)
        self._check_alive()
        _check_version(version)
        if skip_released:
            raise ConfigError("the message channel sends every version to every reader "
                              "(each waits for it): skip_released must be 0")
        if self._sending:
            raise ConfigError("deliver() twice without await_()")
        PyObject_GetBuffer(buf, &view, PyBUF_ANY_CONTIGUOUS)
        try:
            if view.len != self.nbytes:
                raise ConfigError(f"buffer has {view.len} bytes but the window's slots "
                                  f"hold {self.nbytes}")
            if copy:
                with nogil:
                    memcpy(self.stage, view.buf, self.nbytes)
            else:
                # a view of its own, held while MPI reads the memory: released by
                # await_, or the leftovers' once the window dies first
                self._lent = memoryview(buf)
                src = <const char *>view.buf
        finally:
            PyBuffer_Release(&view)
        self._sending = True
        with nogil:
            if checksum:
                cksum[0] = <int64_t>asap_checksum(src, self.nbytes)
            for j in range(self.n_out):
                # Synchronous: the send completes only once the reader's receive of
                # `version` matched it, i.e. once the reader reduced version - 1, and
                # await_ waits for that.  A standard send below the eager limit
                # completes at once: on a directed ring of n ranks a writer then ran up
                # to n - 1 versions ahead of its reader, its messages queued
                # unexpected there (and tags, versions modulo 32768, could alias).
                CHKERR(MPI_Issend(<void *>src, <int>self.nbytes, MPI_BYTE,
                                  self._out[j], <int>(version % TAG_MODULUS), self.msg_comm,
                                  &self.send_reqs[2 * j]), "MPI_Issend")
                # recorded once posted: the drain receives a version from a writer only
                # if its send is really on the way
                self._sent_to[j] = version
                if checksum:
                    CHKERR(MPI_Isend(cksum, 1, MPI_INT64_T, self._out[j],
                                     <int>(version % TAG_MODULUS), self.msg_comm,
                                     &self.send_reqs[2 * j + 1]), "MPI_Isend")
                self.bytes_put += self.nbytes

    def await_(self, int64_t version, double timeout, int mode=AWAIT_EXACT,
               int count=0):
        """Verb: wait until `version` arrived from every in-neighbour (its slot stamped
        with it) and this rank's own sends of `version` completed (each matched by its
        reader's receive: no writer is more than one version ahead of its reader);
        NeighbourTimeoutError naming the ranks after `timeout` seconds.  EXACT only:
        a receive is posted for one version."""
        cdef long polls = 0
        cdef double t0
        cdef int got_in = 0, got_out = 0
        cdef int i
        self._check_alive()
        if mode != AWAIT_EXACT:
            raise ConfigError(f"the message channel awaits exact versions only "
                              f"(mode 0), got mode {mode}")
        if self._posted != version:
            raise ConfigError(f"await_({version}) but the receives are posted for "
                              f"version {self._posted}")
        with nogil:
            t0 = asap_now()
            asap_watchdog_waiting(b"the update", version, self.in_desc)
            while True:
                # one MPI_Testsome over every request (not MPI_Testall, which frees none
                # until all are done): what is still pending after a timeout names the
                # late ranks
                self._test_all()
                got_in = _all_null(self.recv_reqs, 2 * self.n_in)
                got_out = _all_null(self.send_reqs, 2 * self.n_out)
                if got_in and got_out:
                    break
                # the tests above were this poll's progress
                if self.waits.idle(&polls, t0, timeout, True):
                    break
            asap_watchdog_waiting(NULL, 0, NULL)
        if not (got_in and got_out):
            self._message_timeout(version, timeout)
        self._sending = False
        self._release_lent()
        with nogil:
            for i in range(self.n_in):
                stamp_slot(self._slot(i, version % self.depth), self.payload_stride,
                           version, self.recv_cksum[i] if self._msg_checksum else 0,
                           version, self._in[i], self.nbytes)
        self._posted = 0

    cdef int _release_lent(self) except -1:
        # the sends from the caller's buffer completed
        if self._lent is not None:
            self._lent.release()
            self._lent = None
        return 0

    cdef int _test_all(self) except -1 nogil:
        # complete (and free) whatever finished, in one progress call; a receive or
        # send not posted this step is MPI_REQUEST_NULL, which MPI_Testsome skips.  A
        # request that failed (a neighbour died: ULFM) raises its own error, not
        # MPI_ERR_IN_STATUS (CHKSOME), so that fault_tolerance=True survives it
        cdef int count = 0
        cdef int n = 2 * (max(self.n_in, 1) + max(self.n_out, 1))
        CHKSOME(MPI_Testsome(n, self.reqs, &count, self.req_index, self.req_status),
                n, count, self.req_status, "MPI_Testsome")
        return 0

    cdef list _pending(self, MPI_Request *reqs, const int *ranks, int n):
        """The ranks (sorted) whose requests reqs[2i], reqs[2i+1] are not all complete."""
        return [ranks[i] for i in range(n)
                if reqs[2 * i] != MPI_REQUEST_NULL or reqs[2 * i + 1] != MPI_REQUEST_NULL]

    cdef _message_timeout(self, int64_t version, double timeout):
        late = sorted(self._pending(self.recv_reqs, self._in, self.n_in))
        if late:
            raise NeighbourTimeoutError(self.rank, f"the update of version {version}", late,
                                        [version] * len(late), [version - 1] * len(late),
                                        timeout)
        late = sorted(self._pending(self.send_reqs, self._out, self.n_out))
        raise NeighbourTimeoutError(self.rank, f"the receive of its update of version "
                                    f"{version} (posted when the neighbour is done with "
                                    f"version {version - 1})", late,
                                    [version - 1] * len(late), [version - 2] * len(late),
                                    timeout)

    cdef int _drain_messages(self, int64_t *sent) except -1 nogil:
        # At free (collective): every rank's last sent version is in sent[].  A receive
        # whose sender did send that version is completed, the others cancelled, and this
        # rank's own sends completed: no message outlives the communicator (a message
        # left in flight could match a receive of a later one that reuses its context).
        # A writer is at most one version past the newest receive p its reader posted
        # (it sent p + 1 only after its synchronous send of p matched that receive), so
        # a writer that stopped with its send of p + 1 in flight (the reader never got
        # to post p + 1: a timeout, an error) is matched here by one more receive, into
        # a slot that free() discards, and its send completes.
        cdef int i, k
        cdef int64_t p = self._last_posted
        cdef char *hdr
        if self.recv_reqs == NULL:
            return 0
        for i in range(self.n_in):
            for k in range(2 * i, 2 * i + 2):
                if self.recv_reqs[k] == MPI_REQUEST_NULL:
                    continue
                if sent[self._in[i]] < self._posted:
                    CHKERR(MPI_Cancel(&self.recv_reqs[k]), "MPI_Cancel")
                CHKERR(MPI_Wait(&self.recv_reqs[k], MPI_STATUS_IGNORE), "MPI_Wait")
            if sent[self._in[i]] > p:
                hdr = self._slot(i, (p + 1) % self.depth)
                CHKERR(MPI_Recv(hdr + HEADER_BYTES, <int>self.nbytes, MPI_BYTE, self._in[i],
                                <int>((p + 1) % TAG_MODULUS), self.msg_comm,
                                MPI_STATUS_IGNORE), "MPI_Recv")
                if self._msg_checksum:
                    CHKERR(MPI_Recv(&self.recv_cksum[i], 1, MPI_INT64_T, self._in[i],
                                    <int>((p + 1) % TAG_MODULUS), self.msg_comm,
                                    MPI_STATUS_IGNORE), "MPI_Recv")
        for k in range(2 * self.n_out):
            if self.send_reqs[k] != MPI_REQUEST_NULL:
                CHKERR(MPI_Wait(&self.send_reqs[k], MPI_STATUS_IGNORE), "MPI_Wait")
        self._posted = 0
        with gil:
            self._release_lent()
        return 0


cdef inline bint _all_null(const MPI_Request *reqs, int n) noexcept nogil:
    # every request of reqs[0..n-1] completed (freed by MPI_Testsome)
    cdef int k
    for k in range(n):
        if reqs[k] != MPI_REQUEST_NULL:
            return False
    return True
