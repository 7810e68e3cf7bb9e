# The memory of one channel (included by slotwin.pyx after the words; docs/ARCHITECTURE.md):
# where its slots and words live, and what that memory needs of MPI over its life.
#
#   WindowMemory   an MPI_Win_allocate window (put, shared): other ranks write it
#                  one-sidedly; its words are OneSidedWords; every process's MPI call
#                  may drive its progress, and a wait pokes it (a flush to itself)
#   MessageMemory  MPI_Alloc_mem'd (messages, mailbox, newest, push): every word in it
#                  is written by this process, from the messages its channel took, so
#                  no window exists whose progress every MPI call of the process would
#                  also drive (Open MPI's osc ucx polls a UCX worker of its own per call
#                  while a window lives)
#
# A channel chooses its memory in its __cinit__ (SlotChannel makes a WindowMemory, a
# message channel replaces it with a MessageMemory) before any communication, and
# owns it for its life; the channel's base calls these methods and tests nothing about
# which kind it has.


cdef class Memory:
    """`total` bytes at `base` (a cache line aligned), zeroed at creation: one
    channel's slots and words.  The base of WindowMemory and MessageMemory."""

    cdef char *base
    cdef Py_ssize_t total
    cdef readonly str model         # the MPI memory model, for doctor and the tests

    cdef Words make_words(self):
        """The words a channel on this memory gets unless it makes its own."""
        return Words()

    cdef int allocate(self, MPI_Comm comm, Py_ssize_t total) except -1 nogil:
        """Collective over `comm`: the memory, `total` bytes."""
        return 0

    cdef int check(self, SlotStore store) except -1:
        """Once allocated (not yet zeroed): ConfigError if the memory cannot serve
        (the caller frees it); the store's barrier for this memory."""
        return 0

    cdef int bind(self, Words words, str transport) except -1:
        """The words' side of this memory (base and arrays are bound by the channel)."""
        return 0

    cdef int open(self) except -1 nogil:
        """Once the words are bound, before the channel's first access epoch."""
        return 0

    cdef int progress(self, int rank) except -1 nogil:
        """Poke MPI so that what others do to this memory completes (in every wait)."""
        return 0

    cdef int close(self, Words words) except -1 nogil:
        """At free() (collective, after the channel drained): the memory goes."""
        return 0

    cdef int leave(self, _Leftover lo) except -1:
        """The channel dies without a finished free(): memory that a request in flight
        may still touch goes to `lo`."""
        return 0


cdef class WindowMemory(Memory):
    """An MPI_Win_allocate window in MPI_WIN_UNIFIED, locked for all ranks
    (MPI_Win_lock_all, MPI_MODE_NOCHECK) from open() to close()."""

    cdef MPI_Win win
    cdef bint locked
    cdef double timeout             # the watchdog's limit around a flush
    cdef char what[64]              # the rank a flush waits for, for the watchdog

    def __cinit__(self):
        self.win = MPI_WIN_NULL

    cdef Words make_words(self):
        return OneSidedWords()

    cdef int allocate(self, MPI_Comm comm, Py_ssize_t total) except -1 nogil:
        cdef MPI_Info info = MPI_INFO_NULL
        self.total = total
        CHKERR(MPI_Info_create(&info), "MPI_Info_create")
        CHKERR(MPI_Info_set(info, b"same_disp_unit", b"true"), "MPI_Info_set")
        CHKERR(MPI_Win_allocate(total, 1, info, comm, &self.base, &self.win),
               "MPI_Win_allocate")
        return CHKERR(MPI_Info_free(&info), "MPI_Info_free")

    cdef int check(self, SlotStore store) except -1:
        cdef int flag = 0
        cdef int *model = NULL
        with nogil:
            CHKERR(MPI_Win_set_errhandler(self.win, MPI_ERRORS_RETURN),
                   "MPI_Win_set_errhandler")
            CHKERR(MPI_Win_get_attr(self.win, MPI_WIN_MODEL, &model, &flag),
                   "MPI_Win_get_attr")
        if not flag or model == NULL or model[0] != MPI_WIN_UNIFIED:
            raise ConfigError("this MPI gives a separate (not unified) memory model "
                              "for RMA windows; asapmpi needs MPI_WIN_UNIFIED")
        self.model = "MPI_WIN_UNIFIED"
        store.sync = _sync_window
        store.sync_ctx = &self.win
        return 0

    cdef int bind(self, Words words, str transport) except -1:
        self.timeout = words.timeout
        return (<OneSidedWords>words).bound(self.win, transport)

    cdef int open(self) except -1 nogil:
        CHKERR(MPI_Win_lock_all(MPI_MODE_NOCHECK, self.win), "MPI_Win_lock_all")
        self.locked = True
        return 0

    cdef int progress(self, int rank) except -1 nogil:
        # On network paths a put into this window may only complete when this rank
        # calls into MPI; MPI_Win_sync is just a memory barrier on MPICH: a flush to
        # itself pokes the engine
        return CHKERR(MPI_Win_flush(rank, self.win), "MPI_Win_flush")

    cdef int close(self, Words words) except -1 nogil:
        if self.locked:
            self.locked = False
            CHKERR(MPI_Win_unlock_all(self.win), "MPI_Win_unlock_all")
        if self.win != MPI_WIN_NULL:
            CHKERR(MPI_Win_free(&self.win), "MPI_Win_free")
            words.flushed()         # completed: its words' memory may go
        self.base = NULL
        return 0

    cdef int flush_all(self, Words words, const char *what, int64_t version,
                       const char *ranks, const char *nbr_desc) except -1 nogil:
        """MPI_Win_flush_all under the watchdog (a flush cannot time out; the watchdog
        ends the job if it outlives the timeout), which also completes the words'
        lazy notifies and acks (then the watchdog names every neighbour)."""
        cdef int ierr
        if words.lazy():
            ranks = nbr_desc
        asap_watchdog_arm(self.timeout, what, version, ranks)
        ierr = MPI_Win_flush_all(self.win)
        asap_watchdog_disarm()
        CHKERR(ierr, "MPI_Win_flush_all")
        words.flushed()
        return 0

    cdef int flush(self, int target, const char *what) except -1 nogil:
        """MPI_Win_flush to `target` under the watchdog; `what` names the operation."""
        cdef int ierr
        snprintf(self.what, sizeof(self.what), "%d", target)
        asap_watchdog_arm(self.timeout, what, -1, self.what)
        ierr = MPI_Win_flush(target, self.win)
        asap_watchdog_disarm()
        return CHKERR(ierr, "MPI_Win_flush")

    cdef int transfer(self, char *local, Py_ssize_t n, int target, MPI_Aint disp,
                      bint get, Py_ssize_t most) except -1 nogil:
        """`n` bytes put to (or got from) `target` at `disp`, in pieces of at most
        `most` (the channel's max_transfer): MPI counts are int, and MPICH's
        active-message RMA crashes on large pieces."""
        cdef Py_ssize_t done = 0
        cdef int chunk
        while done < n:
            chunk = <int>(n - done if n - done < most else most)
            if get:
                CHKERR(MPI_Get(local + done, chunk, MPI_BYTE, target, disp + done, chunk,
                               MPI_BYTE, self.win), "MPI_Get")
            else:
                CHKERR(MPI_Put(local + done, chunk, MPI_BYTE, target, disp + done, chunk,
                               MPI_BYTE, self.win), "MPI_Put")
            done += chunk
        return 0


cdef class MessageMemory(Memory):
    """MPI_Alloc_mem'd memory (messages land in it; nothing reaches it one-sidedly),
    64 bytes more than asked, so that base starts a cache line as the layout assumes
    (MPI_Alloc_mem promises no alignment; malloc's is 16)."""

    cdef char *alloc_base           # what MPI_Alloc_mem returned

    def __cinit__(self):
        self.model = "none (messages only: no MPI window)"

    cdef int allocate(self, MPI_Comm comm, Py_ssize_t total) except -1 nogil:
        self.total = total
        CHKERR(MPI_Alloc_mem(total + CACHE_LINE, MPI_INFO_NULL, &self.alloc_base),
               "MPI_Alloc_mem")
        self.base = <char *>((<uintptr_t>self.alloc_base + CACHE_LINE - 1)
                             & ~(<uintptr_t>CACHE_LINE - 1))
        return 0

    cdef int close(self, Words words) except -1 nogil:
        if self.alloc_base != NULL:
            CHKERR(MPI_Free_mem(self.alloc_base), "MPI_Free_mem")
        self.base = self.alloc_base = NULL
        return 0

    cdef int leave(self, _Leftover lo) except -1:
        if self.alloc_base != NULL:
            lo.mpi_mem = self.alloc_base    # the slots a posted receive may target
            self.alloc_base = self.base = NULL
        return 0
