"""asapmpi-run: one launcher for MPICH's hydra and Open MPI's mpiexec.

    asapmpi-run -n 8 [--hosts FILE] [--job-timeout S] [--network [tcp|ucx]] \\
                [--slowdown random --slow-factor 6] [--dry-run] -- python train.py ...

It finds the mpiexec of the MPI that mpi4py uses (beside the interpreter, $MPIEXEC,
PATH), recognizes its flavour from `mpiexec --version`, and adds what small and
oversubscribed machines need: Open MPI's --oversubscribe and --bind-to none and
mpi_yield_when_idle (hydra oversubscribes by itself), a job time limit (hydra:
MPIEXEC_TIMEOUT; Open MPI: --timeout), a hosts file (-f / --hostfile), MPICH's forced
network path (--network: TCP on loopback; Open MPI's UCX over TCP with --network ucx;
asapmpi.launchers has the table), slowdown injection for the training demos
and user code (ASAPMPI_SLOWDOWN), and ASAPMPI_EXPECTED_SIZE so that every rank can check
that it landed in a job of the size asked for.  Hosts that MPICH's hydra would misread
(a slot count of 0, -2 or abc: a crash or a spinning mpiexec) are refused first, in one
line naming the file and line (asapmpi.launch.hostfile).
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys
from typing import List, Optional, Sequence

from ..errors import ConfigError
from ..launch.hostfile import check_hosts
from ..launch.ranks import find_mpiexec
from ..launch.restart import add_arguments as restart_arguments
from ..launch.restart import check_restarts
from ..launch.slowdown import add_arguments as slowdown_arguments
from ..launchers import command, flavour


def slowdown_spec(kind: str, factor: float, probability: float, ranks: Sequence[int],
                  seed: int) -> str:
    """The ASAPMPI_SLOWDOWN value: kind:factor:probability:ranks(/-separated):seed."""
    return f"{kind}:{factor}:{probability}:{'/'.join(map(str, ranks))}:{seed}"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of asapmpi-run."""
    p.add_argument("-n", "--ranks", type=int, required=True, help="ranks to start")
    p.add_argument("--hosts", metavar="FILE", help="hosts file (one host per line, "
                                                   "optionally host:slots, slots >= 1)")
    p.add_argument("--job-timeout", type=float, default=0,
                   help="end the job after this many seconds (default: no limit)")
    p.add_argument("--network", nargs="?", const="tcp", choices=("tcp", "ucx"),
                   help="force the MPI's network path on loopback: tcp (MPICH's ch4:ofi, "
                        "Open MPI's tcp btl) or ucx (Open MPI's UCX over TCP)")
    p.add_argument("--mpiexec", help="the mpiexec to use (default: the one beside this "
                                     "Python, $MPIEXEC, PATH)")
    p.add_argument("--mpi-args", default="", help="extra mpiexec arguments, one string")
    p.add_argument("--dry-run", action="store_true", help="print the command, run nothing")
    slow = slowdown_arguments(p)          # passed to the job as ASAPMPI_SLOWDOWN
    slow.add_argument("--slow-seed", type=int, default=0)
    restart_arguments(p)
    p.add_argument("program", nargs=argparse.REMAINDER,
                   help="-- then the program and its arguments")


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of asapmpi-run."""
    from . import OneLineErrorParser

    parser = OneLineErrorParser(prog="asapmpi-run", description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    program = args.program[1:] if args.program[:1] == ["--"] else args.program
    try:
        if args.ranks < 1:
            raise ConfigError(f"-n must be at least 1, got {args.ranks}")
        if not program:
            raise ConfigError("no program to run: asapmpi-run -n N -- python script.py")
        if args.hosts and not os.path.isfile(args.hosts):
            raise ConfigError(f"--hosts {args.hosts}: no such file")
        if not 0 <= args.job_timeout < float("inf"):
            raise ConfigError(f"--job-timeout must be a number of seconds >= 0 (0: no "
                              f"limit), got {args.job_timeout}")
        if args.slowdown != "none":
            from ..launch.slowdown import from_options

            from_options(args.slowdown, args.slow_factor, args.slow_probability,
                         args.slow_ranks, args.slow_seed, args.ranks)
            outside = [r for r in args.slow_ranks if not 0 <= r < args.ranks]
            if outside:
                raise ConfigError(f"--slow-ranks {outside} are outside 0..{args.ranks - 1}")
        check_restarts(args.restarts, args.restart_ranks)
        try:
            mpi_args = shlex.split(args.mpi_args)
        except ValueError as exc:
            raise ConfigError(f"--mpi-args {args.mpi_args!r}: {exc}") from None
        mpiexec = args.mpiexec or find_mpiexec()
        kind = flavour(mpiexec)
        # hydra crashes or spins on a bad slot count: every host it will read, checked
        check_hosts(kind, args.hosts, mpi_args, os.environ)
        cmd, env = command(kind, mpiexec, args.ranks, program, args.hosts,
                           args.job_timeout, args.network)
        cmd[3:3] = mpi_args
        if args.slowdown != "none":
            env["ASAPMPI_SLOWDOWN"] = slowdown_spec(args.slowdown, args.slow_factor,
                                                    args.slow_probability, args.slow_ranks,
                                                    args.slow_seed)
    except (ConfigError, FileNotFoundError) as exc:
        print(f"asapmpi-run: error: {exc}", file=sys.stderr)
        return 2
    shown = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()))
    print(f"asapmpi-run: {kind}: {shown} {shlex.join(cmd)}", file=sys.stderr)
    if args.dry_run:
        return 0
    sys.stderr.flush()
    if args.restarts:
        return _run_restarting(args, kind, mpiexec, program, mpi_args, env)
    # become mpiexec: Ctrl-C and signals reach the process manager directly, which
    # cleans up its ranks (a Python parent would kill it mid-cleanup)
    os.execvpe(cmd[0], cmd, {**os.environ, **env})
    return 1    # not reached


def _run_restarting(args: argparse.Namespace, kind: str, mpiexec: str, program: List[str],
                    mpi_args: List[str], env: dict) -> int:
    """--restarts: stay the job's parent (it dies with this process; Ctrl-C ends it at
    once), relaunch it after a failure with ASAPMPI_RESTART and ASAPMPI_RESTART_LOST set
    (asapmpi.launch.restart): the program resumes from its own checkpoints (asapmpi
    train does by itself)."""
    from ..launch.restart import run_watched, supervise

    def launch(size: int, extra: dict):
        cmd, more = command(kind, mpiexec, size, program, args.hosts, args.job_timeout,
                            args.network)
        cmd[3:3] = mpi_args
        return run_watched(cmd, {**os.environ, **env, **more, **extra})

    def prepare(size: int, failed: List[int]) -> str:
        if args.slowdown != "none":
            outside = [r for r in args.slow_ranks if not 0 <= r < size]
            if outside:
                raise ConfigError(f"--slow-ranks {outside} are outside 0..{size - 1}")
        return "the program resumes from its own newest checkpoint (ASAPMPI_RESTART set)"

    try:
        return supervise("asapmpi-run", args.ranks, args.restarts, args.restart_ranks,
                         launch, prepare)
    except KeyboardInterrupt:
        # the job was killed with the interrupt (run_watched); one line, as asapmpi's own
        print("asapmpi-run: interrupted", file=sys.stderr)
        return 130
