"""Faults end jobs clearly: timeouts name the silent rank and the iteration, an uncaught
error aborts the whole job, a killed rank is named by the survivors, a slow (not dead)
neighbour does not stop Hop with backup workers, BSP's barrier times out."""
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

import asapmpi
from asapmpi.errors import NeighbourTimeoutError

from mpilaunch import STACK, job_command, launch, run

# ranks killed here leave their MPI library's shared-memory files: the tests remove them
pytestmark = [pytest.mark.mpi, pytest.mark.usefixtures("shm_cleaned")]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_a_stall_times_out_notify_ack_naming_the_rank_and_the_iteration(tmp_path):
    # rank 1 stalls until the others timed out (flags in tmp_path), not for a time a
    # loaded host could let a late rank's wait outlast
    results = run("test_faults:slow_rank_stall", 4, "shm", timeout=120, sync="notify_ack",
                  out=str(tmp_path))
    assert results[1]["told"], results
    # complete graph: every other rank waits for rank 1's notify (window words) or
    # update (messages: what transport="auto" measured faster) of version 11 (rank 1
    # itself, once awake, times out on the acks of the ranks that gave up)
    for rank in (0, 2, 3):
        error = results[rank]["error"]
        assert error and re.search(r"the (notify|update) of version 11 from rank 1 "
                                   r"\(expected 11", error), error


@pytest.mark.parametrize("transport", ["put", "messages"])
def test_the_same_stall_does_not_stop_hop_with_a_backup_worker(transport):
    # 512 KB updates: above every eager limit, so on messages each send to the stalled
    # rank waits for it; the writers' staging buffers must outlast the stall as long as
    # the token bound (max_gap) does
    results = run("test_faults:slow_rank_stall", 4, "shm", timeout=120, sync="hop", n=65536,
                  options={"backup": 1, "max_gap": 40, "transport": transport})
    assert all(r["error"] is None and r["version"] >= 40 for r in results), results


def test_the_default_timeout_follows_measured_step_times(tmp_path):
    # floor 0.5 s; steps of ~1 ms: rank 1's stall is caught after ~0.5 s, not 60 s
    from asapmpi.exchange.exchange import STEPS_MEASURED

    results = run("test_faults:adaptive_timeout", 2, "shm", timeout=120,
                  out=str(tmp_path), env_min=0.5)
    victim = results[0]
    assert victim["error"] and "rank 1" in victim["error"], victim
    # caught while rank 1 stalled: it stays asleep, outside MPI, until the victim has
    # timed out (at most 30 s: a victim still waiting then is not on a timeout derived
    # from its steps), not for a fixed stall that a slow run's timeout might outlast
    assert results[1]["told"], results
    # the derived timeout: at least the floor, and at most what the steps measured allow
    # (rc.timeout_factor x their median and 3 x their longest, docs of Exchange's
    # timeout).  Every step timed lay inside the warm-up's span, and a median over the
    # >= STEPS_MEASURED steps timed is at most the span / (STEPS_MEASURED / 2): a bound
    # from this run's own steps, however slow a loaded host made them (here ~1 ms each:
    # the floor)
    span, factor = victim["warm_span"], victim["factor"]
    bound = max(0.5, factor * span / (STEPS_MEASURED // 2), 3 * span)
    assert 0.5 <= victim["timeout"] <= bound, (victim, bound)
    # the wait lasted its deadline, and ended at it rather than at another (10x leaves a
    # loaded host's delay in noticing it)
    assert victim["timeout"] <= victim["elapsed"] < 10 * victim["timeout"], victim


def test_an_uncaught_timeout_ends_the_job_non_zero():
    # a plain user script: without asapmpi's abort hook the ranks that time out would
    # wait in MPI_Finalize for the stalled one (600 s)
    script = os.path.join(ROOT, "tests", "mpi", "uncaught_timeout.py")
    cmd, env = job_command(3, [sys.executable, script], timeout=120)
    start = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=150, check=False)
    assert proc.returncode != 0
    assert "NeighbourTimeoutError" in proc.stderr and "from rank 1 (expected" in proc.stderr
    assert time.monotonic() - start < 60


def test_a_rank_on_another_communicator_is_named_by_those_that_wait_for_it():
    # rank 0 makes its Exchange on COMM_SELF and ends; ranks 1-3 wait for it in the
    # agreement on COMM_WORLD.  Before: rank 0's MPI_Finalize failed on their unmatched
    # arrivals, and hydra killed ranks 1-3 (signal 9, or exit 0) with no asapmpi line.
    # Now rank 0 tells them as it exits, long before their 60 s deadline.
    script = os.path.join(ROOT, "tests", "mpi", "other_communicator.py")
    cmd, env = job_command(4, [sys.executable, script], timeout=120)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=150,
                          check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "rank 0: ends" in proc.stdout, out[-3000:]
    for rank in (1, 2, 3):
        assert (f"NeighbourTimeoutError: rank {rank}: timed out after 60 s waiting for "
                f"the creation of an Exchange from rank 0; rank 0 ended without joining "
                f"it") in proc.stderr, out[-3000:]
        assert f"rank {rank}: made an Exchange" not in proc.stdout
    assert "asapmpi: rank 0: rank(s) 1, 2, 3 wait for this rank" in proc.stderr
    assert "signal 9" not in out
    # the abort hook is installed before the agreement: one line each, no traceback
    assert "Traceback" not in out, out[-3000:]


def test_bsp_barrier_times_out_instead_of_hanging():
    proc = launch("test_faults:bsp_dead_rank", 3, "shm", timeout=120)
    assert proc.returncode != 0
    assert "the barrier of version 4" in proc.stderr, proc.stderr[-2000:]


@pytest.mark.parametrize("path", ["shm", "net"])
def test_killing_one_of_four_ranks_ends_the_others_naming_it(tmp_path, path):
    cmd, env = job_command(4, [sys.executable, "-m", "asapmpi", "train", "svm", "--iters",
                               "100000", "--timeout", "3", "--kill-rank", "2", "--kill-at",
                               "30", "--no-progress", "--out", tmp_path], path, timeout=120,
                           keep_going=True)
    start = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=150,
                          check=False)
    assert proc.returncode != 0
    # a hang limit (the job's own is 120 s): start-up with torch, 30 iterations and the
    # 3 s deadline take about 12 s on a quiet host
    assert time.monotonic() - start < 120
    named = []
    for line in proc.stderr.splitlines():
        # a survivor names rank 2: as a neighbour it waited for (shared memory; ranks
        # further on may name those that stalled behind it), or in the exit handler's
        # list of what it was doing when MPICH's TCP module ended it from inside MPI (a
        # broken connection to the dead rank)
        listed = re.search(r"rank\(s\) ([\d, ]+)", line)
        if line.startswith("asapmpi: rank") and (
                "from rank 2 (expected" in line or ", rank 2 (expected" in line
                or (listed and "2" in listed.group(1).replace(" ", "").split(","))):
            named.append(line)
    if STACK == "openmpi" and path == "shm":
        # orterun told to let the survivors run on does: their deadlines name rank 2
        assert named, proc.stdout[-2000:] + proc.stderr[-3000:]
    else:
        # hydra (MPICH 5.0.2) with -disable-auto-cleanup sends the survivors SIGUSR1;
        # MPICH's handler asks it for the dead processes, and hydra then often tears the
        # whole job down within a second, before any 3 s deadline (its proxy: "unable to
        # forward PMI response"; docs/CLUSTERS.md).  Either the survivors named rank 2
        # or the launcher reported the kill: the job ended, non-zero, no hang.
        assert named or _launcher_ended_it(proc), proc.stdout[-2000:] + proc.stderr[-3000:]


def _launcher_ended_it(proc) -> bool:
    """Whether hydra ended the job after a rank was killed: it reports the kill, or its
    proxy fails forwarding MPICH's question about the dead process and it ends the rest
    (docs/CLUSTERS.md, "Survivors of a killed rank")."""
    out = proc.stdout + proc.stderr
    return "signal 9" in out or "unable to forward PMI response" in out


#: the start-up deadline of the training runs below: the start case's is the deadline
#: under test, the end case's is never reached.  Not 3 s: a loaded host starts the ranks
#: seconds apart (importing torch), and a rank that came 3 s after another was named
#: instead of the stopped one (Open MPI, load 9 on 2 cores)
STARTUP_DEADLINE = {"start": "15", "end": "60", "free": "60"}


@pytest.mark.parametrize("where, what", [("start", "the start of the run"),
                                         ("end", "the final gather of metrics"),
                                         ("free", "free() of an Exchange")])
def test_a_rank_silent_in_a_training_run_s_start_or_end_collective_is_named(tmp_path, where,
                                                                           what):
    # the trainer's own collectives have deadlines too: before them, a rank that never
    # came left the others in MPI_Allgather/MPI_Gather until the launcher's limit; and
    # the exchange's free() (MPI_Win_free is collective).  The rank stops (SIGSTOP):
    # alive to the launcher, so only asapmpi's deadline ends the job.
    cmd, env = job_command(4, [sys.executable, "-m", "asapmpi", "train", "svm", "--iters",
                               "40", "--timeout", "3", "--kill-rank", "2", "--kill-in", where,
                               "--kill-signal", "stop", "--no-progress", "--out", tmp_path],
                           timeout=120)
    env["ASAPMPI_TIMEOUT_STARTUP"] = STARTUP_DEADLINE[where]
    start = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=150,
                          check=False)
    elapsed = time.monotonic() - start
    assert proc.returncode != 0
    named = [line for line in proc.stderr.splitlines()
             if f"waiting for {what} from rank 2;" in line]
    assert named, proc.stdout[-2000:] + proc.stderr[-3000:]
    # the deadline (+2 s for rank 0's verdict) after the survivors' own start-up: a
    # hang limit, not a timing
    assert elapsed < 120, elapsed
    if where == "free":
        # the run had ended, every metric gathered: its report was kept before free()
        from asapmpi.train.report import read_h5

        [result] = read_h5(str(tmp_path / "metrics.h5"))
        assert len(result.logs) == 4, result.logs
        assert all(log["iteration"][-1] == 40 for log in result.logs), result.logs
        assert not list(tmp_path.glob("metrics.h5.tmp*"))


@pytest.mark.parametrize("where", ["start", "end"])
def test_a_rank_killed_in_a_training_run_s_start_or_end_collective_ends_the_job(tmp_path,
                                                                                where):
    # A killed rank: hydra (MPICH 5.0.2) usually ends the whole job itself, even with
    # -disable-auto-cleanup, often before a survivor's deadline (and then its output is
    # lost); when the survivors outlive it (always on Open MPI 4 told to let them), their
    # deadline names the dead rank.  Either way the job ends: no hang.
    cmd, env = job_command(4, [sys.executable, "-m", "asapmpi", "train", "svm", "--iters",
                               "40", "--timeout", "3", "--kill-rank", "2", "--kill-in", where,
                               "--no-progress", "--out", tmp_path], timeout=120,
                           keep_going=True)
    env["ASAPMPI_TIMEOUT_STARTUP"] = STARTUP_DEADLINE[where]
    start = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=150,
                          check=False)
    assert proc.returncode != 0 and time.monotonic() - start < 120
    named = [line for line in proc.stderr.splitlines()
             if line.startswith("asapmpi: rank") and "waiting for" in line]
    assert all("from rank 2;" in line for line in named), named
    # the launcher ends the job (hydra), or the survivors name the dead rank (Open MPI,
    # which lets them run on)
    assert named or _launcher_ended_it(proc), proc.stdout[-2000:] + proc.stderr[-2000:]


def test_a_timed_out_barrier_is_completed_by_the_next_one(tmp_path):
    # MPI allows neither cancelling nor freeing a nonblocking collective: the request
    # of a barrier that timed out must be kept and completed, not leaked
    results = run("test_faults:late_barrier_completes", 3, "shm", timeout=120,
                  out=str(tmp_path))
    assert results[2]["told"], results
    for rank in (0, 1):
        assert "the barrier of version 1" in results[rank]["timed_out"], results[rank]
        assert results[rank]["pending_after_timeout"] is True
    assert results[2]["timed_out"] is None and not results[2]["pending_after_timeout"]
    assert not any(r["pending_after_next"] for r in results), results


@pytest.mark.parametrize("where", ["create", "step", "free"])
def test_a_rank_killed_with_shared_segments_leaves_nothing_in_dev_shm(where):
    # the shared transport's segments are anonymous memory (memfd): nothing of asapmpi's
    # has a name in /dev/shm at any moment, so a kill at any point leaves nothing there
    from asapmpi._core.segments import FILE_PREFIX, SHM_DIR

    def ours():
        return {n for n in os.listdir(SHM_DIR) if n.startswith(FILE_PREFIX)}

    before = ours()
    proc = launch("test_faults:killed_with_segments", 4, "shm", timeout=60, where=where)
    assert proc.returncode != 0 and "signal 9" in proc.stdout + proc.stderr, \
        proc.stdout[-2000:] + proc.stderr[-2000:]
    assert ours() - before == set()


# ---------------------------------------------------------------- scenario bodies (on the ranks)
# tests/mpi/run.py runs each on every rank as "test_faults:NAME"

def slow_rank_stall(comm, sync, options=None, stall_at=10, stall_s=1.5, iter_s=0.05,
                    iters=40, timeout=1.0, n=1000, out=None, cap_s=60.0):
    """Rank 1 stalls before step stall_at + 1 (alive, just slow): `stall_s` seconds, or
    with `out` until every other rank timed out (a flag each in `out`, at most cap_s
    seconds); the others compute `iter_s` per step.  Returns the timeout error this
    rank saw, if any (no collective free after one: the job ends)."""
    from scenarios import raise_flag, wait_for_flags  # tests/mpi, on the ranks' path

    rank, size = comm.Get_rank(), comm.Get_size()
    buf = np.zeros(n)
    ex = asapmpi.Exchange(buf, graph="complete", sync=sync, comm=comm, timeout=timeout,
                          **(options or {}))
    error, told = None, None
    try:
        while ex.version < iters:
            time.sleep(iter_s)
            if rank == 1 and ex.version == stall_at:
                if out is None:
                    time.sleep(stall_s)
                else:
                    told = wait_for_flags(out, [f"stall-timed-out-{r}" for r in range(size)
                                                if r != 1], cap_s)
            ex.step()
    except NeighbourTimeoutError as exc:
        error = str(exc)
        if out is not None and rank != 1:
            raise_flag(out, f"stall-timed-out-{rank}")
    if error is None:
        ex.free()
    return {"error": error, "version": ex.version, "told": told}


def adaptive_timeout(comm, out, env_min=0.5, cap_s=30.0, warm=40, n=1000):
    """With the default (adaptive) timeout and a floor of env_min seconds, quick steps
    make a stall of rank 1 time out after about the floor.  Rank 1 stalls (asleep,
    outside MPI) until rank 0 has timed out (a file in `out`), at most cap_s seconds.
    Rank 0 reports the span its warm-up steps took and rc.timeout_factor, from which
    the test bounds the timeout derived."""
    from scenarios import raise_flag, wait_for_flags  # tests/mpi, on the ranks' path

    rank = comm.Get_rank()
    asapmpi.rc.timeout_min = env_min
    buf = np.zeros(n)
    ex = asapmpi.Exchange(buf, graph="ring", comm=comm)
    warm_start = time.perf_counter()
    for _ in range(warm):
        ex.step()
    warm_span = time.perf_counter() - warm_start
    if rank == 1:
        told = wait_for_flags(out, ["timed-out"], cap_s)
        try:
            ex.step()
        except NeighbourTimeoutError:
            pass        # the victim gave up: nobody sends its acks
        return {"told": told}
    start = time.monotonic()
    error, used = None, ex.current_timeout
    try:
        ex.step()
    except NeighbourTimeoutError as exc:
        error = str(exc)
    elapsed = time.monotonic() - start
    raise_flag(out, "timed-out")
    return {"error": error, "elapsed": elapsed, "timeout": used, "warm_span": warm_span,
            "factor": asapmpi.rc.timeout_factor}


def bsp_dead_rank(comm, n=1000):
    """Rank 2 stops stepping after step 3 (but stays alive); BSP's barrier of step 4
    must time out on the others (the error is not caught: the job ends)."""
    buf = np.zeros(n)
    ex = asapmpi.Exchange(buf, graph="ring", sync="bsp", comm=comm, timeout=2.0)
    for k in range(1, 7):
        if comm.Get_rank() == 2 and k == 4:
            time.sleep(60)
        ex.step()
    ex.free()
    return {}


def late_barrier_completes(comm, out, n=100, cap_s=60.0):
    """Rank 2 reaches a window barrier only once the others timed out in it (after
    0.5 s; a flag in `out` each, at most cap_s seconds): they keep the request; the next
    barrier first completes it, then runs its own, and free() finds nothing pending.
    Returns what each rank saw."""
    from scenarios import raise_flag, wait_for_flags  # tests/mpi, on the ranks' path

    buf = np.zeros(n)
    ex = asapmpi.Exchange(buf, graph="ring", sync="bsp", comm=comm, timeout=10.0)
    win = ex.window
    timed_out, told = None, None
    if comm.Get_rank() == 2:
        # late by an ordering, not by a sleep a loaded host could outlast
        told = wait_for_flags(out, ["barrier-timed-out-0", "barrier-timed-out-1"], cap_s)
    try:
        win.barrier(0.5, 1)
    except NeighbourTimeoutError as exc:
        timed_out = str(exc)
        raise_flag(out, f"barrier-timed-out-{comm.Get_rank()}")
    pending_after_timeout = win.late_collective
    win.barrier(10.0, 2)
    pending_after_next = win.late_collective
    ex.free()
    return {"timed_out": timed_out, "pending_after_timeout": pending_after_timeout,
            "pending_after_next": pending_after_next, "told": told}


def killed_with_segments(comm, where, steps=20, n=16384):
    """Rank 1 SIGKILLs itself while the shared-memory transport holds segments: while
    they are being created (between its own segment and mapping its neighbours'),
    after `steps` steps, or while free() unmaps them.  The others then time out (the
    job ends non-zero); what matters is what is left in /dev/shm afterwards."""
    import os
    import signal

    from asapmpi._core import segments

    def die(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)

    rank = comm.Get_rank()
    if rank == 1 and where == "create":
        segments._attach = die
    if rank == 1 and where == "free":
        segments.SharedSegments.close = die
    buf = np.zeros(n, dtype=np.float32)
    ex = asapmpi.Exchange(buf, graph="ring", comm=comm, timeout=3.0, transport="shared",
                          double_buffer=True)
    for k in range(steps):
        if rank == 1 and where == "step" and k == steps // 2:
            die()
        ex.step()
    ex.free()
    return {}
