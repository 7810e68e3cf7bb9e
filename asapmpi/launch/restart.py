"""Restarting a job that failed (`asapmpi-run --restarts K`, `asapmpi train --restarts
K`): any MPI, no fault tolerance inside it needed.

The launcher runs the job as its child (call_job: the job dies with the launcher, and
Ctrl-C ends it at once), forwards the job's stdout and stderr as they come and reads
them on the way.
When the job ends:

- exit code 0: done;
- bad input (exit code 2, what every asapmpi command returns on a ConfigError, or a
  rank's "ConfigError:" line, which an uncaught ConfigError in a user's script prints
  before MPI_Abort): not restarted, the same input would fail again;
- interrupted (exit code 130, or Ctrl-C here): not restarted;
- anything else is a failure: a rank died (killed, out of memory, a crash) or the others
  gave up on it (NeighbourTimeoutError, the watchdog).  Relaunched, up to K times, with
  ASAPMPI_RESTART=<attempt> (asapmpi train then resumes from its newest checkpoints
  and drops its fault injection) and ASAPMPI_RESTART_LOST=<failed ranks>, on as many
  ranks as before, or with `--restart-ranks shrink` one fewer per failed rank.

Which ranks failed, from what the job said (docs/FAILURES.md):
1. ranks that died: a rank that said it kills itself (the trainer's fault injection,
   "asapmpi: rank 5: fault injection: SIGKILL ..."); else every rank of a job started
   with ASAPMPI_FAULT_DIR registers its pid (asapmpi.launch.faults.register_rank); the
   launcher watches those of its host and takes the one whose process ended first, when
   it ended alone (hydra then kills the others with the same SIGKILL, and its "BAD
   TERMINATION ... PID" names any of them); Open MPI names the rank ("process rank 1
   with PID ... exited on signal 9");
2. failing that, the ranks the others timed out on (NeighbourTimeoutError's "from rank
   1 (expected ...", the watchdog's "to rank(s) 1"), less the ranks that reported (they
   were alive);
3. failing that, unknown: one rank counts as failed (shrink drops the highest-numbered
   replica).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Set

from ..errors import ConfigError

#: the attempt a restarted job is (1, 2, ...; absent in the first)
RESTART_ENV = "ASAPMPI_RESTART"
#: the ranks of the job before that the launcher found failed ("1,3"; "" when unknown)
LOST_ENV = "ASAPMPI_RESTART_LOST"
#: a folder where each rank registers its process id (ranks named by their pid)
FAULT_DIR_ENV = "ASAPMPI_FAULT_DIR"
#: what --restart-ranks takes
RESTART_RANKS = ("same", "shrink")
#: exit codes the launcher does not restart: bad input, an interrupt
BAD_INPUT_EXIT = 2
INTERRUPTED_EXIT = 130

_OMPI_RANK = re.compile(r"process rank (\d+) with PID \d+ on node \S+ exited on signal")
_REPORTER = re.compile(r"^asapmpi: rank (\d+)[: ]")
#: a rank's own line before it SIGKILLs or SIGSTOPs itself (the trainer's --kill
#: options): its rank for certain, where hydra's kills race the pid watch
_INJECTED = re.compile(r"^asapmpi: rank (\d+): fault injection: SIG(KILL|STOP)")
_TIMED_OUT = re.compile(r"timed out after \S+ s waiting for .*? from "
                        r"((?:rank \d+(?: \([^)]*\))?(?:, )?)+)")
_WATCHDOG = re.compile(r"to rank\(s\) ([\d, ]+)")
_RANK = re.compile(r"rank (\d+)")
_BAD_INPUT = re.compile(r"^asapmpi(?:-run)?: (?:rank \d+: ConfigError: |error: )")


def restart_attempt(env: Optional[Mapping[str, str]] = None) -> int:
    """Which restart this job is (0: not a restart)."""
    value = (os.environ if env is None else env).get(RESTART_ENV, "")
    return int(value) if value.isdigit() else 0


def lost_from_environment(env: Optional[Mapping[str, str]] = None) -> List[int]:
    """The failed ranks of the job before this restart (ASAPMPI_RESTART_LOST)."""
    value = (os.environ if env is None else env).get(LOST_ENV, "")
    return sorted({int(v) for v in value.split(",") if v.strip().isdigit()})


def add_arguments(parser) -> None:
    """--restarts and --restart-ranks (asapmpi-run, asapmpi train)."""
    group = parser.add_argument_group("restarts after a failure (docs/FAILURES.md)")
    group.add_argument("--restarts", type=int, default=0, metavar="K",
                       help="relaunch a job that failed (a rank died or was timed out "
                            "on) up to K times, from the newest checkpoint (default 0)")
    group.add_argument("--restart-ranks", default="same", choices=RESTART_RANKS,
                       help="relaunch on as many ranks (same, default) or one fewer per "
                            "failed rank (shrink: the data re-split, the graph re-formed)")


def check_restarts(restarts: int, restart_ranks: str) -> None:
    """ConfigError unless --restarts is >= 0 and --restart-ranks one of RESTART_RANKS."""
    if isinstance(restarts, bool) or not isinstance(restarts, int) or restarts < 0:
        raise ConfigError(f"--restarts must be an integer >= 0, got {restarts!r}")
    if restart_ranks not in RESTART_RANKS:
        raise ConfigError(f"--restart-ranks must be one of {RESTART_RANKS}, got "
                          f"{restart_ranks!r}")


@dataclass
class JobReport:
    """What a job's stderr said about its end: ranks that died, ranks the others timed
    out on, ranks that reported (and so were alive), and whether a rank refused its
    input."""

    pids: Dict[int, int] = field(default_factory=dict)     # pid -> rank (registered)
    died: Set[int] = field(default_factory=set)
    silent: Set[int] = field(default_factory=set)
    reporters: Set[int] = field(default_factory=set)
    injected: Set[int] = field(default_factory=set)     # said it kills itself
    bad_input: bool = False

    def read(self, line: str) -> None:
        """Take one line of the job's stderr into account."""
        m = _OMPI_RANK.search(line)
        if m:
            self.died.add(int(m.group(1)))
        if _BAD_INPUT.match(line):
            self.bad_input = True
        m = _INJECTED.match(line)
        if m:
            # not a report of a live rank: a killed one is dead, a stopped one silent
            # (the others' timeouts name it)
            if m.group(2) == "KILL":
                self.injected.add(int(m.group(1)))
                self.died.add(int(m.group(1)))
            return
        m = _REPORTER.match(line)
        if not m:
            return
        self.reporters.add(int(m.group(1)))
        m = _TIMED_OUT.search(line)
        if m:
            self.silent.update(int(r) for r in _RANK.findall(m.group(1)))
            return
        m = _WATCHDOG.search(line)
        if m:
            self.silent.update(int(r) for r in m.group(1).replace(" ", "").split(",") if r)

    def failed(self) -> List[int]:
        """The ranks that failed, as far as the job said (empty: unknown)."""
        died = self.died - self.reporters
        return sorted(died or (self.silent - self.reporters))


def read_pids(folder: str) -> Dict[int, int]:
    """pid -> rank from the files ranks registered in `folder` (faults.register_rank)."""
    out = {}
    for name in os.listdir(folder):
        try:
            with open(os.path.join(folder, name)) as f:
                out[int(name)] = int(f.read().strip())
        except (OSError, ValueError):
            continue
    return out


def run_watched(cmd: Sequence[str], env: Mapping[str, str],
                log=None) -> "tuple[int, JobReport]":
    """Run the job (call_job's rules: it dies with this process, Ctrl-C ends it and
    propagates), forwarding its stdout and stderr as they come (to the text file
    `log` instead, when given); return its exit code and what they said."""
    from .ranks import child_setup

    report = JobReport()
    folder = tempfile.mkdtemp(prefix="asapmpi-faults-")
    try:
        # the child's preexec_fn only calls prctl and getppid, no lock a thread of this
        # process could hold (the reader thread starts after the fork anyway)
        proc = subprocess.Popen(list(cmd), env={**env, FAULT_DIR_ENV: folder},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                preexec_fn=child_setup())  # noqa: PLW1509
        # both: hydra writes its "BAD TERMINATION" block to stdout, the ranks' errors
        # reach stderr
        readers = [threading.Thread(target=_forward, args=(pipe, to, report), daemon=True)
                   for pipe, to in ((proc.stdout, log or sys.stdout),
                                    (proc.stderr, log or sys.stderr))]
        watcher = _DeathWatch(folder, proc)
        for thread in (*readers, watcher):
            thread.start()
        try:
            code = proc.wait()
        except BaseException:
            proc.kill()         # Ctrl-C, SIGTERM: the whole job, at once (call_job)
            proc.wait()
            raise
        for thread in (*readers, watcher):
            thread.join(timeout=5)
        report.pids = read_pids(folder)
        if not report.injected:
            report.died |= watcher.first
        return code, report
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _dying(pid: int) -> bool:
    """Whether process `pid` is being killed or is exiting: SIGKILL pending (shared or
    its own) or the kernel's PF_EXITING flag set; False when it is gone or unreadable."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            flags = int(f.read().rsplit(")", 1)[1].split()[6])
        if flags & 0x4:                     # PF_EXITING
            return True
        with open(f"/proc/{pid}/status") as f:
            pending = dict(line.split(":", 1) for line in f if ":" in line)
        kill = 1 << (9 - 1)                 # SIGKILL's bit
        return any(int(pending.get(k, "0").strip(), 16) & kill for k in ("SigPnd", "ShdPnd"))
    except (OSError, ValueError, IndexError):
        return False


class _DeathWatch(threading.Thread):
    """Which rank of this host died first: hydra kills the others with SIGKILL too
    once one died, and names one of them at random, so the launcher watches the
    registered ranks' processes itself (pidfd_open, Linux 5.3+) and keeps the ranks
    whose processes ended in the first wake-up (empty when several did: unknown).  A
    pidfd turns readable when its process has finished exiting, not when it was killed:
    a rank killed a few milliseconds after the one that failed can finish first on busy
    cores, so a single ended rank is named only if no other watched rank is dying at
    that moment (else unknown: named wrongly in 3 of about 33 runs of
    tests/train/test_restart.py's spent restarts before this check)."""

    POLL_S = 0.05

    def __init__(self, folder: str, proc: subprocess.Popen):
        super().__init__(daemon=True)
        self.folder, self.proc = folder, proc
        self.first: Set[int] = set()

    def run(self) -> None:
        if not hasattr(os, "pidfd_open"):
            return
        import select

        fds: Dict[int, int] = {}        # pidfd -> rank
        pids: Dict[int, int] = {}       # pidfd -> pid
        seen: Set[int] = set()
        poller = select.poll()
        try:
            while self.proc.poll() is None:
                ended = set()
                for pid, rank in read_pids(self.folder).items():
                    if pid in seen:
                        continue
                    seen.add(pid)
                    try:
                        fd = os.pidfd_open(pid)
                    except ProcessLookupError:      # ended before it was watched
                        ended.add(rank)
                        continue
                    except OSError:                 # not on this host
                        continue
                    fds[fd], pids[fd] = rank, pid
                    poller.register(fd, select.POLLIN)
                ready = {fd for fd, _ in poller.poll(0 if ended else 1000 * self.POLL_S)}
                ended |= {fds[fd] for fd in ready}
                if ended:
                    alone = len(ended) == 1 and not any(
                        _dying(pid) for fd, pid in pids.items() if fd not in ready)
                    self.first = ended if alone else set()
                    return
        finally:
            for fd in fds:
                os.close(fd)


def _forward(stream, to, report: JobReport) -> None:
    # raw chunks straight through (a progress bar's '\r' updates too), lines to the report
    out = getattr(to, "buffer", None)
    pending = b""
    while True:
        chunk = os.read(stream.fileno(), 65536)
        if not chunk:
            break
        if out is not None:
            out.write(chunk)
            out.flush()
        else:
            to.write(chunk.decode(errors="replace"))
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            report.read(line.decode(errors="replace").rstrip("\r"))
    if pending:
        report.read(pending.decode(errors="replace"))


def supervise(prog: str, size: int, restarts: int, restart_ranks: str,
              launch: Callable[[int, Dict[str, str]], "tuple[int, JobReport]"],
              prepare: Callable[[int, List[int]], str]) -> int:
    """Run the job on `size` ranks (`launch(size, extra_env)`); after a failure, relaunch
    it up to `restarts` times.  `prepare(new_size, failed)` checks the restart (a
    ConfigError ends here: a graph family that does not exist at the new size, no
    checkpoint to resume from) and says in a few words what it resumes from.  One line
    on stderr per restart and at the end when the restarts are spent."""
    attempt, env = 0, {}
    while True:
        code, report = launch(size, env)
        if code == 0:
            return 0
        if code == INTERRUPTED_EXIT:
            return code
        if code == BAD_INPUT_EXIT or report.bad_input:
            if attempt:
                print(f"{prog}: attempt {attempt + 1} refused its input (exit code {code}; "
                      f"see above): not restarting", file=sys.stderr, flush=True)
            return code
        failed = report.failed()
        named = f"rank(s) {', '.join(map(str, failed))}" if failed else \
            "rank(s) unknown"
        if attempt >= restarts:
            print(f"{prog}: the job failed (exit code {code}, failed {named}) and its "
                  f"{restarts} restart(s) are spent; giving up", file=sys.stderr,
                  flush=True)
            return code
        attempt += 1
        new_size = size - max(1, len(failed)) if restart_ranks == "shrink" else size
        if new_size < 1:
            print(f"{prog}: the job failed (exit code {code}, failed {named}) and no rank "
                  f"is left to restart on", file=sys.stderr, flush=True)
            return code
        try:
            what = prepare(new_size, failed)
        except ConfigError as exc:
            print(f"{prog}: cannot restart on {new_size} ranks after the failure of "
                  f"{named}: {exc}", file=sys.stderr, flush=True)
            return BAD_INPUT_EXIT
        print(f"{prog}: restart {attempt} of {restarts}: the job failed (exit code {code}, "
              f"failed {named}); relaunching on {new_size} ranks, {what}",
              file=sys.stderr, flush=True)
        env = {RESTART_ENV: str(attempt), LOST_ENV: ",".join(map(str, failed))}
        size = new_size
