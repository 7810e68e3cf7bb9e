# The collectives on a channel's communicator (included by slotwin.pyx after the waits;
# docs/ARCHITECTURE.md): BSP's barrier of every step and gossip's allgather, each a
# nonblocking MPI collective polled through the channel's waits (its progress and
# back-off), so that a rank that never arrives is a NeighbourTimeoutError, not a hang.
# asapmpi.collectives does the same for the moments outside the steps, in Python; these
# stay in C because a BSP step waits in one.


cdef class Collectives:
    """A channel's barrier and allgather, with the one collective that timed out."""

    cdef MPI_Comm comm              # the channel's (it frees it after this is done)
    cdef int rank, size
    cdef double timeout             # the default limit (the channel's flush_timeout)
    cdef Waits waits
    # a nonblocking collective that timed out, and the buffers it may still write: MPI
    # allows neither cancelling nor freeing it, so it is completed before the next
    # collective (every rank issues them in the same order) or at free()
    cdef MPI_Request late
    cdef object late_buffers

    def __cinit__(self):
        self.comm = MPI_COMM_NULL
        self.late = MPI_REQUEST_NULL

    cdef int barrier(self, double timeout, int64_t version) except -1:
        """MPI_Ibarrier polled with back-off; NeighbourTimeoutError after `timeout`
        seconds (< 0: the default), the barrier then left to the next collective."""
        cdef MPI_Request req
        cdef int r = 0
        cdef double t0
        if timeout < 0:
            timeout = self.timeout
        self.finish_late(timeout)
        with nogil:
            t0 = asap_now()
            CHKERR(MPI_Ibarrier(self.comm, &req), "MPI_Ibarrier")
            r = self._complete(&req, t0, timeout)
        if r:
            self.late = req
            self._timed_out(f"the barrier of version {version}", version, timeout)
        return 0

    cdef object allgather_doubles(self, values, double timeout):
        """Every rank's `values` (the same count on every rank) as an array (size,
        count): an MPI_Iallgather polled with back-off."""
        mine_array = np.ascontiguousarray(values, dtype=np.float64)
        cdef double[::1] mine = mine_array
        cdef int n = <int>mine.shape[0]
        cdef MPI_Request req
        cdef int r = 0
        cdef double t0
        if timeout < 0:
            timeout = self.timeout
        out = np.empty((self.size, max(n, 1)), dtype=np.float64)
        cdef double[:, ::1] o = out
        if n == 0:
            return out[:, :0]
        self.finish_late(timeout)
        with nogil:
            t0 = asap_now()
            CHKERR(MPI_Iallgather(&mine[0], n, MPI_DOUBLE, &o[0, 0], n, MPI_DOUBLE,
                                  self.comm, &req), "MPI_Iallgather")
            r = self._complete(&req, t0, timeout)
        if r:
            self.late, self.late_buffers = req, (mine_array, out)
            self._timed_out("an allgather", 0, timeout)
        return out

    cdef int finish_late(self, double timeout) except -1:
        """Complete a collective that timed out earlier (its late ranks have had the
        time since), or raise NeighbourTimeoutError again."""
        cdef int r = 0
        cdef double t0
        if self.late == MPI_REQUEST_NULL:
            return 0
        with nogil:
            t0 = asap_now()
            r = self._complete(&self.late, t0, timeout)
        if r:
            self._timed_out("a collective that timed out before", 0, timeout)
        self.late_buffers = None
        return 0

    cdef int _complete(self, MPI_Request *req, double t0, double timeout) except -1 nogil:
        # poll a nonblocking collective with back-off: 0 when done, 1 after `timeout`
        cdef int done = 0
        cdef long polls = 0
        while True:
            CHKERR(MPI_Test(req, &done, MPI_STATUS_IGNORE), "MPI_Test")
            if done:
                return 0
            if self.waits.idle(&polls, t0, timeout):
                return 1

    cdef _timed_out(self, str what, int64_t version, double timeout):
        # a collective cannot tell who is missing: every other rank is a suspect
        others = [i for i in range(self.size) if i != self.rank]
        raise NeighbourTimeoutError(self.rank, f"{what} (some rank never arrived)", others,
                                    [version] * len(others), [-1] * len(others), timeout)
