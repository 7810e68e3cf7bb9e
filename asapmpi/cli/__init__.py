"""The asapmpi command line: `asapmpi demo`, `asapmpi train`, `asapmpi graph`, `asapmpi bench`.

Commands that need several ranks launch them with mpiexec (`-n`), or, started inside an
MPI job (mpiexec, srun), run on its ranks.  User mistakes give one line, no traceback.
"""
from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from ..errors import AsapError, ConfigError

MULTI_RANK = {"demo", "bench", "train"}


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line (what to change), exit code 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    from ..bench import consistency as bench_consistency
    from ..bench import core as bench_core
    from ..bench import failures as bench_failures
    from ..bench import reduce as bench_reduce
    from ..bench import soak as bench_soak
    from ..bench import stragglers as bench_stragglers
    from ..bench import training as bench_training
    from ..bench import zipline as bench_zipline
    from ..launch import restart
    from ..modelcheck import cli as modelcheck_cli
    from ..train import cli as train_cli
    from . import demo, doctor
    from . import graph as graph_cli
    from . import trace as trace_cli

    parser = OneLineErrorParser(prog="asapmpi", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True,
                                parser_class=OneLineErrorParser)

    def ranks_options(p):
        p.add_argument("-n", "--ranks", type=int, default=4,
                       help="ranks to launch when not already inside an MPI job (default 4)")
        p.add_argument("--network", nargs="?", const="tcp", choices=("tcp", "ucx"),
                       help="force the MPI's network path, not shared memory: tcp (MPICH's "
                            "ch4:ofi or Open MPI's tcp btl, on loopback) or ucx (Open MPI: "
                            "UCX over TCP)")
        p.add_argument("--job-timeout", type=float, default=600,
                       help="kill the launched job after this many seconds (default 600; "
                            "train: 0, no limit)")

    p_demo = sub.add_parser("demo", help="mix vectors across ranks with NOTIFY-ACK and report")
    ranks_options(p_demo)
    demo.add_arguments(p_demo)

    p_train = sub.add_parser("train", help="train an SVM, a CNN, an MLP or a character "
                                           "language model across ranks; report accuracy "
                                           "(lm: held-out loss), time, bytes; --compare "
                                           "policies")
    ranks_options(p_train)
    # training may run for hours: no job limit unless asked (neighbour waits time out)
    p_train.set_defaults(job_timeout=0)
    train_cli.add_arguments(p_train)
    restart.add_arguments(p_train)

    p_doctor = sub.add_parser("doctor", help="check the installation: MPI library and "
                                             "ABI, RMA path, progress, a 2-rank smoke test")
    doctor.add_arguments(p_doctor)

    p_graph = sub.add_parser("graph", help="a graph's degree, bytes on the wire, "
                                           "connectivity and spectral gaps; --png draws it")
    graph_cli.add_arguments(p_graph)

    p_trace = sub.add_parser("trace", help="check or draw iteration traces of hop runs")
    trace_cli.add_arguments(p_trace)

    p_check = sub.add_parser("check-protocol", help="model-check the slot protocols on "
                                                    "small graphs (docs/MODELCHECK.md)")
    modelcheck_cli.add_arguments(p_check)

    p_bench = sub.add_parser("bench", help="benchmarks")
    bench_sub = p_bench.add_subparsers(dest="bench", required=True)
    p_core = bench_sub.add_parser("core", help="put, notify, verified reduce vs memcpy and "
                                               "MPI_Allreduce")
    ranks_options(p_core)
    p_core.set_defaults(ranks=2)
    bench_core.add_arguments(p_core)
    p_cons = bench_sub.add_parser("consistency", help="ASAP Figure 8: consistent, torn, stale "
                                                      "inputs per reduce for bsp, async, "
                                                      "notify_ack")
    ranks_options(p_cons)
    p_cons.set_defaults(ranks=8)
    bench_consistency.add_arguments(p_cons)
    p_strag = bench_sub.add_parser("stragglers", help="Hop's straggler experiments: hop "
                                                      "settings under random and "
                                                      "deterministic slowdown")
    ranks_options(p_strag)
    p_strag.set_defaults(ranks=8)
    bench_stragglers.add_arguments(p_strag)
    p_zip = bench_sub.add_parser("zipline", help="ElasticBSP Table II: ZipLine, GridScan "
                                                 "and FullGridScan barrier selection "
                                                 "times (one process, no MPI)")
    bench_zipline.add_arguments(p_zip)
    p_reduce = bench_sub.add_parser("reduce", help="time per averaging step vs MPI_Allreduce, "
                                                   "gloo and the memory bound; sizes, ranks, "
                                                   "graphs, policies, shm and network path; "
                                                   "targets PASS/FAIL")
    bench_reduce.add_arguments(p_reduce)
    p_soak = bench_sub.add_parser("soak", help="a long run: resident memory per rank, file "
                                               "descriptors, /dev/shm and step time over "
                                               "many steps, one job per policy")
    bench_soak.add_arguments(p_soak)
    p_training = bench_sub.add_parser("training", help="time to target accuracy (lm: "
                                                       "held-out loss) per policy "
                                                       "under stragglers and narrow links, "
                                                       "on emulated hosts with shaped links")
    bench_training.add_arguments(p_training)
    p_failures = bench_sub.add_parser("failures", help="final accuracy and time to target "
                                                       "with ranks killed: surviving in "
                                                       "place (ULFM) and restarting from "
                                                       "checkpoints, against no failure")
    bench_failures.add_arguments(p_failures)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of the `asapmpi` command."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
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
    from ..launch.ranks import inside_mpi_job, relaunch

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
        return _run_command(args)
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
