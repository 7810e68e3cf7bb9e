# The waits of one channel (included by slotwin.pyx after the words; docs/ARCHITECTURE.md):
# every wait on the channel's own words (notifies, acks, tokens, user words), polled
# with back-off, each unsuccessful poll driving the channel's progress (its pump, or
# its memory's poke and a probe), settling this process's lazy words once the wait
# lasts, probing a watched communicator for failures, checking signals; a deadline on
# every wait, and a NeighbourTimeoutError naming the late ranks when it passes.
#
# The channel owns its Waits for its life and lends it its arrays; the Waits reaches
# the channel's progress hooks (_pump, _progress, _sync: the channel's class decides
# them) through a borrowed pointer, which is valid as long as the Waits is, since
# nothing else holds it.


cdef int _check_version(int64_t version) except -1:
    if version < 1:
        raise ConfigError(f"versions start at 1, got {version}")
    return 0


cdef class Waits:
    """One channel's waits over its words and its progress."""

    cdef void *channel              # the SlotChannel that owns this (borrowed)
    cdef Words words
    cdef char *base
    cdef int rank, n_in, n_out, depth, n_user
    cdef Py_ssize_t off_notify, off_ack
    cdef int *_in                   # the channel's (borrowed for its life)
    cdef int *_out
    cdef const char *in_desc
    cdef const char *out_desc
    cdef double settle_timeout      # the limit of a settle of the lazy words
    # the words one wait watches (the channel sizes them), and the smallest word the
    # last successful at-least wait read (await_'s RELEASED)
    cdef MPI_Aint *offs
    cdef int64_t *expected
    cdef int64_t least
    cdef long yields, max_sleep_us
    cdef long slack_ns              # timer slack of the sleeps (0: the thread's)
    # the channel's pump is its progress (a mailbox): a wait that pumped this poll
    # needs no _progress() from idle()
    cdef bint pump_progresses
    # fault tolerance (SlotWindow.watch()): a communicator whose failure or revocation
    # every wait notices between its polls; MPI_COMM_NULL: none
    cdef MPI_Comm watched
    cdef object watched_ref
    cdef double seconds             # spent backing off, for training reports

    def __cinit__(self):
        self.watched = MPI_COMM_NULL

    def __dealloc__(self):
        free(self.offs); self.offs = NULL
        free(self.expected); self.expected = NULL

    cdef int allocate(self, int words) except -1:
        """Room for the most words one wait watches (before any communication)."""
        self.offs = <MPI_Aint *>calloc(max(words, 1), sizeof(MPI_Aint))
        self.expected = <int64_t *>calloc(max(words, 1), sizeof(int64_t))
        if self.offs == NULL or self.expected == NULL:
            raise MemoryError()
        return 0

    cdef int watch(self, MPI.Comm comm) except -1:
        if comm is None or comm.ob_mpi == MPI_COMM_NULL:
            self.watched = MPI_COMM_NULL
            self.watched_ref = None
        else:
            self.watched = comm.ob_mpi
            self.watched_ref = comm
        return 0

    cdef void backoff(self, long polls) noexcept nogil:
        """Sleep after `polls` unsuccessful polls: yield at first, then longer."""
        asap_backoff(polls, self.yields, self.max_sleep_us, self.slack_ns)

    # ------------------------------------------------------------------ one poll

    cdef int settle_pending(self, long polls) except -1 nogil:
        """In a wait that has lasted `yields` polls: complete this rank's pending
        notifies and acks, this window's and every other window's of the process, so
        that no rank waits while a neighbour waits for one of its words."""
        if polls < self.yields:
            return 0
        self.words.settle(self.settle_timeout)
        if _n_pending or _n_mailbox:
            # this window pumps in its own wait (its loop or idle's _progress)
            _settle_all(self.settle_timeout, False, <PyObject *>self.channel)
        return 0

    cdef int idle(self, long *polls, double t0, double timeout,
                  bint pumped=False) except -1 nogil:
        """Between two unsuccessful polls: drive progress (unless the caller's poll
        did: `pumped`), then back off.  Returns 1 once `timeout` seconds have passed
        since t0; raises what a signal's handler raises (KeyboardInterrupt) once the
        wait has lasted SIGNAL_CHECK_S."""
        cdef double t = asap_now()
        cdef int flag = 0
        self.settle_pending(polls[0])
        if not pumped:
            (<SlotChannel>self.channel)._progress()
        if self.watched != MPI_COMM_NULL and polls[0] >= self.yields:
            # fault tolerance: a failure or revocation anywhere ends the wait; probed
            # once the wait sleeps between polls (past its yields), so that the short
            # waits of a healthy run make no MPI call more
            CHKERR(MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, self.watched, &flag,
                              MPI_STATUS_IGNORE), "MPI_Iprobe")
        if t - t0 > timeout:
            return 1
        self.backoff(polls[0])
        polls[0] += 1
        self.seconds += asap_now() - t
        if t - t0 > SIGNAL_CHECK_S and t - _signals_checked > SIGNAL_CHECK_S:
            _check_signals(t)
        return 0

    cdef int local(self, int n, bint at_least, double timeout) except -1 nogil:
        """Wait until each local word offs[i] equals (or, atomically read, is at least)
        expected[i].  Returns 0, or 1 on timeout."""
        cdef long polls = 0
        cdef double t0 = asap_now()
        cdef int i
        cdef int64_t value
        cdef bint done
        while True:
            # a message stamped now is seen before any back-off
            (<SlotChannel>self.channel)._pump()
            (<SlotChannel>self.channel)._sync()
            done = True
            self.least = INT64_MAX
            for i in range(n):
                if at_least:
                    value = self.words.own(self.offs[i])
                    if value < self.expected[i]:
                        done = False
                        break
                    if value < self.least:
                        self.least = value
                elif asap_load_i64(self.base + self.offs[i]) != self.expected[i]:
                    done = False
                    break
            if done:
                (<SlotChannel>self.channel)._sync()
                return 0
            if self.idle(&polls, t0, timeout, self.pump_progresses):
                return 1

    cdef raise_timeout(self, str what, int n, const int *ranks, double timeout,
                       bint at_least=False):
        """NeighbourTimeoutError naming the ranks whose words (offs, expected) lag."""
        cdef Py_ssize_t rel, sender
        cdef SlotStore store = (<SlotChannel>self.channel).store
        waiting, expected, observed = [], [], []
        for i in range(n):
            value = asap_load_i64(self.base + self.offs[i])
            if (value < self.expected[i]) if at_least else (value != self.expected[i]):
                waiting.append(ranks[i])
                expected.append(self.expected[i])
                # a notify word of rotating slots (depth > 1) holds the version that slot
                # had before: the sender's last version is the newest of its slots, or
                # the newest this rank reduced (a message engine stamps the slots, not
                # these words)
                rel = self.offs[i] - self.off_notify
                if 0 <= rel < 8 * self.n_in * self.depth:
                    sender = (rel // 8) // self.depth
                    value = max([value, store._last_version[sender]]
                                + [self.words.own(self.off_notify
                                                  + 8 * (sender * self.depth + s))
                                   for s in range(self.depth)])
                observed.append(value)
        if not waiting:
            return  # everything arrived just as the time ran out: not a timeout
        raise NeighbourTimeoutError(self.rank, what, waiting, expected, observed, timeout)

    # ------------------------------------------------------------------ the waits

    cdef int notifies(self, int64_t version, double timeout, bint at_least) except -1:
        """Until every in-neighbour published `version` in its notify word (at_least:
        any version >= it, read atomically: writers that run ahead)."""
        cdef int i
        cdef int r
        cdef Py_ssize_t slot
        _check_version(version)
        slot = version % self.depth
        for i in range(self.n_in):
            self.offs[i] = self.off_notify + 8 * (i * self.depth + slot)
            self.expected[i] = version
        with nogil:
            asap_watchdog_waiting(b"the notify", version, self.in_desc)
            r = self.local(self.n_in, at_least, timeout)
            asap_watchdog_waiting(NULL, 0, NULL)
        if r:
            self.raise_timeout(f"the notify of version {version}", self.n_in,
                               self._in, timeout, at_least)
        return 0

    cdef int acks(self, int64_t version, double timeout, bint at_least) except -1:
        """Until every out-neighbour acknowledged `version` (<= 0: no wait), or, with
        at_least, wrote any value >= it (read atomically: Hop's tokens)."""
        cdef int j
        cdef int r
        if version <= 0:
            return 0
        for j in range(self.n_out):
            self.offs[j] = self.off_ack + 8 * j
            self.expected[j] = version
        with nogil:
            asap_watchdog_waiting(b"the ack", version, self.out_desc)
            r = self.local(self.n_out, at_least, timeout)
            asap_watchdog_waiting(NULL, 0, NULL)
        if r:
            self.raise_timeout(f"the ack of version {version}", self.n_out, self._out,
                               timeout, at_least)
            if at_least:
                # everything arrived just as the time ran out: the words read again
                with nogil:
                    self.read_least_ack()
        return 0

    cdef int read_least_ack(self) except -1 nogil:
        # least: the smallest of this rank's ack words, each read atomically
        cdef int j
        self.least = INT64_MAX
        for j in range(self.n_out):
            self.least = min(self.least, self.words.own(self.off_ack + 8 * j))
        return 0

    cdef int64_t released(self, int64_t version, double timeout) except? -1:
        """await_'s RELEASED: the token wait, then the smallest release its last poll
        read (the same atomic reads: nothing more per step)."""
        if self.n_out == 0:
            return 1 << 62
        if version > 0:
            self.acks(version, timeout, True)
            return self.least
        with nogil:
            (<SlotChannel>self.channel)._pump()  # the words messages feed: fresh
            self.read_least_ack()
        return self.least

    cdef int count(self, int64_t version, int min_count, double timeout) except -1:
        """Until at least `min_count` in-neighbours published exactly `version`
        (backup workers); how many had when the wait ended."""
        cdef int r = 0
        cdef int got = 0
        _check_version(version)
        if not 0 <= min_count <= self.n_in:
            raise ConfigError(f"min_count {min_count} outside 0..{self.n_in}")
        with nogil:
            asap_watchdog_waiting(b"the notify", version, self.in_desc)
            r = self._count(version, version % self.depth, min_count, timeout, &got)
            asap_watchdog_waiting(NULL, 0, NULL)
        if r:
            self.raise_timeout(f"the notify of version {version} (at least {min_count} "
                               f"of {self.n_in})", self.n_in, self._in, timeout)
        return got

    cdef int _count(self, int64_t version, Py_ssize_t slot, int min_count,
                    double timeout, int *got) except -1 nogil:
        cdef long polls = 0
        cdef double t0 = asap_now()
        cdef int i
        for i in range(self.n_in):
            self.offs[i] = self.off_notify + 8 * (i * self.depth + slot)
            self.expected[i] = version
        while True:
            (<SlotChannel>self.channel)._pump()
            (<SlotChannel>self.channel)._sync()
            got[0] = 0
            for i in range(self.n_in):
                if asap_load_i64(self.base + self.offs[i]) == version:
                    got[0] += 1
            if got[0] >= min_count:
                return 0
            if self.idle(&polls, t0, timeout, self.pump_progresses):
                return 1

    cdef int user_words(self, disps, int64_t at_least, double timeout,
                        from_ranks) except -1:
        """Until the local word at each of `disps` (checked by the caller), read
        atomically, is >= `at_least`; NeighbourTimeoutError names the `from_ranks`
        (one per word: who writes it) whose words lag."""
        cdef int n = len(disps)
        cdef int most = max(self.n_in, self.n_out, self.n_user, 1)
        cdef int i, r
        cdef int *who
        if len(from_ranks) != n or not 1 <= n <= most:
            raise ConfigError(f"wait_words takes 1 to {most} words, one writer rank "
                              f"each; got {n} words and {len(from_ranks)} ranks")
        for i in range(n):
            self.offs[i] = disps[i]
            self.expected[i] = at_least
        with nogil:
            r = self.local(n, True, timeout)
        if r:
            who = <int *>calloc(n, sizeof(int))
            if who == NULL:
                raise MemoryError()
            try:
                for i in range(n):
                    who[i] = from_ranks[i]
                what = (f"word at offset {disps[0]} to reach {at_least}" if n == 1
                        else f"words to reach {at_least}")
                self.raise_timeout(what, n, who, timeout, True)
            finally:
                free(who)
        return 0

    cdef int published(self, str what, double timeout) except -1:
        """Until every reader of this rank's board row has it as last published (the
        row's words by message); NeighbourTimeoutError names the readers that have not
        taken it (`what`: the word, for the error)."""
        cdef long polls = 0
        cdef double t0 = asap_now()
        cdef int r = 0
        with nogil:
            while True:
                (<SlotChannel>self.channel)._pump()
                if self.words.published():
                    break
                if self.idle(&polls, t0, timeout, self.pump_progresses):
                    r = 1
                    break
        if r:
            late = self.words.unpublished()
            if late:
                raise NeighbourTimeoutError(self.rank, what, late, [], [], timeout)
        return 0

    cdef object newest_versions(self, int64_t at_most):
        """Per in-neighbour, the newest version <= at_most whose write completed (its
        notify word, read atomically over all `depth` slots); 0 if none."""
        cdef int i, s
        cdef int64_t best, word
        out = np.zeros(self.n_in, dtype=np.int64)
        cdef int64_t[::1] o = out
        with nogil:
            (<SlotChannel>self.channel)._pump()
            for i in range(self.n_in):
                best = 0
                for s in range(self.depth):
                    word = self.words.own(self.off_notify + 8 * (i * self.depth + s))
                    if best < word <= at_most:
                        best = word
                o[i] = best
        return out

    cdef object newest(self, int64_t at_most, int64_t at_least, double timeout):
        """Until every in-neighbour has a completed version in [at_least, at_most]
        (Hop's bounded staleness); the newest such version per in-neighbour."""
        cdef long polls = 0
        cdef double t0 = asap_now()
        cdef bint done
        while True:
            versions = self.newest_versions(at_most)
            if self.n_in == 0 or versions.min() >= at_least:
                return versions
            with nogil:
                done = self.idle(&polls, t0, timeout)
            if done:
                late = [i for i in range(self.n_in) if versions[i] < at_least]
                raise NeighbourTimeoutError(
                    self.rank, f"an update of version >= {at_least}",
                    [self._in[i] for i in late], [at_least] * len(late),
                    [int(versions[i]) for i in late], timeout)
