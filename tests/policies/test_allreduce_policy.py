"""The allreduce baseline (sync="allreduce"): the mean of every rank's buffer; a rank that
waits for a late one sleeps between polls instead of spinning in the MPI's progress
loop (it took the CPU of a slow rank that shared its host's budget); a rank that never
comes is a NeighbourTimeoutError, not a hang.

Each scenario's body is here, beside its test (`test_allreduce_policy:NAME`)."""
from __future__ import annotations

import json
import time

import numpy as np
import pytest

from mpilaunch import PATHS, launch, run

pytestmark = pytest.mark.mpi


def late_rank(comm, out, late=1.0, steps=3):
    """Every rank averages its rank for `steps` steps; the last rank (the sleeper)
    starts each step `late` seconds after every other rank has entered it: each of the
    others raises a flag (a file in `out`) as it enters step k, and the sleeper,
    outside MPI, waits for their flags, sleeps `late`, then steps.  So each of the
    others waits in every step for at least `late` s, however late any rank left the
    Exchange's construction (under load ranks leave it up to seconds apart).  Every
    rank reports its events on CLOCK_MONOTONIC, one clock for every process of the
    host (the others: when each step began and ended; the sleeper: when it stepped);
    the others also report the CPU seconds their steps took and each step's voluntary
    context switches (the back-off's sleeps)."""
    from asapmpi import Exchange

    from scenarios import raise_flag, voluntary_switches, wait_for_flags  # tests/mpi

    rank, sleeper = comm.rank, comm.size - 1
    buf = np.full(1000, float(rank))
    began, ended, stepped, switches, cpu = [], [], [], [], 0.0
    with Exchange(buf, sync="allreduce", comm=comm, timeout=30) as ex:
        for k in range(steps):
            if rank == sleeper:
                if not wait_for_flags(out, [f"{r}-{k}" for r in range(sleeper)], 60):
                    raise RuntimeError(f"the others did not all enter step {k} in 60 s")
                time.sleep(late)
                stepped.append(time.monotonic())
                ex.step()
                continue
            began.append(time.monotonic())
            raise_flag(out, f"{rank}-{k}")
            c, v = time.process_time(), voluntary_switches()
            ex.step()
            switches.append(voluntary_switches() - v)
            cpu += time.process_time() - c
            ended.append(time.monotonic())
    return {"mean": float(buf.mean()), "spread": float(buf.max() - buf.min()),
            "began": began, "ended": ended, "stepped": stepped, "switches": switches,
            "cpu": cpu}


@pytest.mark.parametrize("path", PATHS)
def test_the_mean_and_a_wait_that_sleeps(path, tmp_path):
    late, steps = 1.0, 3
    res = run("test_allreduce_policy:late_rank", 3, path, timeout=120, out=str(tmp_path),
              late=late, steps=steps)
    for r in res:
        assert r["mean"] == pytest.approx(1.0) and r["spread"] == 0.0
    stepped = res[2]["stepped"]
    for r in res[:2]:
        for k in range(steps):
            # rank 2 stepped `late` s after this rank entered step k (the scenario's
            # handshake, not a hope), and this rank's step k ended only after that:
            # the allreduce waited for the late rank, every step
            assert stepped[k] - r["began"][k] >= late, (k, r, stepped)
            assert r["ended"][k] > stepped[k], (k, r, stepped)
            # it waited asleep: the back-off's sleeps are voluntary context switches,
            # about 1000 per second waited (one per sleep of <= 1 ms; fewer, not none,
            # when a loaded host wakes it late); a blocking MPI_Allreduce made none in a
            # 1 s wait (MPICH and Open MPI, shm and net), only yields and preemptions
            assert r["switches"][k] >= 10 * late, (k, r)
        # and cheaply: the back-off costs about 2% of the wait in CPU, less when load
        # stretches its sleeps (the span is at least steps * late, by the handshake).
        # Spinning cost up to the whole wait (MPI_Allreduce: 2.9-3.0 s of 3.0 s), but
        # a spin that yields to busy neighbours costs only what they leave it (Open
        # MPI's on shared memory, 3 ranks on 2 cores: 0.27 s of 1 s): the count above
        # is what tells them apart
        wall = sum(e - b for b, e in zip(r["began"], r["ended"]))
        assert r["cpu"] < 0.5 * wall, (r, wall)


def absent_rank(comm, out, timeout=2.0):
    """The last rank never joins the allreduce; the others must time out.  The stuck
    collective can be neither completed nor freed, and the runner's gather would match
    it: every rank writes its own result to out/RANK.json (ranks' printed lines
    interleave) and leaves without MPI_Finalize."""
    import os

    from asapmpi import Exchange
    from asapmpi.errors import NeighbourTimeoutError

    buf = np.zeros(10)
    ex = Exchange(buf, sync="allreduce", comm=comm, timeout=timeout)
    result = {}
    if comm.rank != comm.size - 1:
        start = time.monotonic()
        try:
            ex.step()
            result["error"] = None
        except NeighbourTimeoutError as exc:
            result["error"] = str(exc)
            result["after"] = time.monotonic() - start
    with open(os.path.join(out, f"{comm.rank}.json"), "w") as f:
        json.dump(result, f)
    if comm.rank == comm.size - 1:
        time.sleep(timeout + 3)             # alive, outside MPI, until the others gave up
    # the first rank to leave may take the others with it (an exit without MPI_Finalize):
    # leave once every rank wrote its result (a loaded machine may time one out late)
    deadline = time.monotonic() + 60
    while len(os.listdir(out)) < comm.size and time.monotonic() < deadline:
        time.sleep(0.05)
    os._exit(0)


def test_a_rank_that_never_comes_is_a_timeout_not_a_hang(tmp_path):
    proc = launch("test_allreduce_policy:absent_rank", 3, "shm", 60, out=str(tmp_path))
    # leaving without MPI_Finalize is an error exit for Open MPI's mpiexec, not MPICH's
    found = {int(p.stem): json.loads(p.read_text()) for p in tmp_path.glob("*.json")}
    assert sorted(found) == [0, 1, 2], proc.stdout + proc.stderr
    for r in (found[0], found[1]):
        assert r["error"] and "the allreduce of version 1" in r["error"], r
        assert "an MPI collective does not say which" in r["error"]
        # at its deadline (2 s), not at another: 10x the deadline leaves any load's
        # delay in noticing it, and a hang is the job's timeout
        assert 1.5 < r["after"] < 20, r
