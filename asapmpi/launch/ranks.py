"""Start the ranks of a CLI command: run inside an MPI job, or launch one with mpiexec."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from typing import Any, Dict, List, Mapping, Optional, Tuple

from ..errors import AsapError, ConfigError
from ..launchers import command, flavour, ulfm_refusal

#: variables a process manager sets in every rank it starts (MPICH hydra, Open MPI,
#: PMIx, Slurm's srun)
RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID")


def active_message_rma(env: Optional[Mapping[str, str]] = None) -> bool:
    """True when MPICH runs RMA as its own active messages, not the provider's RMA."""
    env = os.environ if env is None else env
    return env.get("MPIR_CVAR_CH4_OFI_ENABLE_RMA", "").strip().lower() in ("0", "false", "no")


def inside_mpi_job() -> bool:
    """True when this process was started by mpiexec, mpirun or srun."""
    return any(v in os.environ for v in RANK_VARIABLES)


def find_mpiexec() -> str:
    """The mpiexec of the MPI mpi4py uses: beside this interpreter first (the embedded
    MPICH wheel), then $MPIEXEC, then PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    for candidate in (beside, os.environ.get("MPIEXEC"), shutil.which("mpiexec")):
        if candidate and os.path.exists(candidate):
            return candidate
    raise FileNotFoundError("no mpiexec found: install the embedded MPI (pip install mpich) "
                            "or set MPIEXEC=/path/to/mpiexec")


def launch_command(ranks: int, program: List[str], network: Optional[str] = None,
                   timeout: float = 0, fault_tolerance: bool = False
                   ) -> Tuple[List[str], Dict[str, str]]:
    """The mpiexec command line and whole environment that run `program` on `ranks`
    ranks of this host with the MPI mpi4py uses (asapmpi.launchers.command);
    `fault_tolerance`: launched so that the ranks can survive a dead one in place
    (ConfigError in one line where this mpiexec cannot: asapmpi.launchers.ulfm_refusal)."""
    mpiexec = find_mpiexec()
    kind = flavour(mpiexec)
    if fault_tolerance:
        why = ulfm_refusal(mpiexec)
        if why:
            raise ConfigError(why)
    cmd, extra = command(kind, mpiexec, ranks, program, job_timeout=timeout or 0,
                         network=network, fault_tolerance=fault_tolerance)
    return cmd, {**os.environ, **extra}


#: prctl(2)'s option: the signal a process gets when the thread that started it ends
PR_SET_PDEATHSIG = 1


def _prctl():
    # libc's prctl, loaded before a fork (nothing is loaded in the child), or None
    if not sys.platform.startswith("linux"):
        return None
    import ctypes
    import ctypes.util

    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def child_setup():
    """The preexec_fn that makes a child die with this process: it gets SIGKILL when
    this process ends, even by SIGKILL or the out-of-memory killer (prctl
    PR_SET_PDEATHSIG); a child whose parent died before that exits at once."""
    prctl = _prctl()
    parent = os.getpid()

    def die_with_parent() -> None:              # in the child, before exec
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:              # the parent died before prctl
            os._exit(1)
    return die_with_parent


def call_job(cmd: List[str], env: Mapping[str, str]) -> int:
    """subprocess.call(cmd), but the job dies with this process: the child (mpiexec, or
    a script that execs it) gets SIGKILL if this process is killed, even by SIGKILL or
    the out-of-memory killer, which leave it no time to clean up, and mpiexec's death
    ends its ranks (hydra's proxies and Open MPI's daemons kill them).  Without it a
    killed benchmark's job runs on to its end.  Ctrl-C or SIGTERM here end the job as
    subprocess.call does (SIGKILL to the child) and propagate."""
    return subprocess.call(cmd, env=env, preexec_fn=child_setup())


#: where a rank of a job launched with fault tolerance says that it finished its
#: command (relaunch; finished())
FINISHED_DIR = "ASAPMPI_FINISHED_DIR"


def relaunch(ranks: int, argv: List[str], network: Optional[str] = None,
             timeout: Optional[float] = None, fault_tolerance: bool = False) -> int:
    """Run `python -m asapmpi ARGV` on `ranks` ranks under mpiexec; return its exit code.
    `fault_tolerance`: as launch_command; then 1 also when mpiexec said 0 but no rank
    finished (every rank ended by an error: under --with-ft ulfm, Open MPI 5's prterun
    returns 0 for ranks ended by a signal, which is how a rank that can be survived
    ends: asapmpi.launch.faults.abort_world)."""
    import tempfile

    cmd, env = launch_command(ranks, [sys.executable, "-m", "asapmpi", *argv], network,
                              timeout or 0, fault_tolerance)
    if not fault_tolerance:
        return call_job(cmd, env)
    with tempfile.TemporaryDirectory(prefix="asapmpi-finished-") as folder:
        code = call_job(cmd, {**env, FINISHED_DIR: folder})
        if code == 0 and not os.listdir(folder):
            print("asapmpi: no rank finished: each ended by an error (above); Open MPI "
                  "under --with-ft ulfm reports ranks ended that way as a success",
                  file=sys.stderr)
            return 1
    return code


def finished(rank: int) -> None:
    """This rank finished its command (a job launched by relaunch(fault_tolerance=True):
    a file named by the rank; elsewhere nothing).  Best effort: another host's
    folder is not this one's."""
    folder = os.environ.get(FINISHED_DIR)
    if folder:
        try:
            open(os.path.join(folder, f"rank{rank}"), "w").close()
        except OSError:
            pass


#: what each kind of launcher tells its ranks about the job's size, most specific first
SIZE_VARIABLES = ("ASAPMPI_EXPECTED_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE")


def expected_size() -> Optional[int]:
    """The number of ranks the launcher announced: asapmpi-run's ASAPMPI_EXPECTED_SIZE,
    the process manager's own variable (hydra's PMI_SIZE, Open MPI's
    OMPI_COMM_WORLD_SIZE), else, in a step started by srun and by nothing else,
    SLURM_STEP_NUM_TASKS; None when nothing says."""
    for var in SIZE_VARIABLES:
        value = os.environ.get(var, "")
        if value.isdigit():
            return int(value)
    # an mpiexec inside an srun step (srun --pty bash; mpirun in sbatch) sets its own
    # variables above; only a bare srun step leaves Slurm's count as the truth
    if "SLURM_PROCID" in os.environ and "SLURM_STEP_ID" in os.environ:
        value = os.environ.get("SLURM_STEP_NUM_TASKS", "")
        if value.isdigit():
            return int(value)
    return None


def check_world_size(size: int) -> None:
    """ConfigError when the job has another number of ranks than its launcher started:
    typically every process is a singleton because mpi4py's MPI is not the launcher's."""
    want = expected_size()
    if want is not None and want != size:
        from .._core.mpiabi import library_version

        library = library_version()
        raise ConfigError(f"this job has {size} rank(s) but its launcher started {want}: "
                          f"the processes did not join one MPI job; launch with the mpiexec "
                          f"of the MPI mpi4py uses ({library}), e.g. asapmpi-run")


def run_job(module: str, ranks: int, spec: Any, out: str, what: str,
            network: Optional[str] = None, timeout: float = 0) -> Dict[str, Any]:
    """Run `python -m MODULE JSON(spec) OUT` on `ranks` ranks under mpiexec and return the
    JSON its rank 0 wrote to `out`; AsapError naming `what` if the job failed (the ranks'
    own errors are on stderr above it)."""
    cmd, env = launch_command(ranks, [sys.executable, "-m", module, json.dumps(spec), out],
                              network, timeout)
    code = call_job(cmd, env)
    if code != 0 or not os.path.exists(out):
        raise AsapError(f"{what} failed (exit code {code}); its errors are above")
    with open(out) as f:
        return json.load(f)
