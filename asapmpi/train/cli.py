"""`asapmpi train svm|cnn|mlp|lm`: the training demos from the command line.

    asapmpi train svm -n 8 --sync notify_ack --graph root-expander
    asapmpi train svm -n 8 --compare allreduce,bsp,async,notify_ack,hop:backup=1
    asapmpi train cnn -n 4 --sync hop --hop max_gap=3 --hop backup=1 --json s.json
    asapmpi train lm -n 8 --sync allreduce --outer diloco --local-steps 20

Rank 0 shows a progress bar, then a summary (a table with --compare); every run's
per-rank metrics go to OUT/metrics.h5, the convergence plot to OUT/convergence.png.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace
from typing import List, Tuple

import numpy as np

from ..errors import ConfigError
from ..extras import check as check_extras
from ..launch.restart import check_restarts, lost_from_environment, restart_attempt
from ..launch.slowdown import add_arguments as slowdown_arguments
from ..outer import METHODS as OUTER_METHODS
from ..outputs import file_problem, folder_problem, output_file, output_folder
from ..reduce.graphs import GRAPHS
from .config import (
    DEFAULTS,
    KILL_POINTS,
    LOST_SHARDS,
    MODELS,
    MODES,
    OPTIMIZERS,
    TRAINABLE,
    TrainConfig,
    parse_options,
    runs_from,
    split_options,
)
from .metric import metric_of, of_summary


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `asapmpi train`."""
    parser.add_argument("model", choices=MODELS, help="svm: linear SVM with log loss; "
                                                      "cnn: a small CNN on 8x8 digits; "
                                                      "mlp: two wide hidden layers "
                                                      "(compute-bound, 5 MB at width 512); "
                                                      "lm: a small character-level "
                                                      "transformer on the standard "
                                                      "library's sources, judged by "
                                                      "held-out loss")
    parser.add_argument("--data", help="svm: 'synthetic-svm' (default, 2000 features), "
                                       "'synthetic-rcv1' (a million features, a 4 MB "
                                       "model: run --iters 3000 or so) or a LIBSVM file "
                                       "(RCV1, webspam, splice-site; .bz2/.gz/.xz read "
                                       "as is); mlp: the same, up to 8192 features; "
                                       "cnn: 'digits' (default, ships with "
                                       "scikit-learn) or 'synthetic-images'; lm: 'stdlib' "
                                       "(this Python's own .py sources: --data-option "
                                       "max_bytes=4194304 heldout=0.1 eval_windows=128 "
                                       "seed=0 root=DIR).  Each rank "
                                       "generates or reads only its own shard")
    parser.add_argument("--test-data", help="a LIBSVM test file (default: hold out 20%%)")
    parser.add_argument("--data-option", dest="data_options", action="append", default=[],
                        metavar="OPTION=VALUE",
                        help="an option of the dataset, e.g. n_features=1000000 "
                             "nnz_per_row=76 for synthetic-svm")
    parser.add_argument("--sync", default="notify_ack", choices=TRAINABLE)
    parser.add_argument("--graph", default="root-expander", choices=sorted(GRAPHS))
    parser.add_argument("--hop", "--option", dest="options", action="append", default=[],
                        metavar="OPTION=VALUE",
                        help="a policy option, e.g. --hop backup=1 --hop max_gap=3")
    parser.add_argument("--compare", metavar="RUN,RUN,...",
                        help="run several configurations in turn and print a table; "
                             "RUN = POLICY[@GRAPH][:OPTION=VALUE...], e.g. "
                             "allreduce,notify_ack@ring,hop:backup=1")
    parser.add_argument("--balance", action="store_true",
                        help="load balancing (LB-BSP): per-rank batch sizes from measured "
                             "compute per sample, the global batch unchanged, the "
                             "gradients weighted by samples; with --compare write "
                             "balance=1 in a run (allreduce:balance=1)")
    parser.add_argument("--balance-every", type=int, default=20, metavar="K",
                        help="re-balance every K own steps (default 20)")
    parser.add_argument("--period", type=int, default=1,
                        help="exchange every PERIOD optimizer steps (default 1)")
    outer = parser.add_argument_group(
        "local steps and an outer optimizer (docs/LOWCOMM.md)",
        "with --compare, write them in a run: allreduce:outer=diloco:local_steps=20")
    outer.add_argument("--outer", choices=OUTER_METHODS,
                       help="diloco: every --local-steps steps the exchange mixes the "
                            "weights, then an outer Nesterov step on the mixed "
                            "pseudo-gradient (allreduce: DiLoCo; gossip or a sparse "
                            "graph: NoLoCo-like)")
    outer.add_argument("--local-steps", type=int, metavar="H",
                       help="inner steps per round with --outer (it is the period)")
    outer.add_argument("--outer-lr", type=float,
                       help="the outer learning rate (default 0.7)")
    outer.add_argument("--outer-momentum", type=float,
                       help="the outer Nesterov momentum, in [0, 1) (default 0.9)")
    parser.add_argument("--mode", default="serial", choices=MODES,
                        help="Hop 3.2 computation graph: serial (default) or parallel "
                             "(send before computing)")
    parser.add_argument("--iters", type=int, default=400, help="iterations (default 400)")
    parser.add_argument("--batch-size", type=int, help="per rank (default 32; mlp 256; "
                                                       "lm 32 windows)")
    parser.add_argument("--width", type=int,
                        help="mlp: units of each hidden layer (default 512); lm: the "
                             f"embedding width (default {DEFAULTS['lm']['width']})")
    parser.add_argument("--layers", type=int, help="lm: transformer blocks (default "
                                                   f"{DEFAULTS['lm']['layers']})")
    parser.add_argument("--heads", type=int, help="lm: attention heads, dividing --width "
                                                  f"(default {DEFAULTS['lm']['heads']})")
    parser.add_argument("--context", type=int, help="lm: characters per window (default "
                                                    f"{DEFAULTS['lm']['context']})")
    parser.add_argument("--lr", type=float, help="learning rate (svm: eta0 of Bottou's "
                                                 f"schedule, default {DEFAULTS['svm']['lr']}; "
                                                 f"cnn: default {DEFAULTS['cnn']['lr']}; "
                                                 f"mlp: {DEFAULTS['mlp']['lr']}; "
                                                 f"lm: {DEFAULTS['lm']['lr']})")
    parser.add_argument("--lam", type=float, default=1e-4,
                        help="svm: L2 regularization lambda (default 1e-4)")
    parser.add_argument("--optimizer", choices=OPTIMIZERS,
                        help="sgd (svm default), momentum (cnn, mlp default) or adam "
                             "(lm default)")
    parser.add_argument("--eval-every", type=int, default=20,
                        help="evaluate test accuracy (lm: held-out loss) every N "
                             "iterations (default 20)")
    parser.add_argument("--target", type=float,
                        help="target test accuracy for time-to-target (svm "
                             f"{DEFAULTS['svm']['target']}, cnn {DEFAULTS['cnn']['target']}, "
                             f"mlp {DEFAULTS['mlp']['target']}); lm: a held-out loss in "
                             f"nats per character, lower is better "
                             f"({DEFAULTS['lm']['target']})")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, help="seconds any wait on a neighbour "
                                                      "may take")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch threads per rank (default: cores / ranks on the host)")
    parser.add_argument("--device", default="cpu",
                        help="where each rank computes: cpu (default), cuda or cuda:N "
                             "(the exchange stages the parameters through pinned host "
                             "memory)")
    parser.add_argument("--dtype", default="float32",
                        help="the parameters' element type: float32 (default), bfloat16 "
                             "or float16 (exchanged as they are, reduced in float32)")
    out = parser.add_argument_group("outputs and checkpoints")
    out.add_argument("--out", default="asapmpi-runs", type=output_folder,
                     help="folder for metrics.h5, convergence.png and checkpoints "
                          "(default ./asapmpi-runs)")
    out.add_argument("--json", metavar="FILE", type=output_file, help="write the summary as JSON")
    out.add_argument("--png", metavar="FILE", type=output_file,
                     help="convergence plot (default OUT/convergence.png)")
    out.add_argument("--h5", metavar="FILE", type=output_file,
                     help="metrics (default OUT/metrics.h5)")
    out.add_argument("--checkpoint-every", type=int, default=0,
                     help="checkpoint every K iterations (and always at the end)")
    out.add_argument("--keep", type=int, default=2, help="checkpoints kept per rank")
    out.add_argument("--resume", action="store_true",
                     help="continue from the newest checkpoint every rank has")
    out.add_argument("--no-progress", action="store_true", help="no progress bar")
    out.add_argument("--average-at-end", action="store_true",
                     help="after the last iteration, average the replicas (one allreduce) "
                          "and evaluate that model too (the summary's averaged_test_*): "
                          "the consensus model decentralized SGD's guarantees are about")
    slowdown_arguments(parser)
    survive = parser.add_argument_group(
        "surviving a dead rank in place (ULFM: Open MPI 5; docs/FAILURES.md)")
    survive.add_argument("--survive", action="store_true",
                         help="a rank that dies does not end the run: the survivors shrink "
                              "the graph and go on (launched with mpiexec --with-ft ulfm; "
                              "refused on an MPI without ULFM: use --restarts there)")
    survive.add_argument("--lost-shards", choices=LOST_SHARDS, default=None,
                         help="--survive: a dead rank's data shard is re-split with the "
                              "rest among the survivors (reassign, the default) or lost "
                              "with it (drop: each survivor keeps its shard)")
    faults = parser.add_argument_group("fault injection (tests)")
    faults.add_argument("--kill-rank", type=int, help="this rank kills itself (SIGKILL)")
    faults.add_argument("--kill", action="append", type=kill_spec, default=[],
                        metavar="RANK@ITER",
                        help="rank RANK kills itself (--kill-signal) after iteration ITER; "
                             "repeat for several ranks (instead of --kill-rank/--kill-at)")
    faults.add_argument("--kill-at", type=int, help="... once it reaches this iteration")
    faults.add_argument("--kill-in", choices=KILL_POINTS[1:],
                        help="... just before the run's start or end collective, (step, "
                             "with --kill-at K) inside the exchange of iteration K + 1, "
                             "after its send, (checkpoint, with --kill-at K) halfway "
                             "through writing its checkpoint of iteration K, as the "
                             "exchange is freed at the end (free), or (with --survive and "
                             "--kill RANK@ITER) in its recovery from that rank's death: "
                             "right after the shrink, while the survivors make their "
                             "exchange (shrink), or once it is made (recovery)")
    faults.add_argument("--kill-signal", choices=("kill", "stop"), default="kill",
                        help="SIGKILL (default) or SIGSTOP (the rank stays alive but "
                             "silent)")
    faults.add_argument("--stop-for", type=float, default=0.0, metavar="SECONDS",
                        help="--kill-signal stop: the rank is continued (SIGCONT) after "
                             "SECONDS (default 0: never)")


#: what the training command imports: torch, the data readers, the progress bar, the plot
TRAIN_MODULES = ("torch", "sklearn", "scipy", "tqdm", "matplotlib")


def kill_spec(text: str) -> Tuple[int, int]:
    """argparse type of --kill: "5@120" -> (5, 120)."""
    rank, at, iteration = text.partition("@")
    if not (at and rank.strip().isdigit() and iteration.strip().isdigit()):
        raise argparse.ArgumentTypeError(f"give RANK@ITERATION, e.g. 5@120, got {text!r}")
    return int(rank), int(iteration)


def configs(args: argparse.Namespace) -> List[TrainConfig]:
    """The checked configuration of every run the command asks for (no MPI needed)."""
    check_extras(TRAIN_MODULES, "train", "asapmpi train")
    options, trainer = split_options(parse_options(args.options, "of --hop"), "in --hop")
    base = TrainConfig(
        model=args.model, data=args.data, test_data=args.test_data,
        data_options=parse_options(args.data_options, "of --data-option"),
        sync=args.sync,
        graph=args.graph, policy_options=options,
        period=args.period,
        mode=args.mode, iters=args.iters, batch_size=args.batch_size, lr=args.lr,
        lam=args.lam, optimizer=args.optimizer, eval_every=args.eval_every,
        target=args.target, seed=args.seed, checkpoint_every=args.checkpoint_every,
        keep=args.keep, out=args.out, resume=args.resume, timeout=args.timeout,
        slowdown=args.slowdown, slow_factor=args.slow_factor,
        slow_probability=args.slow_probability, slow_ranks=tuple(args.slow_ranks),
        threads=args.threads, device=args.device, dtype=args.dtype, width=args.width,
        layers=args.layers, heads=args.heads, context=args.context,
        kill_rank=args.kill_rank, kill_at=args.kill_at, kills=tuple(args.kill),
        kill_in=args.kill_in, kill_signal=args.kill_signal, stop_for=args.stop_for,
        survive=args.survive, lost_shards=args.lost_shards or "reassign",
        average_at_end=args.average_at_end,
        **{"balance": args.balance, "balance_every": args.balance_every,
           "outer": args.outer, "local_steps": args.local_steps,
           "outer_lr": args.outer_lr, "outer_momentum": args.outer_momentum, **trainer})
    from .data import _LOADERS

    for flag, name in (("--data", args.data), ("--test-data", args.test_data)):
        # checked here, before any rank starts (Open MPI prints its own lines when the
        # ranks refuse it)
        if name and name not in _LOADERS and not os.path.isfile(name):
            raise ConfigError(f"{flag} {name}: unknown dataset; choose "
                              f"{', '.join(_LOADERS)} or the path of a LIBSVM file")
    if args.compare and args.options:
        raise ConfigError("with --compare, put policy options in each run "
                          "(hop:backup=1), not in --hop")
    if args.lost_shards and not args.survive:
        raise ConfigError("--lost-shards says what the survivors of --survive do with a "
                          "dead rank's data; add --survive or drop it")
    if args.survive and args.compare:
        raise ConfigError("--survive runs one policy per job (a failure ends the ranks of "
                          "every later run); drop --compare or --survive")
    if args.survive and args.restarts:
        raise ConfigError("--survive goes on without the dead rank, --restarts relaunches "
                          "the job: choose one")
    if args.compare and args.balance:
        raise ConfigError("with --compare, put balance=1 in the runs to balance "
                          "(allreduce:balance=1), not --balance")
    # the paths given were checked when parsed (asapmpi.outputs); the defaults under --out
    # only once it exists (else they are created with it)
    for flag, given, name in (("--h5", args.h5, "metrics.h5"),
                              ("--png", args.png, "convergence.png")):
        default = os.path.join(args.out, name)
        problem = None if given or not os.path.isdir(args.out) else file_problem(default)
        if problem:
            raise ConfigError(f"{flag} (default {default}): {problem}")
    # every run writes checkpoints there (at least its last): with a file in the way
    # every rank would die at its start, each with a traceback
    checkpoints = os.path.join(args.out, "checkpoints")
    problem = folder_problem(checkpoints) if os.path.isdir(args.out) else None
    if problem:
        raise ConfigError(f"--out {args.out}: the checkpoints' folder {checkpoints}: "
                          f"{problem}")
    if args.timeout is not None and not args.timeout > 0:
        raise ConfigError(f"--timeout must be a positive number of seconds, got "
                          f"{args.timeout}")
    check_restarts(args.restarts, args.restart_ranks)
    if args.restarts and not args.checkpoint_every:
        raise ConfigError("--restarts resumes from the newest checkpoint: add "
                          "--checkpoint-every K (else a restart starts from iteration 0)")
    if restart_attempt():
        # a relaunch after a failure (asapmpi.launch.restart): it resumes, and the fault
        # injected into the first attempt is not injected again
        base = replace(base, resume=True, kill_rank=None, kill_at=None, kill_in=None,
                       kills=())
    return runs_from(base, args.compare)


def check_resume(runs: List[TrainConfig], ranks: int) -> None:
    """Before any rank starts: refuse --resume from a checkpoint another configuration
    wrote, or checkpoints the ranks cannot agree on (the ranks check again, for
    checkpoints only their hosts can see)."""
    from .checkpoint import CheckpointDir, load_entry
    from .resume_plan import plan_resume

    for cfg in runs:
        if not cfg.resume:
            continue
        root = cfg.checkpoint_root()
        plan = plan_resume(root, ranks, cfg.keep, lost_from_environment())
        if plan is None:
            continue
        path = CheckpointDir(root, plan.sources[0]).path(plan.iteration)
        mismatch = cfg.resume_mismatch(load_entry(path, "config"))
        if mismatch:
            raise ConfigError(f"cannot resume from {path}: the checkpoint at iteration "
                              f"{plan.iteration} under {root} {mismatch}")


def check_size(runs: List[TrainConfig], ranks: int) -> str:
    """Before a job on `ranks` ranks (a restart on fewer): ConfigError in one line when a
    run's graph family does not exist at that size or its policy does not fit the
    graph there; else the graphs, for the log ("root-expander")."""
    from ..exchange.agreement import check_connected
    from ..reduce.graphs import graph
    from ..sync import POLICIES
    from ..sync import policy as make_policy

    names = []
    for cfg in runs:
        kind = POLICIES[cfg.sync]
        if not kind.uses_window or hasattr(kind, "topology"):
            names.append(f"{cfg.sync}'s own")      # allreduce, parameter servers, gossip
            continue
        try:
            g = graph(cfg.graph, ranks)
            check_connected(g)
            make_policy(cfg.sync, **cfg.policy_options).validate(g, 0)
        except ConfigError as exc:
            raise ConfigError(f"run {cfg.label!r} on {ranks} ranks: {exc}; choose another "
                              f"--graph or --restart-ranks same") from None
        names.append(cfg.graph)
    return ", ".join(sorted(set(names)))


def run_restarting(args: argparse.Namespace, argv: List[str],
                   runs: List[TrainConfig]) -> int:
    """The launcher's side of --restarts: run the job, and after a failure relaunch it
    from the newest checkpoints (asapmpi.launch.restart.supervise)."""
    from ..launch.ranks import launch_command
    from ..launch.restart import run_watched, supervise
    from .resume_plan import plan_resume

    program = [sys.executable, "-m", "asapmpi", *argv]

    def launch(size: int, env: dict):
        cmd, whole = launch_command(size, program, args.network, args.job_timeout)
        return run_watched(cmd, {**whole, **env})

    def prepare(size: int, failed: List[int]) -> str:
        graphs = check_size(runs, size)
        where = []
        for cfg in runs:
            plan = plan_resume(cfg.checkpoint_root(), size, cfg.keep, failed)
            if plan is None:
                where.append(f"{cfg.label!r} from iteration 0 (no checkpoint)")
            elif plan.iteration < cfg.iters:
                where.append(f"{cfg.label!r} from iteration {plan.iteration}")
        return (f"graph {graphs}; resuming " + ("; ".join(where) or "the finished runs")
                + (" (data re-split over the new size)" if size != args.ranks else ""))

    return supervise("asapmpi train", args.ranks, args.restarts, args.restart_ranks,
                     launch, prepare)


def _torch_trainer():
    try:
        from ..torch import trainer
    except ImportError as exc:
        if "torch" not in str(exc):
            raise
        raise ConfigError("the training demos need PyTorch: pip install 'asapmpi[train]' "
                          "(CPU: pip install torch)") from None
    return trainer


def run(args: argparse.Namespace) -> int:
    """Run every configuration on this job's ranks; rank 0 reports."""
    from mpi4py import MPI

    from ..launch.budget import ClockBudget
    from . import report

    runs = configs(args)
    trainer = _torch_trainer()
    comm = MPI.COMM_WORLD
    results = []
    h5 = args.h5 or os.path.join(args.out, "metrics.h5")
    png = args.png or os.path.join(args.out, "convergence.png")

    def keep(finished) -> None:
        # rank 0, every metric of the run gathered, before the exchange's free(): a rank
        # that dies there still ends the job with an error, but not without the report
        _write_data(args, h5, [*results, finished])

    for cfg in runs:
        # bench training's emulated hosts: each rank's share of its host's CPU quota
        result = trainer.train(cfg, comm, progress=not args.no_progress,
                               clock_budget=ClockBudget.from_environment, before_free=keep)
        if result is not None:
            results.append(result)
            _say_one(result.summary())
    if not results:
        # (rank 0 reports; after a failure survived (--survive), the survivors' rank 0)
        return 0
    summaries = _write_data(args, h5, results)
    report.plot(png, results, f"{args.model}: {metric_of(args.model).title}, "
                              f"{len(results[-1].logs)} ranks")
    print(f"\n{report.table(summaries)}")
    print(f"metrics: {h5}   plot: {png}" + (f"   summary: {args.json}" if args.json else ""))
    sys.stdout.flush()
    return 0


def _write_data(args: argparse.Namespace, h5: str, results: list) -> list:
    """The runs' metrics (HDF5) and, with --json, their summaries; the summaries."""
    from . import report

    summaries = [r.summary() for r in results]
    report.write_h5(h5, results)
    if args.json:
        doc = summaries[0] if len(summaries) == 1 else {"runs": summaries}
        part = f"{args.json}.tmp{os.getpid()}"
        with open(part, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=2)
        os.replace(part, args.json)
    return summaries


def _say_report(s: dict) -> None:
    report = s.get("policy_report")
    if not report or "congested" not in report:
        return
    slow = [i for i, c in enumerate(report["congested"]) if c]
    print(f"{s['label']}: congestion condition (gossip eq. 1) at T={report['period']}: "
          f"{'nodes ' + str(slow) + ' congested' if slow else 'no node congested'}; "
          f"smallest T without congestion (eq. 2): {report['min_period']}; measured "
          f"compute {1e3 * float(np.mean(report['compute_s'])):.2f} ms/iteration, "
          f"communication {', '.join(f'{1e3 * c:.1f}' for c in report['comm_s'])} ms",
          flush=True)


def _say_balance(s: dict) -> None:
    if "batch_sizes" not in s:
        return
    mean = ", ".join(f"{b:.1f}" for b in s["mean_batch_sizes"])
    print(f"{s['label']}: per-rank batch sizes {s['batch_sizes']} at the end (mean "
          f"{mean}; global batch {s['global_batch']}), re-balanced "
          f"{max(s['rebalances'])} times", flush=True)


def _say_survivals(s: dict) -> None:
    for record in s.get("survivals") or ():
        what = (f"the failure of rank(s) {', '.join(str(r) for r in record['failed'])}"
                if record["failed"] else "a missed deadline (no rank failed)")
        print(f"{s['label']}: survived {what} in step "
              f"{record['step']}: went on on {record['size']} ranks, graph "
              f"{record['graph']} (spectral gap {record['spectral_gap']:.3f}), "
              f"{record['seconds']:.2f} s lost; {record.get('note', '')}".rstrip("; "),
              flush=True)


def _say_one(s: dict) -> None:
    _say_report(s)
    _say_balance(s)
    _say_survivals(s)
    reached = "not reached" if s["time_to_target_s"] is None else \
        f"{s['time_to_target_s']:.2f} s"
    m = of_summary(s)
    if not m.higher_is_better:
        print(f"{s['label']}: held-out loss {m.text(s['final_test_loss'])} after "
              f"{s['iterations']} iterations, {s['wall_time_s']:.2f} s, "
              f"{s['bytes_sent_per_rank'] / 1e6:.2f} MB sent per rank; "
              f"target {m.target_text(s['target_loss'])}: {reached}", flush=True)
        return
    print(f"{s['label']}: test accuracy {100 * s['final_test_accuracy']:.2f}% after "
          f"{s['iterations']} iterations, {s['wall_time_s']:.2f} s, "
          f"{s['bytes_sent_per_rank'] / 1e6:.2f} MB sent per rank; "
          f"target {100 * s['target_accuracy']:g}%: {reached}", flush=True)
