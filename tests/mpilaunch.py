"""Launch a multi-rank scenario under mpiexec from a pytest test.

Each scenario is a function in tests/mpi/scenarios.py run on every rank by
tests/mpi/run.py.  A deadlock fails the test instead of hanging it: the launcher's job
limit (hydra's MPIEXEC_TIMEOUT, Open MPI's --timeout) kills the job, and the subprocess
itself has a slightly longer timeout.  The MPI family is the one mpi4py uses here:
dev/test.sh runs the suite on the MPICH wheel and the multi-rank tests on Open MPI.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from asapmpi.launchers import NATIVE_TCP_RMA_ENV, command, flavour, network_env

RUNNER = Path(__file__).parent / "mpi" / "run.py"
RESULT_TAG = "ASAPMPI-RESULT"


def mpiexec() -> str:
    """The mpiexec beside this interpreter (the embedded MPICH, or the mpiexec that
    dev/setup-openmpi.sh links there), else MPIEXEC or PATH's."""
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.exists():
        return str(beside)
    found = os.environ.get("MPIEXEC") or shutil.which("mpiexec")
    if not found:
        raise RuntimeError("no mpiexec found; run dev/setup.sh")
    return found


#: "mpich" or "openmpi": the MPI family this test run launches its ranks with
STACK = flavour(mpiexec())

#: shm: shared memory (the MPI's defaults on one host); net: everything through the
#: MPI's network module over TCP on loopback (MPICH: ch4:ofi with RMA as active
#: messages; Open MPI: the tcp btl with osc pt2pt/rdma); ucx (Open MPI with UCX): pml
#: and osc ucx on UCX's TCP transport; net-native (MPICH): libfabric's own tcp RMA
PATHS = ("shm", "net")
PATH_ENV = {"shm": {}, "net": network_env(STACK, "tcp")}
if STACK == "mpich":
    PATH_ENV["net-native"] = NATIVE_TCP_RMA_ENV
else:
    PATH_ENV["ucx"] = network_env(STACK, "ucx")


def _has_ucx() -> bool:
    """True when this Open MPI has the UCX one-sided component (osc ucx)."""
    info = shutil.which("ompi_info", path=str(Path(mpiexec()).resolve().parent))
    if STACK != "openmpi" or not info:
        return False
    out = subprocess.run([info], capture_output=True, text=True, timeout=60,
                         check=False).stdout
    return "MCA osc: ucx" in out


#: Open MPI with UCX: the tests of tests/channels/test_ucx.py run
HAS_UCX = _has_ucx()

#: pytest marks for tests about one MPI family's behaviour: they run only on it
mpich_only = pytest.mark.skipif(STACK != "mpich", reason="about MPICH's behaviour")
#: tests of logic above the core (the trainer's reports and refusals, numerics, the
#: framework integrations): what they test is the same on both families, and the core
#: paths they drive are tested on Open MPI by the others; run on the embedded MPICH only
#: (they would add minutes to CI's Open MPI half)
above_the_core = pytest.mark.skipif(STACK != "mpich",
                                    reason="logic above the core: tested on MPICH")
openmpi_only = pytest.mark.skipif(STACK != "openmpi", reason="about Open MPI's behaviour")


def skip_above_the_core() -> None:
    """above_the_core, called inside a test whose module the ranks import (its scenario
    bodies live beside it, so it imports mpilaunch only inside its tests)."""
    if STACK != "mpich":
        pytest.skip("logic above the core: tested on MPICH")


def job_command(ranks: int, program, path: str = "shm", timeout: float = 0,
                keep_going: bool = False):
    """The mpiexec command line and whole environment that run `program` on `ranks`
    ranks on `path` with this run's MPI (asapmpi.launchers.command: the one place
    that knows each launcher's options)."""
    if path not in PATH_ENV:
        raise ValueError(f"path must be one of {sorted(PATH_ENV)} on {STACK}")
    cmd, extra = command(STACK, mpiexec(), ranks, [str(a) for a in program],
                         job_timeout=timeout, keep_going=keep_going)
    env = dict(os.environ)
    env.pop("PYTEST_CURRENT_TEST", None)
    env.update(extra)
    env.update(PATH_ENV[path])
    return cmd, env


def launch(scenario: str, ranks: int, path: str = "shm", timeout: float = 120,
           **kwargs) -> subprocess.CompletedProcess:
    """Run `scenario` on `ranks` ranks and return the finished mpiexec process, whatever
    its exit code (a hang past the timeout fails the test)."""
    cmd, env = job_command(ranks, [sys.executable, RUNNER, scenario, json.dumps(kwargs)],
                           path, timeout)
    try:
        return subprocess.run(cmd, env=env, capture_output=True, text=True, check=False,
                              timeout=timeout + 30)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"{scenario} on {ranks} ranks ({path}) hung past {timeout + 30} s:\n"
                             f"{exc.stdout}\n{exc.stderr}") from None


def run(scenario: str, ranks: int, path: str = "shm", timeout: float = 120, **kwargs) -> list:
    """Run `scenario` on `ranks` ranks; return the per-rank result dicts, rank order.

    Fails (AssertionError) when the job exits non-zero, times out, or a rank reports
    nothing.
    """
    proc = launch(scenario, ranks, path, timeout, **kwargs)
    return results(proc, ranks, f"{scenario} on {ranks} ranks ({path})")


def run_cases(cases: dict, ranks: int, path: str = "shm", timeout: float = 120) -> dict:
    """Run several scenarios one after another in one job (one start of the ranks and of
    what they import, torch's 2-3 s of CPU a rank, for all): `cases` maps a key to
    (scenario, kwargs); returns each key's per-rank results, rank order.  A failing
    scenario fails the job, its traceback naming it."""
    every = run("CASES", ranks, path, timeout,
                cases={key: [name, kwargs] for key, (name, kwargs) in cases.items()})
    return {key: [res[key] for res in every] for key in cases}


def results(proc: subprocess.CompletedProcess, ranks: int, what: str = "the job") -> list:
    """The per-rank result dicts of a finished job (its `ASAPMPI-RESULT rank json`
    lines), rank order; AssertionError when it exited non-zero or a rank reported
    nothing."""
    found = {}
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_TAG):
            _, rank, payload = line.split(" ", 2)
            found[int(rank)] = json.loads(payload)
    assert proc.returncode == 0 and len(found) == ranks, (
        f"{what} exited {proc.returncode} with results from {sorted(found)}\n"
        f"--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}"
    )
    return [found[r] for r in range(ranks)]
