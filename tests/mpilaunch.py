"""Launch a multi-rank scenario under mpiexec from a pytest test.

Each scenario is a function in tests/mpi/scenarios.py run on every rank by
tests/mpi/run.py.  A deadlock fails the test instead of hanging it: hydra's
MPIEXEC_TIMEOUT kills the job, and the subprocess itself has a slightly longer timeout.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from asapmpi.ranks import NATIVE_TCP_RMA_ENV, NETWORK_PATH_ENV

RUNNER = Path(__file__).parent / "mpi" / "run.py"
RESULT_TAG = "ASAPMPI-RESULT"

#: shm: shared memory; net: RMA through the network module (TCP over loopback only) as
#: MPICH active messages, asapmpi's network path; net-native: libfabric's own tcp RMA
PATHS = ("shm", "net")
PATH_ENV = {"shm": {}, "net": NETWORK_PATH_ENV, "net-native": NATIVE_TCP_RMA_ENV}


def mpiexec() -> str:
    """The mpiexec beside this interpreter (the embedded MPICH), else MPIEXEC or PATH's."""
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.exists():
        return str(beside)
    found = os.environ.get("MPIEXEC") or shutil.which("mpiexec")
    if not found:
        raise RuntimeError("no mpiexec found; run dev/setup.sh")
    return found


def launch(scenario: str, ranks: int, path: str = "shm", timeout: float = 120,
           **kwargs) -> subprocess.CompletedProcess:
    """Run `scenario` on `ranks` ranks and return the finished mpiexec process, whatever
    its exit code (a hang past the timeout fails the test)."""
    env = dict(os.environ)
    env.pop("PYTEST_CURRENT_TEST", None)
    env["MPIEXEC_TIMEOUT"] = str(int(timeout))
    if path not in PATH_ENV:
        raise ValueError(f"path must be one of {sorted(PATH_ENV)}")
    env.update(PATH_ENV[path])
    cmd = [mpiexec(), "-n", str(ranks), sys.executable, str(RUNNER), scenario, json.dumps(kwargs)]
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
