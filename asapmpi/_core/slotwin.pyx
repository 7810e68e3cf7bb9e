# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The slot window: per-sender receive slots in one MPI_Win_allocate window.

See asapmpi/_core/layout.py for the byte layout and docs/PROTOCOL.md for the call
sequence and why it is correct.  This module knows MPI and memory only: which ranks are
neighbours and at which displacements their slots live is computed by the caller.
"""
from cpython.ref cimport PyObject
from cpython.exc cimport PyErr_CheckSignals
from cpython.buffer cimport (PyObject_GetBuffer, PyBuffer_Release, PyBUF_ANY_CONTIGUOUS,
                            PyBUF_WRITABLE, PyBUF_SIMPLE)
from libc.stdint cimport int64_t, uint16_t, uint64_t, uintptr_t, INT64_MAX
from libc.stdlib cimport malloc, free, calloc, realloc
from libc.stdio cimport fprintf, fflush, snprintf, stderr
from libc.string cimport memset, memcpy, strncpy
from mpi4py.libmpi cimport *
from mpi4py cimport MPI

import numpy as np

from asapmpi.errors import ConfigError, FreedError, NeighbourTimeoutError, ProtocolError
from asapmpi._core import layout as _layout

include "chkerr.pxi"

# What a channel's await_() waits for (asapmpi.sync.Await: the same numbers, in the
# order of AWAIT_MODES)
cdef enum:
    AWAIT_EXACT = 0
    AWAIT_AT_LEAST = 1
    AWAIT_COUNT = 2
    AWAIT_NEWEST = 3
    AWAIT_RELEASED = 4
    AWAIT_BARRIER = 5

#: the await modes by number (asapmpi.sync.Await names them alike)
AWAIT_MODES = ("exact", "at_least", "count", "newest", "released", "barrier")

cdef extern from "watchdog.h" nogil:
    int asap_watchdog_start()
    void asap_watchdog_arm(double seconds, const char *call, long long version,
                           const char *ranks)
    void asap_watchdog_disarm()
    void asap_watchdog_arm_exit(double seconds, const char *call, int exit_code)
    void asap_watchdog_waiting(const char *what, long long version, const char *ranks)
    ctypedef struct asap_watchdog_t:
        const char *wait_what
        long long wait_version
        const char *wait_ranks
    asap_watchdog_t asap_wd

cdef extern from "ucx_teardown.h" nogil:
    int asap_ucx_quiet_teardown()
    int asap_ucx_leaked

# Status of one input of a reduce, as counted in `stats`.
cpdef enum:
    CONSISTENT = 0   # header == footer == expected version
    TORN = 1         # header != footer, or the slot changed (or failed its checksum) while read
    STALE = 2        # complete, but older than expected (0 = never written)
    AHEAD = 3        # complete, but newer than expected
STATUS_NAMES = ("consistent", "torn", "stale", "ahead")

cdef enum:
    N_STATUS = 4
    MAX_PUT_CHUNK = 1 << 30
    LAZY_WORDS = 16
    HEADER_BYTES = 64
    CACHE_LINE = 64                 # every region of a window starts on one (layout.py)
    # message transport: tags are versions modulo this (MPI guarantees tags up to 32767;
    # NOTIFY-ACK keeps a sender within one version of its receiver)
    TAG_MODULUS = 32768
    # write_words: the most words one call writes (a mailbox sends them as one message)
    WRITE_WORDS_MAX = 6

#: the most words of a board's row (SlotWindow.set_row: one word message carries it)
ROW_WORDS_MAX = WRITE_WORDS_MAX

# The windows of this process holding lazy notifies or acks (OneSidedWords._lazy).  A rank
# waiting on one window completes the pending words of every other first: an MPI may
# defer even issuing them until a synchronization call (Open MPI's osc pt2pt does), and
# a neighbour could be waiting for one of them while this rank waits on another window
# (two exchanges, the transport probe's two windows).  One thread drives MPI.
cdef enum:
    MAX_PENDING = 64
cdef MPI_Win *_pending_win[MAX_PENDING]
cdef int *_pending_n[MAX_PENDING]
cdef int _n_pending = 0
# The mailboxes of this process (mailbox.pxi, newest.pxi), whose held-back tokens and
# waiting updates _settle_all sends like the lazy words of the one-sided windows
# (borrowed references: a window leaves the list at its drain and in its destructor).
cdef PyObject *_mailbox_win[MAX_PENDING]
cdef int _n_mailbox = 0


cdef void _note_pending(MPI_Win *win, int *n) noexcept nogil:
    global _n_pending
    cdef int i
    for i in range(_n_pending):
        if _pending_win[i] == win:
            return
    if _n_pending < MAX_PENDING:      # else the window's own waits still complete them
        _pending_win[_n_pending] = win
        _pending_n[_n_pending] = n
        _n_pending += 1


cdef void _forget_pending(MPI_Win *win) noexcept nogil:
    global _n_pending
    cdef int i
    for i in range(_n_pending):
        if _pending_win[i] == win:
            _n_pending -= 1
            _pending_win[i] = _pending_win[_n_pending]
            _pending_n[i] = _pending_n[_n_pending]
            return


cdef int _settle_all(double timeout, bint deliver=True,
                     PyObject *pumped=NULL) except -1 nogil:
    """Complete the lazy words of every window of this process (MPI_Win_flush_all),
    and send the tokens and updates its mailboxes hold back: with `deliver`, all of
    them (before waiting outside the windows); else those whose channel is free (in a
    window's own wait, which must not wait for a slow reader; that window, `pumped`,
    pumps itself)."""
    global _n_pending
    cdef int ierr
    _settle_mailboxes(timeout, deliver, pumped)
    while _n_pending:
        _n_pending -= 1
        if _pending_n[_n_pending][0]:
            asap_watchdog_arm(timeout, b"MPI_Win_flush_all of its notifies and acks", -1,
                              b"its neighbours")
            ierr = MPI_Win_flush_all(_pending_win[_n_pending][0])
            asap_watchdog_disarm()
            _pending_n[_n_pending][0] = 0
            CHKERR(ierr, "MPI_Win_flush_all")
    return 0


def settle_all(double timeout=60.0):
    """Complete the pending notifies and acks of every slot window of this process and
    send the tokens and updates its mailboxes hold back, before waiting outside them
    (asapmpi's collectives call it); then free what dropped windows left behind and MPI
    has completed since."""
    with nogil:
        _settle_all(timeout)
    _reap_leftovers()


def bound_the_exit(double seconds, int exit_code):
    """This process's last MPI call (MPI_Finalize, at exit) may take at most `seconds`:
    past them the watchdog ends the process alone, with `exit_code` and a line on
    stderr (after surviving a failure, Open MPI's closing fence may wait for the dead
    rank).  Call it only when nothing is left to do but MPI_Finalize."""
    if asap_watchdog_start() != 0:
        raise OSError("asapmpi could not start its watchdog thread")
    asap_watchdog_arm_exit(seconds, b"MPI_Finalize after surviving a failure "
                           b"(Open MPI's closing fence may wait for the dead rank)",
                           exit_code)


def release_all():
    """One poll of a wait outside this process's slot windows (asapmpi's collectives
    call it between their polls, after settle_all): what its mailboxes hold back and
    may send now leaves (a token whose predecessor's send completed, the newest version
    for a channel that has a free request).  Never waits."""
    with nogil:
        _release_mailboxes()


cdef class Watched:
    """``with Watched(seconds, call, ranks):`` around an MPI call outside the windows
    that cannot time out (a flush of asapmpi.collectives.flush): the watchdog ends the
    job with a line naming `call` and `ranks` once it has lasted `seconds`, as around
    the windows' own flushes (watchdog.h).  Not nested: one armed call per process."""

    cdef double seconds
    cdef bytes call, ranks

    def __cinit__(self, double seconds, str call, str ranks):
        self.seconds = seconds
        # the watchdog reads both while armed: they live as long as this object
        self.call = call.encode()
        self.ranks = ranks.encode()

    def __enter__(self):
        if asap_watchdog_start() != 0:
            raise OSError("asapmpi could not start its watchdog thread")
        asap_watchdog_arm(self.seconds, self.call, -1, self.ranks)
        return self

    def __exit__(self, kind, value, traceback):
        asap_watchdog_disarm()
        return False


# ------------------------------------------------------------------ leftovers
# A window dropped without a finished free() (collected after an exception left its
# Exchange, or a free() whose drain failed) may still have receives posted into its
# buffers and sends reading them: a neighbour that still steps would then write into
# freed heap.  Its receives are cancelled and its requests, with every buffer they
# touch, are kept here until MPI completes them (tested at every window's creation and
# free() and at settle_all()); what never completes is leaked, never freed under MPI.

cdef class _Leftover:
    """The requests a window left in flight and the memory they read or write."""

    cdef MPI_Request *reqs
    cdef int n_reqs, cap_reqs
    cdef void **mem                 # malloc'd: free()d once every request completed
    cdef int n_mem, cap_mem
    cdef char *mpi_mem              # MPI_Alloc_mem'd: MPI_Free_mem'd then
    cdef list kept                  # buffers a caller lent (views held): dropped then
    cdef readonly str transport
    # a window abandoned after a process failure: a receive that cannot be cancelled
    # (its communicator revoked) is kept as it is, not an error
    cdef bint after_failure

    def __cinit__(self, str transport):
        self.transport = transport

    def __dealloc__(self):
        # only reached once done() released everything (or at exit, when it leaks)
        free(self.reqs)
        free(self.mem)

    cdef int add(self, MPI_Request *req, bint cancel) except -1 nogil:
        """Take request `req` (set to MPI_REQUEST_NULL in its owner); a receive is
        cancelled first: no message must land once its owner is gone."""
        cdef MPI_Request *grown
        if req[0] == MPI_REQUEST_NULL:
            return 0
        if cancel:
            if self.after_failure:
                MPI_Cancel(req)
            else:
                CHKERR(MPI_Cancel(req), "MPI_Cancel")
        if self.n_reqs == self.cap_reqs:
            grown = <MPI_Request *>realloc(self.reqs, (2 * self.cap_reqs + 8)
                                           * sizeof(MPI_Request))
            if grown == NULL:
                with gil:
                    raise MemoryError()
            self.reqs = grown
            self.cap_reqs = 2 * self.cap_reqs + 8
        self.reqs[self.n_reqs] = req[0]
        self.n_reqs += 1
        req[0] = MPI_REQUEST_NULL
        return 0

    cdef int add_all(self, MPI_Request *reqs, int n, bint cancel) except -1 nogil:
        cdef int k
        if reqs != NULL:
            for k in range(n):
                self.add(&reqs[k], cancel)
        return 0

    cdef int own(self, void *p) except -1 nogil:
        """Free `p` (malloc'd) once every request completed."""
        cdef void **grown
        if p == NULL:
            return 0
        if self.n_mem == self.cap_mem:
            grown = <void **>realloc(self.mem, (2 * self.cap_mem + 8) * sizeof(void *))
            if grown == NULL:
                with gil:
                    raise MemoryError()
            self.mem = grown
            self.cap_mem = 2 * self.cap_mem + 8
        self.mem[self.n_mem] = p
        self.n_mem += 1
        return 0

    cdef int keep(self, object view) except -1:
        """Hold `view` (an exported buffer a request reads) until every request
        completed."""
        if self.kept is None:
            self.kept = []
        self.kept.append(view)
        return 0

    cdef int pending(self) noexcept nogil:
        cdef int k, n = 0
        for k in range(self.n_reqs):
            if self.reqs[k] != MPI_REQUEST_NULL:
                n += 1
        return n

    cdef bint done(self) except -1:
        """Test every request; once all completed, free the memory: True."""
        cdef int k, flag = 0
        cdef int finalized = 0
        MPI_Finalized(&finalized)
        if finalized:
            return False
        with nogil:
            for k in range(self.n_reqs):
                if self.reqs[k] != MPI_REQUEST_NULL:
                    # an error is the request's, not ours: one whose peer died (ULFM)
                    # completes in error (its handle freed), or stays pending, and then
                    # its memory stays with it for the life of the process
                    MPI_Test(&self.reqs[k], &flag, MPI_STATUS_IGNORE)
            if self.pending():
                return False
            for k in range(self.n_mem):
                free(self.mem[k])
            self.n_mem = 0
            if self.mpi_mem != NULL:
                CHKERR(MPI_Free_mem(self.mpi_mem), "MPI_Free_mem")
                self.mpi_mem = NULL
        self.kept = None
        return True


cdef list _leftovers = []


cdef int _reap_leftovers() except -1:
    global _leftovers
    if _leftovers:
        _leftovers = [lo for lo in _leftovers if not (<_Leftover>lo).done()]
    return 0


def leftovers():
    """What windows dropped without a finished free() still have in flight: a list of
    (transport, requests not yet completed), after testing them all (and freeing the
    memory of those that completed)."""
    _reap_leftovers()
    return [(lo.transport, (<_Leftover>lo).pending()) for lo in (_leftovers or [])]


# What a window's one-sided words may still read and write once the window was dropped
# without a finished free(): the notifies and acks issued lazily (OneSidedWords._lazy)
# and not yet flushed.  An MPI_Fetch_and_op has no request: nothing tells when it
# completes short of a flush, which a destructor must not issue (it can block on a dead
# rank, and on an active-message path completes only once every target entered MPI).  So
# their block, origin and result words, is kept here for the life of the process, never
# freed (OneSidedWords.__dealloc__), and counted for kept_words().  Small: 8 bytes per
# word, LAZY_WORDS * (1 + max(n_in, n_out)) words per window.
cdef void **_kept_mem = NULL        # the blocks (held, so that they stay reachable)
cdef int _n_kept_mem = 0, _cap_kept_mem = 0
cdef list _kept = []                # per block: (transport, words in flight, bytes)


cdef void _keep_words(void *block, size_t nbytes, int words, str transport) noexcept:
    # from a destructor: never raises; a block that cannot be listed is still never freed
    global _kept_mem, _cap_kept_mem, _n_kept_mem
    cdef void **grown
    if _n_kept_mem == _cap_kept_mem:
        grown = <void **>realloc(_kept_mem, (2 * _cap_kept_mem + 8) * sizeof(void *))
        if grown != NULL:
            _kept_mem = grown
            _cap_kept_mem = 2 * _cap_kept_mem + 8
    if _n_kept_mem < _cap_kept_mem:
        _kept_mem[_n_kept_mem] = block
        _n_kept_mem += 1
    if _kept is not None:
        try:
            _kept.append((transport, words, nbytes))
        except MemoryError:
            pass


def kept_words():
    """The memory that one-sided windows (put, shared) dropped without a finished
    free() left to their notifies and acks still in flight, kept for the life of the
    process (never freed: MPI may still read and write it, and nothing tells when it is
    done): a list of (transport, words issued and not flushed, bytes kept), one entry
    per window."""
    return list(_kept or [])


cdef int64_t MAGIC = _layout.MAGIC
cdef int64_t LAYOUT_VERSION = _layout.LAYOUT_VERSION
assert _layout.HEADER_BYTES == HEADER_BYTES, "layout.py and slotwin.pyx disagree on the header size"
assert _layout.CACHE_LINE == CACHE_LINE, "layout.py and slotwin.pyx disagree on the alignment"


# A process that creates a window has an attribute on MPI_COMM_SELF whose delete
# callback runs first in MPI_Finalize.  It says which windows were never freed (a
# program that forgot free() otherwise sees only its MPI's own complaints about
# them: UCX's "was not returned to mpool", nothing from asapmpi, whose ResourceWarning
# Python hides by default).  And Open MPI's osc ucx prints a UCX ERROR and WARN for
# each endpoint that a faster peer disconnected while it still closed it inside
# MPI_Finalize (a race in osc ucx's own teardown, after every window is freed;
# ucx_teardown.h): the callback filters out exactly those messages (a no-op without
# UCX).
cdef int _finalize_keyval = MPI_KEYVAL_INVALID
cdef int _n_open = 0                # windows created and not yet freed or dropped


cdef void _say_unfreed(const char *when) noexcept nogil:
    # One line per process, however many windows (an Exchange has several: its slots,
    # its join board): the first dropped or still open says it, the rest are counted
    # in it only.  It also tells the UCX log filter that the registrations UCX will
    # find unreleased at MPI_Finalize are these (ucx_teardown.h).
    global asap_ucx_leaked
    cdef int rank = -1, finalized = 1
    if asap_ucx_leaked:
        return
    asap_ucx_leaked = 1
    MPI_Finalized(&finalized)
    if not finalized:
        MPI_Comm_rank(MPI_COMM_WORLD, &rank)
    fprintf(stderr, b"asapmpi: rank %d: an Exchange was %s without free(); call free() "
            b"on every Exchange (or DecentralizedOptimizer) on every rank, or use it in "
            b"a with block\n", rank, when)
    fflush(stderr)


cdef int _at_finalize(MPI_Comm comm, int keyval, void *value, void *extra) noexcept nogil:
    if _n_open > 0:
        _say_unfreed(b"still open at MPI_Finalize")
    asap_ucx_quiet_teardown()
    return MPI_SUCCESS


cdef int _watch_finalize() except -1 nogil:
    global _finalize_keyval
    if _finalize_keyval != MPI_KEYVAL_INVALID:
        return 0
    CHKERR(MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, _at_finalize, &_finalize_keyval,
                                  NULL), "MPI_Comm_create_keyval")
    return CHKERR(MPI_Comm_set_attr(MPI_COMM_SELF, _finalize_keyval, NULL),
                  "MPI_Comm_set_attr")


include "slotstore.pxi"
include "words.pxi"
include "memory.pxi"
include "waits.pxi"
include "collectives.pxi"
include "reads.pxi"


# Interrupts (Ctrl-C, or a signal the launcher forwards).  CPython's handler only notes a
# signal; the exception is raised when the main thread runs Python again, which a wait
# in the core (nogil, until its timeout: tens of seconds) does not.  So a wait that has
# lasted SIGNAL_CHECK_S looks, at most once per SIGNAL_CHECK_S, for a pending signal
# (PyErr_CheckSignals, with the GIL taken for that moment): Ctrl-C ends a waiting rank
# within about that long.  Never in a wait shorter than that, nor on the fast path: a
# step that does not wait never takes the GIL for it, and a short one never waits for it
# behind another Python thread.
cdef double SIGNAL_CHECK_S = 0.1
cdef double _signals_checked = 0.0


cdef int _check_signals(double now) except -1 nogil:
    """Run the Python handlers of the signals that arrived during a wait: a
    KeyboardInterrupt (or whatever a handler raises) propagates out of the wait, with a
    note saying what the wait was for when the watchdog knows it."""
    global _signals_checked
    _signals_checked = now
    with gil:
        try:
            PyErr_CheckSignals()
        except BaseException as exc:
            if asap_wd.wait_what != NULL:
                # a note as Python 3.11's add_note keeps it (set by hand: 3.9 and 3.10)
                exc.__notes__ = list(getattr(exc, "__notes__", ())) + [
                    f"asapmpi: interrupted waiting for {asap_wd.wait_what.decode()} of "
                    f"version {asap_wd.wait_version} from rank(s) "
                    f"{asap_wd.wait_ranks.decode()}"]
            # the wait ends here, not at its usual end: no crash report may name it
            asap_watchdog_waiting(NULL, 0, NULL)
            raise
    return 0


cdef class SlotChannel:
    """One rank's channel, built from its parts: its memory (`mem`, memory.pxi: an MPI
    window or message memory) holds the slots and words; its words (`words`,
    words.pxi) carry the notifies, acks, tokens and user words the transport's way; its
    waits (`waits`, waits.pxi) poll them with the channel's progress and a deadline;
    its collectives (`coll`, collectives.pxi) are the barrier and allgather on its
    communicator; its slot store (`store`, slotstore.pxi) verifies and reduces what the
    transport brought, pointed at the slots by its reader (`reader`, reads.pxi).  This
    class makes and binds them, and frees them (collective over `comm` on creation and
    on free()); SlotWindow adds the calls a policy makes.

    A transport is a subclass of SlotWindow (one file each, included below): PutWindow
    (put.pxi), SharedWindow (shared.pxi), MessageWindow (messages.pxi), MailboxWindow
    (mailbox.pxi), NewestWindow (newest.pxi) and PushWindow (push.pxi).  It chooses its
    memory (in __cinit__) and words (_make_words), moves updates into the slots (_send,
    or its own calls), says where a slot is (_slot, _point), drives its progress
    (_pump, _progress) and drains what is in flight before the window is freed
    (_drain); the parts call these hooks and nothing else of it.  A PutWindow's put()
    returns once its bytes are complete at every target (one MPI_Win_flush_all), but
    notifies and acks (put, shared) are issued lazily (OneSidedWords._lazy) and
    complete only by the next MPI_Win_flush_all of the window (the next put, or a word
    issued while LAZY_WORDS are pending), by any wait of this process once it has
    lasted poll_yields polls (Waits.settle_pending), before asapmpi's collectives
    (settle_all) and at free().
    """

    cdef MPI_Comm comm
    cdef readonly str transport     # the subclass's name: "put", "shared", ...
    cdef readonly int rank, size, n_in, n_out, depth, itemsize
    cdef readonly object dtype          # the element type: float32, float64, bfloat16, float16
    cdef readonly Py_ssize_t nbytes, payload_stride, slot_stride, total_bytes
    cdef Py_ssize_t off_notify, off_ack, off_user, off_slots, off_publish
    cdef int n_user                 # user words in this rank's window
    cdef char *base                 # the memory's (mem.base), for the slots' addresses
    cdef bint _freed
    cdef bint _left                 # its requests and their memory went to _leftovers
    cdef bint _counted              # counted in _n_open
    cdef Py_ssize_t _exports
    cdef readonly double flush_timeout
    cdef char out_desc[256]
    cdef char in_desc[256]
    # in- and out-neighbours: whom a flush_all waits for while acks are pending
    cdef char nbr_desc[256]
    cdef MPI_Aint *sizes
    cdef int *_in
    cdef int *_out
    cdef MPI_Aint *out_slot_disp
    cdef MPI_Aint *out_notify_disp
    cdef MPI_Aint *in_ack_disp
    # the parts (the class's docstring)
    cdef Memory mem
    cdef Words words
    cdef Waits waits
    cdef Collectives coll
    cdef SlotReader reader
    cdef readonly SlotStore store
    # The channel moves gossip's models by the sender's push (push, take, release:
    # PushWindow) rather than by the reader's pull of what the sender published
    # (publish, pull: PutWindow).  A capability, read by the gossip policy
    cdef readonly bint pushes
    # The writer's discipline the channel verbs follow.  waits_for_release (the
    # policy's Reads.EXACT): a deliver(k) waits until every reader released k - 1.
    # releases (those, and a policy that awaits RELEASED: Hop's tokens): release(k) is
    # what a writer waits for (an ack where the writer reads a window word, a token on
    # a mailbox); else release(k) only hands the slots back (a mailbox's receives).
    # ordered (those, and a policy whose protocol keeps readers off a slot while it is
    # written: Policy.ordered_writes): deliver writes header, payload and footer in
    # one order with one flush; else in the seqlock order, for a reader that may
    # overlap the write
    cdef readonly bint waits_for_release
    cdef readonly bint releases
    cdef readonly bint ordered
    # deliver() publishes each version in the readers' notify words (else its readers
    # never await it: async, BSP, whose reduce reads what the slots hold)
    cdef readonly bint notifies
    cdef Py_ssize_t _max_transfer
    cdef int *skip                  # per out-neighbour: left out of this deliver
    cdef readonly long long suppressed
    # traffic, for training reports: payload bytes put (headers, footers and control
    # words excluded)
    cdef readonly long long bytes_put, bytes_got
    cdef readonly bint abandoned

    def __cinit__(self):
        self.comm = MPI_COMM_NULL
        self._freed = True
        self.transport = "none"
        self.mem = WindowMemory()       # a message channel's __cinit__ replaces it
        self.waits = Waits()
        self.waits.channel = <void *>self
        self.coll = Collectives()
        self.coll.waits = self.waits
        self.reader = SlotReader()
        self.reader.channel = <void *>self

    def __init__(self, MPI.Comm comm not None, layout, in_ranks, out_ranks, out_slot_disp,
                 out_notify_disp, in_ack_disp, dtype, int poll_yields=32,
                 int poll_max_sleep_us=100, double flush_timeout=60.0, long poll_slack_ns=0,
                 bint waits_for_release=False, bint notifies=True, bint releases=False,
                 bint ordered=False):
        cdef int i
        cdef MPI_Aint my_size
        if type(self) is SlotWindow or type(self) is SlotChannel:
            raise TypeError("SlotWindow is the transports' common base: create a "
                            "PutWindow, SharedWindow, MessageWindow, MailboxWindow, "
                            "NewestWindow or PushWindow")
        self.n_in = layout.n_in
        self.n_out = layout.n_out
        self.depth = layout.depth
        self.waits_for_release = waits_for_release
        # a writer that waits for its readers waits for their releases, and writes
        # only slots they released
        self.releases = releases or waits_for_release
        self.ordered = ordered or waits_for_release
        self.notifies = notifies
        self.nbytes = layout.nbytes
        self.itemsize = element(dtype)[0]
        self.dtype = dtype
        self.payload_stride = layout.payload_stride
        self.slot_stride = layout.slot_stride
        self.total_bytes = layout.total
        self.off_notify = layout.off_notify
        self.off_ack = layout.off_ack
        self.off_user = layout.off_user
        self.n_user = layout.n_user
        self.off_slots = layout.off_slots
        self.off_publish = layout.off_publish
        if poll_slack_ns < 0:
            raise ConfigError(f"poll_slack_ns must be >= 0 (0: the thread's own), got "
                              f"{poll_slack_ns}")
        self.waits.yields = poll_yields
        self.waits.max_sleep_us = poll_max_sleep_us
        self.waits.slack_ns = poll_slack_ns
        self._max_transfer = MAX_PUT_CHUNK
        if not flush_timeout > 0:
            raise ConfigError(f"flush_timeout must be positive, got {flush_timeout}")
        self.flush_timeout = flush_timeout
        if len(in_ranks) != self.n_in or len(in_ack_disp) != self.n_in:
            raise ConfigError("in-neighbour arrays do not match the layout's n_in")
        if (len(out_ranks) != self.n_out or len(out_slot_disp) != self.n_out
                or len(out_notify_disp) != self.n_out):
            raise ConfigError("out-neighbour arrays do not match the layout's n_out")
        if self.nbytes % self.itemsize:
            raise ConfigError(f"{dtype} elements of {self.itemsize} bytes do not divide "
                              f"{self.nbytes} bytes")
        _reap_leftovers()
        self.size = comm.Get_size()
        self._alloc_arrays()
        for i in range(self.n_in):
            self._in[i] = in_ranks[i]
            self.in_ack_disp[i] = in_ack_disp[i]
        for i in range(self.n_out):
            self._out[i] = out_ranks[i]
            self.out_slot_disp[i] = out_slot_disp[i]
            self.out_notify_disp[i] = out_notify_disp[i]
        # the transport's words and its own checks and memory, before any communication
        self.words = self._make_words()
        self._prepare(layout)
        _describe(self.out_desc, out_ranks)
        _describe(self.in_desc, in_ranks)
        _describe(self.nbr_desc, sorted(set(in_ranks) | set(out_ranks)))
        if asap_watchdog_start() != 0:
            raise OSError("asapmpi could not start its watchdog thread")
        self.store = SlotStore(self.n_in, self.nbytes, self.payload_stride, dtype)

        with nogil:
            CHKERR(MPI_Comm_dup(comm.ob_mpi, &self.comm), "MPI_Comm_dup")
            CHKERR(MPI_Comm_set_errhandler(self.comm, MPI_ERRORS_RETURN),
                   "MPI_Comm_set_errhandler")
            CHKERR(MPI_Comm_rank(self.comm, &self.rank), "MPI_Comm_rank")
            CHKERR(MPI_Comm_size(self.comm, &self.size), "MPI_Comm_size")
            self.mem.allocate(self.comm, self.total_bytes)
        self.base = self.mem.base
        self._freed = False
        self._opened()
        try:
            self.mem.check(self.store)
        except ConfigError:
            self.free()         # not opened yet: free() skips what open() does
            raise
        # Version 0 everywhere means "never written".  No rank can leave the allgather
        # below before every rank entered it, so no remote write precedes these stores.
        memset(self.base, 0, self.total_bytes)
        (<int64_t *>self.base)[0] = MAGIC
        (<int64_t *>self.base)[1] = LAYOUT_VERSION
        (<int64_t *>self.base)[2] = self.n_in
        (<int64_t *>self.base)[3] = self.n_out
        (<int64_t *>self.base)[4] = self.depth
        (<int64_t *>self.base)[5] = self.nbytes
        self._bind_parts()
        with nogil:
            self.mem.open()
            self._sync()
            # every rank's window size, to bounds-check remote word offsets
            my_size = self.total_bytes
            CHKERR(MPI_Allgather(&my_size, 1, MPI_AINT, self.sizes, 1, MPI_AINT, self.comm),
                   "MPI_Allgather")
        # the transport's communicators and first receives (collective)
        self._open()

    # ------------------------------------------------------------------ transport hooks

    cdef int _prepare(self, layout) except -1:
        """Check the transport's options against the layout and allocate its memory
        (before any communication)."""
        if layout.outbox:
            raise ConfigError("an outbox layout is the shared transport's: create a "
                              "SharedWindow")
        return 0

    cdef Words _make_words(self):
        """The transport's words (before any communication): its memory's (one-sided
        atomics in a window, else local words only: a message transport whose
        messages are its notifies and acks)."""
        return self.mem.make_words()

    cdef int _bind_parts(self) except -1:
        # once the memory exists: where the words are, whom they go to
        cdef Words w = self.words
        cdef Waits waits = self.waits
        w.base = self.base
        w.rank, w.size = self.rank, self.size
        w.n_in, w.n_out, w.depth, w.n_user = self.n_in, self.n_out, self.depth, self.n_user
        w.off_notify, w.off_ack, w.off_user = self.off_notify, self.off_ack, self.off_user
        w.timeout = self.flush_timeout
        w._in, w._out = self._in, self._out
        w.out_notify_disp, w.in_ack_disp = self.out_notify_disp, self.in_ack_disp
        w.skip = self.skip
        w.nbr_desc = self.nbr_desc
        self.mem.bind(w, self.transport)
        waits.words, waits.base, waits.rank = w, self.base, self.rank
        waits.n_in, waits.n_out, waits.depth = self.n_in, self.n_out, self.depth
        waits.n_user = self.n_user
        waits.off_notify, waits.off_ack = self.off_notify, self.off_ack
        waits._in, waits._out = self._in, self._out
        waits.in_desc, waits.out_desc = self.in_desc, self.out_desc
        waits.settle_timeout = self.flush_timeout
        self.coll.comm, self.coll.rank, self.coll.size = self.comm, self.rank, self.size
        self.coll.timeout = self.flush_timeout
        self.reader.store, self.reader.rank = self.store, self.rank
        self.reader.n_in, self.reader.nbytes, self.reader._in = self.n_in, self.nbytes, self._in
        return 0

    cdef int _open(self) except -1:
        """After the window exists (collective): the transport's communicators and
        first receives."""
        return 0

    cdef int _send(self, const char *src, int64_t version, int64_t iteration, bint seqlock,
                   bint checksum, bint notify, int64_t suppress_if_acked) except -1:
        """put()'s transfer of one update of nbytes at `src` (sizes checked)."""
        raise ConfigError(f"a {self.transport} window does not put(); its updates go "
                          f"through its own calls (asapmpi.transports)")

    cdef char *_slot(self, int i, Py_ssize_t slot) noexcept nogil:
        """The header of in-neighbour i's slot `slot`, where this rank reads it."""
        return self.base + self.off_slots + (i * self.depth + slot) * self.slot_stride

    cdef int _pump(self) except -1 nogil:
        """Complete what arrived for this window (messages into slots and words)."""
        return 0

    cdef int _progress(self) except -1 nogil:
        """One poll of progress in a wait: the memory's poke, and a probe of the
        communicator (a mailbox, which nothing reaches one-sidedly, pumps instead)."""
        cdef int flag = 0
        self.mem.progress(self.rank)
        return CHKERR(MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, self.comm, &flag,
                                 MPI_STATUS_IGNORE), "MPI_Iprobe")

    cdef int _sync(self) except -1 nogil:
        """Order this process's loads and stores of its memory with what MPI and other
        processes wrote there (the store's barrier, _sync_window or _fence_only)."""
        return self.store.sync(self.store.sync_ctx)

    cdef int _point(self, bint only_notified) except -1 nogil:
        # make the slots' memory visible, then point the store at each in-neighbour's
        # slot of version exp_v[i] (NULL with only_notified when its notify word is not
        # that version: its sender may be writing it)
        cdef int i
        cdef Py_ssize_t slot
        self._sync()
        for i in range(self.n_in):
            slot = self.store.exp_v[i] % self.depth
            if only_notified and asap_load_i64(
                    self.base + self.off_notify + 8 * (i * self.depth + slot)) != self.store.exp_v[i]:
                self.store.hdr[i] = NULL
            else:
                self.store.hdr[i] = self._slot(i, slot)
        return 0

    cdef int _drain(self) except -1:
        """At free() (collective, every rank came): complete or cancel what the
        transport has in flight, and free its communicators."""
        return 0

    cdef void _release(self) noexcept:
        """At the end of free(): memory the transport holds outside the window."""
        pass

    cdef int _leave(self, _Leftover lo) except -1:
        """The window dies without a finished free(): hand every request the transport
        has in flight to `lo` (receives cancelled) with the memory they read or write,
        and forget both (a subclass adds its own, then calls its base's).  The one-sided
        words' notifies and acks in flight have no request: their memory is kept by the
        words themselves (OneSidedWords.__dealloc__, kept_words())."""
        if self.mem is not None:    # a cycle's clearing may have dropped it: then leaked
            self.mem.leave(lo)
        self.base = NULL
        return 0

    cdef int _leave_behind(self, bint after_failure=False) except -1:
        # once, from the first destructor of the chain, a free() that failed or
        # abandon() (after_failure: a process of the communicator died)
        cdef _Leftover lo
        cdef int finalized = 0
        if self._left or self._freed:
            return 0
        self._left = True
        MPI_Finalized(&finalized)
        if finalized:
            return 0            # nothing is in flight once MPI is gone
        lo = _Leftover(self.transport)
        lo.after_failure = after_failure
        self._leave(lo)
        if not lo.done() and _leftovers is not None:
            _leftovers.append(lo)
        return 0

    cdef int _opened(self) except -1:
        # counted until freed or dropped: MPI_Finalize names what was never freed
        global _n_open
        if not self._counted:
            self._counted = True
            _n_open += 1
            with nogil:
                _watch_finalize()
        return 0

    cdef void _closed(self) noexcept:
        global _n_open
        if self._counted:
            self._counted = False
            _n_open -= 1

    cdef int _dup_comm(self, MPI_Comm *out) except -1 nogil:
        """A duplicate of the window's communicator that returns errors (a message
        transport's own, so its tags never meet the window's collectives)."""
        CHKERR(MPI_Comm_dup(self.comm, out), "MPI_Comm_dup")
        return CHKERR(MPI_Comm_set_errhandler(out[0], MPI_ERRORS_RETURN),
                      "MPI_Comm_set_errhandler")

    cdef _alloc_arrays(self):
        cdef int m = max(self.n_out, 1)
        self._in = <int *>calloc(max(self.n_in, 1), sizeof(int))
        self._out = <int *>calloc(m, sizeof(int))
        self.out_slot_disp = <MPI_Aint *>calloc(m, sizeof(MPI_Aint))
        self.out_notify_disp = <MPI_Aint *>calloc(m, sizeof(MPI_Aint))
        self.in_ack_disp = <MPI_Aint *>calloc(max(self.n_in, 1), sizeof(MPI_Aint))
        self.skip = <int *>calloc(m, sizeof(int))
        self.sizes = <MPI_Aint *>calloc(max(self.size, 1), sizeof(MPI_Aint))
        if (self.sizes == NULL or self.skip == NULL
                or self._in == NULL or self._out == NULL or self.out_slot_disp == NULL
                or self.out_notify_disp == NULL or self.in_ack_disp == NULL):
            raise MemoryError()
        # the most words one wait watches
        self.waits.allocate(max(self.n_in, self.n_out, self.n_user))

    cdef void _free_arrays(self) noexcept:
        free(self._in); self._in = NULL
        free(self._out); self._out = NULL
        free(self.out_slot_disp); self.out_slot_disp = NULL
        free(self.out_notify_disp); self.out_notify_disp = NULL
        free(self.in_ack_disp); self.in_ack_disp = NULL
        free(self.skip); self.skip = NULL
        free(self.sizes); self.sizes = NULL

    def __dealloc__(self):
        # a subclass's __dealloc__ ran first: it left its requests and their memory
        # behind (_leave_behind) and freed the rest of the transport's own memory
        cdef int finalized = 1
        if self.words is not None:
            self.words.forget()
        self._closed()
        if not self._freed:
            MPI_Finalized(&finalized)
            if not finalized:
                self._leave_behind()
                # Freeing a window is collective: a destructor must not do it.  Said on
                # stderr, not as a ResourceWarning: Python hides those by default, and
                # at interpreter exit (where a forgotten free() is found, before
                # mpi4py's MPI_Finalize) the warnings module is gone.
                _say_unfreed(b"dropped")
                fflush(stderr)
        self._free_arrays()

    # ------------------------------------------------------------------ lifetime

    def free(self):
        """Free the window and its communicator (collective). Safe to call twice.

        Raises BufferError on every rank, freeing nothing, while any rank still holds a
        view from payload().
        """
        cdef int finalized = 0
        cdef long long exports = self._exports
        cdef long long most = 0
        if self._freed:
            return
        MPI_Finalized(&finalized)
        if finalized:
            self._freed = True
            self._closed()
            return
        # a neighbour may still wait for this rank's last notifies or acks (of this or
        # another window) while this rank waits in the collectives below
        with nogil:
            _settle_all(self.flush_timeout)
        _reap_leftovers()
        # a collective that once timed out completes once its late ranks reach free()
        self.coll.finish_late(self.flush_timeout)
        # agree first, so that all ranks raise together instead of some entering
        # MPI_Win_free while one refuses; a rank that never comes ends the job (the
        # watchdog names the call) instead of hanging the others here
        with nogil:
            asap_watchdog_arm(self.flush_timeout, b"free()'s MPI_Allreduce (every rank "
                              b"must call free())", -1, b"every rank of the window")
            try:
                CHKERR(MPI_Allreduce(&exports, &most, 1, MPI_LONG_LONG, MPI_MAX,
                                     self.comm), "MPI_Allreduce")
            finally:
                asap_watchdog_disarm()
        if most:
            raise BufferError(f"rank {self.rank} holds {exports} view(s) of slots (the most "
                              f"on one rank: {most}); release every payload() view (del or "
                              f".release()) on every rank before free()")
        try:
            try:
                self._drain()
            except BaseException:
                # requests may still be in flight: their memory must outlive them
                self._leave_behind()
                raise
            with nogil:
                # MPI_Win_free synchronizes the window's ranks (MPICH and Open MPI both
                # do): a rank that died after the agreement above would hold the others
                # here for ever.  Twice the drain's limit: a live rank that is still
                # draining (at most flush_timeout) is never taken for a dead one
                asap_watchdog_arm(2 * self.flush_timeout, b"MPI_Win_free (every rank of "
                                  b"the window frees it)", -1, b"every rank of the window")
                try:
                    self.words.forget()     # unlock_all completes its words
                    self.mem.close(self.words)
                    self.base = NULL
                    CHKERR(MPI_Comm_free(&self.comm), "MPI_Comm_free")
                finally:
                    asap_watchdog_disarm()
        finally:
            self._freed = True
            self._closed()
            self._release()

    def watch(self, MPI.Comm comm):
        """Fault tolerance: from now on every wait of this window also probes `comm`
        between its polls once it sleeps between them (past poll_yields polls;
        MPI_Iprobe, nothing is ever sent there), so that a process failure or a
        revocation of `comm` ends the wait with a ProcessFailedError instead of a
        timeout.  None stops it.  A wait that ends within its yields makes no call
        more."""
        self.waits.watch(comm)

    def abandon(self):
        """Stop using this window after a process of its communicator failed (fault
        tolerance), without an MPI call that could wait on the dead rank: its requests
        in flight go to the leftovers (receives cancelled) with the memory they touch,
        its pending notifies and acks are forgotten (never flushed: their memory is
        kept, kept_words()), and the window, its memory and its communicators are never
        freed (MPI_Win_free and MPI_Comm_free are collective over a communicator that
        has a dead rank): they stay, unused, for the life of the process.  Afterwards
        the window counts as freed (FreedError on use).  Local; safe twice."""
        if self._freed:
            return
        self.waits.watch(None)
        self.words.forget()
        self._leave_behind(True)
        self.abandoned = True
        self._freed = True
        self._closed()

    @property
    def max_transfer(self):
        """The largest single MPI_Put/MPI_Get of a payload in bytes; larger payloads go
        in pieces (asapmpi.rc.max_transfer)."""
        return self._max_transfer

    @max_transfer.setter
    def max_transfer(self, Py_ssize_t value):
        if not 0 < value <= MAX_PUT_CHUNK:
            raise ConfigError(f"max_transfer must be in 1..{MAX_PUT_CHUNK} bytes, got {value}")
        self._max_transfer = value

    @property
    def late_collective(self):
        """True while a barrier or allgather that timed out waits for its late ranks."""
        return self.coll.late != MPI_REQUEST_NULL

    @property
    def freed(self):
        """True once free() ran."""
        return self._freed

    @property
    def rma(self):
        """True where other ranks reach this channel's memory one-sidedly (an MPI
        window: put, shared); False for the message channels."""
        return isinstance(self.mem, WindowMemory)

    @property
    def memory_model(self):
        """The MPI memory model of the channel's memory ("MPI_WIN_UNIFIED"), or what
        stands for it where there is no window."""
        return self.mem.model

    @property
    def words_kind(self):
        """How this window's words travel (words.pxi): "OneSidedWords" (MPI atomics in
        the neighbours' windows), "MessageWords" (tokens and word messages) or "Words"
        (local only: the transport's messages are its notifies and acks)."""
        return type(self.words).__name__

    @property
    def poll_slack_ns(self):
        """Timer slack of the waits' sleeps in ns (0: the thread's own)."""
        return self.waits.slack_ns

    @property
    def wait_seconds(self):
        """Seconds spent backing off in waits and barriers, for training reports."""
        return self.waits.seconds

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.free()

    cdef inline int _check_alive(self) except -1:
        if self._freed:
            raise FreedError("this slot window was freed; create a new Exchange")
        return 0


cdef class SlotWindow(SlotChannel):
    """The calls a policy makes on a channel: the channel verbs (deliver, await_,
    release, progress, drain), the words' calls, the waits', the collectives' and the
    reader's, each checked here and handed to the part that does it (SlotChannel)."""

    cdef str row_what               # a board's name, once set_row made its row

    # ------------------------------------------------------------------ writing

    def put(self, buf, int64_t version, int64_t iteration=0, bint seqlock=False,
            bint checksum=False, bint notify=True, int64_t suppress_if_acked=0):
        """Write `buf` as `version` into slot `version % depth` of every out-neighbour.

        Ordered mode: header, payload and footer, one flush, then the notify word.
        seqlock: header, flush, payload, flush, footer, flush, so a concurrent reader can
        tell a read that overlapped this write (asapmpi.testing.faults writes torn ones).
        suppress_if_acked > 0: skip every out-neighbour whose ack word (read atomically)
        is already >= it (Hop 6.2: it can no longer use this update); counted in
        `suppressed`.  How the bytes travel is the transport's (its class's _send).
        """
        self._check_alive()
        self._put_buffer(buf, version, iteration, seqlock, checksum, notify,
                         suppress_if_acked)

    cdef int _put_buffer(self, buf, int64_t version, int64_t iteration, bint seqlock,
                         bint checksum, bint notify, int64_t suppress_if_acked) except -1:
        # put()'s checks and transfer, also deliver()'s
        cdef Py_buffer view
        _check_version(version)
        PyObject_GetBuffer(buf, &view, PyBUF_ANY_CONTIGUOUS)
        try:
            if view.len != self.nbytes:
                raise ConfigError(f"buffer has {view.len} bytes but the window's slots hold "
                                  f"{self.nbytes}; pass a buffer of the size the Exchange "
                                  f"was created with")
            self._send(<const char *>view.buf, version, iteration, seqlock, checksum,
                       notify, suppress_if_acked)
        finally:
            PyBuffer_Release(&view)
        return 0

    cdef int _mark_suppressed(self, int64_t threshold) except -1 nogil:
        cdef int j
        for j in range(self.n_out):
            self.skip[j] = 0
            if threshold > 0:
                if self.words.own(self.off_ack + 8 * j) >= threshold:
                    self.skip[j] = 1
                    self.suppressed += 1
        return 0

    # ------------------------------------------------------------------ the channel verbs
    #
    # Every channel (asapmpi.transports.channels) steps a policy through the same five
    # verbs: deliver(k), await_(k, mode), release(k), progress(), drain().  What each
    # means on a channel is its class's (this base: window words in an MPI window, put
    # and shared; messages.pxi, mailbox.pxi, push.pxi override them); the await modes a
    # channel gives are in its capability row (Channel.awaits), and the resolver hands
    # a policy only a channel that gives the modes it uses (Policy.awaits).  Each verb
    # is one call into this module: a step adds no Python between its MPI calls.

    def deliver(self, buf, int64_t version, double timeout, bint checksum=False,
                bint copy=True, int64_t skip_released=0):
        """Verb: `buf` as `version` into every out-neighbour's slot, its notify after
        it (unless the window was made with notifies=False).  With waits_for_release,
        first wait until every out-neighbour released version - 1 (its ack;
        NeighbourTimeoutError naming the late after `timeout` seconds).  A window whose
        writers write only slots no reader is reading (`ordered`: this wait, Hop's
        tokens, a server's publication) writes in the ordered sequence; else in the
        seqlock order, for a reader that may overlap the write.  skip_released > 0:
        leave out every out-neighbour that already released that version (it can no
        longer use this one: Hop 6.2), counted in `suppressed`.  `buf` may be written
        as soon as this returns (copy=False is for the channels that could send from
        it: none of the one-sided ones)."""
        self._check_alive()
        if self.waits_for_release:
            self.waits.acks(version - 1, timeout, False)
        self._put_buffer(buf, version, version, not self.ordered, checksum,
                         self.notifies, skip_released)

    def await_(self, int64_t version, double timeout, int mode=AWAIT_EXACT,
               int count=0):
        """Verb: wait for the in-neighbours' `version` (asapmpi.sync.Await, `mode`):
        EXACT every in-neighbour's notify is `version`; AT_LEAST is >= it (read
        atomically: writers that run ahead); COUNT at least `count` in-neighbours'
        are `version` (returns how many were); NEWEST every in-neighbour has a whole
        version in [count, version] (returns the newest per in-neighbour); RELEASED
        the other way: every out-neighbour released `version` or a later one (its ack
        or token, read atomically: Hop's token wait), returns the smallest release
        among them (version <= 0: no wait, the smallest now; 1 << 62 with no
        out-neighbour); BARRIER a barrier of all ranks, each entering it once it
        delivered `version`, then every in-neighbour's `version` in this rank's
        slots (BSP: a put is there once its writer entered the barrier, a message
        may still be on its way).  NeighbourTimeoutError naming the late after
        `timeout` seconds."""
        self._check_alive()
        if mode == AWAIT_EXACT or mode == AWAIT_AT_LEAST:
            self.waits.notifies(version, timeout, mode == AWAIT_AT_LEAST)
            return None
        if mode == AWAIT_COUNT:
            return self.wait_notifies_count(version, count, timeout)
        if mode == AWAIT_NEWEST:
            return self.wait_newest(version, count, timeout)
        if mode == AWAIT_RELEASED:
            return self.waits.released(version, timeout)
        if mode == AWAIT_BARRIER:
            self.coll.barrier(timeout, version)
            self.wait_delivered(version, timeout)
            return None
        raise ConfigError(f"await mode must be one of {', '.join(AWAIT_MODES)} (0 to "
                          f"{len(AWAIT_MODES) - 1}), got {mode}")

    def release(self, int64_t version, bint checksum=False):
        """Verb: this rank is done reading every slot that holds a version <= `version`
        (1 << 62: all of them), so their writers may refill them.  With
        waits_for_release that is the ack its writers wait for (issued lazily: see
        OneSidedWords._lazy; release(0) acks nothing, every slot starts free); else
        nothing here (a writer into a window waits for no reader).  A mailbox reposts
        the slots' receives, the message channel posts the receives of version + 1."""
        self._check_alive()
        if self.releases and version > 0:
            self.words.check_remote("release()", -1, self.transport)
            with nogil:
                self.words.ack(version)

    def progress(self):
        """Verb: one poll of this channel's progress (a window's: MPI may complete a
        one-sided operation at its target only when the target calls into MPI; a
        message channel's: complete what arrived).  Every wait does it between its
        polls; a policy that computes for long without waiting may call it."""
        self._check_alive()
        with nogil:
            self._progress()

    def drain(self):
        """Verb: complete what this rank issued that needs nothing of its neighbours:
        the notifies and acks issued lazily (one-sided words) and the tokens and words
        a mailbox holds back, so that no neighbour waits for them while this rank
        computes or waits elsewhere.  What waits on a reader (a message the reader has
        not taken) completes in free()'s collective drain."""
        self._check_alive()
        with nogil:
            self.words.settle(self.flush_timeout)

    def wait_delivered(self, int64_t version, double timeout):
        """After a collective that every in-neighbour entered once it had sent
        `version`: return when those updates are in this rank's slots.  A put is
        complete at its target before its writer enters the collective (flushed): no
        wait.  A mailbox's messages may still be on their way: wait for every
        in-neighbour's notify of `version` (NeighbourTimeoutError naming the late)."""
        self._check_alive()

    # ------------------------------------------------------------------ words
    #
    # The words' calls: each checks its arguments and hands the call to the channel's
    # words (words.pxi), which refuse what their kind cannot do (check_remote).

    def notify(self, int64_t version):
        """Publish `version` in every out-neighbour's notify word for slot version % depth
        (issued lazily: see OneSidedWords._lazy)."""
        self._check_alive()
        self.words.check_remote("notify()", -1, self.transport)
        _check_version(version)
        with nogil:
            self._mark_suppressed(0)
            self.words.notify(version, version % self.depth)

    def ack(self, int64_t version):
        """Tell every in-neighbour that its `version` was consumed (its slot is free);
        issued lazily, not flushed before this returns (see OneSidedWords._lazy)."""
        self._check_alive()
        self.words.check_remote("ack()", -1, self.transport)
        with nogil:
            self.words.ack(version)

    def accumulate_word(self, int target, Py_ssize_t disp, int64_t value, op="replace"):
        """Atomically replace, add to or raise to at least `value` ("replace", "sum",
        "max") the int64 word at `disp` in `target`'s window; returns the word's old
        value (MPI_Fetch_and_op, flushed)."""
        cdef MPI_Op mop
        cdef int64_t old = 0
        self._check_alive()
        self._check_target(target, disp)
        self.words.check_remote("accumulate_word()", -1, self.transport)
        if op == "replace":
            mop = MPI_REPLACE
        elif op == "sum":
            mop = MPI_SUM
        elif op == "max":
            mop = MPI_MAX
        else:
            raise ConfigError(f"op must be 'replace', 'sum' or 'max', got {op!r}")
        with nogil:
            old = self.words.accumulate(target, disp, value, mop)
        return old

    def write_words(self, int target, Py_ssize_t disp, values):
        """Write the int64 `values` (1 to 6) into consecutive words of `target`'s window
        from `disp`, in order, each atomically (MPI_Fetch_and_op REPLACE, flushed): a
        reader that waits for the last one (wait_word) sees the others.  A mailbox
        sends them as one message instead."""
        self.words.check_remote("write_words()", -1, self.transport)
        vals = self._words(values)
        for k in range(len(vals)):
            self.accumulate_word(target, disp + 8 * k, int(vals[k]))

    cdef object _words(self, values):
        # write_words' values as a contiguous int64 array, or ConfigError
        vals = np.ascontiguousarray(values, dtype=np.int64).ravel()
        if not 1 <= len(vals) <= WRITE_WORDS_MAX:
            raise ConfigError(f"write_words writes 1 to {WRITE_WORDS_MAX} words, got "
                              f"{len(vals)}")
        return vals

    def compare_and_swap_word(self, int target, Py_ssize_t disp, int64_t compare,
                              int64_t value):
        """Atomically set the int64 word at `disp` in `target`'s window to `value` if it
        equals `compare` (MPI_Compare_and_swap); return the word's old value.  Not on
        Open MPI 4.1's shared memory (osc rdma over btl vader crashes in a 64-bit
        compare-and-swap: open-mpi/ompi#7967, #11349): asapmpi's own protocols use
        accumulate_word."""
        cdef int64_t old = 0
        self._check_alive()
        self._check_target(target, disp)
        self.words.check_remote("compare_and_swap_word()", -1, self.transport)
        with nogil:
            old = self.words.compare_and_swap(target, disp, compare, value)
        return old

    def fetch_word(self, int target, Py_ssize_t disp):
        """Read the int64 word at `disp` in `target`'s window atomically (MPI_NO_OP;
        this rank's own word on a transport without a window)."""
        cdef int64_t value = 0
        self._check_alive()
        self._check_target(target, disp)
        self.words.check_remote("fetch_word() of another rank", target, self.transport)
        with nogil:
            if target == self.rank:
                self._pump()        # the words messages feed: as fresh as they can be
                value = self.words.own(disp)
            else:
                value = self.words.fetch_one(target, disp)
        return value

    def fetch_words(self, int target, Py_ssize_t disp, Py_ssize_t count):
        """Read `count` int64 words from `disp` in `target`'s window, each atomically
        (one MPI_Get_accumulate with MPI_NO_OP, one flush: a single round trip where
        `count` fetch_word calls would take `count`)."""
        self._check_alive()
        if count < 1:
            raise ConfigError(f"count must be at least 1, got {count}")
        self._check_target(target, disp)
        self._check_target(target, disp + 8 * (count - 1))
        self.words.check_remote("fetch_words() of another rank", target, self.transport)
        out = np.empty(count, dtype=np.int64)
        cdef int64_t[::1] o = out
        with nogil:
            if target == self.rank:
                self._pump()        # the words messages feed: as fresh as they can be
            self.words.fetch_many(target, disp, &o[0], <int>count)
        return out

    def local_word(self, Py_ssize_t disp):
        """Atomic load of the int64 word at `disp` in this rank's own window."""
        self._check_alive()
        self._check_local_word(disp)
        return asap_load_i64(self.base + disp)

    # ------------------------------------------------------------------ a board's row
    #
    # A board (asapmpi.board) is a channel with user words only: a row of each rank's
    # few words, which it writes into every reader's copy and every reader reads in its
    # own memory (the words deliver it: accumulates, or messages).

    def set_row(self, Py_ssize_t disp, int count, readers, str what):
        """Make this rank's `count` (1 to 6) user words from `disp` its row: publish_word
        writes them into the same words of every rank in `readers`.  `what` names the
        board in errors."""
        self._check_alive()
        if self.row_what is not None:
            raise ConfigError("set_row() makes a channel's row once")
        if not 1 <= count <= WRITE_WORDS_MAX:
            raise ConfigError(f"a board's row has 1 to {WRITE_WORDS_MAX} words, got {count}")
        self._check_local_word(disp)
        self._check_local_word(disp + 8 * (count - 1))
        if disp < self.off_user or disp + 8 * count > self.off_user + 8 * self.n_user:
            raise ConfigError(f"a board's row is in the user words (offsets {self.off_user}"
                              f" to {self.off_user + 8 * self.n_user}), not at {disp}")
        for r in readers:
            if not 0 <= r < self.size:
                raise ConfigError(f"reader {r} is outside the communicator (size "
                                  f"{self.size})")
        self.words.set_row(disp, count, readers, what)
        self.row_what = what

    def publish_word(self, int index, int64_t value, bint wait=True):
        """Word `index` of this rank's row (set_row) becomes `value` in every reader's
        copy: complete at every reader when this returns with `wait` (else at a later
        pump: a one-sided write is always complete).  A reader that does not take it
        within flush_timeout is a NeighbourTimeoutError naming it."""
        self._check_alive()
        if self.row_what is None:
            raise ConfigError("publish_word() needs a row: call set_row() first")
        if not 0 <= index < self.words.row_count:
            raise ConfigError(f"word {index} is outside the row's "
                              f"{self.words.row_count} words")
        with nogil:
            self.words.publish(index, value)
        if wait:
            self.waits.published(f"the {self.row_what}'s word {index} to be received",
                                 self.flush_timeout)

    def local_words(self, Py_ssize_t disp, Py_ssize_t count):
        """`count` int64 words from `disp` of this rank's own memory, each by an atomic
        load after a fence (what arrived by message pumped in first): for words whose
        writes completed before the caller looks (docs/PROTOCOL.md A12)."""
        self._check_alive()
        if count < 1:
            raise ConfigError(f"count must be at least 1, got {count}")
        self._check_local_word(disp)
        self._check_local_word(disp + 8 * (count - 1))
        out = np.empty(count, dtype=np.int64)
        cdef int64_t[::1] o = out
        cdef Py_ssize_t k
        with nogil:
            self._pump()
            asap_fence()
            for k in range(count):
                o[k] = asap_load_i64(self.base + disp + 8 * k)
        return out

    def word_peek(self, Py_ssize_t disp, Py_ssize_t stride, Py_ssize_t count):
        """A WordPeek of `count` words of this rank's memory, every `stride`-th from
        `disp` (a board's word of every rank)."""
        self._check_alive()
        if count < 1 or stride < 1:
            raise ConfigError(f"word_peek needs count >= 1 and stride >= 1, got {count}, "
                              f"{stride}")
        self._check_local_word(disp)
        self._check_local_word(disp + 8 * stride * (count - 1))
        return WordPeek(self, disp, stride, count)

    cdef int _check_target(self, int target, Py_ssize_t disp) except -1:
        if not 0 <= target < self.size:
            raise ConfigError(f"rank {target} is outside the communicator (size {self.size})")
        if disp < 0 or disp % 8 or disp > self.sizes[target] - 8:
            raise ConfigError(f"offset {disp} is not an int64 word of rank {target}'s window")
        return 0

    cdef int _check_local_word(self, Py_ssize_t disp) except -1:
        if not 0 <= disp <= self.total_bytes - 8 or disp % 8:
            raise ConfigError(f"offset {disp} is not an int64 word of this window")
        return 0

    # ------------------------------------------------------------------ waiting
    #
    # The waits' and collectives' calls (waits.pxi, collectives.pxi), checked here.

    def wait_notifies(self, int64_t version, double timeout, bint at_least=False):
        """Wait until every in-neighbour published `version` in its notify word (or, with
        at_least, any version >= it, read atomically: for writers that may run ahead)."""
        self._check_alive()
        self.waits.notifies(version, timeout, at_least)

    def wait_acks(self, int64_t version, double timeout, bint at_least=False):
        """Wait until every out-neighbour acknowledged `version` (0: nothing to wait for),
        or, with at_least, wrote any value >= it (read atomically: Hop's tokens)."""
        self._check_alive()
        self.waits.acks(version, timeout, at_least)

    def wait_notifies_count(self, int64_t version, int min_count, double timeout):
        """Wait until at least `min_count` in-neighbours published exactly `version`
        (backup workers); return how many had when the wait ended."""
        self._check_alive()
        return self.waits.count(version, min_count, timeout)

    def wait_word(self, Py_ssize_t disp, int64_t at_least, double timeout, int from_rank=-1):
        """Wait until the local word at `disp`, read atomically, is >= `at_least`
        (NeighbourTimeoutError naming `from_rank`, who writes it)."""
        self._check_alive()
        self._check_local_word(disp)
        self.waits.user_words([disp], at_least, timeout, [from_rank])

    def wait_words(self, disps, int64_t at_least, double timeout, from_ranks):
        """wait_word for several local words at once (one pump per poll for all): until
        the word at each of `disps`, read atomically, is >= `at_least`.  At most
        max(n_in, n_out, user words) words; NeighbourTimeoutError names the
        `from_ranks` (one per word: who writes it) whose words lag."""
        self._check_alive()
        for disp in disps:
            self._check_local_word(disp)
        self.waits.user_words(disps, at_least, timeout, from_ranks)

    def wait_newest(self, int64_t at_most, int64_t at_least, double timeout):
        """Wait until every in-neighbour has a completed version in [at_least, at_most]
        (Hop's bounded staleness: block only on neighbours with nothing recent enough);
        return the newest such version per in-neighbour."""
        self._check_alive()
        return self.waits.newest(at_most, at_least, timeout)

    def newest_versions(self, int64_t at_most):
        """Per in-neighbour, the newest version <= at_most whose write completed (its
        notify word, read atomically over all `depth` slots); 0 if none."""
        self._check_alive()
        return self.waits.newest_versions(at_most)

    def barrier(self, double timeout=-1.0, int64_t version=0):
        """The BSP baseline's global barrier on the window's communicator: MPI_Ibarrier
        polled with backoff, so that a rank that never arrives is a timeout
        (NeighbourTimeoutError after `timeout` seconds; < 0: flush_timeout), not a hang.
        A barrier that timed out is completed by the next barrier or allgather, or by
        free(), once the late ranks reach it."""
        self._check_alive()
        self.coll.barrier(timeout, version)

    def allgather_doubles(self, values, double timeout=-1.0):
        """Collective over the window's communicator: every rank's `values` (the same
        count on every rank), as an array (size, count).  An MPI_Iallgather polled with
        backoff: a rank that never arrives is a NeighbourTimeoutError after `timeout`
        seconds (< 0: flush_timeout), not a hang."""
        self._check_alive()
        return self.coll.allgather_doubles(values, timeout)

    # ------------------------------------------------------------------ slots

    def ack_offset(self, int out_index):
        """Offset of the word out-neighbour `out_index` writes (acks, Hop's progress)."""
        if not 0 <= out_index < self.n_out:
            raise ConfigError(f"out-neighbour index {out_index} outside 0..{self.n_out - 1}")
        return self.off_ack + 8 * out_index

    def slot_offset(self, int in_index, int64_t version):
        """Offset of the header of in-neighbour `in_index`'s slot for `version` (the
        shared and newest-version transports, whose slots are not at a fixed place in
        this window, refuse)."""
        if not 0 <= in_index < self.n_in:
            raise ConfigError(f"in-neighbour index {in_index} outside 0..{self.n_in - 1}")
        _check_version(version)
        return self.off_slots + (in_index * self.depth + version % self.depth) * self.slot_stride

    def payload(self, int in_index, int64_t version):
        """A read-only zero-copy view of in-neighbour `in_index`'s payload slot for
        `version` (whatever it holds now: no version check).  The window cannot be freed
        while such a view is alive."""
        self._check_alive()
        return memoryview(_SlotPayload(self, self.slot_offset(in_index, version) + HEADER_BYTES))

    # ------------------------------------------------------------------ reducing
    #
    # The reader's calls (reads.pxi, where each is described), checked here.

    def reduce(self, buf, double w_self, double[::1] weights not None, int64_t expected,
               int64_t min_version, int64_t max_version, bint seqlock=False,
               bint checksum=False, bint renormalize=False, bint require_all=False,
               bint only_notified=False, own=None):
        """buf = w_self*buf (or own) + sum_i weights[i]*slot_i over the usable inputs,
        verified, in one pass (SlotReader.reduce); the number of inputs reduced."""
        self._check_alive()
        return self.reader.reduce(buf, w_self, weights, expected, min_version,
                                  max_version, seqlock, checksum, renormalize,
                                  require_all, only_notified, own)

    def reduce_versions(self, buf, double w_self, double[::1] weights not None,
                        int64_t[::1] versions not None, bint checksum=False,
                        bint renormalize=True):
        """buf = w_self*buf + sum_i weights[i]*(version versions[i] of in-neighbour i),
        each verified (SlotReader.reduce_versions); the number of inputs reduced."""
        self._check_alive()
        return self.reader.reduce_versions(buf, w_self, weights, versions, checksum,
                                           renormalize)

    def read_begin(self, int64_t[::1] versions not None, int64_t min_version,
                   int64_t max_version, bint exact_each=False, bint require_all=False,
                   bint only_notified=False):
        """The first half of a reduce made elsewhere (SlotReader.read_begin): each
        input's payload address to copy out (0: not to be read)."""
        self._check_alive()
        return self.reader.read_begin(versions, min_version, max_version, exact_each,
                                      require_all, only_notified)

    def read_end(self):
        """The second half (SlotReader.read_end): the indices of the inputs whose slot
        changed during the copy."""
        return self.reader.read_end()

    # ------------------------------------------------------------------ introspection

    @property
    def stats(self):
        """int64 array (n_in, 4): per in-neighbour counts of consistent, torn, stale, ahead."""
        return self.store.stats

    @property
    def last_versions(self):
        """int64 array (n_in,): last untorn version read from each in-neighbour."""
        return self.store.last_versions

    @property
    def in_ranks(self):
        """The in-neighbours, in the order of the weights and slots."""
        return [self._in[i] for i in range(self.n_in)]

    @property
    def out_ranks(self):
        """The out-neighbours, in the order of their slots."""
        return [self._out[i] for i in range(self.n_out)]

    @property
    def out_slot_offsets(self):
        """Per out-neighbour: the offset of this rank's first slot in its window."""
        return [int(self.out_slot_disp[i]) for i in range(self.n_out)]

    def record_reduced(self, int64_t[::1] row not None, int64_t iteration):
        """The trace of the last reduce into `row` (SlotStore.record_reduced)."""
        self.store._record(row, iteration)

    def last_status(self):
        """Status of each input in the last reduce (CONSISTENT, TORN, STALE or AHEAD)."""
        return self.store.last_status()


cdef int _sync_window(void *win) except -1 nogil:
    # MPI_Win_sync on a window (the standard's call for window memory), then a full
    # fence.  The fence is what orders: Open MPI's osc rdma implements MPI_Win_sync as
    # progress alone, and the shared transport's slots are not window memory at all
    # (docs/PROTOCOL.md, section 8, A6 and A7).
    CHKERR(MPI_Win_sync((<MPI_Win *>win)[0]), "MPI_Win_sync")
    asap_fence()
    return 0


cdef class WordPeek:
    """Every `stride`-th int64 word of a channel's memory from `disp`, peeked on every
    exchange step (the join board's joined-at words): seen() pumps what arrived by
    message, then one fence and an 8-byte atomic load per word, about 0.1 us on a
    window; False once the channel is freed."""

    cdef SlotWindow win
    cdef Py_ssize_t disp, stride, count
    #: what seen() compares the largest word with
    cdef public int64_t threshold

    def __cinit__(self, SlotWindow win, Py_ssize_t disp, Py_ssize_t stride,
                  Py_ssize_t count):
        self.win, self.disp, self.stride, self.count = win, disp, stride, count
        self.threshold = 0

    def seen(self):
        """Whether some word is at least `threshold`: the step's whole cost while no
        rank has joined."""
        cdef int64_t best = -0x7FFFFFFFFFFFFFFF - 1, v
        cdef Py_ssize_t i
        cdef const char *at
        if self.win._freed:
            return False
        self.win._pump()
        asap_fence()
        at = self.win.base + self.disp
        for i in range(self.count):
            v = asap_load_i64(at + 8 * i * self.stride)
            if v > best:
                best = v
        return best >= self.threshold


cdef class _SlotPayload:
    """Buffer exporter for SlotWindow.payload: keeps the window alive and unfreeable."""

    cdef SlotWindow win
    cdef Py_ssize_t offset
    cdef Py_ssize_t shape[1]
    cdef Py_ssize_t strides[1]

    def __cinit__(self, SlotWindow win, Py_ssize_t offset):
        self.win = win
        self.offset = offset
        self.shape[0] = win.nbytes // win.itemsize
        self.strides[0] = win.itemsize

    def __getbuffer__(self, Py_buffer *view, int flags):
        if flags & PyBUF_WRITABLE:
            raise BufferError("slot payloads are read-only")
        if self.win._freed:
            raise BufferError("the window was freed")
        view.buf = self.win.base + self.offset
        view.obj = self
        view.len = self.win.nbytes
        view.readonly = 1
        view.itemsize = self.win.itemsize
        # bfloat16 payloads as their raw 16-bit patterns (no buffer format has them)
        if self.win.dtype == "bfloat16":
            view.format = b"H"
        elif self.win.itemsize == 2:
            view.format = b"e"
        elif self.win.itemsize == 4:
            view.format = b"f"
        else:
            view.format = b"d"
        view.ndim = 1
        view.shape = self.shape
        view.strides = self.strides
        view.suboffsets = NULL
        view.internal = NULL
        self.win._exports += 1

    def __releasebuffer__(self, Py_buffer *view):
        self.win._exports -= 1


cdef void _describe(char *out, ranks) noexcept:
    """Write "1, 3, 5" (shortened with "..." to fit 256 bytes) for watchdog messages."""
    text = ", ".join(str(int(r)) for r in ranks) or "none"
    if len(text) > 200:
        text = text[:200].rsplit(", ", 1)[0] + ", ..."
    data = text.encode()
    strncpy(out, data, 255)
    out[255] = 0


include "put.pxi"
include "shared.pxi"
include "messages.pxi"
include "mailbox.pxi"
include "newest.pxi"
include "push.pxi"
