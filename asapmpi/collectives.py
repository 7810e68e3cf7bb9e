"""Collectives with a deadline, for the moments outside the steps: agreeing on options
before an Exchange exists, starting the clocks, gathering results, freeing.

A plain MPI collective waits forever for a rank that died or stalls outside MPI.  Each
function here first runs `arrive`, a barrier relayed through rank 0 with point-to-point
messages that are polled with backoff: every rank sends rank 0 one byte; rank 0 waits
for them until the deadline and then tells every rank that arrived which ranks did not
(none: go on).  A missing rank is named on every rank that arrived, in a
NeighbourTimeoutError; if rank 0 itself is missing, the others name it.  Only after
everyone arrived does the real collective run, so it cannot wait on a dead rank (short
of one dying in between).  arrive()'s pending requests are cancelled and completed
before its error is raised: nothing outlives the call.

The rule for every MPI call outside asapmpi._core (tests/exchange/test_beside_core.py scans):
a nonblocking request is completed (wait_polled, wait_or_leave) or handed, with every
buffer it reads or writes, to the leftovers (leave); every wait and flush has a
deadline and names whom it waited for (wait_or_leave, allreduce, flush).  A collective
request can be neither cancelled nor freed while other ranks may still take part
(MPI-3.1 section 5.12): dropped, mpi4py would free it and Python its buffers, into
which the late rank's contribution is then written.  The leftovers keep both
referenced until MPI completes the request, and are tested at every wait here.

The messages use tags ARRIVE_TAG and VERDICT_TAG on the caller's communicator; a
program must not receive those tags with MPI_ANY_TAG on it at the same time.

A rank 0 that ends while other ranks wait for it in arrive() (it made its Exchange on
another communicator, or never called the collective) answers them as it exits
(answer_the_waiting, an atexit handler): it receives their arrivals and sends each a
verdict naming rank 0 itself as missing, which no other verdict does, and they raise a
NeighbourTimeoutError saying that rank 0 ended without joining.  Unanswered, their
arrivals stayed unmatched on its COMM_WORLD: its MPI_Finalize failed ("being freed has
1 unmatched message(s)"), the process ended without telling the launcher, and hydra
killed every other rank at once (SIGKILL), before any deadline could name rank 0
(issue 49).
"""
from __future__ import annotations

import atexit
import sys
import time
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np
from mpi4py import MPI

from .errors import NeighbourTimeoutError

# below 32767, the smallest MPI_TAG_UB the standard allows
ARRIVE_TAG = 32701
VERDICT_TAG = 32702
_MAX_SLEEP_S = 1e-3
#: how much longer than the deadline a rank waits for rank 0's verdict
VERDICT_GRACE_S = 2.0


def _settle() -> None:
    """Complete the pending notifies and acks of this process's slot windows before
    waiting here.  A rank's last NOTIFY-ACK or Hop notifies are issued lazily, and an
    MPI may defer even issuing them until a synchronization call (Open MPI's osc pt2pt
    does): a neighbour still in its last steps would wait for them while this rank
    waits here."""
    slotwin = sys.modules.get("asapmpi._core.slotwin")
    if slotwin is not None:
        slotwin.settle_all()


def _release_held() -> None:
    """Between two polls here: what this process's mailboxes hold back and may send now
    leaves (a held-back token, the newest version waiting for a free request): a
    neighbour still stepping may wait for it, and no window of this rank pumps while it
    waits here (docs/MODELCHECK.md, the message paths)."""
    slotwin = sys.modules.get("asapmpi._core.slotwin")
    if slotwin is not None:
        slotwin.release_all()


def _backoff(polls: int) -> None:
    # yield at first, then sleep up to a millisecond: ranks may share cores
    time.sleep(0 if polls < 32 else min(_MAX_SLEEP_S, 1e-6 * (polls - 31) ** 2))


#: requests whose wait ran out of time, each with the buffers MPI may still read or
#: write (module docstring): referenced here until MPI completes them
_leftovers: List[Tuple[MPI.Request, Tuple[Any, ...]]] = []


def leave(request: MPI.Request, *buffers: Any) -> None:
    """Hand a request still pending at its deadline to the leftovers, with every buffer
    it reads or writes: neither is freed before MPI completes the request (module
    docstring).  A receive that must not land later is cancelled by the caller first
    (a collective request cannot be cancelled)."""
    if request == MPI.REQUEST_NULL:
        return
    _leftovers.append((request, buffers))


def _done(request: MPI.Request) -> bool:
    # a leftover's end: completed, or completed with an error, which belongs to the
    # call that gave it up (a process failure, a revoked communicator under fault
    # tolerance), never to the call that happens to test it now
    try:
        return request.Test()
    except MPI.Exception:
        return request == MPI.REQUEST_NULL      # else still pending (MPI_ERR_PENDING)


def leftovers() -> int:
    """The requests handed to leave() that MPI has not completed yet, after testing
    each (those completed, with or without an error, are let go with their
    buffers)."""
    if _leftovers:
        _leftovers[:] = [(r, b) for r, b in _leftovers if not _done(r)]
    return len(_leftovers)


def wait_polled(requests: List[MPI.Request], deadline: float) -> List[int]:
    """Poll until every request completed or the deadline (time.monotonic()) passed,
    yielding, then sleeping up to a millisecond between polls; returns the indices
    still pending (each request tested on its own, so that one late peer is told apart
    from the rest)."""
    pending = list(range(len(requests)))
    polls = 0
    leftovers()
    while pending:
        _release_held()
        pending = [i for i in pending if not requests[i].Test()]
        if not pending or time.monotonic() > deadline:
            break
        _backoff(polls)
        polls += 1
    return pending


def cancel(requests: List[MPI.Request]) -> None:
    """Cancel each request still pending and complete it (a message that was already
    matched completes instead)."""
    for req in requests:
        if req != MPI.REQUEST_NULL:
            req.Cancel()
            req.Wait()


def wait_or_leave(requests: Sequence[MPI.Request], buffers: Sequence[Any], timeout: float,
                  rank: int, what: str, ranks: Sequence[int] = ()) -> None:
    """Wait for every request (polled, backing off) for up to `timeout` seconds; past
    it, hand those still pending with `buffers` (what any of them reads or writes) to
    the leftovers and raise NeighbourTimeoutError: rank `rank` waited for `what` from
    `ranks` (none: an MPI collective, which does not say which rank is late)."""
    late = wait_polled(list(requests), time.monotonic() + timeout)
    if late:
        for i in late:
            leave(requests[i], *buffers)
        raise NeighbourTimeoutError(rank, what, list(ranks), [], [], timeout)


class _left_on_error:
    """``with _left_on_error(receives, sends, *buffers):`` around the waits of requests
    already started: an exception out of them (a process failure raised by a test, a
    KeyboardInterrupt) first hands every request still pending to the leftovers with
    `buffers`, the receives cancelled (so none lands later), then goes on."""

    def __init__(self, receives: Sequence[MPI.Request], sends: Sequence[MPI.Request],
                 *buffers: Any):
        self.receives, self.sends, self.buffers = receives, sends, buffers

    def __enter__(self) -> "_left_on_error":
        return self

    def __exit__(self, kind, value, traceback) -> bool:
        if kind is None:
            return False
        for req in self.receives:
            if req != MPI.REQUEST_NULL:
                try:
                    req.Cancel()
                except MPI.Exception:
                    pass        # a revoked communicator: kept as it is
        for req in (*self.receives, *self.sends):
            leave(req, *self.buffers)
        return False


class Nonblocking:
    """A nonblocking collective in flight and the buffers it reads and writes, for a
    caller that does other work while it completes (join's agreement steps along):
    test() until it completes; a caller that gives up (a deadline, an exception) calls
    leave(), which hands both to the leftovers."""

    def __init__(self, request: MPI.Request, *buffers: Any):
        self.request = request
        self.buffers = buffers

    def test(self) -> bool:
        """Whether it completed (then its buffers hold the result)."""
        return bool(self.request.Test())

    def leave(self) -> None:
        """Give up on it: the leftovers keep it and its buffers until MPI completes it."""
        leave(self.request, *self.buffers)
        self.request = MPI.REQUEST_NULL


def start_allreduce(comm: MPI.Comm, sendbuf: Any, recvbuf: Any, op: MPI.Op) -> Nonblocking:
    """MPI_Iallreduce(sendbuf, recvbuf, op), as a Nonblocking the caller completes or
    leaves."""
    return Nonblocking(comm.Iallreduce(sendbuf, recvbuf, op=op), sendbuf, recvbuf)


def allreduce(comm: MPI.Comm, sendbuf: Any, recvbuf: Any, op: MPI.Op, timeout: float,
              what: str) -> None:
    """MPI_Allreduce(sendbuf, recvbuf, op) as an MPI_Iallreduce polled with backoff
    (a blocking one spins in the MPI's progress loop, taking the cycles of a slow rank
    that shares the cores); past `timeout` seconds the request and both buffers go to
    the leftovers and NeighbourTimeoutError says what waited."""
    request = comm.Iallreduce(sendbuf, recvbuf, op=op)
    wait_or_leave([request], [sendbuf, recvbuf], timeout, comm.Get_rank(), what)


def waitall_watched(requests: Sequence[MPI.Request], timeout: float, what: str,
                    ranks: Sequence[int]) -> None:
    """MPI_Waitall under the watchdog: for code whose wait is what it measures (a
    benchmark's floor of the MPI's own exchange), where polling with backoff would
    change the figure.  Past `timeout` seconds the watchdog ends the job with a line
    naming `what` and `ranks`, instead of a hang."""
    from ._core import slotwin

    with slotwin.Watched(timeout, what, ", ".join(str(r) for r in ranks) or "?"):
        MPI.Request.Waitall(list(requests))


def arrive(comm: MPI.Comm, timeout: float, what: str) -> None:
    """A barrier with a deadline over `comm`: returns once every rank called it, or
    raises NeighbourTimeoutError naming the ranks that did not arrive within `timeout`
    seconds (on every rank that did).  `what` says what the ranks were meeting for."""
    rank, size = comm.Get_rank(), comm.Get_size()
    _settle()
    if size == 1:
        return
    deadline = time.monotonic() + timeout
    # verdict: number of missing ranks, then their ranks
    verdict = np.zeros(size + 1, dtype=np.int64)
    if rank == 0:
        byte = np.zeros(size, dtype=np.uint8)
        recvs = [comm.Irecv([byte[r:r + 1], MPI.BYTE], source=r, tag=ARRIVE_TAG)
                 for r in range(1, size)]
        with _left_on_error(recvs, (), byte):
            missing = [i + 1 for i in wait_polled(recvs, deadline)]
            cancel([recvs[r - 1] for r in missing])
        verdict[0] = len(missing)
        verdict[1:1 + len(missing)] = missing
        present = [r for r in range(1, size) if r not in missing]
        sends = [comm.Isend([verdict, MPI.INT64_T], dest=r, tag=VERDICT_TAG) for r in present]
        # the verdict is small (sent eagerly): a rank that arrived cannot keep it waiting
        with _left_on_error((), sends, verdict):
            late = wait_polled(sends, time.monotonic() + timeout)
            cancel([sends[i] for i in late])
    else:
        one = np.ones(1, dtype=np.uint8)
        send = comm.Isend([one, MPI.BYTE], dest=0, tag=ARRIVE_TAG)
        recv = comm.Irecv([verdict, MPI.INT64_T], source=0, tag=VERDICT_TAG)
        with _left_on_error([recv], [send], verdict, one):
            # rank 0 sends its verdict at its own deadline, which may be after ours:
            # wait a little longer, so that the missing rank, not rank 0, is named
            if wait_polled([recv], deadline + min(timeout, VERDICT_GRACE_S)):
                cancel([recv, send])
                raise NeighbourTimeoutError(rank, f"{what} (relayed by rank 0)", [0], [],
                                            [], timeout)
        # one byte, sent eagerly: rank 0 answered, so it has matched it too
        wait_or_leave([send], [one], timeout, rank, f"{what}: rank 0's receive", [0])
        missing = verdict[1:1 + int(verdict[0])].tolist()
        if 0 in missing:        # rank 0's last word (answer_the_waiting)
            raise NeighbourTimeoutError(rank, what, [0], [], [], timeout).explained(ENDED)
    if missing:
        raise NeighbourTimeoutError(rank, what, missing, [], [], timeout)


#: why the ranks told by answer_the_waiting() did not wait out their deadline
ENDED = ("rank 0 ended without joining it (it made its Exchange on another communicator, "
         "or never called this): every rank must call it, on the same communicator")


def answer_the_waiting() -> List[int]:
    """At the end of this process: receive the arrivals of the ranks that wait for this
    one in arrive() on COMM_WORLD, where this rank is rank 0 and will not come, and tell
    each that rank 0 ended (a verdict naming rank 0 as missing); say so on stderr.
    Returns the ranks told.  Registered with atexit, which runs before mpi4py's
    MPI_Finalize: their unmatched arrivals would make it fail, and hydra then kills
    every rank without a word (module docstring)."""
    if not MPI.Is_initialized() or MPI.Is_finalized():
        return []
    comm = MPI.COMM_WORLD
    if comm.Get_size() == 1 or comm.Get_rank() != 0:
        return []
    status = MPI.Status()
    byte = np.zeros(1, dtype=np.uint8)
    waiting = set()
    # a matched probe: the receive takes the very message found, there already
    try:
        while (message := comm.Improbe(source=MPI.ANY_SOURCE, tag=ARRIVE_TAG,
                                       status=status)) is not None:
            message.Recv([byte, MPI.BYTE])
            waiting.add(status.Get_source())
    except MPI.Exception as exc:
        # a rank of COMM_WORLD died and the others survived it in place (ULFM: a probe
        # of any source fails); nobody waits for this rank on COMM_WORLD any more.
        # Any other error is the caller's to see.
        from .errors import ProcessFailedError, mpi_error

        if not isinstance(mpi_error(exc.Get_error_code(), "MPI_Improbe", str(exc)),
                          ProcessFailedError):
            raise
        return []
    if not waiting:
        return []
    told = sorted(waiting)
    verdict = np.zeros(comm.Get_size() + 1, dtype=np.int64)
    verdict[0], verdict[1] = 1, 0
    sends = [comm.Isend([verdict, MPI.INT64_T], dest=r, tag=VERDICT_TAG) for r in told]
    # the verdict is small (sent eagerly), and each waits for it with a receive posted
    late = wait_polled(sends, time.monotonic() + VERDICT_GRACE_S)
    cancel([sends[i] for i in late])
    print(f"asapmpi: rank 0: rank(s) {', '.join(map(str, told))} wait for this rank in an "
          f"asapmpi collective on MPI_COMM_WORLD (an Exchange's creation, say) that it "
          f"never joined; it is ending, and has told them", file=sys.stderr, flush=True)
    return told


atexit.register(answer_the_waiting)


def barrier(comm: MPI.Comm, timeout: float, what: str) -> None:
    """MPI_Barrier with a deadline (see arrive)."""
    arrive(comm, timeout, what)


def allgather(comm: MPI.Comm, obj: Any, timeout: float, what: str) -> List[Any]:
    """comm.allgather(obj) once every rank arrived within `timeout` seconds."""
    arrive(comm, timeout, what)
    return comm.allgather(obj)


def gather(comm: MPI.Comm, obj: Any, timeout: float, what: str,
           root: int = 0) -> Optional[List[Any]]:
    """comm.gather(obj, root) once every rank arrived within `timeout` seconds."""
    arrive(comm, timeout, what)
    return comm.gather(obj, root=root)
