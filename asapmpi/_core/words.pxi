# The words (included by slotwin.pyx before the channels; docs/ARCHITECTURE.md): the
# notify, ack, token and user counters of one window, behind one interface.
#
# Every word lives in the window's own memory (layout.py: notify words per in-neighbour
# and slot, ack words per out-neighbour, user words), and every wait of every channel
# reads them there.  What differs is how a write reaches another rank's word and how
# this rank reads its own:
#
#   Words          no remote writes (NOTIFY-ACK's message engine, whose messages are its
#                  notifies and acks): own words read by an atomic load
#   OneSidedWords  MPI atomics into the neighbours' windows (put, shared): notifies and
#                  acks lazily (completed by the next flush or settle), the rest
#                  flushed; own words read by an MPI atomic (neighbours write them
#                  one-sidedly)
#   MessageWords   messages (the mailboxes): tokens to the in-neighbours, word messages
#                  to any rank; the channel's pump hands their arrivals here, which
#                  stores them into the same words; own words read by an atomic load
#                  (only this process writes them)
#
# Words never poll (a one-sided flush blocks in MPI under the watchdog): a write that
# needs a free request says so (word_send_free), and the channel's waits, which drive
# progress and back off, do the waiting.  A channel owns its words (SlotWindow.words,
# made by _make_words, bound by SlotChannel._bind_parts) and lends them its arrays for
# its life; nothing else holds them.


cdef class Words:
    """The words of one window whose writes stay local: this rank's notify, ack and
    user words, read atomically.  The base of OneSidedWords and MessageWords."""

    cdef char *base
    cdef int rank, size, n_in, n_out, depth, n_user
    cdef Py_ssize_t off_notify, off_ack, off_user
    cdef double timeout
    # the channel's (borrowed for the channel's life)
    cdef int *_in
    cdef int *_out
    cdef MPI_Aint *out_notify_disp
    cdef MPI_Aint *in_ack_disp
    cdef int *skip
    cdef const char *nbr_desc
    # a board's row (set_row): this rank's row_count words from row_disp, which
    # publish() writes into the same words of every rank in row_readers
    cdef Py_ssize_t row_disp
    cdef int row_count
    cdef int *row_readers
    cdef int n_row_readers
    cdef char row_what[160]         # the watchdog's line of a one-sided row write

    def __dealloc__(self):
        free(self.row_readers)
        self.row_readers = NULL

    cdef int64_t own(self, MPI_Aint disp) except? -1 nogil:
        """This rank's word at `disp`, read atomically (only this process writes it)."""
        return asap_load_i64(self.base + disp)

    cdef int notify(self, int64_t version, Py_ssize_t slot) except -1 nogil:
        """`version` into the notify word of `slot` of every out-neighbour not skipped
        (the channel's skip[]): nothing to write where the update is the notify."""
        return 0

    cdef int ack(self, int64_t version) except -1 nogil:
        """`version` to every in-neighbour's ack word for this rank: nothing to write
        where the next receive posted is the ack."""
        return 0

    cdef int lazy(self) noexcept nogil:
        """Words issued and not yet complete (completed by a flush or settle)."""
        return 0

    cdef int flushed(self) noexcept nogil:
        """The window's memory was flushed to every rank: every lazy word is complete."""
        return 0

    cdef int settle(self, double timeout) except -1 nogil:
        """Complete the lazy words now (before this rank waits on anything else)."""
        return 0

    cdef int forget(self) noexcept nogil:
        """Out of the process's list of words to settle (the window goes)."""
        return 0

    # The words of another rank's window, read or written one-sidedly: only
    # OneSidedWords can; a channel calls check_remote first, which refuses the rest
    # with the line that says what to change.

    cdef int check_remote(self, str what, int target, str transport) except -1:
        """ConfigError unless `what` (on `target`; -1: on any rank, this one included)
        can be done with these words: a word of this rank's own needs no window."""
        if target != self.rank:
            raise ConfigError(f"{what} needs an MPI window, and the {transport} "
                              f"transport moves everything by message (a mailbox writes "
                              f"words with write_words and reads them with wait_word or "
                              f"local_word): for one-sided words create the Exchange "
                              f"with transport='put'")
        return 0

    cdef int64_t accumulate(self, int target, MPI_Aint disp, int64_t value,
                            MPI_Op op) except? -1 nogil:
        """Atomically combine `value` into `target`'s word at `disp` (flushed); the
        word's old value."""
        with gil:
            self.check_remote("an accumulate", -1, "")
        return -1

    cdef int64_t compare_and_swap(self, int target, MPI_Aint disp, int64_t compare,
                                  int64_t value) except? -1 nogil:
        """`target`'s word at `disp` set to `value` if it equals `compare` (flushed);
        its old value."""
        with gil:
            self.check_remote("a compare-and-swap", -1, "")
        return -1

    cdef int64_t fetch_one(self, int target, MPI_Aint disp) except? -1 nogil:
        """`target`'s word at `disp`, read atomically."""
        with gil:
            self.check_remote("an atomic read", -1, "")
        return -1

    cdef int fetch_many(self, int target, MPI_Aint disp, int64_t *out,
                        int count) except -1 nogil:
        """`count` words of `target` from `disp`, each read atomically, in one round
        trip (here this rank's own: atomic loads, only this process writes them)."""
        cdef int k
        if target != self.rank:
            with gil:
                self.check_remote("an atomic read", target, "")
        for k in range(count):
            out[k] = asap_load_i64(self.base + disp + 8 * k)
        return 0

    # A board's row (asapmpi.board): each rank writes its own few words into every
    # reader's copy of them, and reads its own copy of every rank's.  The channel
    # checks the row once (SlotWindow.set_row); each kind of words delivers it its way.

    cdef int set_row(self, Py_ssize_t disp, int count, readers, str what) except -1:
        """This rank's `count` words from `disp` are its row, written by publish() to
        every rank of `readers` (this one included or not: its own copy is always
        written); `what` names the board in a watchdog's line."""
        cdef int k
        readers = [int(r) for r in readers]
        free(self.row_readers)
        self.row_readers = <int *>calloc(max(len(readers), 1), sizeof(int))
        if self.row_readers == NULL:
            raise MemoryError()
        for k in range(len(readers)):
            self.row_readers[k] = readers[k]
        self.n_row_readers = len(readers)
        self.row_disp, self.row_count = disp, count
        line = f"MPI_Win_flush of a word of the {what}".encode()[:159]
        memcpy(self.row_what, <const char *>line, len(line))
        self.row_what[len(line)] = 0
        return 0

    cdef int publish(self, int index, int64_t value) except -1 nogil:
        """Word `index` of this rank's row becomes `value` in every reader's copy (at
        each once published() says so).  Here nothing reaches another rank."""
        with gil:
            raise ConfigError("a board's row needs words that reach the other ranks: a "
                              "put window's or a mailbox's (asapmpi.board makes them)")

    cdef int published(self) except -1 nogil:
        """1 once every reader has this rank's row as last published (sending what
        waited for a reader to take the one before)."""
        return 1

    cdef list unpublished(self):
        """The readers that do not have this rank's row as last published yet."""
        return []


cdef class OneSidedWords(Words):
    """The words of the one-sided channels (put, shared): notifies and acks are lazy
    MPI atomics into the neighbours' windows, completed by the window's next flush,
    by a wait that lasted poll_yields polls, before asapmpi's collectives
    (settle_all) or at free(); accumulate, compare-and-swap and fetch are flushed."""

    cdef MPI_Win win
    cdef int64_t word_out, word_in, word_sink
    cdef char what[64]              # the rank a flush waits for, for the watchdog
    cdef str transport              # the channel's name, for kept_words()
    # The memory of the notifies and acks not yet completed (see _lazy), one malloc'd
    # block: LAZY_WORDS origin words (lazy_words, the block's start), then their result
    # buffers, LAZY_WORDS rows of max(n_in, n_out) words (lazy_sink), the row of the
    # newest word at lazy_results.  Not in this object: a window dropped with words in
    # flight keeps the block for ever (__dealloc__), while the object goes.
    cdef int64_t *lazy_words
    cdef int n_lazy
    cdef int64_t *lazy_sink
    cdef int64_t *lazy_results

    def __cinit__(self):
        self.win = MPI_WIN_NULL

    def __dealloc__(self):
        cdef int finalized = 1
        self.forget()
        if self.lazy_words == NULL:
            return
        # Words issued and not flushed when the window goes unfreed (dropped, or a
        # free() that failed before MPI_Win_free; free() zeroes n_lazy once the window
        # is gone, which completed them) may still read their origin word and write
        # their result: on an active-message path (MPICH's network path) not before
        # their target enters MPI, however late.  They have no request that could tell
        # when they complete, and a flush here could block on a dead rank: the block is
        # kept, never freed.  After MPI_Finalize nothing is in flight.
        if self.n_lazy:
            MPI_Finalized(&finalized)
            if not finalized:
                _keep_words(self.lazy_words, self._block_words() * sizeof(int64_t),
                            self.n_lazy, self.transport)
                self.lazy_words = self.lazy_sink = self.lazy_results = NULL
                return
        free(self.lazy_words)
        self.lazy_words = self.lazy_sink = self.lazy_results = NULL

    cdef Py_ssize_t _block_words(self) noexcept nogil:
        # the words of the lazy block: LAZY_WORDS origins, then LAZY_WORDS result rows
        return LAZY_WORDS * (1 + max(self.n_in, self.n_out, 1))

    cdef int bound(self, MPI_Win win, str transport) except -1:
        """The window exists (SlotChannel._bind_parts set the rest): its handle, its
        channel's name, and the lazy words' origin and result buffers."""
        self.win = win
        self.transport = transport
        self.lazy_words = <int64_t *>calloc(self._block_words(), sizeof(int64_t))
        if self.lazy_words == NULL:
            raise MemoryError()
        self.lazy_sink = self.lazy_words + LAZY_WORDS
        return 0

    cdef int64_t own(self, MPI_Aint disp) except? -1 nogil:
        # Neighbours write these words with one-sided atomics: an MPI atomic read
        # (same_op_no_op), not a load.
        self.fetch(self.rank, disp)
        return self.word_in

    cdef int notify(self, int64_t version, Py_ssize_t slot) except -1 nogil:
        cdef int j
        cdef int64_t *word = self._lazy(version)
        for j in range(self.n_out):
            if self.skip[j]:
                continue
            CHKERR(MPI_Fetch_and_op(word, self.lazy_results + j, MPI_INT64_T, self._out[j],
                                    self.out_notify_disp[j] + 8 * slot, MPI_REPLACE,
                                    self.win), "MPI_Fetch_and_op")
        return 0

    cdef int ack(self, int64_t version) except -1 nogil:
        """`version` into every in-neighbour's ack word for this rank (lazy)."""
        cdef int i
        cdef int64_t *word = self._lazy(version)
        for i in range(self.n_in):
            CHKERR(MPI_Fetch_and_op(word, self.lazy_results + i, MPI_INT64_T,
                                    self._in[i], self.in_ack_disp[i], MPI_REPLACE,
                                    self.win), "MPI_Fetch_and_op")
        return 0

    cdef int64_t *_lazy(self, int64_t value) except NULL nogil:
        # Notifies and acks are not flushed: a flush is a round trip to the neighbours,
        # and on the network path it waits for their CPUs (MPICH's active-message RMA),
        # even a local flush.  The payload was complete (put: flushed; shared: stored
        # and fenced) before its notify was issued, which is all the ordering the
        # protocol needs.  Each word gets its own origin buffer, untouched until
        # completion; completion comes with the window's next flush_all (the next put,
        # or a word issued while LAZY_WORDS are pending, below), with any wait of this
        # process once it has lasted poll_yields polls (Waits.settle_pending),
        # before asapmpi's collectives (settle_all) or at free(): a rank that waits on
        # a neighbour for longer than poll_yields polls holds no incomplete word of its
        # own.
        # The words are written with MPI_Fetch_and_op(MPI_REPLACE), not MPI_Accumulate:
        # both are atomic and ordered alike (accumulate_ordering), but MPICH 5.0.2 keeps
        # 128 bytes per MPI_Accumulate on its shared-memory path for the life of the
        # window (dev/repro/mpich_accumulate_leak.py): 0.5 KB per NOTIFY-ACK step, a
        # gigabyte per rank in a few million steps.  Each operation has its own result
        # word in lazy_sink, untouched until the flush that completes it; origins and
        # results share one malloc'd block, which a window dropped with words in flight
        # keeps (__dealloc__).
        if self.n_lazy == LAZY_WORDS:
            self.settle(self.timeout)
        if self.n_lazy == 0:
            _note_pending(&self.win, &self.n_lazy)
        self.lazy_words[self.n_lazy] = value
        self.lazy_results = self.lazy_sink + self.n_lazy * max(self.n_in, self.n_out, 1)
        self.n_lazy += 1
        return &self.lazy_words[self.n_lazy - 1]

    cdef int lazy(self) noexcept nogil:
        return self.n_lazy

    cdef int flushed(self) noexcept nogil:
        self.n_lazy = 0
        return 0

    cdef int settle(self, double timeout) except -1 nogil:
        # A flush cannot time out; the watchdog ends the job if it outlives the timeout.
        cdef int ierr
        if not self.n_lazy:
            return 0
        asap_watchdog_arm(timeout, b"MPI_Win_flush_all of its notifies and acks", -1,
                          self.nbr_desc)
        ierr = MPI_Win_flush_all(self.win)
        asap_watchdog_disarm()
        CHKERR(ierr, "MPI_Win_flush_all")
        self.n_lazy = 0
        return 0

    cdef int forget(self) noexcept nogil:
        _forget_pending(&self.win)
        return 0

    cdef int _flush(self, int target, const char *what) except -1 nogil:
        # a flush to `target` (this rank's own: no watchdog, nothing to wait for)
        cdef int ierr
        if target == self.rank:
            return CHKERR(MPI_Win_flush(target, self.win), "MPI_Win_flush")
        snprintf(self.what, sizeof(self.what), "%d", target)
        asap_watchdog_arm(self.timeout, what, -1, self.what)
        ierr = MPI_Win_flush(target, self.win)
        asap_watchdog_disarm()
        return CHKERR(ierr, "MPI_Win_flush")

    cdef int64_t accumulate(self, int target, MPI_Aint disp, int64_t value,
                            MPI_Op op) except? -1 nogil:
        """Atomically combine `value` into `target`'s word at `disp` (flushed); the
        word's old value."""
        return self._accumulate(target, disp, value, op,
                                b"MPI_Win_flush after an accumulate")

    cdef int64_t _accumulate(self, int target, MPI_Aint disp, int64_t value, MPI_Op op,
                             const char *what) except? -1 nogil:
        self.word_out = value
        # Fetch_and_op rather than Accumulate: see _lazy (MPICH's leak)
        CHKERR(MPI_Fetch_and_op(&self.word_out, &self.word_sink, MPI_INT64_T, target,
                                disp, op, self.win), "MPI_Fetch_and_op")
        self._flush(target, what)
        return self.word_sink

    cdef int publish(self, int index, int64_t value) except -1 nogil:
        """An atomic REPLACE into each reader's copy, flushed before the next (a flush
        to a rank that stopped ends the job naming it: the watchdog): complete at every
        reader when this returns.  This rank's own copy too, if it is not a reader."""
        cdef int k
        cdef bint mine = False
        cdef MPI_Aint disp = self.row_disp + 8 * index
        for k in range(self.n_row_readers):
            mine = mine or self.row_readers[k] == self.rank
            self._accumulate(self.row_readers[k], disp, value, MPI_REPLACE, self.row_what)
        if not mine:
            self._accumulate(self.rank, disp, value, MPI_REPLACE, self.row_what)
        return 0

    cdef int64_t compare_and_swap(self, int target, MPI_Aint disp, int64_t compare,
                                  int64_t value) except? -1 nogil:
        """`target`'s word at `disp` set to `value` if it equals `compare` (flushed);
        its old value."""
        cdef int64_t old = 0
        self.word_out = value
        CHKERR(MPI_Compare_and_swap(&self.word_out, &compare, &old, MPI_INT64_T, target,
                                    disp, self.win), "MPI_Compare_and_swap")
        self._flush(target, b"MPI_Win_flush after a compare-and-swap")
        return old

    cdef int check_remote(self, str what, int target, str transport) except -1:
        return 0

    cdef int64_t fetch_one(self, int target, MPI_Aint disp) except? -1 nogil:
        self.fetch(target, disp)
        return self.word_in

    cdef int fetch(self, int target, MPI_Aint disp) except -1 nogil:
        """`target`'s word at `disp`, read atomically, into word_in."""
        CHKERR(MPI_Fetch_and_op(NULL, &self.word_in, MPI_INT64_T, target, disp, MPI_NO_OP,
                                self.win), "MPI_Fetch_and_op")
        return self._flush(target, b"MPI_Win_flush after an atomic read")

    cdef int fetch_many(self, int target, MPI_Aint disp, int64_t *out,
                        int count) except -1 nogil:
        """`count` words of `target` from `disp`, each read atomically, in one round
        trip (one MPI_Get_accumulate with MPI_NO_OP, one flush)."""
        CHKERR(MPI_Get_accumulate(NULL, 0, MPI_INT64_T, out, count, MPI_INT64_T, target,
                                  disp, count, MPI_INT64_T, MPI_NO_OP, self.win),
               "MPI_Get_accumulate")
        return self._flush(target, b"MPI_Win_flush after an atomic read")


cdef enum:
    # the tag of token messages (slot tags are 0 .. depth - 1)
    MB_TOKEN_TAG = 32767
    # words written into another rank's window (write_words): one message of the
    # displacement, the count and up to WRITE_WORDS_MAX values, MB_WORD_SENDS in flight
    MB_WORD_TAG = 32766
    MB_WORD_CELLS = WRITE_WORDS_MAX + 2
    MB_WORD_SENDS = 16


cdef class MessageWords(Words):
    """The words of the mailboxes: an ack is a token message to every in-neighbour
    (one in flight per in-neighbour; a newer one waits in tok_next and says everything
    the older did), write() a word message to any rank.  The channel posts the token
    and word receives in its own request array (one MPI_Testsome per pump: tok_recv,
    wd_recv point into it) and hands each completion here (token_arrived,
    word_arrived), which stores it into this rank's words."""

    cdef MPI_Comm msg_comm
    cdef MPI_Request *tok_recv      # per out-neighbour: its next token (the channel's)
    cdef int64_t *tok_in
    cdef MPI_Request *tok_send      # per in-neighbour: the token in flight
    cdef int64_t *tok_out
    cdef int64_t *tok_next          # per in-neighbour: the token waiting to go (0: none)
    cdef int *tok_index             # MPI_Testsome's indices over tok_send
    cdef MPI_Request *wd_recv       # the next word message, from any rank (the channel's)
    cdef int64_t *wd_in             # its cells: displacement, count, values
    cdef MPI_Request *wd_send       # word messages in flight (a ring)
    cdef int64_t *wd_out            # their cells
    cdef int *wd_peer               # and the rank each went to
    cdef int wd_next                # the ring's next entry
    # messages sent to and received from each rank, for the drain at free(): per rank,
    # tokens then word messages
    cdef int64_t *sent
    cdef int64_t *got
    # a board's row (set_row): per reader, the one message of the row in flight (a
    # synchronous send: complete once the reader's receive took it) and its cells, the
    # row's publish it carries and the one the reader has (the last send completed)
    cdef MPI_Request *rw_req
    cdef int64_t *rw_out
    cdef int64_t *rw_sent
    cdef int64_t *rw_done
    cdef int64_t rw_version         # this rank's publishes so far
    cdef bint rw_pending            # some reader lacks the last

    def __cinit__(self):
        self.msg_comm = MPI_COMM_NULL

    def __dealloc__(self):
        free(self.tok_in); self.tok_in = NULL
        free(self.tok_send); self.tok_send = NULL
        free(self.tok_out); self.tok_out = NULL
        free(self.tok_next); self.tok_next = NULL
        free(self.tok_index); self.tok_index = NULL
        free(self.wd_in); self.wd_in = NULL
        free(self.wd_send); self.wd_send = NULL
        free(self.wd_out); self.wd_out = NULL
        free(self.wd_peer); self.wd_peer = NULL
        free(self.sent); self.sent = NULL
        free(self.got); self.got = NULL
        free(self.rw_req); self.rw_req = NULL
        free(self.rw_out); self.rw_out = NULL
        free(self.rw_sent); self.rw_sent = NULL
        free(self.rw_done); self.rw_done = NULL

    cdef int allocate(self, int n_in, int n_out, int size) except -1:
        """Before any communication: the buffers (the channel binds the rest later)."""
        cdef int n = max(n_in, 1)
        cdef int m = max(n_out, 1)
        cdef int k
        self.tok_in = <int64_t *>calloc(m, sizeof(int64_t))
        self.tok_send = <MPI_Request *>calloc(n, sizeof(MPI_Request))
        self.tok_out = <int64_t *>calloc(n, sizeof(int64_t))
        self.tok_next = <int64_t *>calloc(n, sizeof(int64_t))
        self.tok_index = <int *>calloc(n, sizeof(int))
        self.wd_in = <int64_t *>calloc(MB_WORD_CELLS, sizeof(int64_t))
        self.wd_send = <MPI_Request *>calloc(MB_WORD_SENDS, sizeof(MPI_Request))
        self.wd_out = <int64_t *>calloc(MB_WORD_SENDS * MB_WORD_CELLS, sizeof(int64_t))
        self.wd_peer = <int *>calloc(MB_WORD_SENDS, sizeof(int))
        self.sent = <int64_t *>calloc(2 * max(size, 1), sizeof(int64_t))
        self.got = <int64_t *>calloc(2 * max(size, 1), sizeof(int64_t))
        if (self.tok_in == NULL or self.tok_send == NULL or self.tok_out == NULL
                or self.tok_next == NULL or self.tok_index == NULL or self.wd_in == NULL
                or self.wd_send == NULL or self.wd_out == NULL or self.wd_peer == NULL
                or self.sent == NULL or self.got == NULL):
            raise MemoryError()
        for k in range(MB_WORD_SENDS):
            self.wd_send[k] = MPI_REQUEST_NULL
        for k in range(n):
            self.tok_send[k] = MPI_REQUEST_NULL
        return 0

    cdef int open(self, MPI_Comm msg_comm, MPI_Request *tok_recv,
                  MPI_Request *wd_recv) except -1 nogil:
        """With the channel's communicator and its token and word receives: every
        out-neighbour's tokens awaited, and word messages if this window has user
        words."""
        cdef int j
        self.msg_comm = msg_comm
        self.tok_recv = tok_recv
        self.wd_recv = wd_recv
        for j in range(self.n_out):
            self._post_token(j)
        if self.n_user:         # only a window with user words takes word messages
            self._post_words()
        return 0

    cdef int leave(self, _Leftover lo) except -1:
        """The window dies without a finished free(): the sends in flight and every
        buffer a send or receive touches go to `lo` (the channel cancels the receives,
        which are in its request array)."""
        with nogil:
            lo.add_all(self.tok_send, self.n_in, False)
            lo.add_all(self.wd_send, MB_WORD_SENDS, False)
            if self.rw_req != NULL:
                lo.add_all(self.rw_req, self.n_row_readers, False)
        lo.own(self.tok_in); self.tok_in = NULL
        lo.own(self.tok_out); self.tok_out = NULL
        lo.own(self.wd_in); self.wd_in = NULL
        lo.own(self.wd_out); self.wd_out = NULL
        lo.own(self.rw_out); self.rw_out = NULL
        return 0

    # ------------------------------------------------------------------ tokens

    cdef int _post_token(self, int j) except -1 nogil:
        return CHKERR(MPI_Irecv(&self.tok_in[j], 1, MPI_INT64_T, self._out[j], MB_TOKEN_TAG,
                                self.msg_comm, &self.tok_recv[j]), "MPI_Irecv")

    cdef int token_arrived(self, int j) except -1 nogil:
        """Out-neighbour j's token: into its ack word, and its next token awaited."""
        cdef int64_t *ack = <int64_t *>(self.base + self.off_ack + 8 * j)
        self.got[2 * self._out[j]] += 1
        # tokens of one sender arrive in order; max() keeps a word that only grows
        if self.tok_in[j] > asap_load_i64(ack):
            asap_store_i64(ack, self.tok_in[j])
        return self._post_token(j)

    cdef int ack(self, int64_t version) except -1 nogil:
        """Hop's token `version` to every in-neighbour (or held back behind the one in
        flight)."""
        cdef int i
        for i in range(self.n_in):
            if version > self.tok_next[i]:
                self.tok_next[i] = version
        return self.send_tokens()

    cdef int send_tokens(self) except -1 nogil:
        """The tokens held back whose predecessor left.  One token in flight per
        in-neighbour; the tokens in flight are tested together (one progress call), and
        only when one waits."""
        cdef int i
        cdef int count = 0
        if not self.tokens_waiting():
            return 0
        CHKERR(MPI_Testsome(self.n_in, self.tok_send, &count, self.tok_index,
                            MPI_STATUSES_IGNORE), "MPI_Testsome")
        for i in range(self.n_in):
            if self.tok_next[i] <= 0 or self.tok_send[i] != MPI_REQUEST_NULL:
                continue
            self.tok_out[i] = self.tok_next[i]
            self.tok_next[i] = 0
            CHKERR(MPI_Isend(&self.tok_out[i], 1, MPI_INT64_T, self._in[i], MB_TOKEN_TAG,
                             self.msg_comm, &self.tok_send[i]), "MPI_Isend")
            self.sent[2 * self._in[i]] += 1
        return 0

    cdef bint tokens_waiting(self) noexcept nogil:
        """A token is held back behind the one in flight."""
        cdef int i
        for i in range(self.n_in):
            if self.tok_next[i] > 0:
                return True
        return False

    def tokens_held(self):
        """The in-neighbours whose newest token waits for the one before it."""
        return [self._in[i] for i in range(self.n_in) if self.tok_next[i] > 0]

    # ------------------------------------------------------------------ word messages

    cdef int _post_words(self) except -1 nogil:
        return CHKERR(MPI_Irecv(self.wd_in, MB_WORD_CELLS, MPI_INT64_T, MPI_ANY_SOURCE,
                                MB_WORD_TAG, self.msg_comm, self.wd_recv), "MPI_Irecv")

    cdef int word_arrived(self, int source) except -1 nogil:
        """The word message from `source` completed: its values into this rank's user
        words, in order (a reader that waits for the last word of a message sees the
        others), and the next one awaited."""
        cdef int64_t cells[MB_WORD_CELLS]
        cdef int64_t k, disp, count
        memcpy(cells, self.wd_in, sizeof(cells))
        self.got[2 * source + 1] += 1
        self._post_words()
        disp, count = cells[0], cells[1]
        if (count < 1 or count > WRITE_WORDS_MAX or disp % 8 or disp < self.off_user
                or disp + 8 * count > self.off_user + 8 * self.n_user):
            with gil:
                raise ProtocolError(f"rank {self.rank}: rank {source} wrote {count} "
                                    f"word(s) at offset {disp}, outside this window's "
                                    f"{self.n_user} user words")
        for k in range(count):
            asap_store_i64(self.base + disp + 8 * k, cells[2 + k])
        asap_fence()
        return 0

    cdef int word_send_free(self) except -1 nogil:
        """1 when the next word message's send buffer is free (the message sent from it
        MB_WORD_SENDS writes ago was received)."""
        cdef int flag = 0
        if self.wd_send[self.wd_next] == MPI_REQUEST_NULL:
            return 1
        CHKERR(MPI_Test(&self.wd_send[self.wd_next], &flag, MPI_STATUS_IGNORE), "MPI_Test")
        return flag

    cdef int write(self, int target, MPI_Aint disp, const int64_t *values,
                   int n) except -1 nogil:
        """The `n` values into `target`'s user words from `disp`, as one message (its
        buffer must be free: word_send_free)."""
        cdef int slot = self.wd_next
        cdef int k
        self.wd_out[slot * MB_WORD_CELLS] = disp
        self.wd_out[slot * MB_WORD_CELLS + 1] = n
        for k in range(n):
            self.wd_out[slot * MB_WORD_CELLS + 2 + k] = values[k]
        CHKERR(MPI_Isend(self.wd_out + slot * MB_WORD_CELLS, 2 + n, MPI_INT64_T, target,
                         MB_WORD_TAG, self.msg_comm, &self.wd_send[slot]), "MPI_Isend")
        self.wd_peer[slot] = target
        self.sent[2 * target + 1] += 1
        self.wd_next = (slot + 1) % MB_WORD_SENDS
        return 0

    # ------------------------------------------------------------------ a board's row
    #
    # Each publish changes this rank's own copy and sends the whole row (its few words,
    # as one word message) to every reader, by a synchronous send: one in flight per
    # reader; a publish meanwhile waits in the row (a row says everything an older one
    # did: the words only grow), and goes when that send completed.  So at most one of
    # this rank's row messages waits unreceived at a reader: on MPICH's network path
    # (libfabric's tcp provider) the 65th unexpected message from one sender stops every
    # later message from it until the reader receives them (docs/PROTOCOL.md).  A
    # completed synchronous send was matched by the reader's posted word receive, which
    # its next pump completes into its words (A13).

    cdef int set_row(self, Py_ssize_t disp, int count, readers, str what) except -1:
        """Words.set_row without this rank among the readers (its copy is its own)."""
        cdef int k, n
        Words.set_row(self, disp, count, [r for r in readers if r != self.rank], what)
        free(self.rw_req); free(self.rw_out); free(self.rw_sent); free(self.rw_done)
        n = max(self.n_row_readers, 1)
        self.rw_req = <MPI_Request *>calloc(n, sizeof(MPI_Request))
        self.rw_out = <int64_t *>calloc(n * MB_WORD_CELLS, sizeof(int64_t))
        self.rw_sent = <int64_t *>calloc(n, sizeof(int64_t))
        self.rw_done = <int64_t *>calloc(n, sizeof(int64_t))
        if (self.rw_req == NULL or self.rw_out == NULL or self.rw_sent == NULL
                or self.rw_done == NULL):
            raise MemoryError()
        for k in range(n):
            self.rw_req[k] = MPI_REQUEST_NULL
        return 0

    cdef int publish(self, int index, int64_t value) except -1 nogil:
        asap_store_i64(self.base + self.row_disp + 8 * index, value)
        self.rw_version += 1
        self.rw_pending = self.n_row_readers > 0
        return self.send_rows()

    cdef int send_rows(self) except -1 nogil:
        """The row to every reader whose last row message completed and lacks the last
        publish (no wait: what cannot go now goes at a later pump)."""
        cdef int i, k, flag
        cdef int64_t *cells
        if not self.rw_pending:
            return 0
        self.rw_pending = False
        for i in range(self.n_row_readers):
            if self.rw_req[i] != MPI_REQUEST_NULL:
                CHKERR(MPI_Test(&self.rw_req[i], &flag, MPI_STATUS_IGNORE), "MPI_Test")
                if not flag:
                    self.rw_pending = True
                    continue
                self.rw_done[i] = self.rw_sent[i]
            if self.rw_sent[i] < self.rw_version:
                cells = self.rw_out + i * MB_WORD_CELLS
                cells[0] = self.row_disp
                cells[1] = self.row_count
                for k in range(self.row_count):
                    cells[2 + k] = asap_load_i64(self.base + self.row_disp + 8 * k)
                CHKERR(MPI_Issend(cells, 2 + self.row_count, MPI_INT64_T,
                                  self.row_readers[i], MB_WORD_TAG, self.msg_comm,
                                  &self.rw_req[i]), "MPI_Issend")
                self.rw_sent[i] = self.rw_version
                self.sent[2 * self.row_readers[i] + 1] += 1
                self.rw_pending = True
        return 0

    cdef int published(self) except -1 nogil:
        self.send_rows()
        return not self.rw_pending

    cdef list unpublished(self):
        return [self.row_readers[i] for i in range(self.n_row_readers)
                if self.rw_done[i] < self.rw_version]

    # ------------------------------------------------------------------ drain

    cdef int drain_post(self, const int64_t *to_me, list extra) except -1:
        """At free() (every rank came, tokens held back sent): `to_me` holds, per rank,
        the tokens and word messages it sent to this one.  The posted receive takes the
        first still to come, a scratch buffer in `extra` each of the rest; a receive no
        message will match is cancelled."""
        cdef int j, r
        cdef int64_t missing = 0
        for r in range(self.size):
            missing += to_me[2 * r + 1] - self.got[2 * r + 1]
        if self.wd_recv[0] != MPI_REQUEST_NULL:
            if missing > 0:
                missing -= 1
            else:
                with nogil:
                    CHKERR(MPI_Cancel(self.wd_recv), "MPI_Cancel")
        for _ in range(missing):
            extra.append((MPI_ANY_SOURCE, MB_WORD_TAG, np.empty(MB_WORD_CELLS, np.int64)))
        for j in range(self.n_out):
            missing = to_me[2 * self._out[j]] - self.got[2 * self._out[j]]
            if missing > 0:
                missing -= 1
            else:
                with nogil:
                    CHKERR(MPI_Cancel(&self.tok_recv[j]), "MPI_Cancel")
            for _ in range(missing):
                extra.append((self._out[j], MB_TOKEN_TAG, np.empty(1, np.int64)))
        return 0

    cdef int drain_wait(self) except -1 nogil:
        """At free(), after drain_post: every token and word request completed."""
        cdef int r
        for r in range(self.n_out):
            CHKERR(MPI_Wait(&self.tok_recv[r], MPI_STATUS_IGNORE), "MPI_Wait")
        for r in range(self.n_in):
            CHKERR(MPI_Wait(&self.tok_send[r], MPI_STATUS_IGNORE), "MPI_Wait")
        CHKERR(MPI_Wait(self.wd_recv, MPI_STATUS_IGNORE), "MPI_Wait")
        for r in range(MB_WORD_SENDS):
            CHKERR(MPI_Wait(&self.wd_send[r], MPI_STATUS_IGNORE), "MPI_Wait")
        for r in range(self.n_row_readers):
            CHKERR(MPI_Wait(&self.rw_req[r], MPI_STATUS_IGNORE), "MPI_Wait")
        return 0
