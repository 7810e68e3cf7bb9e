"""Restarting a failed job (`asapmpi train --restarts K`, `asapmpi-run --restarts K`):
the resume plan (serial), what the launcher reads from a job's output (serial), and
end to end under mpiexec: a rank killed at 40% of a run, the job relaunched on the
three ranks left (or as many), restarts spent, bad input not restarted."""
import json
import os
import re
import subprocess
import sys
import time

import pytest

from asapmpi.errors import ConfigError
from asapmpi.launch.restart import JobReport, lost_from_environment, supervise
from asapmpi.train.checkpoint import CheckpointDir, load_tree
from asapmpi.train.resume_plan import ResumePlan, plan, plan_resume

from mpilaunch import above_the_core

# ------------------------------------------------------------------ the plan (serial)


def test_the_same_ranks_resume_their_own_checkpoints_at_the_newest_common_iteration():
    p = plan({0: [30, 40], 1: [30, 40], 2: [40, 50], 3: [30, 40]}, 4)
    assert (p.iteration, p.sources, p.lost, p.regrouped) == (40, (0, 1, 2, 3), (), False)


def test_a_shrink_with_a_middle_rank_lost_renumbers_the_survivors_in_order():
    # rank 2 of 8 lost: its older checkpoints do not hold the others back
    saved = {r: [30, 40] for r in range(8)}
    saved[2] = [30]
    p = plan(saved, 7, lost=[2])
    assert p.iteration == 40 and p.sources == (0, 1, 3, 4, 5, 6, 7) and p.lost == (2,)
    assert p.regrouped and "2<-3" in p.describe()
    assert ResumePlan.from_list(p.as_list()) == p
    # nobody named: the highest-numbered replica is the one left out
    assert plan({r: [40] for r in range(4)}, 3).sources == (0, 1, 2)


def test_as_many_ranks_take_a_lost_ranks_place_from_the_nearest_survivor():
    p = plan({0: [40], 1: [30], 2: [40], 3: [40]}, 4, lost=[1])
    assert p.iteration == 40 and p.sources == (0, 0, 2, 3) and p.lost == (1,)
    # a failed rank whose checkpoint at the iteration is whole keeps its own
    assert plan({0: [40], 1: [40], 2: [40]}, 3, lost=[1]).sources == (0, 1, 2)


def test_a_checkpoint_killed_while_written_is_not_used(tmp_path):
    root = str(tmp_path)
    for r in range(3):
        for it in (10, 20):
            CheckpointDir(root, r).save(it, {"iteration": it})
    # rank 1 died writing 30: a temporary file, and a truncated file under the final name
    # (which save_tree never leaves; a disk fault might)
    for r in (0, 2):
        CheckpointDir(root, r).save(30, {"iteration": 30})
    folder = CheckpointDir(root, 1).folder
    with open(os.path.join(folder, "iter_000000030.h5.tmp999"), "wb") as f:
        f.write(b"\x89HDF\r\n")
    assert plan_resume(root, 3).iteration == 20
    with open(os.path.join(folder, "iter_000000030.h5"), "wb") as f:
        f.write(b"\x89HDF\r\n\x1a\n" + b"\0" * 100)
    assert plan_resume(root, 3).iteration == 20
    # named failed: the others' newest, its place from a neighbour
    p = plan_resume(root, 3, lost=[1])
    assert p.iteration == 30 and p.sources == (0, 0, 2)
    assert load_tree(CheckpointDir(root, p.sources[1]).path(30))["iteration"] == 30


def test_nothing_to_resume_from_is_none_and_nothing_in_common_one_line(tmp_path):
    assert plan_resume(str(tmp_path), 4) is None
    assert plan({0: [], 1: []}, 2) is None
    with pytest.raises(ConfigError, match=r"share no iteration \(rank 0: \[10\]; rank 1: "
                                          r"\[20\]\); keep more") as err:
        plan({0: [10], 1: [20]}, 2, where="runs/x")
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="only the failed ranks"):
        plan({0: [10], 1: []}, 2, lost=[0])


# --------------------------------------------------------- the launcher's side (serial)


def test_the_report_names_dead_ranks_before_those_timed_out_on():
    r = JobReport()
    r.read("asapmpi: rank 2: NeighbourTimeoutError: rank 2: timed out after 3 s waiting "
           "for the notify of version 41 from rank 1 (expected 41, last seen 40); the "
           "neighbour is dead or stalled")
    r.read("asapmpi: rank 3: the flush of version 5 to rank(s) 2, 1 did not complete")
    assert r.failed() == [1]            # 2 reported: alive
    r.died.add(3)
    assert r.failed() == [1]            # 3 died by its own MPI_Abort after reporting
    r.died = {0}
    assert r.failed() == [0]
    r.read("asapmpi: rank 0: ConfigError: --batch-size 9999 exceeds this rank's shard")
    assert r.bad_input
    # a rank that said it kills itself is dead, not a reporter; one that stops itself
    # is named by the others' timeouts
    r = JobReport()
    r.read("asapmpi: rank 5: fault injection: SIGKILL after iteration 120 "
           "(CLOCK_MONOTONIC 26928.459959)")
    assert r.failed() == [5] and r.injected == {5} and not r.reporters
    r = JobReport()
    r.read("asapmpi: rank 2: fault injection: SIGSTOP before the run's start collective "
           "(CLOCK_MONOTONIC 1.0)")
    r.read("asapmpi: rank 0: NeighbourTimeoutError: rank 0: timed out after 3 s waiting "
           "for the start of the run from rank 2; the neighbour is dead or stalled")
    assert r.failed() == [2] and not r.injected
    assert lost_from_environment({"ASAPMPI_RESTART_LOST": "3,1"}) == [1, 3]


def test_supervise_restarts_failures_only_and_says_so(capsys):
    def outcomes(*codes):
        calls = []

        def launch(size, env):
            calls.append((size, dict(env)))
            return codes[len(calls) - 1], JobReport(died={1})
        return calls, launch

    calls, launch = outcomes(9, 0)
    assert supervise("x", 4, 2, "shrink", launch, lambda n, f: "from 40") == 0
    assert [c[0] for c in calls] == [4, 3]
    assert calls[1][1] == {"ASAPMPI_RESTART": "1", "ASAPMPI_RESTART_LOST": "1"}
    assert "x: restart 1 of 2: the job failed (exit code 9, failed rank(s) 1); " \
           "relaunching on 3 ranks, from 40" in capsys.readouterr().err
    for code in (2, 130):               # bad input, interrupted: never restarted
        calls, launch = outcomes(code)
        assert supervise("x", 4, 2, "same", launch, lambda n, f: "") == code
        assert len(calls) == 1

    def refuse(n, f):
        raise ConfigError("double-ring needs an even number of ranks, got 3")
    calls, launch = outcomes(9)
    assert supervise("x", 4, 1, "shrink", launch, refuse) == 2 and len(calls) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "x: cannot restart on 3 ranks after the failure of rank(s) 1: " \
                      "double-ring needs an even number of ranks, got 3"


def test_a_graph_family_missing_at_the_new_size_is_refused_in_one_line():
    from asapmpi.train.cli import check_size
    from asapmpi.train.config import TrainConfig

    runs = [TrainConfig(graph="double-ring").resolved(),
            TrainConfig(sync="allreduce").resolved()]
    assert check_size(runs, 4) == "allreduce's own, double-ring"
    with pytest.raises(ConfigError) as err:
        check_size(runs, 3)
    assert str(err.value) == "run 'notify_ack' on 3 ranks: double-ring needs an even " \
                             "number of ranks, got 3; choose another --graph or " \
                             "--restart-ranks same"
    hop = TrainConfig(sync="hop", policy_options={"backup": 1}, graph="ring").resolved()
    with pytest.raises(ConfigError, match="backup=1 must be smaller"):
        check_size([hop], 4)


# ------------------------------------------------------------ end to end under mpiexec

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SVM = ["svm", "--iters", "150", "--eval-every", "20", "--checkpoint-every", "10",
       "--timeout", "20"]


def _asapmpi(*args, timeout=120):
    env = dict(os.environ)
    env.pop("PYTEST_CURRENT_TEST", None)
    return subprocess.run([sys.executable, "-m", "asapmpi", *args], capture_output=True,
                          text=True, timeout=timeout + 30, env=env, check=False)


def _train(tmp, name, ranks, *extra):
    out = tmp / name
    proc = _asapmpi("train", *SVM, "-n", str(ranks), "--out", str(out), "--json",
                    str(tmp / f"{name}.json"), "--no-progress", "--job-timeout", "120",
                    *extra)
    if proc.returncode != 0:
        return proc, None
    summary = json.loads((tmp / f"{name}.json").read_text())
    return proc, summary.get("runs", [summary])[0]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    pytest.importorskip("torch")
    proc, summary = _train(tmp_path_factory.mktemp("whole"), "whole", 4)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return summary


@pytest.mark.mpi
@above_the_core     # the trainer: logic above the core, MPICH only
def test_a_rank_killed_at_40_percent_restarts_on_the_three_left(tmp_path, uninterrupted):
    proc, summary = _train(tmp_path, "shrink", 4, "--kill-rank", "1", "--kill-at", "60",
                           "--restarts", "1", "--restart-ranks", "shrink")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [x for x in proc.stderr.splitlines() if x.startswith("asapmpi train: restart")]
    assert len(lines) == 1, proc.stderr[-3000:]
    code = _exit_code(lines[0])
    # the killed rank said so before it died: named for certain, whatever hydra's kills
    # of the others did to the pid watch
    assert f"restart 1 of 1: the job failed (exit code {code}, failed rank(s) 1); " \
           f"relaunching on 3 ranks, graph root-expander; resuming 'notify_ack' from " \
           f"iteration 60" in lines[0], lines[0]
    assert "resumes from iteration 60 (3 ranks resume from iteration 60 of 4 ranks' " \
           "checkpoints; lost ranks [1]; replicas taken (new rank <- old rank): " \
           "1<-2, 2<-3)" in proc.stdout
    assert summary["ranks"] == 3 and summary["iterations"] == 150
    # it trained on after the restart: well above chance (0.5) at the end, as the run
    # without a failure.  How close the two end (issue 31's 0.5 points) is a benchmark's
    # question: at 150 iterations SGD alone swings a run by 20 points (a fresh 3-rank
    # run ended at 67% after reaching 90%)
    assert uninterrupted["final_test_accuracy"] > 0.6, uninterrupted
    assert summary["final_test_accuracy"] > 0.6, summary
    root = tmp_path / "shrink" / "checkpoints" / "svm-notify_ack"
    assert sorted(os.listdir(root)) == ["rank00000", "rank00001", "rank00002"]
    last = load_tree(str(root / "rank00001" / "iter_000000150.h5"))
    assert last["trainer"]["exchange"]["size"] == 3


@pytest.mark.mpi
@above_the_core     # the trainer: logic above the core, MPICH only
def test_a_same_size_restart_finishes_on_four(tmp_path, uninterrupted):
    proc, summary = _train(tmp_path, "same", 4, "--kill-rank", "2", "--kill-at", "60",
                           "--restarts", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "relaunching on 4 ranks, graph root-expander; resuming 'notify_ack' from " \
           "iteration 60" in proc.stderr
    assert summary["ranks"] == 4 and summary["iterations"] == 150
    assert abs(summary["final_test_accuracy"]
               - uninterrupted["final_test_accuracy"]) < 0.05, (summary, uninterrupted)


@pytest.mark.mpi
def test_bad_input_is_not_restarted(tmp_path):
    pytest.importorskip("torch")
    # refused by the ranks themselves (a shard smaller than the batch): exit code 2
    proc, _ = _train(tmp_path, "bad", 3, "--batch-size", "100000", "--restarts", "3")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "exceeds this rank's shard" in proc.stderr
    assert "restart" not in proc.stderr
    # --restarts without checkpoints: one line, nothing launched
    proc = _asapmpi("train", "svm", "-n", "2", "--restarts", "1", "--out", str(tmp_path))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "asapmpi: error: --restarts resumes from the newest checkpoint: add "
        "--checkpoint-every K (else a restart starts from iteration 0)"]


ALWAYS_FAILS = """
import os, signal, sys, time
from mpi4py import MPI
rank = MPI.COMM_WORLD.Get_rank()
print(f"attempt {os.environ.get('ASAPMPI_RESTART', '0')} rank {rank} of "
      f"{MPI.COMM_WORLD.Get_size()} lost [{os.environ.get('ASAPMPI_RESTART_LOST', '')}]",
      flush=True)
from asapmpi.launch.faults import register_rank
register_rank(rank)
MPI.COMM_WORLD.Barrier()
time.sleep(0.5)         # the launcher watches the registered ranks every 50 ms
if rank == 1:
    os.kill(os.getpid(), signal.SIGKILL)
MPI.COMM_WORLD.Recv(bytearray(1), source=1)      # waits for the dead rank
"""


@pytest.mark.mpi
def test_asapmpi_run_gives_up_when_its_restarts_are_spent(tmp_path):
    script = tmp_path / "fails.py"
    script.write_text(ALWAYS_FAILS)
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "launch", "asapmpi-run"), "-n", "3",
                           "--restarts", "1", "--restart-ranks", "shrink", "--job-timeout",
                           "60", "--", sys.executable, str(script)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode not in (0, 2), proc.stderr[-3000:]
    assert "attempt 0 rank 2 of 3 lost []" in proc.stdout
    said = [x for x in proc.stderr.splitlines() if x.startswith("asapmpi-run: ")]
    first, last = _failed_rank(said[-2]), _failed_rank(said[-1])
    # the relaunched job is told the rank that failed (none when unknown)
    lost = "1" if first == "1" else ""
    assert f"attempt 1 rank 1 of 2 lost [{lost}]" in proc.stdout, proc.stdout
    code = _exit_code(said[-1])
    assert said[-2].startswith(f"asapmpi-run: restart 1 of 1: the job failed (exit code "
                               f"{code}, failed rank(s) {first}); relaunching on 2 ranks"), said
    assert said[-1] == f"asapmpi-run: the job failed (exit code {code}, failed rank(s) " \
                       f"{last}) and its 1 restart(s) are spent; giving up"


def _exit_code(line: str) -> int:
    # a rank killed by SIGKILL: hydra exits 9, Open MPI's mpiexec 137 (128 + 9)
    match = re.search(r"exit code (\d+),", line)
    assert match and int(match.group(1)) in (9, 137), line
    return int(match.group(1))


def _failed_rank(line: str) -> str:
    # hydra kills the other ranks (SIGKILL too) as soon as one died: the launcher names
    # the one whose process ended first when it saw one end alone, which a loaded host
    # can deny it (the watch thread woken after hydra's kill): then "unknown"
    match = re.search(r"failed rank\(s\) (1|unknown)\)", line)
    assert match, line
    return match.group(1)


def test_the_death_watch_names_the_one_rank_whose_process_ended(tmp_path):
    # the launcher's watch of the registered ranks' processes (pidfd): one of three
    # ended, the job still running -> that one's rank
    from asapmpi.launch.restart import _DeathWatch

    if not hasattr(os, "pidfd_open"):
        pytest.skip("no pidfd_open (Linux 5.3+, Python 3.9+)")
    sleepers = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
                for _ in range(3)]
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        for rank, p in enumerate(sleepers):
            (tmp_path / str(p.pid)).write_text(f"{rank}\n")
        watch = _DeathWatch(str(tmp_path), job)
        watch.start()
        time.sleep(0.2)                     # registered and watched (either way: below)
        sleepers[1].kill()
        sleepers[1].wait()
        watch.join(timeout=30)
        assert not watch.is_alive() and watch.first == {1}
    finally:
        for p in (*sleepers, job):
            p.kill()
            p.wait()
