"""Failing clearly: a multi-rank job whose rank hits an uncaught error ends, non-zero.

An exception that unwinds out of a rank's script would otherwise reach MPI_Finalize,
which waits for the other ranks, while they wait for this one in a one-sided wait or a
collective: a hang.  The hook installed here (once, by the first Exchange of a job of
more than one rank; asapmpi.rc.abort_on_error = False or ASAPMPI_ABORT_ON_ERROR=0 turns
it off) prints the error, one line for asapmpi's own errors, and calls MPI_Abort (in a
job launched with fault tolerance, `mpiexec --with-ft ulfm`, it ends its own process
instead: abort_world).

Ctrl-C is such an exception too: mpiexec forwards SIGINT to every rank, and a rank
waiting in the core sees it within the core's SIGNAL_CHECK_S (asapmpi/_core/slotwin.pyx).
Each rank then says in one line where it was (no traceback: the user asked to stop, and
eight ranks' tracebacks bury the line that matters) and the first to abort ends the job,
a rank that got no signal (SIGINT sent to one rank only) included.
"""
from __future__ import annotations

import linecache
import os
import signal
import sys
import sysconfig
import time
import traceback
from typing import Optional

_state = {"installed": False, "survivable": False}

# MPI_Abort makes hydra (and Slurm, Flux) tear the job down at once; what the aborting
# rank wrote to stderr just before can be lost if the launcher's I/O forwarder has not
# read it yet (seen in a loaded CI run: a timeout error with no output at all).  Failing
# clearly is worth half a second.
ABORT_GRACE_S = 0.5


def ft_enabled_at_run_time() -> Optional[bool]:
    """Whether Open MPI's fault tolerance is on in this process (`mpiexec --with-ft
    ulfm` sets the MCA parameter mpi_ft_enable through its "ft-mpi" parameter set); None
    when it cannot be told."""
    for key in ("OMPI_MCA_mpi_ft_enable", "OMPI_MCA_ompi_mpi_ft_enable"):
        value = os.environ.get(key)
        if value is not None:
            return value.strip().lower() in ("1", "true", "yes", "enabled")
    amca = os.environ.get("OMPI_MCA_mca_base_param_file_prefix", "")
    if "ft-mpi" in amca.split(":"):
        return True
    return None


def survivable() -> None:
    """This process made an exchange that survives failures (Exchange(fault_tolerance=
    True)): from now on abort_world() under ULFM ends it as a failure its survivors see
    (SIGKILL), not as an exit they would wait for."""
    _state["survivable"] = True


def ends_as_a_death() -> bool:
    """Whether abort_world() ends this process as a death its survivors go on without
    (SIGKILL): launched with fault tolerance and survivable()."""
    return _state["survivable"] and bool(ft_enabled_at_run_time())


def abort_world(code: int = 1) -> None:
    """Flush this rank's output, give the launcher time to forward it, then MPI_Abort;
    in a job launched with fault tolerance (Open MPI 5, `mpiexec --with-ft ulfm`), end
    this process alone instead: by SIGKILL once it made an exchange that survives
    failures (its survivors go on), else with `code` (below)."""
    from mpi4py import MPI

    sys.stdout.flush()
    sys.stderr.flush()
    time.sleep(ABORT_GRACE_S)
    if ft_enabled_at_run_time():
        # Under --with-ft ulfm prterun lets a job run on after a process ended.  MPI_Abort
        # there now and then left Open MPI 5.0.11's prterun running past its own
        # --timeout after every process had ended (docs/TESTING.md, the register), so
        # this process ends alone.  How: ULFM reports a process killed by a signal to
        # the others as failed (in 0.03 s), but not one that exited (os._exit): ranks
        # waiting in MPI for it wait forever.  So a process that survives failures
        # (survivable()) ends by SIGKILL and its survivors go on without it; any other
        # ends with `code`, which prterun returns once every process ended (under
        # --with-ft ulfm it returns 0 for processes killed by a signal), and the
        # others, which fail as this one did (their exchange does not survive), end
        # the same way.  An interrupt too: Ctrl-C reaches every rank and the launcher
        # (prterun, asapmpi's own, which returns INTERRUPTED_EXIT), and a SIGINT sent to
        # one rank alone is then a death the others survive, not one they wait for.
        if ends_as_a_death():
            os.kill(os.getpid(), signal.SIGKILL)
        os._exit(code)
    MPI.COMM_WORLD.Abort(code)
    os._exit(code)      # MPI_Abort does not return; should an MPI let it, do not go on


#: the exit code of a job ended by an interrupt (as a shell reports a process ended by
#: SIGINT)
INTERRUPTED_EXIT = 130


def where_interrupted(exc: BaseException) -> str:
    """Where `exc` (a KeyboardInterrupt) stopped this rank, in one line: the innermost
    line of the user's code and the asapmpi call made from there (in asapmpi's own
    programs: its innermost function), and what that call waited for (the note the
    core's wait adds)."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    libraries = tuple({sysconfig.get_paths()[k] for k in ("stdlib", "purelib", "platlib")})
    walked = list(traceback.walk_tb(exc.__traceback__))

    def ours(path: str) -> bool:
        return path.startswith((package, "asapmpi/")) or f"{os.sep}bindings{os.sep}" in path

    def user(path: str) -> bool:
        return not ours(path) and not path.startswith(libraries)

    paths = [frame.f_code.co_filename for frame, _ in walked]
    # Python files only: not a library's compiled frames ("_pcg64.pyx"), not "<frozen>"
    users = [i for i, p in enumerate(paths) if user(p) and p.endswith(".py")]
    parts = []
    if users:
        i = users[-1]
        line = linecache.getline(paths[i], walked[i][1]).strip()
        if len(line) > 60:
            line = line[:57] + "..."
        parts.append(f"at {os.path.basename(paths[i])}:{walked[i][1]}"
                     + (f" ({line})" if line else ""))
        # the asapmpi call made from there ("Exchange.step")
        called = next((_name(walked[j][0]) for j in range(i + 1, len(walked))
                       if ours(paths[j])), None)
        if called:
            parts.append(f"in {called}")
    else:
        # asapmpi's own program (the trainer, a benchmark): its innermost function
        mine = [i for i, p in enumerate(paths) if ours(p) and p.endswith(".py")]
        if mine:
            i = mine[-1]
            parts.append(f"in {_name(walked[i][0])} "
                         f"({os.path.basename(paths[i])}:{walked[i][1]})")
    notes = [n.removeprefix("asapmpi: interrupted ") for n in getattr(exc, "__notes__", ())]
    return ", ".join(parts + notes) or "before its first Python line"


def _name(frame) -> str:
    # "Exchange.step" (co_qualname: Python 3.11; the bare name before)
    return getattr(frame.f_code, "co_qualname", frame.f_code.co_name)


def report_error(exc: BaseException) -> None:
    """Print `exc` on stderr, prefixed with this rank: one line for asapmpi's own errors
    and for an interrupt, the traceback for anything else."""
    from mpi4py import MPI

    from ..errors import AsapError

    rank = MPI.COMM_WORLD.Get_rank()
    if isinstance(exc, KeyboardInterrupt):
        ending = "ending this rank" if ends_as_a_death() else "ending the job"
        text = f"asapmpi: rank {rank}: interrupted {where_interrupted(exc)}; {ending}"
    elif isinstance(exc, AsapError):
        text = f"asapmpi: rank {rank}: {type(exc).__name__}: {exc}"
    else:
        trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        text = f"asapmpi: rank {rank} failed:\n{trace}".rstrip("\n")
    _write_whole(text + "\n")


def _write_whole(text: str) -> None:
    # in one write where stderr is a file: the launcher interleaves the ranks' output by
    # write, and a line written in two pieces can end up glued to another rank's
    try:
        sys.stderr.flush()
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):      # a stream of Python's own
        sys.stderr.write(text)
        sys.stderr.flush()
        return
    data = text.encode(errors="replace")
    while data:
        data = data[os.write(fd, data):]


def abort_job(exc: BaseException, code: int = 1) -> None:
    """Report `exc` on this rank and end the whole job with MPI_Abort (exit code
    INTERRUPTED_EXIT for an interrupt)."""
    report_error(exc)
    abort_world(INTERRUPTED_EXIT if isinstance(exc, KeyboardInterrupt) else code)


def register_rank(rank: int) -> None:
    """Under a launcher that restarts failed jobs (ASAPMPI_FAULT_DIR set: asapmpi-run
    --restarts), write this process's rank to a file named by its pid: hydra names a
    rank that died only by its pid, and the restart needs its rank.  Best effort."""
    folder = os.environ.get("ASAPMPI_FAULT_DIR")
    if not folder:
        return
    path = os.path.join(folder, str(os.getpid()))
    try:
        # whole or absent: the launcher reads the folder while ranks write to it
        with open(f"{path}.tmp", "w") as f:
            f.write(f"{rank}\n")
        os.replace(f"{path}.tmp", path)
    except OSError:
        pass        # another host's folder: the launcher falls back on other evidence


def install_abort_hook() -> None:
    """Make an uncaught exception end the whole MPI job (idempotent); register this
    rank's pid for a restarting launcher (register_rank)."""
    if _state["installed"]:
        return
    from mpi4py import MPI

    register_rank(MPI.COMM_WORLD.Get_rank())
    previous = sys.excepthook

    def hook(kind, exc, tb):
        from mpi4py import MPI

        if MPI.Is_initialized() and not MPI.Is_finalized() and MPI.COMM_WORLD.Get_size() > 1:
            abort_job(exc)
        previous(kind, exc, tb)

    sys.excepthook = hook
    _state["installed"] = True
