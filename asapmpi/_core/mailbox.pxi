# The mailbox (included by slotwin.pyx; docs/PROTOCOL.md section 2d): a slot window
# whose slots and ack words are fed by two-sided messages.
#
# Policies that wait on window words (Hop's rotating update slots and token counters,
# BSP's slots) run unchanged over it: put() copies the update into one of its staging
# buffers, followed by a 32-byte trailer laid out as a footer (version,
# checksum, iteration), and sends that as one message per out-neighbour, tagged with
# the slot index version % depth; ack(c) sends the token c to every in-neighbour.  The
# reader keeps one receive posted per (in-neighbour, slot) and one per out-neighbour's
# tokens.
# Every wait of the window pumps them (_pump, from _progress): a completed update is
# stamped into its slot's header, footer and notify word exactly as a put would have
# written them, a token raises the local ack word, so the verified reduce and every wait
# read the same words on every transport.
#
# Why it is safe: a slot's receive (payload and trailer, into the slot's payload and
# the footer after it) is posted only while no reader may take the slot (its words say
# "never written"), and reposted once this rank released the version it holds:
# ack(c) reposts every slot holding a version <= c - retain (Hop: retain is the
# staleness bound, c + 1 - retain the oldest version iteration c + 1 may still reduce),
# release(c) every slot holding a version <= c (BSP, after its reduce).  A writer sends
# version k into slot k % depth only after the token bound let it enter iteration k, by
# which time the reader has released the slot's previous version; a message that
# arrives earlier waits at the MPI layer, never in the slot.

cdef enum:
    # trailer of an update message, after its payload: version, checksum (the footer's
    # first two words), iteration, spare
    MB_TRAILER = 4
    MB_TRAILER_BYTES = 32


cdef class MailboxWindow(SlotWindow):
    """The message transport of the policies that wait on window words (Hop, BSP):
    put() sends, ack() sends tokens, and every wait completes the messages into the
    same slots and words a put would have written.

    retain: ack(c) releases the slots holding versions <= c - retain."""

    cdef MPI_Comm msg_comm
    cdef readonly int retain
    # Every request of the window in one array, so that a pump is one MPI_Testsome (one
    # progress call, which on UCX is an epoll_wait per worker): the update receives,
    # the token receives, the word receive, then the sends, which only a mailbox of
    # newest versions completes in its pump.  mb_recv, tok_recv, wd_recv and mb_send
    # point into it.
    cdef MPI_Request *mb_req
    cdef int mb_nreq                # their number
    cdef MPI_Status *mb_status      # MPI_Testsome's statuses (a word's sender)
    cdef int mb_npump               # requests from mb_req's start that _pump tests
    cdef int mb_req_tok, mb_req_wd, mb_req_snd  # where tok_recv, wd_recv, mb_send start
    cdef MPI_Request *mb_recv       # per in-neighbour and slot: its update
    cdef int mb_nrecv               # their number (newest: two per in-neighbour)
    cdef int64_t *mb_held           # per in-neighbour and slot: version held, 0: posted
                                    # (newest: per receive, when it was posted)
    cdef int *mb_index              # MPI_Testsome's indices
    cdef int mb_stages
    cdef char *mb_stage             # mb_stages copies of an update: payload, trailer
    cdef Py_ssize_t mb_stage_stride
    cdef int64_t *mb_stage_version  # per stage: the version it holds (0: none)
    cdef int mb_stage_next          # the stage the next put fills
    cdef MPI_Request *mb_send       # per stage and out-neighbour
    cdef MPI_Request *tok_recv      # per out-neighbour: its next token (msg_words')
    cdef MPI_Request *wd_recv       # the next word message, from any rank (msg_words')
    cdef int64_t *mb_sent           # updates sent and received per (peer, tag), for the
    cdef int64_t *mb_got            # drain at free()
    cdef MessageWords msg_words     # the words: tokens and word messages (words.pxi)

    def __cinit__(self):
        self.transport = "mailbox"
        self.mem = MessageMemory()    # messages only: no MPI window
        self.waits.pump_progresses = True
        self.msg_comm = MPI_COMM_NULL

    def __init__(self, *args, int retain=0, **kwargs):
        self.retain = retain
        SlotWindow.__init__(self, *args, **kwargs)

    def __dealloc__(self):
        _forget_mailbox(self)
        self._leave_behind()
        free(self.mb_req); self.mb_req = NULL
        self.mb_recv = self.tok_recv = self.wd_recv = self.mb_send = NULL
        free(self.mb_status); self.mb_status = NULL
        free(self.mb_stage); self.mb_stage = NULL
        free(self.mb_stage_version); self.mb_stage_version = NULL
        free(self.mb_held); self.mb_held = NULL
        free(self.mb_index); self.mb_index = NULL
        free(self.mb_sent); self.mb_sent = NULL
        free(self.mb_got); self.mb_got = NULL

    # ------------------------------------------------------------------ lifetime

    cdef int _leave(self, _Leftover lo) except -1:
        # the receives (updates, tokens, words) cancelled, the sends kept, and every
        # buffer either may touch (the words' own sends and buffers: theirs to hand);
        # no longer settled with the process's other mailboxes (abandon())
        _forget_mailbox(self)
        with nogil:
            lo.add_all(self.mb_req, self.mb_req_snd, True)
            lo.add_all(self.mb_req + self.mb_req_snd, self.mb_nreq - self.mb_req_snd, False)
        lo.own(self.mb_stage); self.mb_stage = NULL
        if self.msg_words is not None:
            self.msg_words.leave(lo)
        return SlotWindow._leave(self, lo)

    cdef Words _make_words(self):
        self.msg_words = MessageWords()
        return self.msg_words

    cdef int _prepare(self, layout) except -1:
        SlotWindow._prepare(self, layout)
        if not (0 <= self.retain < self.depth and self.depth < MB_TOKEN_TAG):
            raise ConfigError(f"a mailbox needs 0 <= retain < depth < {MB_TOKEN_TAG}, got "
                              f"retain={self.retain}, depth={self.depth}")
        # One staging buffer per version the token bound lets a writer have in flight to
        # one reader (depth, at least 2): a reader that stops calling MPI (a straggler
        # that backup workers tolerate) holds up its writer's stages no sooner than
        # Hop's tokens hold up the writer itself.
        return self._alloc(self.n_in * self.depth, max(2, self.depth))

    cdef int _alloc(self, int nrecv, int stages) except -1:
        cdef int n = max(self.n_in, 1)
        cdef int m = max(self.n_out, 1)
        cdef int k
        cdef int n_req = nrecv + self.n_out + 1 + stages * m
        if self.nbytes + MB_TRAILER_BYTES > 0x7fffffff:
            raise ConfigError(f"the message transport sends less than 2 GiB per update, "
                              f"not {self.nbytes} bytes; use transport='put'")
        self.mb_nrecv = nrecv
        self.mb_stages = stages
        self.mb_req = <MPI_Request *>calloc(n_req, sizeof(MPI_Request))
        self.mb_nreq = n_req if self.mb_req != NULL else 0
        self.mb_status = <MPI_Status *>calloc(n_req, sizeof(MPI_Status))
        self.mb_held = <int64_t *>calloc(max(nrecv, 1), sizeof(int64_t))
        self.mb_index = <int *>calloc(n_req, sizeof(int))
        self.msg_words.allocate(self.n_in, self.n_out, self.size)
        self.mb_stage_stride = (self.nbytes + MB_TRAILER_BYTES + 63) // 64 * 64
        self.mb_stage = <char *>calloc(stages, self.mb_stage_stride)
        self.mb_stage_version = <int64_t *>calloc(stages, sizeof(int64_t))
        self.mb_sent = <int64_t *>calloc(self.size * self.depth, sizeof(int64_t))
        self.mb_got = <int64_t *>calloc(self.size * self.depth, sizeof(int64_t))
        if (self.mb_req == NULL or self.mb_status == NULL or self.mb_stage == NULL
                or self.mb_held == NULL or self.mb_stage_version == NULL
                or self.mb_index == NULL or self.mb_sent == NULL or self.mb_got == NULL):
            raise MemoryError()
        for k in range(n_req):
            self.mb_req[k] = MPI_REQUEST_NULL
        self.mb_recv = self.mb_req
        self.mb_req_tok = nrecv
        self.tok_recv = self.mb_req + self.mb_req_tok
        self.mb_req_wd = nrecv + self.n_out
        self.wd_recv = self.mb_req + self.mb_req_wd
        self.mb_req_snd = self.mb_req_wd + 1
        self.mb_send = self.mb_req + self.mb_req_snd
        self.mb_npump = self.mb_req_snd
        return 0

    cdef int _open(self) except -1:
        # the messages' own communicator; every slot free, every out-neighbour's
        # tokens awaited
        with nogil:
            self._dup_comm(&self.msg_comm)
            self._post_all()
            self.msg_words.open(self.msg_comm, self.tok_recv, self.wd_recv)
            _note_mailbox(self)
        return 0

    cdef int _post_all(self) except -1 nogil:
        cdef int i, s
        for i in range(self.n_in):
            for s in range(self.depth):
                self._post_slot(i, s)
        return 0

    cdef int _drain(self) except -1:
        # At free (collective): every message sent to this rank is received (into the
        # slot it was meant for, or a scratch buffer once the slot holds an unreleased
        # version) and every receive no message will match is cancelled, so that no
        # message outlives the communicator.  The counts of messages sent, per sender
        # and tag (updates), and per sender (tokens, word messages: the words'), come
        # by MPI_Alltoall.
        cdef int width = self.depth
        cdef int64_t *sent_to_me
        cdef int64_t *words_to_me
        cdef int i, r
        _forget_mailbox(self)   # what still waits goes now (send_tokens below)
        if self.msg_comm == MPI_COMM_NULL:
            return 0
        sent_to_me = <int64_t *>calloc(self.size * width, sizeof(int64_t))
        words_to_me = <int64_t *>calloc(2 * self.size, sizeof(int64_t))
        if sent_to_me == NULL or words_to_me == NULL:
            free(sent_to_me)
            free(words_to_me)
            raise MemoryError()
        extra = []
        try:
            with nogil:
                # every rank came to free(): what follows completes unless a rank dies
                # now, and the watchdog ends the job then instead of a hang
                asap_watchdog_arm(self.flush_timeout, b"the mailbox's drain at free()", -1,
                                  self.nbr_desc)
                self.msg_words.send_tokens()    # tokens still waiting go too: counted
                CHKERR(MPI_Alltoall(self.mb_sent, width, MPI_INT64_T, sent_to_me, width,
                                    MPI_INT64_T, self.comm), "MPI_Alltoall")
                CHKERR(MPI_Alltoall(self.msg_words.sent, 2, MPI_INT64_T, words_to_me, 2,
                                    MPI_INT64_T, self.comm), "MPI_Alltoall")
            self.msg_words.drain_post(words_to_me, extra)
            for i in range(self.n_in):
                self._drain_sender(i, sent_to_me + self._in[i] * width, extra)
            requests = [self._irecv_scratch(buf, peer, tag) for peer, tag, buf in extra]
            with nogil:
                for r in range(self.mb_nrecv):
                    CHKERR(MPI_Wait(&self.mb_recv[r], MPI_STATUS_IGNORE), "MPI_Wait")
                for r in range(self.mb_stages * self.n_out):
                    CHKERR(MPI_Wait(&self.mb_send[r], MPI_STATUS_IGNORE), "MPI_Wait")
                self.msg_words.drain_wait()
            for req in requests:
                req.Wait()
            with nogil:
                CHKERR(MPI_Comm_free(&self.msg_comm), "MPI_Comm_free")
        finally:
            asap_watchdog_disarm()      # also when an MPI call failed: no stale deadline
            free(sent_to_me)
            free(words_to_me)
        return 0

    cdef int _drain_sender(self, int i, const int64_t *sent, list extra) except -1:
        # in-neighbour i sent sent[s] updates with tag s: the posted receive of a slot
        # takes the first still to come, a scratch buffer each of the rest
        cdef int s, idx
        cdef int64_t missing
        cdef int width = self.depth
        for s in range(self.depth):
            idx = i * self.depth + s
            missing = sent[s] - self.mb_got[self._in[i] * width + s]
            if self.mb_held[idx] == 0:
                if missing > 0:
                    missing -= 1        # the posted receive takes the first
                else:
                    with nogil:
                        CHKERR(MPI_Cancel(&self.mb_recv[idx]), "MPI_Cancel")
            for _ in range(missing):
                extra.append((self._in[i], s,
                              np.empty(self.nbytes + MB_TRAILER_BYTES, np.uint8)))
        return 0

    cdef object _irecv_scratch(self, buf, int peer, int tag):
        # a receive into a scratch NumPy buffer (uint8: an update, int64: a token, the
        # type it was sent as), as an mpi4py request the drain waits on
        cdef MPI.Request req = MPI.Request()
        cdef Py_buffer view
        cdef MPI_Datatype kind = MPI_BYTE if buf.dtype == np.uint8 else MPI_INT64_T
        PyObject_GetBuffer(buf, &view, PyBUF_ANY_CONTIGUOUS | PyBUF_WRITABLE)
        try:
            CHKERR(MPI_Irecv(view.buf, <int>(view.len if kind == MPI_BYTE else view.len // 8),
                             kind, peer, tag, self.msg_comm, &req.ob_mpi), "MPI_Irecv")
        finally:
            PyBuffer_Release(&view)
        return req

    # ------------------------------------------------------------------ receiving

    cdef int _post_slot(self, int i, int s) except -1 nogil:
        # The slot is about to be written by MPI: no reader may take it until _arrived.
        # Notify word, header and footer say version 0, "never written": a wait does
        # not take it, a reduce counts it stale and skips it.
        cdef int idx = i * self.depth + s
        cdef char *hdr = self._slot(i, s)
        asap_store_i64(self.base + self.off_notify + 8 * idx, 0)
        asap_store_i64(hdr, 0)
        asap_store_i64(hdr + HEADER_BYTES + self.payload_stride, 0)
        asap_fence()
        # payload and trailer in one message: the trailer lands in the payload's padding
        # or the footer (at least MB_TRAILER_BYTES follow the payload in every slot)
        CHKERR(MPI_Irecv(hdr + HEADER_BYTES, <int>(self.nbytes + MB_TRAILER_BYTES),
                         MPI_BYTE, self._in[i], s, self.msg_comm, &self.mb_recv[idx]),
               "MPI_Irecv")
        self.mb_held[idx] = 0
        return 0

    cdef int64_t _fill(self, int i, char *hdr) noexcept nogil:
        # An update arrived in the buffer at `hdr`: write its header and footer from the
        # trailer as a put would have (footer before header), so every reader's checks
        # see a whole version or none; returns the version.
        cdef int64_t t[MB_TRAILER]
        asap_fence()
        memcpy(t, hdr + HEADER_BYTES + self.nbytes, MB_TRAILER_BYTES)   # 4-byte aligned only
        stamp_slot(hdr, self.payload_stride, t[0], t[1], t[2], self._in[i], self.nbytes)
        return t[0]

    cdef int _arrived(self, int idx) except -1 nogil:
        # Receive idx completed, an update in its slot: its words, then the notify word
        # (after the header, so a wait that sees the notify reads a whole version).
        cdef int i = idx // self.depth
        cdef int64_t version = self._fill(i, self._slot(i, idx % self.depth))
        asap_store_i64(self.base + self.off_notify + 8 * idx, version)
        self.mb_held[idx] = version if version > 0 else 1
        self.mb_got[self._in[i] * self.depth + idx % self.depth] += 1
        self.bytes_got += self.nbytes
        return 0

    cdef int _pump(self) except -1 nogil:
        # Complete what arrived, by MPI_Testsome over every request at once (where
        # nothing arrived, as in most polls of a wait, one progress call), again while
        # it finds some (an MPI may deliver one message per progress call: MPICH's
        # shared memory does): updates into their slots, tokens into the ack words,
        # sends taken (newest), words into this window; then send what waited for a
        # channel.  The caller's wait checks its words only after the whole pump.
        cdef int count = 0
        cdef int k, idx, word
        cdef int passes = 0
        # at most this many passes: the receives reposted meanwhile may complete at
        # once again, and what waits for _pumped (tokens, waiting sends) must go out
        while passes < self.mb_npump + 2:
            passes += 1
            CHKSOME(MPI_Testsome(self.mb_npump, self.mb_req, &count, self.mb_index,
                                 self.mb_status), self.mb_npump, count, self.mb_status,
                    "MPI_Testsome")
            if count == MPI_UNDEFINED or count == 0:
                break
            word = -1
            for k in range(count):
                idx = self.mb_index[k]
                if idx < self.mb_req_tok:
                    self._arrived(idx)
                elif idx < self.mb_req_wd:
                    self.msg_words.token_arrived(idx - self.mb_req_tok)
                elif idx >= self.mb_req_snd:
                    self._sent(idx - self.mb_req_snd)
                else:
                    word = k
            # the word message last: a bad one raises, and everything else that
            # completed in this pass is already accounted for (the drain counts it)
            if word >= 0:
                self.msg_words.word_arrived(self.mb_status[word].MPI_SOURCE)
        return self._pumped()

    cdef int _sent(self, int k) except -1 nogil:
        # send k of mb_send was taken (only a mailbox of newest versions pumps sends)
        return 0

    cdef int _pumped(self) except -1 nogil:
        # after a pump: the tokens and a board's row that waited for an earlier
        # message to leave
        self.msg_words.send_rows()
        return self.msg_words.send_tokens()

    cdef int _progress(self) except -1 nogil:
        # nothing reaches this window one-sidedly: the messages are the progress
        return self._pump()

    # ------------------------------------------------------------------ words

    def write_words(self, int target, Py_ssize_t disp, values):
        """Write the int64 `values` (1 to 6) into `target`'s user words from `disp`, as
        one message: the target's next wait or pump stores them in order, so a reader
        that waits for the last one (wait_word) sees the others.  One-way: no old
        values; the message may still be in flight when this returns."""
        cdef int64_t[::1] v = self._words(values)
        cdef int r = 0
        self._check_alive()
        self._check_target(target, disp)
        with nogil:
            r = self._wait_word_send(self.flush_timeout)
        if r:
            raise NeighbourTimeoutError(
                self.rank, f"the receive of the word message it sent {MB_WORD_SENDS} "
                f"writes ago (the reader's next wait takes it)",
                [self.msg_words.wd_peer[self.msg_words.wd_next]], [], [],
                self.flush_timeout)
        with nogil:
            self.msg_words.write(target, disp, &v[0], <int>v.shape[0])

    cdef int _wait_word_send(self, double timeout) except -1 nogil:
        # 1 on timeout: the word message sent from the next send buffer MB_WORD_SENDS
        # messages ago has not left (its reader stopped calling MPI)
        cdef long polls = 0
        cdef double t0 = asap_now()
        while not self.msg_words.word_send_free():
            if self.waits.idle(&polls, t0, timeout):
                return 1
        return 0

    # ------------------------------------------------------------------ tokens

    @property
    def tokens_held(self):
        """The in-neighbours whose newest token waits for the send of the one before
        it (it leaves at this window's next pump, or any wait's or settle's)."""
        return self.msg_words.tokens_held()

    cdef int _settle(self, double timeout) except -1 nogil:
        # Before this rank waits outside this window (another window's wait, asapmpi's
        # collectives, free()): every token held back goes now.  A neighbour may be
        # waiting for it, and this window's own pump, which would send it, does not run
        # while this rank waits elsewhere.  A token waits only for the send of the one
        # before it (8 bytes, sent eagerly): that completes unless the reader stopped
        # calling MPI: then, after a second at most, this rank goes on (that reader is
        # not waiting in MPI for the token, and its own wait names this rank if it is).
        cdef long polls = 0
        cdef double t0 = asap_now()
        cdef double limit = timeout if timeout < 1.0 else 1.0
        self._pump()
        while self.msg_words.tokens_waiting() and asap_now() - t0 < limit:
            self.waits.backoff(polls)
            polls += 1
            self._pump()
        return 0

    cdef int _release_outside(self) except -1 nogil:
        # One poll of a wait outside the windows (asapmpi's collectives, after their
        # settle_all): what the channels let go leaves now, without waiting.  A token
        # held back past _settle's second leaves once the one before it completed: this
        # rank's own pump, which would send it, does not run while it waits there
        # (docs/MODELCHECK.md, "Tokens held back").
        return self._pump()

    def notify(self, int64_t version):
        """Refused: a mailbox notifies with each put."""
        raise ConfigError("a mailbox window (transport='messages') notifies with "
                          "each put; use transport='put' for a separate notify")

    def ack(self, int64_t version):
        """Hop's token: `version` iterations done, sent to every in-neighbour; then
        release the slots no later iteration reads (a version <= version - retain), so
        their writers may refill them."""
        self._check_alive()
        with nogil:
            self.msg_words.ack(version)
            self._repost(version - self.retain)

    def release(self, int64_t version, bint checksum=False):
        """Verb: this rank is done reading every slot that holds a version <= `version`
        (1 << 62: all of them): their receives are posted again, so that their writers'
        next updates can land.  Where its writers wait for releases (`releases`:
        Hop's tokens) it is the token: as ack(version).  (`checksum`: every update
        carries its checksum here.)"""
        self._check_alive()
        with nogil:
            if self.releases and version > 0:
                self.msg_words.ack(version)
                self._repost(version - self.retain)
            else:
                self._repost(version)

    def drain(self):
        """Verb: as SlotWindow.drain; the tokens and updates this mailbox holds back
        leave now (waiting at most a second for a reader that stopped calling MPI)."""
        self._check_alive()
        with nogil:
            self._settle(self.flush_timeout)

    cdef int _repost(self, int64_t upto) except -1 nogil:
        # repost the receive of every slot holding a version <= upto
        cdef int idx
        for idx in range(self.n_in * self.depth):
            if 0 < self.mb_held[idx] <= upto:
                self._post_slot(idx // self.depth, idx % self.depth)
        return 0

    def wait_delivered(self, int64_t version, double timeout):
        """After a collective that every in-neighbour entered once it had sent
        `version`: the messages may still be on their way, so wait for every
        in-neighbour's notify of `version` (NeighbourTimeoutError naming the late)."""
        self.wait_notifies(version, timeout)

    # ------------------------------------------------------------------ sending

    cdef int _send(self, const char *src, int64_t version, int64_t iteration, bint seqlock,
                   bint checksum, bint notify, int64_t suppress_if_acked) except -1:
        # put() on a mailbox: the update copied into the next stage and sent from there
        # as one message per out-neighbour, so `src` is free at once and a slow reader
        # holds up its writer only when the stage comes round again.  A reader only
        # ever sees whole versions, which is what seqlock's order is for, and every
        # arrival is stamped with its notify: put()'s seqlock and notify change nothing
        # here.
        cdef int r = 0
        cdef int stage = self.mb_stage_next
        with nogil:
            asap_watchdog_waiting(b"the receive of its update", self.mb_stage_version[stage],
                                  self.out_desc)
            r = self._wait_stage(stage, self.flush_timeout)
            asap_watchdog_waiting(NULL, 0, NULL)
        if r:
            late = sorted(self._out[j] for j in range(self.n_out)
                          if self.mb_send[stage * self.n_out + j] != MPI_REQUEST_NULL)
            old = self.mb_stage_version[stage]
            raise NeighbourTimeoutError(
                self.rank, f"the receive of its update of version {old} (posted once "
                f"the neighbour released the slot's older version)", late,
                [old] * len(late), [old - self.depth] * len(late), self.flush_timeout)
        with nogil:
            self._mark_suppressed(suppress_if_acked)
            self._send_stage(stage, src, version, iteration, checksum)
        return 0

    cdef int _fill_stage(self, int stage, const char *src, int64_t version,
                         int64_t iteration, bint checksum) except -1 nogil:
        # the update's payload and its trailer (version, checksum, iteration) into `stage`
        cdef char *buf = self.mb_stage + stage * self.mb_stage_stride
        cdef int64_t t[MB_TRAILER]
        t[0] = version
        t[1] = <int64_t>asap_checksum(src, self.nbytes) if checksum else 0
        t[2] = iteration
        t[3] = 0
        memcpy(buf, src, self.nbytes)
        memcpy(buf + self.nbytes, t, MB_TRAILER_BYTES)
        self.mb_stage_version[stage] = version
        return 0

    cdef int _send_stage(self, int stage, const char *src, int64_t version,
                         int64_t iteration, bint checksum) except -1 nogil:
        # The update: one copy into `stage` (whose earlier sends completed), then one
        # message per out-neighbour not skipped (suppressed).
        cdef int j
        cdef int tag = <int>(version % self.depth)
        cdef char *buf = self.mb_stage + stage * self.mb_stage_stride
        self._fill_stage(stage, src, version, iteration, checksum)
        self.mb_stage_next = (stage + 1) % self.mb_stages
        for j in range(self.n_out):
            if self.skip[j]:
                continue
            CHKERR(MPI_Isend(buf, <int>(self.nbytes + MB_TRAILER_BYTES), MPI_BYTE,
                             self._out[j], tag, self.msg_comm,
                             &self.mb_send[stage * self.n_out + j]), "MPI_Isend")
            self.mb_sent[self._out[j] * self.depth + tag] += 1
            self.bytes_put += self.nbytes
        return 0

    cdef int _wait_stage(self, int stage, double timeout) except -1 nogil:
        # 1 on timeout; the sends from `stage` complete once each receiver has posted
        # the slot's receive (and, above the eager limit, taken the message)
        cdef long polls = 0
        cdef double t0 = asap_now()
        cdef int count = 0
        while True:
            # one call for the stage's sends (one progress call per poll); Testsome, not
            # Testall, frees each send as it completes, so a timeout names only the
            # readers whose receive never came
            CHKSOME(MPI_Testsome(self.n_out, self.mb_send + stage * self.n_out, &count,
                                 self.mb_index, self.mb_status), self.n_out, count,
                    self.mb_status, "MPI_Testsome")
            if count == MPI_UNDEFINED:
                return 0
            if self.waits.idle(&polls, t0, timeout):
                return 1


cdef void _note_mailbox(MailboxWindow w) noexcept nogil:
    global _n_mailbox
    if _n_mailbox < MAX_PENDING:    # else the window's own waits still send them
        _mailbox_win[_n_mailbox] = <PyObject *>w
        _n_mailbox += 1


cdef void _forget_mailbox(MailboxWindow w) noexcept nogil:
    global _n_mailbox
    cdef int i
    for i in range(_n_mailbox):
        if _mailbox_win[i] == <PyObject *>w:
            _n_mailbox -= 1
            _mailbox_win[i] = _mailbox_win[_n_mailbox]
            return


cdef int _release_mailboxes() except -1 nogil:
    # one poll outside the windows: every mailbox releases what it may (_release_outside)
    cdef int i
    for i in range(_n_mailbox):
        with gil:
            (<MailboxWindow>_mailbox_win[i])._release_outside()
    return 0


cdef int _settle_mailboxes(double timeout, bint deliver, PyObject *pumped) except -1 nogil:
    # every mailbox but `pumped`: with deliver, all it holds back goes (_settle); else
    # a pump sends what its channels let go
    cdef int i
    for i in range(_n_mailbox):
        if _mailbox_win[i] == pumped:
            continue
        with gil:
            if deliver:
                (<MailboxWindow>_mailbox_win[i])._settle(timeout)
            else:
                (<MailboxWindow>_mailbox_win[i])._pump()
    return 0
