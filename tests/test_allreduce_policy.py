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


def late_rank(comm, late=1.0, steps=3):
    """Every rank averages its rank for `steps` steps; the last rank starts each step
    `late` seconds later (asleep, outside MPI).  The others report the CPU seconds
    they spent waiting."""
    from asapmpi import Exchange

    buf = np.full(1000, float(comm.rank))
    with Exchange(buf, sync="allreduce", comm=comm, timeout=30) as ex:
        cpu = wall = 0.0
        for _ in range(steps):
            if comm.rank == comm.size - 1:
                time.sleep(late)
            c, w = time.process_time(), time.perf_counter()
            ex.step()
            cpu += time.process_time() - c
            wall += time.perf_counter() - w
    return {"mean": float(buf.mean()), "spread": float(buf.max() - buf.min()),
            "cpu": cpu, "wall": wall}


@pytest.mark.parametrize("path", PATHS)
def test_the_mean_and_a_wait_that_sleeps(path):
    res = run("test_allreduce_policy:late_rank", 3, path, timeout=120)
    for r in res:
        assert r["mean"] == pytest.approx(1.0) and r["spread"] == 0.0
    # ranks 0 and 1 waited about 3 s for rank 2; spinning would have cost them about
    # that much CPU (measured with MPI_Allreduce: 2.9-3.0 s of 3.0 s)
    for r in res[:2]:
        assert r["wall"] > 2.5, r
        assert r["cpu"] < 0.5 * r["wall"], r


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
        assert 1.5 < r["after"] < 10, r
