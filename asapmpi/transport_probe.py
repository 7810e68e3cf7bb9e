"""transport="auto" by measurement: time what each transport's protocol waits on.

NOTIFY-ACK waits, every step, for one small signal per neighbour and direction: on the
put and shared transports a notify or ack is an int64 word written into the
neighbour's window (MPI_Fetch_and_op, then a flush), on the message transport it is a
message (the update itself; its receive, posted, is the ack).  Which is faster is a
property of the MPI stack, not of its name: on shared memory a window word costs a
store, on MPICH's active-message network path and on Open MPI's UCX over TCP it is
several round trips that wait for the target's CPU, while a message costs one.

`measure` runs, on a communicator, ROUNDS rounds of each signal over the graph's edges
(every rank signals its out-neighbours and waits for its in-neighbours, as a step
does), after WARMUP rounds, and returns the median round per neighbour class (same host,
other host), the slowest rank's.  Collective; a rank that does not answer within the
timeout is named (NeighbourTimeoutError), as in a step.
"""
from __future__ import annotations

import statistics
import time
from typing import Dict, List, Sequence

import numpy as np
from mpi4py import MPI

from .errors import NeighbourTimeoutError

WARMUP = 3
ROUNDS = 15
PROBE_TAG = 32703
_MAX_SLEEP_S = 1e-4


def _backoff(polls: int) -> None:
    # ranks may share cores: yield, then sleep briefly (never past 0.1 ms, well below
    # the latencies being told apart)
    time.sleep(0 if polls < 32 else _MAX_SLEEP_S)


class _WordRounds:
    """Rounds of window words, as the slot window signals: each rank adds 1 to its
    slot in every out-neighbour's window (MPI_Fetch_and_op, completed lazily: by the
    first flush when it has to wait) and waits until every in-neighbour's slot in its
    own window reached the round, reading it in place and driving progress between
    reads."""

    def __init__(self, comm: MPI.Comm, ins: Sequence[int], outs: Sequence[int],
                 slot_of_sender: List[Dict[int, int]], timeout: float):
        self.comm, self.ins, self.outs, self.timeout = comm, list(ins), list(outs), timeout
        self.win = MPI.Win.Allocate(8 * max(len(ins), 1), 8, comm=comm)
        self.win.Lock_all()
        self.words = np.frombuffer(self.win.tomemory(), dtype=np.int64)
        self.words[:] = 0
        self.win.Sync()
        comm.Barrier()
        rank = comm.Get_rank()
        self.disp = [slot_of_sender[j][rank] for j in self.outs]
        self.one = np.ones(1, dtype=np.int64)
        self.sink = np.zeros(max(len(self.outs), 1), dtype=np.int64)

    def round(self, k: int) -> float:
        t0 = time.perf_counter()
        for n, (j, d) in enumerate(zip(self.outs, self.disp)):
            self.win.Fetch_and_op(self.one, self.sink[n:n + 1], j, d, MPI.SUM)
        rank, polls, pending = self.comm.Get_rank(), 0, bool(self.outs)
        while True:
            self.win.Sync()
            late = [i for i in range(len(self.ins)) if self.words[i] < k]
            if not late:
                break
            if pending:
                self.win.Flush_all()
                pending = False
            self.win.Flush(rank)            # progress, as the slot window's waits do
            if time.perf_counter() - t0 > self.timeout:
                raise NeighbourTimeoutError(rank, f"the transport probe's word {k}",
                                            [self.ins[i] for i in late], [k] * len(late),
                                            [int(self.words[i]) for i in late],
                                            self.timeout)
            _backoff(polls)
            polls += 1
        if pending:
            self.win.Flush_all()
        return time.perf_counter() - t0

    def free(self) -> None:
        self.words = None
        self.win.Unlock_all()
        self.win.Free()


class _MessageRounds:
    """Rounds of messages: each rank sends one small message to every out-neighbour and
    waits for one from every in-neighbour."""

    def __init__(self, comm: MPI.Comm, ins: Sequence[int], outs: Sequence[int],
                 timeout: float):
        self.comm, self.ins, self.outs, self.timeout = comm, list(ins), list(outs), timeout
        self.out_buf = np.zeros(1, dtype=np.int64)
        self.in_bufs = np.zeros((max(len(ins), 1), 1), dtype=np.int64)

    def round(self, k: int) -> float:
        t0 = time.perf_counter()
        self.out_buf[0] = k
        recvs = [self.comm.Irecv(self.in_bufs[i], source=j, tag=PROBE_TAG)
                 for i, j in enumerate(self.ins)]
        sends = [self.comm.Isend(self.out_buf, dest=j, tag=PROBE_TAG) for j in self.outs]
        polls = 0
        while not MPI.Request.Testall(recvs):
            if time.perf_counter() - t0 > self.timeout:
                late = [j for r, j in zip(recvs, self.ins) if not r.Test()]
                for r in recvs:
                    if r != MPI.REQUEST_NULL:
                        r.Cancel()
                        r.Wait()
                raise NeighbourTimeoutError(self.comm.Get_rank(),
                                            f"the transport probe's message {k}", late,
                                            [k] * len(late), [k - 1] * len(late),
                                            self.timeout)
            _backoff(polls)
            polls += 1
        elapsed = time.perf_counter() - t0
        MPI.Request.Waitall(sends)
        return elapsed

    def free(self) -> None:
        pass


def measure(comm: MPI.Comm, ins: Sequence[int], outs: Sequence[int],
            in_lists: Sequence[Sequence[int]], timeout: float) -> Dict[str, float]:
    """Seconds per round of window words ("words") and of messages ("messages") over
    the graph (`ins`/`outs`: this rank's neighbours; `in_lists`: every rank's
    in-neighbours, for the word offsets): the median round after the warm-up, the
    slowest rank's.  The two kinds of rounds alternate, so that both see the same
    load (ranks oversubscribing cores, other jobs).  Collective."""
    probe = comm.Dup()
    try:
        slot_of_sender = [{j: i for i, j in enumerate(lst)} for lst in in_lists]
        words = _WordRounds(probe, ins, outs, slot_of_sender, timeout)
        messages = _MessageRounds(probe, ins, outs, timeout)
        times: Dict[str, list] = {"words": [], "messages": []}
        try:
            for k in range(1, WARMUP + ROUNDS + 1):
                for name, rounds in (("words", words), ("messages", messages)):
                    t = rounds.round(k)
                    if k > WARMUP:
                        times[name].append(t)
        finally:
            words.free()
        return {name: probe.allreduce(statistics.median(ts), op=MPI.MAX)
                for name, ts in times.items()}
    finally:
        probe.Free()
