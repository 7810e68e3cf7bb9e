# Push gossip (included by slotwin.pyx; docs/PROTOCOL.md section 2h): gossip's models
# by two-sided messages, for paths where a one-sided read waits on the peer's progress.
#
# Why push and not a pull by request and reply: on a path without RDMA hardware
# (MPICH's TCP path runs RMA as active messages, Open MPI's osc ucx over TCP) an
# MPI_Rget completes only once its target next enters MPI, and a pull by request and
# reply would wait for that same moment (in training the peer computes a whole step
# without calling MPI).  A push waits for nobody: the sender hands its model to MPI
# (MPI_Issend to the peer its schedule chose) and steps on; the receiver's next pump
# takes what arrived, and its mix reads the newest whole version from each sender.
# Neither side waits for a particular version, as a pull never did.
#
# Receiving: a pool of PUSH_BUFFERS slot-shaped buffers (header, payload, footer, the
# sender's words), each either posted (an MPI_ANY_SOURCE receive on the channel's own
# communicator), held (the newest whole version of one sender, stamped from its
# trailer as a mailbox stamps a slot) or taken (handed to a reduce by take(), until
# release()).  Memory is PUSH_BUFFERS model copies whatever the ranks, not one per
# sender: a receive is reposted as soon as its buffer is free (a newer version of the
# same sender superseded it, or release() after a reduce); while every buffer is held
# or taken, no receive is posted and the senders' messages wait inside MPI (their
# synchronous sends stay incomplete, see below), so nothing piles up in this rank.
# A reduce reads only taken buffers, which MPI never writes (no receive is posted into
# them), and the verified reduce checks each (header == footer == version, checksum).
#
# Sending: MPI_Issend from a stage (a copy: the caller's buffer is free on return),
# which completes only once a receive took the message.  At most one message in flight
# per peer and PUSH_SENDS in all; a push that finds its peer's channel (or every send)
# busy does not wait: its model waits in the one waiting stage, replacing an older
# one (which is then never sent: counted in `replaced`), and the pump sends it once a
# send completes.  So a sender never blocks on a receiver, and its memory is
# PUSH_SENDS + 1 stages.
#
# free() (collective): the waiting model is dropped; an MPI_Alltoall of the messages
# each rank sent each other; every posted receive is cancelled (MPI_Cancel, MPI_Wait,
# MPI_Test_cancelled: one that a message matched meanwhile completes and is counted);
# the messages still to come are received into a scratch buffer; then this rank's
# own sends are completed.  A window dropped without free() hands its receives
# (cancelled), its sends and all their memory to the leftovers (slotwin.pyx).

cdef enum:
    PUSH_BUFFERS = 4                # receive buffers: posted, held or taken
    PUSH_SENDS = 2                  # sends in flight at most (one per peer)
    PUSH_TAG = 1
    PUSH_POSTED = -1                # buf_owner: a receive is posted into it
    PUSH_FREE = -2                  # buf_owner: neither (only inside a call, or drained)


cdef class PushWindow(SlotWindow):
    """Gossip by messages: push(buf, version, peer) sends this rank's model to the peer
    its schedule chose, never waiting; take() hands the newest whole version that
    arrived from each sender to the verified reduce (reduce_versions), release() gives
    their buffers back to the receives (docs/PROTOCOL.md 2h)."""

    cdef MPI_Comm msg_comm
    cdef MPI_Request *req           # PUSH_BUFFERS receives, then PUSH_SENDS sends
    cdef int *index                 # MPI_Testsome's indices
    cdef MPI_Status *status         # MPI_Testsome's statuses (a message's sender)
    cdef char *bufs                 # the receive buffers, slot-shaped
    cdef Py_ssize_t buf_stride
    cdef int64_t *buf_words         # per buffer: the words that came with its model
    cdef int *buf_owner             # per buffer: PUSH_POSTED, or in-index holding it
    cdef bint *buf_taken            # per buffer: handed to a reduce by take()
    cdef int *held                  # per in-neighbour: its newest held buffer (-1)
    cdef int *taken                 # per in-neighbour: its taken buffer (-1)
    cdef int *in_index              # per rank: its in-neighbour index (-1: not one)
    cdef char *stages               # PUSH_SENDS + 1 stages: payload, trailer, words
    cdef Py_ssize_t stage_stride
    cdef Py_ssize_t msg_bytes       # one message: payload, 32-byte trailer, words
    cdef int n_words                # words carried with each model (the user words)
    cdef int *snd_stage             # per send: its stage (-1: free)
    cdef int *snd_peer              # per send: the rank it goes to
    cdef double *snd_t0             # per send: when it was posted
    cdef int wait_stage             # the model waiting for a free send (-1: none)
    cdef int wait_peer
    cdef int64_t *sent_to           # per rank: messages sent to it (for the drain)
    cdef int64_t got_total          # messages received (for the drain)
    cdef int64_t *last_v            # per in-neighbour: the newest version taken
    cdef double *latency            # per rank: seconds of the last send to it that
                                    # completed, posting to the pump that saw it (-1)
    cdef readonly long long pushed, replaced, arrived, superseded
    #: take() gives the CPU away once (sched_yield) while a model of this rank is in
    #: flight or waits: where ranks share cores (the Exchange sets it when its host is
    #: oversubscribed, asapmpi.launch.cores), a gossip loop never waits, so nothing else
    #: yields, and a push completes only once its peer is scheduled and calls MPI
    cdef public bint yields

    def __cinit__(self):
        self.transport = "push"
        self.mem = MessageMemory()    # messages only: no MPI window
        self.pushes = True
        self.msg_comm = MPI_COMM_NULL
        self.wait_stage = -1

    def __dealloc__(self):
        self._leave_behind()
        free(self.req); self.req = NULL
        free(self.index); self.index = NULL
        free(self.status); self.status = NULL
        free(self.bufs); self.bufs = NULL
        free(self.buf_words); self.buf_words = NULL
        free(self.buf_owner); self.buf_owner = NULL
        free(self.buf_taken); self.buf_taken = NULL
        free(self.held); self.held = NULL
        free(self.taken); self.taken = NULL
        free(self.in_index); self.in_index = NULL
        free(self.stages); self.stages = NULL
        free(self.snd_stage); self.snd_stage = NULL
        free(self.snd_peer); self.snd_peer = NULL
        free(self.snd_t0); self.snd_t0 = NULL
        free(self.sent_to); self.sent_to = NULL
        free(self.latency); self.latency = NULL
        free(self.last_v); self.last_v = NULL

    # ------------------------------------------------------------------ lifetime

    cdef int _prepare(self, layout) except -1:
        cdef int n = max(self.n_in, 1)
        cdef int k
        SlotWindow._prepare(self, layout)
        if self.depth != 0:
            raise ConfigError(f"push gossip keeps a pool of receive buffers, not slots "
                              f"per sender: needs depth 0, got depth={self.depth}")
        self.n_words = self.n_user
        self.msg_bytes = self.nbytes + MB_TRAILER_BYTES + 8 * self.n_words
        if self.msg_bytes > 0x7fffffff:
            raise ConfigError(f"push gossip sends less than 2 GiB per model, not "
                              f"{self.nbytes} bytes; use transport='put'")
        # a slot (header, payload, footer) and room for the words after the trailer
        self.buf_stride = (HEADER_BYTES + self.payload_stride + HEADER_BYTES
                           + (8 * self.n_words + 63) // 64 * 64)
        self.stage_stride = (self.msg_bytes + 63) // 64 * 64
        self.req = <MPI_Request *>calloc(PUSH_BUFFERS + PUSH_SENDS, sizeof(MPI_Request))
        self.index = <int *>calloc(PUSH_BUFFERS + PUSH_SENDS, sizeof(int))
        self.status = <MPI_Status *>calloc(PUSH_BUFFERS + PUSH_SENDS, sizeof(MPI_Status))
        self.bufs = <char *>calloc(PUSH_BUFFERS, self.buf_stride)
        self.buf_words = <int64_t *>calloc(PUSH_BUFFERS * max(self.n_words, 1), 8)
        self.buf_owner = <int *>calloc(PUSH_BUFFERS, sizeof(int))
        self.buf_taken = <bint *>calloc(PUSH_BUFFERS, sizeof(bint))
        self.held = <int *>calloc(n, sizeof(int))
        self.taken = <int *>calloc(n, sizeof(int))
        self.in_index = <int *>calloc(self.size, sizeof(int))
        self.stages = <char *>calloc(PUSH_SENDS + 1, self.stage_stride)
        self.snd_stage = <int *>calloc(PUSH_SENDS, sizeof(int))
        self.snd_peer = <int *>calloc(PUSH_SENDS, sizeof(int))
        self.snd_t0 = <double *>calloc(PUSH_SENDS, sizeof(double))
        self.sent_to = <int64_t *>calloc(self.size, sizeof(int64_t))
        self.latency = <double *>calloc(self.size, sizeof(double))
        self.last_v = <int64_t *>calloc(n, sizeof(int64_t))
        if (self.req == NULL or self.index == NULL or self.status == NULL
                or self.bufs == NULL or self.buf_words == NULL or self.buf_owner == NULL
                or self.buf_taken == NULL or self.held == NULL or self.taken == NULL
                or self.in_index == NULL or self.stages == NULL or self.snd_stage == NULL
                or self.snd_peer == NULL or self.snd_t0 == NULL or self.sent_to == NULL
                or self.latency == NULL or self.last_v == NULL):
            raise MemoryError()
        for k in range(PUSH_BUFFERS + PUSH_SENDS):
            self.req[k] = MPI_REQUEST_NULL
        for k in range(PUSH_BUFFERS):
            self.buf_owner[k] = PUSH_FREE
        for k in range(n):
            self.held[k] = self.taken[k] = -1
        for k in range(self.size):
            self.in_index[k] = -1
            self.latency[k] = -1.0
        for k in range(self.n_in):
            self.in_index[self._in[k]] = k
        for k in range(PUSH_SENDS):
            self.snd_stage[k] = -1
        return 0

    cdef int _open(self) except -1:
        # the channel's own communicator; every buffer receives
        cdef int b
        with nogil:
            self._dup_comm(&self.msg_comm)
            for b in range(PUSH_BUFFERS):
                self._post(b)
        return 0

    cdef int _leave(self, _Leftover lo) except -1:
        # the receives cancelled, the sends kept, with the buffers and stages they touch
        with nogil:
            lo.add_all(self.req, PUSH_BUFFERS, True)
            lo.add_all(self.req + PUSH_BUFFERS, PUSH_SENDS, False)
        lo.own(self.bufs); self.bufs = NULL
        lo.own(self.stages); self.stages = NULL
        return SlotWindow._leave(self, lo)

    cdef int _drain(self) except -1:
        # At free (collective, every rank came): no message outlives the communicator.
        cdef int64_t *to_me
        cdef int64_t missing = 0
        cdef int b, k, r, flag = 0
        cdef MPI_Status st
        cdef char *scratch
        if self.msg_comm == MPI_COMM_NULL:
            return 0
        self.wait_stage = -1            # nobody waits for a model: it goes unsent
        to_me = <int64_t *>calloc(self.size, sizeof(int64_t))
        scratch = <char *>malloc(max(self.msg_bytes, 1))
        if to_me == NULL or scratch == NULL:
            free(to_me)
            free(scratch)
            raise MemoryError()
        try:
            with nogil:
                asap_watchdog_arm(self.flush_timeout, b"push gossip's drain at free()", -1,
                                  self.nbr_desc)
                CHKERR(MPI_Alltoall(self.sent_to, 1, MPI_INT64_T, to_me, 1, MPI_INT64_T,
                                    self.comm), "MPI_Alltoall")
                for b in range(PUSH_BUFFERS):
                    if self.req[b] == MPI_REQUEST_NULL:
                        continue
                    # a message may match it before the cancel: then it completes
                    CHKERR(MPI_Cancel(&self.req[b]), "MPI_Cancel")
                    CHKERR(MPI_Wait(&self.req[b], &st), "MPI_Wait")
                    CHKERR(MPI_Test_cancelled(&st, &flag), "MPI_Test_cancelled")
                    if not flag:
                        self.got_total += 1
                    self.buf_owner[b] = PUSH_FREE
                for r in range(self.size):
                    missing += to_me[r]
                missing -= self.got_total
                while missing > 0:
                    CHKERR(MPI_Recv(scratch, <int>self.msg_bytes, MPI_BYTE, MPI_ANY_SOURCE,
                                    PUSH_TAG, self.msg_comm, MPI_STATUS_IGNORE), "MPI_Recv")
                    missing -= 1
                    self.got_total += 1
                for k in range(PUSH_SENDS):
                    CHKERR(MPI_Wait(&self.req[PUSH_BUFFERS + k], MPI_STATUS_IGNORE), "MPI_Wait")
                    self.snd_stage[k] = -1
                CHKERR(MPI_Comm_free(&self.msg_comm), "MPI_Comm_free")
        finally:
            asap_watchdog_disarm()
            free(to_me)
            free(scratch)
        return 0

    # ------------------------------------------------------------------ receiving

    cdef int _post(self, int b) except -1 nogil:
        # buffer b receives the next model from anyone; until it completes no reader
        # takes it (it is neither held nor taken)
        cdef char *hdr = self.bufs + b * self.buf_stride
        asap_store_i64(hdr, 0)
        asap_store_i64(hdr + HEADER_BYTES + self.payload_stride, 0)
        asap_fence()
        self.buf_owner[b] = PUSH_POSTED
        self.buf_taken[b] = False
        return CHKERR(MPI_Irecv(hdr + HEADER_BYTES, <int>self.msg_bytes, MPI_BYTE,
                                MPI_ANY_SOURCE, PUSH_TAG, self.msg_comm, &self.req[b]),
                      "MPI_Irecv")

    cdef int _arrived(self, int b, int source) except -1 nogil:
        # A model arrived in buffer b: its words out of the way, then header and footer
        # stamped from the trailer (a whole version or none, as a mailbox's slot); it
        # becomes its sender's held model if newer than the one held (two completions
        # may be taken in either order), and the older buffer receives again.
        cdef char *hdr = self.bufs + b * self.buf_stride
        cdef int64_t t[MB_TRAILER]
        cdef int i = self.in_index[source] if 0 <= source < self.size else -1
        cdef int old
        self.got_total += 1
        self.arrived += 1
        self.bytes_got += self.nbytes
        asap_fence()
        memcpy(t, hdr + HEADER_BYTES + self.nbytes, MB_TRAILER_BYTES)
        if self.n_words:
            memcpy(self.buf_words + b * self.n_words,
                   hdr + HEADER_BYTES + self.nbytes + MB_TRAILER_BYTES, 8 * self.n_words)
        if i < 0 or t[0] <= self.last_v[i]:
            # not an in-neighbour, or no newer than what a reduce already took (the
            # data of two messages may complete out of order): never mixed
            return self._post(b)
        stamp_slot(hdr, self.payload_stride, t[0], t[1], t[2], source, self.nbytes)
        old = self.held[i]
        if old >= 0:
            self.superseded += 1
            if asap_load_i64(self.bufs + old * self.buf_stride) >= t[0]:
                return self._post(b)
            self._post(old)
        self.held[i] = b
        self.buf_owner[b] = i
        return 0

    cdef int _pump(self) except -1 nogil:
        # One MPI_Testsome over every receive and send (one progress call where nothing
        # completed), again while it finds some: models into their buffers, sends
        # taken; then the waiting model goes if a send is free.
        cdef int count = 0
        cdef int k, idx
        cdef int passes = 0
        while passes < PUSH_BUFFERS + PUSH_SENDS + 2:
            passes += 1
            CHKSOME(MPI_Testsome(PUSH_BUFFERS + PUSH_SENDS, self.req, &count, self.index,
                                 self.status), PUSH_BUFFERS + PUSH_SENDS, count, self.status,
                    "MPI_Testsome")
            if count == MPI_UNDEFINED or count == 0:
                break
            for k in range(count):
                idx = self.index[k]
                if idx < PUSH_BUFFERS:
                    self._arrived(idx, self.status[k].MPI_SOURCE)
                else:
                    self._sent(idx - PUSH_BUFFERS)
        if self.wait_stage >= 0:
            self._send_waiting()
        return 0

    cdef int _progress(self) except -1 nogil:
        return self._pump()

    cdef char *_slot(self, int i, Py_ssize_t slot) noexcept nogil:
        # in-neighbour i's taken model (NULL: none; the store then never reads it)
        return NULL if self.taken[i] < 0 else self.bufs + self.taken[i] * self.buf_stride

    cdef int _point(self, bint only_notified) except -1 nogil:
        cdef int i
        self._sync()
        for i in range(self.n_in):
            self.store.hdr[i] = self._slot(i, 0)
        return 0

    def take(self):
        """Pump, then hand the newest whole version that arrived from each in-neighbour
        since the last take() to the next reduce: returns their versions, an int64
        array in in-neighbour order (0: nothing new from it).  The buffers stay put
        (no receive is posted into them) until release(); a newer version arriving
        meanwhile is held beside them for the next take()."""
        cdef int i
        self._check_alive()
        out = np.zeros(self.n_in, dtype=np.int64)
        cdef int64_t[::1] o = out
        with nogil:
            self._pump()
            if self.yields and (self.wait_stage >= 0 or self._sends_in_flight()):
                asap_backoff(0, 1, 0, 0)        # a sched_yield
                self._pump()
            for i in range(self.n_in):
                if self.taken[i] >= 0 or self.held[i] < 0:
                    if self.taken[i] >= 0:
                        o[i] = asap_load_i64(self.bufs + self.taken[i] * self.buf_stride)
                    continue
                self.taken[i] = self.held[i]
                self.held[i] = -1
                self.buf_taken[self.taken[i]] = True
                o[i] = asap_load_i64(self.bufs + self.taken[i] * self.buf_stride)
                self.last_v[i] = o[i]
        return out

    def taken_words(self, int in_index):
        """The words in-neighbour `in_index` sent with its taken model (push's `words`;
        an int64 array of n_user values), or None when nothing of it is taken."""
        cdef int b
        self._check_alive()
        if not 0 <= in_index < self.n_in:
            raise ConfigError(f"in-neighbour index {in_index} is outside 0..{self.n_in - 1}")
        b = self.taken[in_index]
        if b < 0:
            return None
        out = np.zeros(self.n_words, dtype=np.int64)
        cdef int64_t[::1] o = out
        if self.n_words:
            memcpy(&o[0], self.buf_words + b * self.n_words, 8 * self.n_words)
        return out

    def deliver(self, buf, int64_t version, double timeout, bint checksum=False,
                bint copy=True, int64_t skip_released=0):
        """Refused: a model goes to the one peer a schedule chose (push())."""
        raise ConfigError("the push channel delivers to one peer at a time: push(buf, "
                          "version, peer); Channel.delivers is False for it")

    def await_(self, int64_t version, double timeout, int mode=AWAIT_EXACT,
               int count=0):
        """Refused: nobody waits for a pushed model (take() what arrived)."""
        raise ConfigError("nobody waits for a pushed model: take() what arrived "
                          "(Channel.awaits is empty for the push channel)")

    def release(self, int64_t version, bint checksum=False):
        """Verb: the reduce is done with every taken model of a version <= `version`
        (1 << 62: all of them): their buffers receive again."""
        cdef int i
        self._check_alive()
        with nogil:
            for i in range(self.n_in):
                if self.taken[i] >= 0 and asap_load_i64(
                        self.bufs + self.taken[i] * self.buf_stride) <= version:
                    self._post(self.taken[i])
                    self.taken[i] = -1

    def wait_notifies(self, int64_t version, double timeout, bint at_least=False):
        """Refused: nobody waits for a pushed model (take() what arrived)."""
        raise ConfigError("push gossip never waits for a model: take() returns what "
                          "arrived; for notifies create the Exchange with transport='put'")

    def wait_notifies_count(self, int64_t version, int min_count, double timeout):
        """Refused: nobody waits for a pushed model (take() what arrived)."""
        return self.wait_notifies(version, timeout)

    def slot_offset(self, int in_index, int64_t version):
        """Refused: push gossip's models land in a pool of buffers, not in slots."""
        raise ConfigError("push gossip's models land in a pool of receive buffers, not in "
                          "per-sender slots; read them with take() and reduce_versions(), "
                          "or create the Exchange with transport='put'")

    @property
    def buffers(self):
        """Per receive buffer: "posted", "held by <rank>" or "taken from <rank>"."""
        out = []
        for b in range(PUSH_BUFFERS):
            owner = self.buf_owner[b]
            if owner == PUSH_POSTED:
                out.append("posted")
            elif owner == PUSH_FREE:
                out.append("free")
            else:
                out.append(f"{'taken from' if self.buf_taken[b] else 'held by'} "
                           f"{self._in[owner]}")
        return out

    # ------------------------------------------------------------------ sending

    def push(self, buf, int64_t version, int peer, words=None):
        """Send `buf` as `version` to `peer` (MPI_Issend from a copy: `buf` is free on
        return), with up to n_user int64 `words` (the sender's time table).  Never
        waits: when the channel to `peer`, or every send, is busy, the model waits and
        the pump sends it once a send completes; a newer push replaces a waiting model
        (counted in `replaced`)."""
        cdef Py_buffer view
        cdef int s, k
        cdef int nw = 0
        cdef int64_t[::1] w
        cdef char *stage
        cdef int64_t t[MB_TRAILER]
        self._check_alive()
        _check_version(version)
        if not 0 <= peer < self.size:
            raise ConfigError(f"push gossip sends to a rank of 0..{self.size - 1}, not "
                              f"{peer}")
        if words is not None:
            arr = np.ascontiguousarray(words, dtype=np.int64).ravel()
            if len(arr) > self.n_words:
                raise ConfigError(f"a model carries at most {self.n_words} words, got "
                                  f"{len(arr)}")
            nw = len(arr)
            if nw:
                w = arr
        PyObject_GetBuffer(buf, &view, PyBUF_ANY_CONTIGUOUS)
        try:
            if view.len != self.nbytes:
                raise ConfigError(f"buffer has {view.len} bytes but the model has "
                                  f"{self.nbytes}")
            with nogil:
                self._pump()
                # a stage no send reads: the waiting one (replaced), else a free one
                # (PUSH_SENDS + 1 stages, at most PUSH_SENDS sends in flight)
                if self.wait_stage >= 0:
                    s = self.wait_stage
                    self.replaced += 1
                else:
                    s = 0
                    while self._stage_busy(s):
                        s += 1
                stage = self.stages + s * self.stage_stride
                t[0] = version
                t[1] = <int64_t>asap_checksum(view.buf, self.nbytes)
                t[2] = version
                t[3] = 0
                memcpy(stage, view.buf, self.nbytes)
                memcpy(stage + self.nbytes, t, MB_TRAILER_BYTES)
                memset(stage + self.nbytes + MB_TRAILER_BYTES, 0, 8 * self.n_words)
                if nw:
                    memcpy(stage + self.nbytes + MB_TRAILER_BYTES, &w[0], 8 * nw)
                self.pushed += 1
                self.wait_stage = s
                self.wait_peer = peer
                self._send_waiting()
        finally:
            PyBuffer_Release(&view)

    cdef bint _sends_in_flight(self) noexcept nogil:
        cdef int k
        for k in range(PUSH_SENDS):
            if self.snd_stage[k] >= 0:
                return True
        return False

    cdef bint _stage_busy(self, int s) noexcept nogil:
        cdef int k
        for k in range(PUSH_SENDS):
            if self.snd_stage[k] == s:
                return True
        return False

    cdef int _send_waiting(self) except -1 nogil:
        # the waiting model goes if its peer's channel and a send are free
        cdef int k
        cdef int free_k = -1
        for k in range(PUSH_SENDS):
            if self.snd_stage[k] < 0:
                free_k = k
            elif self.snd_peer[k] == self.wait_peer:
                return 0            # one message in flight per peer
        if free_k < 0:
            return 0
        CHKERR(MPI_Issend(self.stages + self.wait_stage * self.stage_stride,
                          <int>self.msg_bytes, MPI_BYTE, self.wait_peer, PUSH_TAG,
                          self.msg_comm, &self.req[PUSH_BUFFERS + free_k]), "MPI_Issend")
        self.snd_stage[free_k] = self.wait_stage
        self.snd_peer[free_k] = self.wait_peer
        self.snd_t0[free_k] = asap_now()
        self.sent_to[self.wait_peer] += 1
        self.bytes_put += self.nbytes
        self.wait_stage = -1
        return 0

    cdef int _sent(self, int k) except -1 nogil:
        # a receive took send k
        self.latency[self.snd_peer[k]] = asap_now() - self.snd_t0[k]
        self.snd_stage[k] = -1
        return 0

    def push_seconds(self, int peer):
        """Seconds from posting the last send to `peer` that completed to the pump that
        saw it complete (an upper bound on its transfer; -1: none completed yet)."""
        if not 0 <= peer < self.size:
            raise ConfigError(f"rank {peer} is outside the communicator (size {self.size})")
        return self.latency[peer]

    def overdue(self, double seconds):
        """The peers whose send has been in flight (not yet taken by their receive) for
        longer than `seconds`, sorted: a peer that stopped calling MPI, or died, never
        takes it (docs/PROTOCOL.md 2h)."""
        cdef double now = asap_now()
        return sorted(self.snd_peer[k] for k in range(PUSH_SENDS)
                      if self.snd_stage[k] >= 0 and now - self.snd_t0[k] > seconds)

    @property
    def sends_in_flight(self):
        """The ranks this rank's sends in flight go to (at most one each)."""
        return sorted(self.snd_peer[k] for k in range(PUSH_SENDS) if self.snd_stage[k] >= 0)

    @property
    def waiting_peer(self):
        """The peer of the model waiting for a free send, or -1."""
        return self.wait_peer if self.wait_stage >= 0 else -1
