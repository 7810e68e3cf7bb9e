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


cdef class SlotWindow:
    """One rank's slot window: the slot layout and the waits on its words, shared by
    every transport; its words (`words`, words.pxi) carry the notifies, acks, tokens
    and user words the transport's way, and its slot store (`store`, slotstore.pxi)
    verifies and reduces what the transport brought.

    A transport is a subclass (one file each, included below): PutWindow (put.pxi),
    SharedWindow (shared.pxi), MessageWindow (messages.pxi), MailboxWindow
    (mailbox.pxi), NewestWindow (newest.pxi) and PushWindow (push.pxi).  It moves updates into the slots
    (_send, or its own calls), says where a slot is (_slot), makes its words
    (_make_words), drives its progress (_pump, _progress) and drains what is in flight
    before the window is freed (_drain); the base calls these hooks and nothing else
    of it.  Collective over
    `comm` on creation and on free().  A PutWindow's put() returns once its bytes
    are complete at every target (one MPI_Win_flush_all), but notifies and acks (put,
    shared) are issued lazily (OneSidedWords._lazy) and complete only by the next
    MPI_Win_flush_all of the window (the next put, or a word issued while LAZY_WORDS
    are pending), by any wait of this process once it has lasted poll_yields polls
    (_settle_pending), before asapmpi's collectives (settle_all) and at free().
    """

    cdef MPI_Win win
    cdef MPI_Comm comm
    cdef readonly str transport     # the subclass's name: "put", "shared", ...
    cdef readonly int rank, size, n_in, n_out, depth, itemsize
    cdef readonly object dtype          # the element type: float32, float64, bfloat16, float16
    cdef readonly Py_ssize_t nbytes, payload_stride, slot_stride, total_bytes
    cdef Py_ssize_t off_notify, off_ack, off_user, off_slots, off_publish
    cdef int n_user                 # user words in this rank's window
    cdef char *base
    cdef char *alloc_base           # rma False: what MPI_Alloc_mem returned (base aligned)
    cdef bint _freed
    cdef bint _left                 # its requests and their memory went to _leftovers
    cdef bint _counted              # counted in _n_open
    cdef bint _locked
    cdef Py_ssize_t _exports
    cdef readonly double flush_timeout
    cdef readonly str memory_model
    cdef char out_desc[256]
    cdef char in_desc[256]
    # in- and out-neighbours: whom a flush_all waits for while acks are pending
    cdef char nbr_desc[256]
    cdef char what[512]
    cdef MPI_Aint *sizes
    cdef int *_in
    cdef int *_out
    cdef MPI_Aint *out_slot_disp
    cdef MPI_Aint *out_notify_disp
    cdef MPI_Aint *in_ack_disp
    cdef MPI_Aint *wait_offs
    cdef int64_t *wait_expected
    # the smallest word the last successful at-least wait read (await_'s RELEASED)
    cdef int64_t wait_least
    cdef int64_t hdr[8]
    cdef int64_t ftr[8]
    # the notify, ack, token and user words: how they reach other ranks and how this
    # rank reads its own (words.pxi; the channel's kind, made by _make_words)
    cdef Words words
    cdef long poll_yields, poll_max_sleep_us
    cdef readonly long poll_slack_ns  # timer slack of the waits' sleeps (0: the thread's)
    # _pump() is this transport's progress (a mailbox): a wait that pumped this poll
    # needs no _progress() from _idle
    cdef bint pump_progresses
    # The transport reaches other ranks' memory one-sidedly (put, shared): the memory
    # is an MPI window.  The message transports (rma False) never do: their memory is
    # MPI_Alloc_mem'd and every word in it is written by this process, so that no
    # window exists whose progress every MPI call of the process would also drive
    # (Open MPI's osc ucx polls a UCX worker of its own per call while a window lives).
    cdef readonly bint rma
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
    # reduce scratch
    cdef readonly SlotStore store   # the inputs and the verified reduce (slotstore.pxi)
    cdef int *skip
    cdef readonly long long suppressed
    # traffic and idle time, for training reports: payload bytes put (headers, footers
    # and control words excluded) and seconds spent backing off in waits and barriers
    cdef readonly long long bytes_put, bytes_got
    cdef readonly double wait_seconds
    # a nonblocking collective that timed out, and the buffers it may still write: MPI
    # allows neither cancelling nor freeing it, so it is completed before the next
    # collective (every rank issues them in the same order) or at free()
    cdef MPI_Request _late
    cdef object _late_buffers
    # fault tolerance (watch()): a communicator whose failure or revocation every wait
    # of this window notices between its polls; MPI_COMM_NULL: none
    cdef MPI_Comm watched
    cdef object _watched_ref
    cdef readonly bint abandoned

    def __cinit__(self):
        self.win = MPI_WIN_NULL
        self.rma = True
        self.comm = MPI_COMM_NULL
        self._freed = True
        self._late = MPI_REQUEST_NULL
        self.transport = "none"
        self.watched = MPI_COMM_NULL

    def __init__(self, MPI.Comm comm not None, layout, in_ranks, out_ranks, out_slot_disp,
                 out_notify_disp, in_ack_disp, dtype, int poll_yields=32,
                 int poll_max_sleep_us=100, double flush_timeout=60.0, long poll_slack_ns=0,
                 bint waits_for_release=False, bint notifies=True, bint releases=False,
                 bint ordered=False):
        cdef MPI_Info info = MPI_INFO_NULL
        cdef int flag = 0
        cdef int *model = NULL
        cdef int i
        cdef MPI_Aint my_size
        if type(self) is SlotWindow:
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
        self.poll_yields = poll_yields
        self.poll_max_sleep_us = poll_max_sleep_us
        if poll_slack_ns < 0:
            raise ConfigError(f"poll_slack_ns must be >= 0 (0: the thread's own), got "
                              f"{poll_slack_ns}")
        self.poll_slack_ns = poll_slack_ns
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
            if self.rma:
                CHKERR(MPI_Info_create(&info), "MPI_Info_create")
                CHKERR(MPI_Info_set(info, b"same_disp_unit", b"true"), "MPI_Info_set")
                CHKERR(MPI_Win_allocate(self.total_bytes, 1, info, self.comm, &self.base,
                                        &self.win), "MPI_Win_allocate")
                CHKERR(MPI_Info_free(&info), "MPI_Info_free")
            else:
                # 64 bytes more, so that base starts a cache line as the layout assumes
                # (MPI_Alloc_mem promises no alignment; malloc's is 16)
                CHKERR(MPI_Alloc_mem(self.total_bytes + CACHE_LINE, MPI_INFO_NULL,
                                     &self.alloc_base), "MPI_Alloc_mem")
                self.base = <char *>((<uintptr_t>self.alloc_base + CACHE_LINE - 1)
                                     & ~(<uintptr_t>CACHE_LINE - 1))
        self._freed = False
        self._opened()
        if self.rma:
            with nogil:
                CHKERR(MPI_Win_set_errhandler(self.win, MPI_ERRORS_RETURN),
                       "MPI_Win_set_errhandler")
                CHKERR(MPI_Win_get_attr(self.win, MPI_WIN_MODEL, &model, &flag),
                       "MPI_Win_get_attr")
            if not flag or model == NULL or model[0] != MPI_WIN_UNIFIED:
                self.free()  # not locked yet: free() skips the unlock
                raise ConfigError("this MPI gives a separate (not unified) memory model "
                                  "for RMA windows; asapmpi needs MPI_WIN_UNIFIED")
            self.memory_model = "MPI_WIN_UNIFIED"
            self.store.sync = _sync_window
            self.store.sync_ctx = &self.win
        else:
            self.memory_model = "none (messages only: no MPI window)"
        # Version 0 everywhere means "never written".  No rank can leave the allgather
        # below before every rank entered it, so no remote write precedes these stores.
        memset(self.base, 0, self.total_bytes)
        (<int64_t *>self.base)[0] = MAGIC
        (<int64_t *>self.base)[1] = LAYOUT_VERSION
        (<int64_t *>self.base)[2] = self.n_in
        (<int64_t *>self.base)[3] = self.n_out
        (<int64_t *>self.base)[4] = self.depth
        (<int64_t *>self.base)[5] = self.nbytes
        self._bind_words()
        if self.rma:
            with nogil:
                CHKERR(MPI_Win_lock_all(MPI_MODE_NOCHECK, self.win), "MPI_Win_lock_all")
            self._locked = True
        with nogil:
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
        """The transport's words (before any communication): one-sided atomics where
        there is a window, else local words only (a message transport whose messages
        are its notifies and acks)."""
        return OneSidedWords() if self.rma else Words()

    cdef int _bind_words(self) except -1:
        # once the memory exists: where the words are, whom they go to
        cdef Words w = self.words
        w.base = self.base
        w.rank, w.size = self.rank, self.size
        w.n_in, w.n_out, w.depth, w.n_user = self.n_in, self.n_out, self.depth, self.n_user
        w.off_notify, w.off_ack, w.off_user = self.off_notify, self.off_ack, self.off_user
        w.timeout = self.flush_timeout
        w._in, w._out = self._in, self._out
        w.out_notify_disp, w.in_ack_disp = self.out_notify_disp, self.in_ack_disp
        w.skip = self.skip
        w.nbr_desc = self.nbr_desc
        if self.rma:
            (<OneSidedWords>w).bound(self.win, self.transport)
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
        if not self.rma and self.alloc_base != NULL:
            lo.mpi_mem = self.alloc_base    # the slots a posted receive may target
            self.alloc_base = self.base = NULL
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
        cdef int n = max(self.n_in, 1)
        cdef int m = max(self.n_out, 1)
        cdef int w = max(n, m, self.n_user)    # words one wait watches
        self._in = <int *>calloc(n, sizeof(int))
        self._out = <int *>calloc(m, sizeof(int))
        self.out_slot_disp = <MPI_Aint *>calloc(m, sizeof(MPI_Aint))
        self.out_notify_disp = <MPI_Aint *>calloc(m, sizeof(MPI_Aint))
        self.in_ack_disp = <MPI_Aint *>calloc(n, sizeof(MPI_Aint))
        self.wait_offs = <MPI_Aint *>calloc(w, sizeof(MPI_Aint))
        self.wait_expected = <int64_t *>calloc(w, sizeof(int64_t))
        self.skip = <int *>calloc(m, sizeof(int))
        self.sizes = <MPI_Aint *>calloc(max(self.size, 1), sizeof(MPI_Aint))
        if (self.sizes == NULL or self.skip == NULL
                or self._in == NULL or self._out == NULL or self.out_slot_disp == NULL
                or self.out_notify_disp == NULL or self.in_ack_disp == NULL
                or self.wait_offs == NULL or self.wait_expected == NULL):
            raise MemoryError()

    cdef void _free_arrays(self) noexcept:
        free(self._in); self._in = NULL
        free(self._out); self._out = NULL
        free(self.out_slot_disp); self.out_slot_disp = NULL
        free(self.out_notify_disp); self.out_notify_disp = NULL
        free(self.in_ack_disp); self.in_ack_disp = NULL
        free(self.wait_offs); self.wait_offs = NULL
        free(self.wait_expected); self.wait_expected = NULL
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
        self._finish_late(self.flush_timeout)
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
                    if self._locked:
                        CHKERR(MPI_Win_unlock_all(self.win), "MPI_Win_unlock_all")
                    if self.rma:
                        CHKERR(MPI_Win_free(&self.win), "MPI_Win_free")
                        self.words.flushed()    # completed: its words' memory may go
                    elif self.alloc_base != NULL:
                        CHKERR(MPI_Free_mem(self.alloc_base), "MPI_Free_mem")
                    self.base = self.alloc_base = NULL
                    CHKERR(MPI_Comm_free(&self.comm), "MPI_Comm_free")
                finally:
                    asap_watchdog_disarm()
        finally:
            self._freed = True
            self._closed()
            self._locked = False
            self._release()

    def watch(self, MPI.Comm comm):
        """Fault tolerance: from now on every wait of this window also probes `comm`
        between its polls once it sleeps between them (past poll_yields polls;
        MPI_Iprobe, nothing is ever sent there), so that a process failure or a
        revocation of `comm` ends the wait with a ProcessFailedError instead of a
        timeout.  None stops it.  A wait that ends within its yields makes no call
        more."""
        if comm is None or comm.ob_mpi == MPI_COMM_NULL:
            self.watched = MPI_COMM_NULL
            self._watched_ref = None
            return
        self.watched = comm.ob_mpi
        self._watched_ref = comm

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
        self.watched = MPI_COMM_NULL
        self._watched_ref = None
        self.words.forget()
        self._leave_behind(True)
        self.abandoned = True
        self._freed = True
        self._locked = False
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
        return self._late != MPI_REQUEST_NULL

    @property
    def freed(self):
        """True once free() ran."""
        return self._freed

    @property
    def words_kind(self):
        """How this window's words travel (words.pxi): "OneSidedWords" (MPI atomics in
        the neighbours' windows), "MessageWords" (tokens and word messages) or "Words"
        (local only: the transport's messages are its notifies and acks)."""
        return type(self.words).__name__

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.free()

    cdef inline int _check_alive(self) except -1:
        if self._freed:
            raise FreedError("this slot window was freed; create a new Exchange")
        return 0

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
        if version <= 0:
            raise ConfigError(f"versions start at 1, got {version}")
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
                if self._own_word(self.off_ack + 8 * j) >= threshold:
                    self.skip[j] = 1
                    self.suppressed += 1
        return 0

    cdef int _flush_all(self, const char *what, int64_t version, const char *ranks) except -1 nogil:
        # A flush cannot time out; the watchdog ends the job if it outlives the timeout.
        cdef int ierr
        if self.words.lazy():
            ranks = self.nbr_desc       # it also completes the lazy notifies and acks
        asap_watchdog_arm(self.flush_timeout, what, version, ranks)
        ierr = MPI_Win_flush_all(self.win)
        asap_watchdog_disarm()
        CHKERR(ierr, "MPI_Win_flush_all")
        self.words.flushed()
        return 0

    cdef int _flush(self, int target, const char *what) except -1 nogil:
        # `what` names the operation; the target is described in self.what
        cdef int ierr
        snprintf(self.what, sizeof(self.what), "%d", target)
        asap_watchdog_arm(self.flush_timeout, what, -1, self.what)
        ierr = MPI_Win_flush(target, self.win)
        asap_watchdog_disarm()
        return CHKERR(ierr, "MPI_Win_flush")

    cdef int _transfer(self, char *local, Py_ssize_t n, int target, MPI_Aint disp,
                       bint get) except -1 nogil:
        # MPI counts are int, and MPICH's active-message RMA crashes on large pieces:
        # payloads go in pieces of at most max_transfer bytes.
        cdef Py_ssize_t done = 0
        cdef int chunk
        while done < n:
            chunk = <int>(n - done if n - done < self._max_transfer else self._max_transfer)
            if get:
                CHKERR(MPI_Get(local + done, chunk, MPI_BYTE, target, disp + done, chunk,
                               MPI_BYTE, self.win), "MPI_Get")
            else:
                CHKERR(MPI_Put(local + done, chunk, MPI_BYTE, target, disp + done, chunk,
                               MPI_BYTE, self.win), "MPI_Put")
            done += chunk
        return 0

    # ------------------------------------------------------------------ words

    def notify(self, int64_t version):
        """Publish `version` in every out-neighbour's notify word for slot version % depth
        (issued lazily: see OneSidedWords._lazy)."""
        self._check_alive()
        self._check_rma("notify()", -1)
        self._check_version(version)
        with nogil:
            self._mark_suppressed(0)
            self.words.notify(version, version % self.depth)

    def ack(self, int64_t version):
        """Tell every in-neighbour that its `version` was consumed (its slot is free);
        issued lazily, not flushed before this returns (see OneSidedWords._lazy)."""
        self._check_alive()
        self._check_rma("ack()", -1)
        with nogil:
            self.words.ack(version)

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
            self._await_acks(version - 1, timeout, False)
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
            self._await_notifies(version, timeout, mode == AWAIT_AT_LEAST)
            return None
        if mode == AWAIT_COUNT:
            return self.wait_notifies_count(version, count, timeout)
        if mode == AWAIT_NEWEST:
            return self.wait_newest(version, count, timeout)
        if mode == AWAIT_RELEASED:
            return self._await_released(version, timeout)
        if mode == AWAIT_BARRIER:
            self.barrier(timeout, version)
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
            self._check_rma("release()", -1)
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

    def accumulate_word(self, int target, Py_ssize_t disp, int64_t value, op="replace"):
        """Atomically replace, add to or raise to at least `value` ("replace", "sum",
        "max") the int64 word at `disp` in `target`'s window; returns the word's old
        value (MPI_Fetch_and_op, flushed)."""
        cdef MPI_Op mop
        cdef int64_t old = 0
        self._check_alive()
        self._check_target(target, disp)
        self._check_rma("accumulate_word()", -1)
        if op == "replace":
            mop = MPI_REPLACE
        elif op == "sum":
            mop = MPI_SUM
        elif op == "max":
            mop = MPI_MAX
        else:
            raise ConfigError(f"op must be 'replace', 'sum' or 'max', got {op!r}")
        with nogil:
            old = (<OneSidedWords>self.words).accumulate(target, disp, value, mop)
        return old

    def write_words(self, int target, Py_ssize_t disp, values):
        """Write the int64 `values` (1 to 6) into consecutive words of `target`'s window
        from `disp`, in order, each atomically (MPI_Fetch_and_op REPLACE, flushed): a
        reader that waits for the last one (wait_word) sees the others.  A mailbox
        sends them as one message instead."""
        self._check_rma("write_words()", -1)
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

    def allgather_doubles(self, values, double timeout=-1.0):
        """Collective over the window's communicator: every rank's `values` (the same
        count on every rank), as an array (size, count).  An MPI_Iallgather polled with
        backoff: a rank that never arrives is a NeighbourTimeoutError after `timeout`
        seconds (< 0: flush_timeout), not a hang."""
        mine_array = np.ascontiguousarray(values, dtype=np.float64)
        cdef double[::1] mine = mine_array
        cdef int n = <int>mine.shape[0]
        cdef MPI_Request req
        cdef int r = 0
        cdef double t0
        self._check_alive()
        if timeout < 0:
            timeout = self.flush_timeout
        out = np.empty((self.size, max(n, 1)), dtype=np.float64)
        cdef double[:, ::1] o = out
        if n == 0:
            return out[:, :0]
        self._finish_late(timeout)
        with nogil:
            t0 = asap_now()
            CHKERR(MPI_Iallgather(&mine[0], n, MPI_DOUBLE, &o[0, 0], n, MPI_DOUBLE,
                                  self.comm, &req), "MPI_Iallgather")
            r = self._complete(&req, t0, timeout)
        if r:
            self._late, self._late_buffers = req, (mine_array, out)
            self._collective_timeout("an allgather", 0, timeout)
        return out

    cdef _finish_late(self, double timeout):
        """Complete a collective that timed out earlier (its late ranks have had the
        time since), or raise NeighbourTimeoutError again."""
        cdef int r = 0
        cdef double t0
        if self._late == MPI_REQUEST_NULL:
            return
        with nogil:
            t0 = asap_now()
            r = self._complete(&self._late, t0, timeout)
        if r:
            self._collective_timeout("a collective that timed out before", 0, timeout)
        self._late_buffers = None

    cdef int _complete(self, MPI_Request *req, double t0, double timeout) except -1 nogil:
        """Poll a nonblocking collective with backoff: 0 when done, 1 after `timeout`."""
        cdef int done = 0
        cdef long polls = 0
        while True:
            CHKERR(MPI_Test(req, &done, MPI_STATUS_IGNORE), "MPI_Test")
            if done:
                return 0
            if self._idle(&polls, t0, timeout):
                return 1

    cdef _collective_timeout(self, str what, int64_t version, double timeout):
        # a collective cannot tell who is missing: every other rank is a suspect
        others = [i for i in range(self.size) if i != self.rank]
        raise NeighbourTimeoutError(self.rank, f"{what} (some rank never arrived)", others,
                                    [version] * len(others), [-1] * len(others), timeout)

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
        self._check_rma("compare_and_swap_word()", -1)
        with nogil:
            old = (<OneSidedWords>self.words).compare_and_swap(target, disp, compare, value)
        return old

    def fetch_word(self, int target, Py_ssize_t disp):
        """Read the int64 word at `disp` in `target`'s window atomically (MPI_NO_OP;
        this rank's own word on a transport without a window)."""
        cdef int64_t value = 0
        self._check_alive()
        self._check_target(target, disp)
        self._check_rma("fetch_word() of another rank", target)
        with nogil:
            if target == self.rank:
                self._pump()        # the words messages feed: as fresh as they can be
                value = self.words.own(disp)
            else:
                (<OneSidedWords>self.words).fetch(target, disp)
                value = (<OneSidedWords>self.words).word_in
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
        self._check_rma("fetch_words()", -1)
        out = np.empty(count, dtype=np.int64)
        cdef int64_t[::1] o = out
        with nogil:
            (<OneSidedWords>self.words).fetch_many(target, disp, &o[0], <int>count)
        return out

    cdef int64_t _own_word(self, MPI_Aint disp) except? -1 nogil:
        # a word of this rank's window, read atomically (how: the words' kind)
        return self.words.own(disp)

    cdef int _check_rma(self, str what, int target) except -1:
        # a one-sided word operation (on `target`; -1: on any rank, its own included)
        # needs a window, which the message transports do not have (fetch_word of a
        # word of its own does not)
        if not self.rma and target != self.rank:
            raise ConfigError(f"{what} needs an MPI window, and the {self.transport} "
                              f"transport moves everything by message (a mailbox writes "
                              f"words with write_words and reads them with wait_word or "
                              f"local_word): for one-sided words create the Exchange "
                              f"with transport='put'")
        return 0

    cdef int _check_version(self, int64_t version) except -1:
        if version < 1:
            raise ConfigError(f"versions start at 1, got {version}")
        return 0

    cdef int _check_target(self, int target, Py_ssize_t disp) except -1:
        if not 0 <= target < self.size:
            raise ConfigError(f"rank {target} is outside the communicator (size {self.size})")
        if disp < 0 or disp % 8 or disp > self.sizes[target] - 8:
            raise ConfigError(f"offset {disp} is not an int64 word of rank {target}'s window")
        return 0

    # ------------------------------------------------------------------ waiting

    cdef int _sync(self) except -1 nogil:
        """Order this process's loads and stores of its memory with what MPI and other
        processes wrote there (the store's barrier, _sync_window or _fence_only)."""
        return self.store.sync(self.store.sync_ctx)

    cdef int _progress(self) except -1 nogil:
        # On network paths a put into this window may only complete when this rank calls
        # into MPI; MPI_Win_sync is just a memory barrier on MPICH, so poke the engine.
        # (A mailbox, which nothing reaches one-sidedly, pumps its messages instead.)
        cdef int flag = 0
        if self.rma:
            CHKERR(MPI_Win_flush(self.rank, self.win), "MPI_Win_flush")
        CHKERR(MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, self.comm, &flag, MPI_STATUS_IGNORE),
               "MPI_Iprobe")
        return 0

    cdef int _settle_pending(self, long polls) except -1 nogil:
        """In a wait that has lasted poll_yields polls: complete this rank's pending
        notifies and acks, this window's and every other window's of the process, so
        that no rank waits while a neighbour waits for one of its words."""
        if polls < self.poll_yields:
            return 0
        self.words.settle(self.flush_timeout)
        if _n_pending or _n_mailbox:
            # this window pumps in its own wait (its loop or _idle's _progress)
            _settle_all(self.flush_timeout, False, <PyObject *>self)
        return 0

    cdef int _idle(self, long *polls, double t0, double timeout,
                   bint pumped=False) except -1 nogil:
        """Between two unsuccessful polls: drive progress (unless the caller's poll
        did: `pumped`), then back off.  Returns 1 once `timeout` seconds have passed
        since t0; raises what a signal's handler raises (KeyboardInterrupt) once the
        wait has lasted SIGNAL_CHECK_S."""
        cdef double t = asap_now()
        cdef int flag = 0
        self._settle_pending(polls[0])
        if not pumped:
            self._progress()
        if self.watched != MPI_COMM_NULL and polls[0] >= self.poll_yields:
            # fault tolerance: a failure or revocation anywhere ends the wait; probed
            # once the wait sleeps between polls (past its poll_yields yields), so that
            # the short waits of a healthy run make no MPI call more
            CHKERR(MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, self.watched, &flag,
                              MPI_STATUS_IGNORE), "MPI_Iprobe")
        if t - t0 > timeout:
            return 1
        asap_backoff(polls[0], self.poll_yields, self.poll_max_sleep_us,
                     self.poll_slack_ns)
        polls[0] += 1
        self.wait_seconds += asap_now() - t
        if t - t0 > SIGNAL_CHECK_S and t - _signals_checked > SIGNAL_CHECK_S:
            _check_signals(t)
        return 0

    cdef int _wait_local(self, int n, bint at_least, double timeout) except -1 nogil:
        """Wait until each local word wait_offs[i] equals (or, atomically read, is at
        least) wait_expected[i].  Returns 0, or 1 on timeout."""
        cdef long polls = 0
        cdef double t0 = asap_now()
        cdef int i
        cdef int64_t value
        cdef bint done
        while True:
            self._pump()        # a message stamped now is seen before any back-off
            self._sync()
            done = True
            self.wait_least = INT64_MAX
            for i in range(n):
                if at_least:
                    value = self._own_word(self.wait_offs[i])
                    if value < self.wait_expected[i]:
                        done = False
                        break
                    if value < self.wait_least:
                        self.wait_least = value
                elif asap_load_i64(self.base + self.wait_offs[i]) != self.wait_expected[i]:
                    done = False
                    break
            if done:
                self._sync()
                return 0
            if self._idle(&polls, t0, timeout, self.pump_progresses):
                return 1

    cdef _raise_timeout(self, str what, int n, const int *ranks, double timeout,
                        bint at_least=False):
        cdef Py_ssize_t rel, sender
        waiting, expected, observed = [], [], []
        for i in range(n):
            value = asap_load_i64(self.base + self.wait_offs[i])
            if (value < self.wait_expected[i]) if at_least else (value != self.wait_expected[i]):
                waiting.append(ranks[i])
                expected.append(self.wait_expected[i])
                # a notify word of rotating slots (depth > 1) holds the version that slot
                # had before: the sender's last version is the newest of its slots, or
                # the newest this rank reduced (a message engine stamps the slots, not
                # these words)
                rel = self.wait_offs[i] - self.off_notify
                if 0 <= rel < 8 * self.n_in * self.depth:
                    sender = (rel // 8) // self.depth
                    value = max([value, self.store._last_version[sender]]
                                + [self._own_word(self.off_notify + 8 * (sender * self.depth + s))
                                   for s in range(self.depth)])
                observed.append(value)
        if not waiting:
            return  # everything arrived just as the time ran out: not a timeout
        raise NeighbourTimeoutError(self.rank, what, waiting, expected, observed, timeout)

    def wait_notifies(self, int64_t version, double timeout, bint at_least=False):
        """Wait until every in-neighbour published `version` in its notify word (or, with
        at_least, any version >= it, read atomically: for writers that may run ahead)."""
        self._check_alive()
        self._await_notifies(version, timeout, at_least)

    cdef int _await_notifies(self, int64_t version, double timeout,
                             bint at_least) except -1:
        # wait_notifies(), also await_()'s
        cdef int i
        cdef int r
        cdef Py_ssize_t slot
        self._check_version(version)
        slot = version % self.depth
        for i in range(self.n_in):
            self.wait_offs[i] = self.off_notify + 8 * (i * self.depth + slot)
            self.wait_expected[i] = version
        with nogil:
            asap_watchdog_waiting(b"the notify", version, self.in_desc)
            r = self._wait_local(self.n_in, at_least, timeout)
            asap_watchdog_waiting(NULL, 0, NULL)
        if r:
            self._raise_timeout(f"the notify of version {version}", self.n_in,
                                self._in, timeout, at_least)
        return 0

    def wait_acks(self, int64_t version, double timeout, bint at_least=False):
        """Wait until every out-neighbour acknowledged `version` (0: nothing to wait for),
        or, with at_least, wrote any value >= it (read atomically: Hop's tokens)."""
        self._check_alive()
        self._await_acks(version, timeout, at_least)

    cdef int _await_acks(self, int64_t version, double timeout, bint at_least) except -1:
        # wait_acks(), also deliver()'s
        cdef int j
        cdef int r
        if version <= 0:
            return 0
        for j in range(self.n_out):
            self.wait_offs[j] = self.off_ack + 8 * j
            self.wait_expected[j] = version
        with nogil:
            asap_watchdog_waiting(b"the ack", version, self.out_desc)
            r = self._wait_local(self.n_out, at_least, timeout)
            asap_watchdog_waiting(NULL, 0, NULL)
        if r:
            self._raise_timeout(f"the ack of version {version}", self.n_out, self._out,
                                timeout, at_least)
            if at_least:
                # everything arrived just as the time ran out: the words read again
                with nogil:
                    self._read_least_ack()
        return 0

    cdef int _read_least_ack(self) except -1 nogil:
        # wait_least: the smallest of this rank's ack words, each read atomically
        cdef int j
        self.wait_least = INT64_MAX
        for j in range(self.n_out):
            self.wait_least = min(self.wait_least, self._own_word(self.off_ack + 8 * j))
        return 0

    cdef int64_t _await_released(self, int64_t version, double timeout) except? -1:
        # await_'s RELEASED: the token wait, then the smallest release its last poll
        # read (the same atomic reads: nothing more per step)
        if self.n_out == 0:
            return 1 << 62
        if version > 0:
            self._await_acks(version, timeout, True)
            return self.wait_least
        with nogil:
            self._pump()        # the words messages feed: as fresh as they can be
            self._read_least_ack()
        return self.wait_least

    def wait_notifies_count(self, int64_t version, int min_count, double timeout):
        """Wait until at least `min_count` in-neighbours published exactly `version`
        (backup workers); return how many had when the wait ended."""
        cdef int r = 0
        cdef int got = 0
        cdef Py_ssize_t slot
        self._check_alive()
        self._check_version(version)
        if not 0 <= min_count <= self.n_in:
            raise ConfigError(f"min_count {min_count} outside 0..{self.n_in}")
        slot = version % self.depth
        with nogil:
            asap_watchdog_waiting(b"the notify", version, self.in_desc)
            r = self._wait_count(version, slot, min_count, timeout, &got)
            asap_watchdog_waiting(NULL, 0, NULL)
        if r:
            self._raise_timeout(f"the notify of version {version} (at least {min_count} of "
                                f"{self.n_in})", self.n_in, self._in, timeout)
        return got

    cdef int _wait_count(self, int64_t version, Py_ssize_t slot, int min_count,
                         double timeout, int *got) except -1 nogil:
        cdef long polls = 0
        cdef double t0 = asap_now()
        cdef int i
        for i in range(self.n_in):
            self.wait_offs[i] = self.off_notify + 8 * (i * self.depth + slot)
            self.wait_expected[i] = version
        while True:
            self._pump()
            self._sync()
            got[0] = 0
            for i in range(self.n_in):
                if asap_load_i64(self.base + self.wait_offs[i]) == version:
                    got[0] += 1
            if got[0] >= min_count:
                return 0
            if self._idle(&polls, t0, timeout, self.pump_progresses):
                return 1

    def barrier(self, double timeout=-1.0, int64_t version=0):
        """The BSP baseline's global barrier on the window's communicator: MPI_Ibarrier
        polled with backoff, so that a rank that never arrives is a timeout
        (NeighbourTimeoutError after `timeout` seconds; < 0: flush_timeout), not a hang.
        A barrier that timed out is completed by the next barrier or allgather, or by
        free(), once the late ranks reach it."""
        cdef MPI_Request req
        cdef int r = 0
        cdef double t0
        self._check_alive()
        if timeout < 0:
            timeout = self.flush_timeout
        self._finish_late(timeout)
        with nogil:
            t0 = asap_now()
            CHKERR(MPI_Ibarrier(self.comm, &req), "MPI_Ibarrier")
            r = self._complete(&req, t0, timeout)
        if r:
            self._late = req
            self._collective_timeout(f"the barrier of version {version}", version, timeout)

    def wait_word(self, Py_ssize_t disp, int64_t at_least, double timeout, int from_rank=-1):
        """Wait until the local word at `disp`, read atomically, is >= `at_least`."""
        cdef int r
        cdef int who = from_rank
        self._check_alive()
        self._check_local_word(disp)
        self.wait_offs[0] = disp
        self.wait_expected[0] = at_least
        with nogil:
            r = self._wait_local(1, True, timeout)
        if r:
            raise NeighbourTimeoutError(self.rank, f"word at offset {disp} to reach {at_least}",
                                        [who], [at_least], [self.local_word(disp)], timeout)

    def wait_words(self, disps, int64_t at_least, double timeout, from_ranks):
        """wait_word for several local words at once (one pump per poll for all): until
        the word at each of `disps`, read atomically, is >= `at_least`.  At most
        max(n_in, n_out, user words) words; NeighbourTimeoutError names the
        `from_ranks` (one per word: who writes it) whose words lag."""
        cdef int n = len(disps)
        cdef int most = max(self.n_in, self.n_out, self.n_user, 1)
        cdef int i, r
        cdef int *who
        self._check_alive()
        if len(from_ranks) != n or not 1 <= n <= most:
            raise ConfigError(f"wait_words takes 1 to {most} words, one writer rank "
                              f"each; got {n} words and {len(from_ranks)} ranks")
        for i in range(n):
            self._check_local_word(disps[i])
            self.wait_offs[i] = disps[i]
            self.wait_expected[i] = at_least
        with nogil:
            r = self._wait_local(n, True, timeout)
        if r:
            who = <int *>calloc(n, sizeof(int))
            if who == NULL:
                raise MemoryError()
            try:
                for i in range(n):
                    who[i] = from_ranks[i]
                self._raise_timeout(f"words to reach {at_least}", n, who, timeout, True)
            finally:
                free(who)

    def ack_offset(self, int out_index):
        """Offset of the word out-neighbour `out_index` writes (acks, Hop's progress)."""
        if not 0 <= out_index < self.n_out:
            raise ConfigError(f"out-neighbour index {out_index} outside 0..{self.n_out - 1}")
        return self.off_ack + 8 * out_index

    def local_word(self, Py_ssize_t disp):
        """Atomic load of the int64 word at `disp` in this rank's own window."""
        self._check_alive()
        self._check_local_word(disp)
        return asap_load_i64(self.base + disp)

    cdef int _check_local_word(self, Py_ssize_t disp) except -1:
        if not 0 <= disp <= self.total_bytes - 8 or disp % 8:
            raise ConfigError(f"offset {disp} is not an int64 word of this window")
        return 0

    def slot_offset(self, int in_index, int64_t version):
        """Offset of the header of in-neighbour `in_index`'s slot for `version` (the
        shared and newest-version transports, whose slots are not at a fixed place in
        this window, refuse)."""
        if not 0 <= in_index < self.n_in:
            raise ConfigError(f"in-neighbour index {in_index} outside 0..{self.n_in - 1}")
        self._check_version(version)
        return self.off_slots + (in_index * self.depth + version % self.depth) * self.slot_stride

    def payload(self, int in_index, int64_t version):
        """A read-only zero-copy view of in-neighbour `in_index`'s payload slot for
        `version` (whatever it holds now: no version check).  The window cannot be freed
        while such a view is alive."""
        self._check_alive()
        return memoryview(_SlotPayload(self, self.slot_offset(in_index, version) + HEADER_BYTES))

    # ------------------------------------------------------------------ reducing

    def reduce(self, buf, double w_self, double[::1] weights not None, int64_t expected,
               int64_t min_version, int64_t max_version, bint seqlock=False,
               bint checksum=False, bint renormalize=False, bint require_all=False,
               bint only_notified=False, own=None):
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
        self._check_alive()
        self._check_version(expected)
        if weights.shape[0] != self.n_in:
            raise ConfigError(f"{weights.shape[0]} weights for {self.n_in} in-neighbours")
        with nogil:
            self._pump()        # a reduce that never waits (async's) sees what arrived
        PyObject_GetBuffer(buf, &view, PyBUF_ANY_CONTIGUOUS | PyBUF_WRITABLE)
        try:
            if view.len != self.nbytes:
                raise ConfigError(f"buffer has {view.len} bytes but the window's slots hold "
                                  f"{self.nbytes}")
            own_ptr = <const char *>view.buf
            if own is not None:
                PyObject_GetBuffer(own, &own_view, PyBUF_ANY_CONTIGUOUS)
                own_held = True
                if own_view.len != self.nbytes:
                    raise ConfigError(f"own has {own_view.len} bytes but the window's slots "
                                      f"hold {self.nbytes}")
                own_ptr = <const char *>own_view.buf
            if (seqlock or checksum) and own_ptr == <const char *>view.buf:
                self.store.keep_copies()
            for i in range(self.n_in):
                self.store.exp_v[i] = expected
            with nogil:
                r = self._reduce(<char *>view.buf, w_self, &weights[0] if self.n_in else NULL,
                                 min_version, max_version, False, seqlock, checksum,
                                 renormalize, require_all, only_notified, own_ptr)
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
            bad = {self._in[i]: STATUS_NAMES[self.store.status[i]] for i in range(self.n_in)
                   if not self.store.used[i]}
            raise ProtocolError(f"rank {self.rank}: version {expected} from rank(s) "
                                f"{sorted(bad)} was not usable ({bad}); nothing was reduced, "
                                f"the buffer is unchanged (a peer broke the protocol)")
        return r

    def reduce_versions(self, buf, double w_self, double[::1] weights not None,
                        int64_t[::1] versions not None, bint checksum=False,
                        bint renormalize=True):
        """buf = w_self*buf + sum_i weights[i]*(version versions[i] of in-neighbour i),
        each input verified (header == footer == its version); versions[i] <= 0 skips
        input i.  Inputs that fail are dropped and the reduce recomputed (a copy of buf is
        kept), with the weights of the rest renormalized unless renormalize is false.
        Returns the number of inputs reduced."""
        cdef Py_buffer view
        cdef int r, i
        self._check_alive()
        if weights.shape[0] != self.n_in or versions.shape[0] != self.n_in:
            raise ConfigError(f"need {self.n_in} weights and versions, got "
                              f"{weights.shape[0]} and {versions.shape[0]}")
        with nogil:
            self._pump()        # a reduce that never waits (async's) sees what arrived
        PyObject_GetBuffer(buf, &view, PyBUF_ANY_CONTIGUOUS | PyBUF_WRITABLE)
        try:
            if view.len != self.nbytes:
                raise ConfigError(f"buffer has {view.len} bytes but the window's slots hold "
                                  f"{self.nbytes}")
            self.store.keep_copies()
            for i in range(self.n_in):
                self.store.exp_v[i] = versions[i]
            with nogil:
                r = self._reduce(<char *>view.buf, w_self, &weights[0] if self.n_in else NULL,
                                 0, 0, True, True, checksum, renormalize, False, False,
                                 <const char *>view.buf)
        finally:
            PyBuffer_Release(&view)
        return r

    def wait_newest(self, int64_t at_most, int64_t at_least, double timeout):
        """Wait until every in-neighbour has a completed version in [at_least, at_most]
        (Hop's bounded staleness: block only on neighbours with nothing recent enough);
        return the newest such version per in-neighbour."""
        cdef long polls = 0
        cdef double t0
        cdef bint done
        cdef int i
        self._check_alive()
        t0 = asap_now()
        while True:
            versions = self.newest_versions(at_most)
            if self.n_in == 0 or versions.min() >= at_least:
                return versions
            with nogil:
                done = self._idle(&polls, t0, timeout)
            if done:
                late = [i for i in range(self.n_in) if versions[i] < at_least]
                raise NeighbourTimeoutError(
                    self.rank, f"an update of version >= {at_least}",
                    [self._in[i] for i in late], [at_least] * len(late),
                    [int(versions[i]) for i in late], timeout)

    def newest_versions(self, int64_t at_most):
        """Per in-neighbour, the newest version <= at_most whose write completed (its
        notify word, read atomically over all `depth` slots); 0 if none."""
        cdef int i, s
        cdef int64_t best
        self._check_alive()
        out = np.zeros(self.n_in, dtype=np.int64)
        cdef int64_t[::1] o = out
        cdef int64_t word
        with nogil:
            self._pump()
            for i in range(self.n_in):
                best = 0
                for s in range(self.depth):
                    word = self._own_word(self.off_notify + 8 * (i * self.depth + s))
                    if best < word <= at_most:
                        best = word
                o[i] = best
        return out

    cdef int _reduce(self, char *out, double w_self, const double *weights,
                     int64_t min_version, int64_t max_version, bint exact_each, bint seqlock,
                     bint checksum, bint renormalize, bint require_all,
                     bint only_notified, const char *own_in) except -2 nogil:
        # The channel's part of a reduce: make the slots' memory visible, then point the
        # store at the slot of version store.exp_v[i] of each in-neighbour (NULL with
        # only_notified when its notify word is not that version: its sender may be
        # writing it); the store verifies and reduces (slotstore.pxi).
        self._point(only_notified)
        return self.store.reduce(out, w_self, weights, min_version, max_version, exact_each,
                            seqlock, checksum, renormalize, require_all, own_in)

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

    def read_begin(self, int64_t[::1] versions not None, int64_t min_version,
                   int64_t max_version, bint exact_each=False, bint require_all=False,
                   bint only_notified=False):
        """The first half of a reduce made elsewhere (on a device: asapmpi.device):
        the checks a reduce makes before it reads any payload, on the slot of
        version versions[i] of each in-neighbour (usable as in reduce(), or exactly
        versions[i] > 0 with exact_each).  Returns each input's payload address to
        read (uint64; 0: not to be read); ProtocolError with require_all when an input
        is not usable.  Copy the payloads out, then call read_end() before using them."""
        cdef int i, r
        self._check_alive()
        if versions.shape[0] != self.n_in:
            raise ConfigError(f"need {self.n_in} versions, got {versions.shape[0]}")
        with nogil:
            self._pump()        # a reduce that never waits (async's) sees what arrived
        for i in range(self.n_in):
            self.store.exp_v[i] = versions[i]
        with nogil:
            self._point(only_notified)
            r = self.store.check(min_version, max_version, exact_each, require_all)
        if r == -3:
            bad = {self._in[i]: STATUS_NAMES[self.store.status[i]] for i in range(self.n_in)
                   if not self.store.used[i]}
            raise ProtocolError(f"rank {self.rank}: version(s) {list(versions)} from rank(s) "
                                f"{sorted(bad)} were not usable ({bad}); nothing was "
                                f"reduced, the buffer is unchanged (a peer broke the "
                                f"protocol)")
        addresses = np.zeros(self.n_in, dtype=np.uint64)
        for i in range(self.n_in):
            if self.store.used[i]:
                addresses[i] = <uint64_t>(<uintptr_t>(self.store.hdr[i] + HEADER_BYTES))
        return addresses

    def read_end(self):
        """The second half of a reduce made elsewhere, once the payloads read_begin
        named were copied out: the barrier, then each read slot's header again.
        Returns the indices of the inputs whose slot changed during the copy (dropped,
        counted torn: their copies must not be used); the statuses are counted."""
        cdef int i
        before = [i for i in range(self.n_in) if self.store.used[i]]
        with nogil:
            self.store.recheck()
        return [i for i in before if not self.store.used[i]]

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
