"""The asapmpi command line: `asapmpi demo`, `asapmpi train`, `asapmpi graph`, `asapmpi bench`.

Commands that need several ranks launch them with mpiexec (`-n`), or, started inside an
MPI job (mpiexec, srun), run on its ranks.  User mistakes give one line, no traceback.
"""
from __future__ import annotations

import argparse
import sys
from typing import List, Optional, Sequence

from ..errors import AsapError, ConfigError

MULTI_RANK = {"demo", "bench", "train"}


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line (what to change), exit code 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def _ranks_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("-n", "--ranks", type=int, default=4,
                   help="ranks to launch when not already inside an MPI job (default 4)")
    p.add_argument("--network", nargs="?", const="tcp", choices=("tcp", "ucx"),
                   help="force the MPI's network path, not shared memory: tcp (MPICH's "
                        "ch4:ofi or Open MPI's tcp btl, on loopback) or ucx (Open MPI: "
                        "UCX over TCP)")
    p.add_argument("--job-timeout", type=float, default=600,
                   help="kill the launched job after this many seconds (default 600; "
                        "train: 0, no limit)")


def _module(name: str):
    """A command's module, imported when its options are needed (asapmpi.<name>)."""
    import importlib

    return importlib.import_module(f"asapmpi.{name}")


def _options(module: str, ranks: Optional[int] = None):
    """A subparser's set-up: the launch options (with -n's default `ranks`) when the
    command starts ranks, then the module's own options."""
    def setup(p: argparse.ArgumentParser) -> None:
        if ranks is not None:
            _ranks_options(p)
            if ranks != 4:
                p.set_defaults(ranks=ranks)
        _module(module).add_arguments(p)
    return setup


def _train_options(p: argparse.ArgumentParser) -> None:
    _ranks_options(p)
    # training may run for hours: no job limit unless asked (neighbour waits time out)
    p.set_defaults(job_timeout=0)
    _module("train.cli").add_arguments(p)
    _module("launch.restart").add_arguments(p)


#: every command: (name, help, set-up of its options); a command's module is imported
#: only when its options are parsed (a training rank, a one-line error, `-h` need only
#: theirs: importing every command's module took 0.3 s of each start)
COMMANDS = (
    ("demo", "mix vectors across ranks with NOTIFY-ACK and report", _options("cli.demo", 4)),
    ("train", "train an SVM, a CNN, an MLP or a character language model across ranks; "
              "report accuracy (lm: held-out loss), time, bytes; --compare policies",
     _train_options),
    ("doctor", "check the installation: MPI library and ABI, RMA path, progress, a 2-rank "
               "smoke test", _options("cli.doctor")),
    ("graph", "a graph's degree, bytes on the wire, connectivity and spectral gaps; --png "
              "draws it", _options("cli.graph")),
    ("trace", "check or draw iteration traces of hop runs", _options("cli.trace")),
    ("check-protocol", "model-check the slot protocols on small graphs (docs/MODELCHECK.md)",
     _options("modelcheck.cli")),
    ("bench", "benchmarks", None),
)

#: the benchmarks under `asapmpi bench`, as COMMANDS
BENCHMARKS = (
    ("core", "put, notify, verified reduce vs memcpy and MPI_Allreduce",
     _options("bench.core", 2)),
    ("consistency", "ASAP Figure 8: consistent, torn, stale inputs per reduce for bsp, "
                    "async, notify_ack", _options("bench.consistency", 8)),
    ("stragglers", "Hop's straggler experiments: hop settings under random and "
                   "deterministic slowdown", _options("bench.stragglers", 8)),
    ("zipline", "ElasticBSP Table II: ZipLine, GridScan and FullGridScan barrier selection "
                "times (one process, no MPI)", _options("bench.zipline")),
    ("reduce", "time per averaging step vs MPI_Allreduce, gloo and the memory bound; "
               "sizes, ranks, graphs, policies, shm and network path; targets PASS/FAIL",
     _options("bench.reduce")),
    ("soak", "a long run: resident memory per rank, file descriptors, /dev/shm and step "
             "time over many steps, one job per policy", _options("bench.soak")),
    ("training", "time to target accuracy (lm: held-out loss) per policy under stragglers "
                 "and narrow links, on emulated hosts with shaped links",
     _options("bench.training")),
    ("failures", "final accuracy and time to target with ranks killed: surviving in place "
                 "(ULFM) and restarting from checkpoints, against no failure",
     _options("bench.failures")),
)


def _asked(argv: Sequence[str]) -> List[str]:
    """The command and benchmark names on a command line (its first two words that are
    not options): the subparsers whose options must be built to parse it."""
    return [a for a in argv if not a.startswith("-")][:2]


def build_parser(argv: Optional[Sequence[str]] = None) -> argparse.ArgumentParser:
    """The argument parser of every subcommand; given the command line `argv`, only the
    options of the command it names are built (the others' names and help stay, for
    `-h` and the "invalid choice" error)."""
    asked = None if argv is None else _asked(argv)
    parser = OneLineErrorParser(prog="asapmpi", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True,
                                parser_class=OneLineErrorParser)
    for name, text, setup in COMMANDS:
        p = sub.add_parser(name, help=text)
        if name == "bench":
            bench_sub = p.add_subparsers(dest="bench", required=True)
            for bench, bench_text, bench_setup in BENCHMARKS:
                q = bench_sub.add_parser(bench, help=bench_text)
                if asked is None or asked == ["bench", bench]:
                    bench_setup(q)
        elif asked is None or asked[:1] == [name]:
            setup(p)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of the `asapmpi` command."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    try:
        if getattr(args, "png", None):      # before any rank starts or any work is done
            from ..extras import check

            check(["matplotlib"], "plot", "--png")
        if args.command == "bench" and args.bench == "zipline":
            from ..bench import zipline as bench_zipline

            return bench_zipline.run(args)      # one process: no mpiexec, no -n
        if args.command == "bench" and args.bench == "reduce":
            from ..bench import reduce as bench_reduce

            return bench_reduce.run(args)       # launches one job per path and rank count
        if args.command == "bench" and args.bench == "soak":
            from ..bench import soak as bench_soak

            return bench_soak.run(args)         # launches one job per run
        if args.command == "bench" and args.bench == "training":
            from ..bench import training as bench_training

            return bench_training.run(args)     # one job per scenario and seed
        if args.command == "bench" and args.bench == "failures":
            from ..bench import failures as bench_failures

            return bench_failures.run(args)     # one job per policy, seed and way
        if args.command in MULTI_RANK:
            return _run_multi_rank(args, argv)
        if args.command == "graph":
            from . import graph as graph_cli

            return graph_cli.run(args)
        if args.command == "trace":
            from . import trace as trace_cli

            return trace_cli.run(args)
        if args.command == "doctor":
            from . import doctor

            return doctor.run(args)
        if args.command == "check-protocol":
            from ..modelcheck import cli as modelcheck_cli

            return modelcheck_cli.run(args)     # one process, no MPI
    except ConfigError as exc:
        if _is_rank_zero():     # every rank raised the same error: say it once
            print(f"asapmpi: error: {exc}", file=sys.stderr)
        return 2
    except AsapError as exc:
        print(f"asapmpi: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except FileNotFoundError as exc:        # no mpiexec to launch the ranks with
        print(f"asapmpi: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        # the launcher's side (a rank's interrupt ends its job in _run_multi_rank): the
        # job was killed with it (subprocess.call), the emulated hosts removed on the way
        # out; the user asked to stop, so one line
        print(f"asapmpi: {args.command} interrupted", file=sys.stderr)
        return 130
    parser.error(f"unknown command {args.command!r}")
    return 2


def _run_multi_rank(args: argparse.Namespace, argv: List[str]) -> int:
    from ..launch.ranks import finished, inside_mpi_job, relaunch

    if args.ranks < 1:
        raise ConfigError(f"-n must be at least 1, got {args.ranks}")
    if not 0 <= args.job_timeout < float("inf"):
        raise ConfigError(f"--job-timeout must be a number of seconds >= 0 (0: no limit), "
                          f"got {args.job_timeout}")
    # bad input fails here, before any rank starts
    survive = False
    if args.command == "train":
        from ..train import cli as train_cli

        runs = train_cli.configs(args)
        survive = any(cfg.survive for cfg in runs)
        if not inside_mpi_job():
            train_cli.check_resume(runs, args.ranks)
            if args.restarts:
                return train_cli.run_restarting(args, argv, runs)
    elif args.command == "demo":
        from . import demo

        demo.check(args)
    elif args.bench == "consistency":
        from ..bench import consistency as bench_consistency

        bench_consistency.check(args, args.ranks)
    elif args.bench == "stragglers":
        from ..bench import stragglers as bench_stragglers

        bench_stragglers.check(args, args.ranks)
    if not inside_mpi_job():
        # --survive: launched so that a dead rank does not end the job (ULFM)
        return relaunch(args.ranks, argv, network=args.network, timeout=args.job_timeout,
                        fault_tolerance=survive)
    from mpi4py import MPI

    from ..launch.faults import register_rank

    register_rank(MPI.COMM_WORLD.Get_rank())     # for a restarting launcher
    try:
        code = _run_command(args)
        if not code:
            finished(MPI.COMM_WORLD.Get_rank())
        return code
    except ConfigError:
        raise       # raised by every rank alike, before any communication: no abort
    except BaseException as exc:      # any failure must end the whole job
        _abort_job(exc)
        raise


def _is_rank_zero() -> bool:
    from ..launch.ranks import inside_mpi_job

    if not inside_mpi_job():
        return True
    from mpi4py import MPI

    return MPI.COMM_WORLD.Get_rank() == 0


def _abort_job(exc: BaseException) -> None:
    """Report `exc` on this rank and end the whole job: the other ranks may be waiting
    for this one in a collective or a one-sided wait."""
    from mpi4py import MPI

    from ..launch.faults import abort_job, report_error

    if MPI.COMM_WORLD.Get_size() > 1:
        abort_job(exc)
    report_error(exc)


def _run_command(args: argparse.Namespace) -> int:
    if args.command == "train":
        from ..train import cli as train_cli

        return train_cli.run(args)
    if args.command == "demo":
        from . import demo

        demo.run(args)
        return 0
    if args.bench == "consistency":
        from ..bench import consistency as bench_consistency

        return bench_consistency.run(args)
    if args.bench == "stragglers":
        from ..bench import stragglers as bench_stragglers

        return bench_stragglers.run(args)
    from ..bench import core_job as bench_core

    return bench_core.run(args)
