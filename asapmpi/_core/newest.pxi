# The mailbox of newest versions (included by slotwin.pyx after mailbox.pxi, whose
# class it extends; docs/PROTOCOL.md section 2e).
#
# A mailbox of newest versions (NewestWindow: async, backup_ps, elastic) keeps one
# slot per sender that always holds the newest whole version that arrived, and lets no
# writer wait for a reader.  The reader keeps two receives per sender posted, into two buffers outside the window; when one completes with a version newer
# than the slot's, it and the slot trade places (the slot is a pointer, mb_cur), and
# the receive is posted again into the old slot, so a reduce never reads memory MPI may
# write.  Two receives, not one: the writer sends its next version as soon as the
# previous one was matched, before this rank's next pump reposts, and an update that
# finds no receive posted is copied into a temporary buffer inside MPI (a copy per
# update, and MPICH's heap growing by megabytes once).
#
# A writer sends with MPI_Issend, which completes only once the reader's receive took
# the message, and a put sends to a reader only when the channel to it is free (no
# message in flight): an update the reader has not taken never piles up behind
# another at a reader that stopped calling MPI.  A put while the channel is busy does
# not wait: the channel is marked waiting, and the writer's next pump sends the newest
# version once the channel is free (the versions in between are never sent).
#
# Before this rank waits outside its windows (asapmpi's collectives, free():
# _settle_all with deliver), a waiting channel gets the newest version at once, as a
# second message in flight beside the busy one: a reader still stepping (a slow worker
# a backup_ps server left behind) must not wait for a writer that no longer pumps.
# Settling never waits for a reader, which may itself be in a blocking collective with
# its receives already taken.  So a channel has at most two messages in flight: the
# first (index j of mb_busy, mb_send) and the settled one (index n_out + j).



cdef class NewestWindow(MailboxWindow):
    """The message transport of the policies that read each sender's newest version
    (async, backup_ps, elastic): one slot per sender, always its newest whole version;
    writers never wait for a reader.  Depth 1, retain 0."""

    cdef char **mb_cur              # per in-neighbour: the buffer that is its slot now
    cdef char **mb_posted           # per receive (two per in-neighbour): its buffer
    cdef char *mb_spare             # those buffers (2 n_in slots, not in the window)
    cdef int *mb_busy               # per out-neighbour, twice (first and settled
                                    # message): the stage of its send (-1: none)
    cdef int *mb_refs               # per stage: the sends in flight from it
    cdef char *mb_waiting           # per out-neighbour: the newest stage waits for it
    cdef int mb_newest_stage        # the stage holding the newest version put (-1: none)

    def __cinit__(self):
        self.transport = "newest"
        self.mb_newest_stage = -1

    def __dealloc__(self):
        _forget_mailbox(self)
        self._leave_behind()
        free(self.mb_cur); self.mb_cur = NULL
        free(self.mb_posted); self.mb_posted = NULL
        free(self.mb_spare); self.mb_spare = NULL
        free(self.mb_busy); self.mb_busy = NULL
        free(self.mb_refs); self.mb_refs = NULL
        free(self.mb_waiting); self.mb_waiting = NULL

    cdef int _prepare(self, layout) except -1:
        cdef int n = max(self.n_in, 1)
        cdef int m = max(self.n_out, 1)
        cdef int k
        SlotWindow._prepare(self, layout)
        if not (self.depth == 1 and self.retain == 0):
            raise ConfigError(f"a mailbox of newest versions has one slot per sender and "
                              f"retains nothing: needs depth 1, retain 0, got "
                              f"depth={self.depth}, retain={self.retain}")
        # two receives per in-neighbour; at most two sends in flight per out-neighbour
        # (_send_newest), each from any stage, and the newest: one more stage is always
        # free
        self._alloc(2 * self.n_in, 2 * m + 2)
        self.mb_npump += 2 * self.n_out     # the pump also completes the sends
        self.mb_cur = <char **>calloc(n, sizeof(char *))
        self.mb_posted = <char **>calloc(2 * n, sizeof(char *))
        self.mb_spare = <char *>calloc(2 * n, self.slot_stride)
        self.mb_busy = <int *>calloc(2 * m, sizeof(int))
        self.mb_refs = <int *>calloc(self.mb_stages, sizeof(int))
        self.mb_waiting = <char *>calloc(m, 1)
        if (self.mb_cur == NULL or self.mb_posted == NULL or self.mb_spare == NULL
                or self.mb_busy == NULL or self.mb_refs == NULL or self.mb_waiting == NULL):
            raise MemoryError()
        for k in range(2 * m):
            self.mb_busy[k] = -1
        return 0

    cdef int _post_all(self) except -1 nogil:
        cdef int i, s
        for i in range(self.n_in):
            # the window's slot says "never written" until the first version arrives in
            # a spare buffer and the two trade places
            self.mb_cur[i] = self.base + self.off_slots + i * self.slot_stride
            for s in range(2):
                self.mb_posted[2 * i + s] = self.mb_spare + (2 * i + s) * self.slot_stride
                self._post_newest(2 * i + s)
        return 0

    cdef int _leave(self, _Leftover lo) except -1:
        # the receives into the spare buffers, or into window slots they traded places
        # with (MailboxWindow._leave takes the window's memory as well)
        MailboxWindow._leave(self, lo)
        lo.own(self.mb_spare); self.mb_spare = NULL
        return 0

    cdef char *_slot(self, int i, Py_ssize_t slot) noexcept nogil:
        return self.mb_cur[i]

    def slot_offset(self, int in_index, int64_t version):
        """Refused: a neighbour's slot moves between two buffers as versions arrive."""
        raise ConfigError("a mailbox of newest versions moves a neighbour's slot "
                          "between two buffers as versions arrive; read it with "
                          "reduce(), or create the Exchange with transport='put'")

    cdef int _repost(self, int64_t upto) except -1 nogil:
        # the receives are posted again as updates arrive: nothing to release
        return 0

    # ------------------------------------------------------------------ receiving

    cdef int _post_newest(self, int r) except -1 nogil:
        # receive r (of in-neighbour r // 2) into its buffer, which is not the slot:
        # nobody reads it meanwhile.  mb_held orders the two receives of a sender as
        # MPI matches them (the earlier posted first), for the drain.
        cdef int i = r // 2
        self.mb_held[r] = max(self.mb_held[2 * i], self.mb_held[2 * i + 1]) + 1
        return CHKERR(MPI_Irecv(self.mb_posted[r] + HEADER_BYTES,
                                <int>(self.nbytes + MB_TRAILER_BYTES), MPI_BYTE,
                                self._in[i], 0, self.msg_comm, &self.mb_recv[r]),
                      "MPI_Irecv")

    cdef int _arrived(self, int r) except -1 nogil:
        # an update arrived in receive r's buffer: if newer than the slot's version (two
        # completions may be taken in either order), the buffer becomes the slot and
        # the old slot receives the next one; else the buffer receives again
        cdef int i = r // 2
        cdef char *arrived = self.mb_posted[r]
        cdef int64_t version = self._fill(i, arrived)
        if version > asap_load_i64(self.base + self.off_notify + 8 * i):
            self.mb_posted[r] = self.mb_cur[i]
            self.mb_cur[i] = arrived
            asap_store_i64(self.base + self.off_notify + 8 * i, version)
        self.mb_got[self._in[i]] += 1
        self.bytes_got += self.nbytes
        return self._post_newest(r)

    cdef int _drain_sender(self, int i, const int64_t *sent, list extra) except -1:
        # At free: the updates from in-neighbour i still to come.  Its two posted
        # receives take the first two (the earlier posted first, as MPI matches them),
        # a scratch buffer each of the rest; a receive no update will match is
        # cancelled.
        cdef int64_t missing = sent[0] - self.mb_got[self._in[i]]
        cdef int first = 2 * i if self.mb_held[2 * i] < self.mb_held[2 * i + 1] else 2 * i + 1
        cdef int second = 4 * i + 1 - first
        if missing < 2:
            with nogil:
                CHKERR(MPI_Cancel(&self.mb_recv[second]), "MPI_Cancel")
                if missing < 1:
                    CHKERR(MPI_Cancel(&self.mb_recv[first]), "MPI_Cancel")
        for _ in range(missing - 2):
            extra.append((self._in[i], 0, np.empty(self.nbytes + MB_TRAILER_BYTES, np.uint8)))
        return 0

    # ------------------------------------------------------------------ sending

    cdef int _send(self, const char *src, int64_t version, int64_t iteration, bint seqlock,
                   bint checksum, bint notify, int64_t suppress_if_acked) except -1:
        # The update into a stage no send reads, then to every reader whose channel is
        # free; the others get it (or a newer one) from _pump once theirs is.  Never
        # waits for a reader.
        cdef int s = 0
        cdef int j
        with nogil:
            self._mark_suppressed(suppress_if_acked)
            self._complete_sends()
            # found: at most 2 n_out stages have a send in flight and one more is the
            # newest
            while self.mb_refs[s] != 0 or s == self.mb_newest_stage:
                s += 1
            self._fill_stage(s, src, version, iteration, checksum)
            self.mb_newest_stage = s
            for j in range(self.n_out):
                self.mb_waiting[j] = 0
                if self.skip[j]:
                    continue
                if self.mb_busy[j] >= 0 or self.mb_busy[self.n_out + j] >= 0:
                    self.mb_waiting[j] = 1
                else:
                    self._send_newest(j, 0)
        return 0

    cdef int _send_newest(self, int j, int second) except -1 nogil:
        # the newest stage to out-neighbour j, as its first or second message in flight
        cdef int s = self.mb_newest_stage
        cdef int k = second * self.n_out + j
        CHKERR(MPI_Issend(self.mb_stage + s * self.mb_stage_stride,
                          <int>(self.nbytes + MB_TRAILER_BYTES), MPI_BYTE, self._out[j], 0,
                          self.msg_comm, &self.mb_send[k]), "MPI_Issend")
        self.mb_busy[k] = s
        self.mb_refs[s] += 1
        self.mb_waiting[j] = 0
        self.mb_sent[self._out[j]] += 1
        self.bytes_put += self.nbytes
        return 0

    cdef int _complete_sends(self) except -1 nogil:
        # free the messages readers took (one MPI_Testsome over the sends)
        cdef int count = 0
        cdef int k
        CHKSOME(MPI_Testsome(2 * self.n_out, self.mb_send, &count, self.mb_index,
                             self.mb_status), 2 * self.n_out, count, self.mb_status,
                "MPI_Testsome")
        if count != MPI_UNDEFINED:
            for k in range(count):
                self._sent(self.mb_index[k])
        return 0

    cdef int _sent(self, int k) except -1 nogil:
        # a reader took send k: its stage has one message in flight less
        self.mb_refs[self.mb_busy[k]] -= 1
        self.mb_busy[k] = -1
        return 0

    cdef int _pumped(self) except -1 nogil:
        # the newest version into the channels that waited for it and are free now
        cdef int j
        for j in range(self.n_out):
            if (self.mb_waiting[j] and self.mb_busy[j] < 0
                    and self.mb_busy[self.n_out + j] < 0):
                self._send_newest(j, 0)
        return self.msg_words.send_tokens()

    cdef int _release_outside(self) except -1 nogil:
        # one poll of a wait outside the windows: as a settle (it never waits).  A
        # channel whose two requests were both in flight at the settle before the wait
        # (an earlier settle between iterations used the second) gets its newest version
        # once one of them completes (docs/MODELCHECK.md, "The newest version stranded")
        return self._settle(0.0)

    cdef int _settle(self, double timeout) except -1 nogil:
        # before waiting outside the windows: every waiting channel gets the newest now
        cdef int j
        self._pump()
        for j in range(self.n_out):
            if self.mb_waiting[j]:
                if self.mb_busy[j] < 0:
                    self._send_newest(j, 0)
                elif self.mb_busy[self.n_out + j] < 0:
                    self._send_newest(j, 1)
        return 0
