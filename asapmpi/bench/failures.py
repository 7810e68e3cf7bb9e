"""`asapmpi bench failures`: training through dead ranks (issue 31).  Final accuracy and
time to target with ranks killed at given iterations, per policy and seed, three ways:

  none      the same run with no rank killed
  survive   the survivors shrink the graph and go on in place (`asapmpi train --survive`:
            ULFM, Open MPI 5 launched with `--with-ft ulfm`)
  restart   the job ends with the failure and is relaunched from its newest checkpoint
            on the ranks left (`--restarts 1 --restart-ranks shrink`: any MPI)

    asapmpi bench failures [-n 8] [--hosts 4] [--workload mlp] [--kill 5@120 ...]
                           [--policies notify_ack,hop:backup=1,gossip] [--seeds 0,1,2]
                           [--ways none,survive,restart | --restarts]
                           [--lost-shards reassign|drop] [--json F] [--keep DIR]

The jobs run on the emulated hosts of `asapmpi bench training` (launch/netns-hosts: rank
r on host r % hosts, links shaped, a CPU budget per host while the training clock
runs), or with --one-host on this host.  `--kill RANK@ITER` (repeatable) kills RANK
(SIGKILL) after iteration ITER; by default rank 5n/8 at 40% of the run.  Where the MPI
has no ULFM the survive rows are left out, and the report says so in one line; the
restart rows are then run instead.

Per (policy, seed) the report gives, for each way: the final accuracy (the mean over the
ranks' replicas at the end, `asapmpi train`'s summary) and its difference from the run
with no failure, the same for the average of the replicas (`--average-at-end`: the
consensus model, which for a policy whose replicas have not come together, gossip in a
short run, says more than the mean of their accuracies), the smoothed time to target (as
`bench training`: the training clock of the last run, which does not count the restart's
relaunch), the ranks at the end, the job's wall seconds (the relaunch included), and the
recovery: survive, from the death (the victim's CLOCK_MONOTONIC line) to the last
survivor's first step on the survivors' exchange, with the most "seconds lost" a
survivor reported; restart, from the death to the relaunch. On emulated hosts every
clock is this machine's. Seconds depend on the machine's load (say it with the figures);
accuracy does not.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..errors import ConfigError
from ..outputs import output_file, output_folder
from ..train.metric import ACCURACY
from .common import publish
from .hosts import add_host_arguments, check_rate, choose_hosts
from .training import WORKLOADS, Workload, _list, smoothed

WAYS = ("none", "survive", "restart")
DEFAULT_POLICIES = "notify_ack,hop:backup=1,gossip"
#: the victim's line (bindings/torch/trainer.die)
DIED = re.compile(r"rank (\d+): fault injection: SIGKILL .*\(CLOCK_MONOTONIC ([\d.]+)\)")
#: a survivor's line (asapmpi.exchange.survive)
LOST = re.compile(r"survived the failure of .*; ([\d.]+) s lost")


def kill_spec(text: str) -> Tuple[int, int]:
    """argparse type of --kill: "5@120" -> (5, 120)."""
    from ..train.cli import kill_spec as parse

    return parse(text)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `asapmpi bench failures`."""
    add_host_arguments(parser, "10gbit")
    parser.add_argument("--workload", default="mlp", choices=sorted(WORKLOADS),
                        help="what each run trains, as `bench training` (default mlp)")
    parser.add_argument("--iters", type=int, help="iterations per run (workload default)")
    parser.add_argument("--eval-every", type=int, metavar="N",
                        help="evaluate every N iterations (default: 5 evaluations a run)")
    parser.add_argument("--policies", default=DEFAULT_POLICIES,
                        help=f"POLICY[@GRAPH][:OPTION=VALUE] runs, one job each (default "
                             f"{DEFAULT_POLICIES})")
    parser.add_argument("--seeds", type=_list(int, "--seeds"), default=[0, 1, 2],
                        help="seeds of the runs (default 0,1,2)")
    parser.add_argument("--kill", action="append", type=kill_spec, default=[],
                        metavar="RANK@ITER",
                        help="kill RANK (SIGKILL) after iteration ITER; repeat for more "
                             "ranks (default: rank 5n/8 at 40%% of the run)")
    parser.add_argument("--ways", type=_list(str, "--ways"), default=["none", "survive"],
                        help=f"of {','.join(WAYS)} (default none,survive; where the MPI "
                             f"has no ULFM, restart instead of survive)")
    parser.add_argument("--restarts", action="store_true",
                        help="the restart path too (adds restart to --ways)")
    parser.add_argument("--checkpoint-every", type=int, metavar="K",
                        help="the restart path's checkpoints (default: every tenth of "
                             "the run)")
    parser.add_argument("--lost-shards", default="reassign", choices=("reassign", "drop"),
                        help="survive: what becomes of a dead rank's data (default "
                             "reassign)")
    parser.add_argument("--timeout", type=float, default=60,
                        help="seconds any wait on a neighbour may take (default 60)")
    parser.add_argument("--job-timeout", type=float, default=1200,
                        help="seconds one job may take (default 1200)")
    parser.add_argument("--json", metavar="FILE", type=output_file, help="the report as JSON")
    parser.add_argument("--keep", metavar="DIR", type=output_folder,
                        help="keep each job's outputs (its log, summary, curves) here")


def workload_of(args: argparse.Namespace) -> Workload:
    """The workload with the command line's overrides; 5 evaluations a run by default,
    so that a kill at 40% falls on an evaluation mark only where asked."""
    w = WORKLOADS[args.workload]
    iters = args.iters if args.iters is not None else w.iters
    every = args.eval_every if args.eval_every is not None else max(1, iters // 5)
    return Workload(**{**w.__dict__, "iters": iters, "eval_every": every})


def check(args: argparse.Namespace, work: Workload) -> List[Tuple[str, str, Dict[str, Any]]]:
    """ConfigError before anything starts; the runs as (label, sync, graph, options).
    Fills in the default kill."""
    from ..launch.ranks import inside_mpi_job
    from ..train.config import parse_run_spec

    if inside_mpi_job():
        raise ConfigError("bench failures launches one job per run itself; run it outside "
                          "mpiexec/srun, with -n for the ranks")
    if args.ranks < 3:
        raise ConfigError(f"-n must be at least 3 (a rank dies, two go on), got {args.ranks}")
    if work.iters < 2:
        raise ConfigError(f"--iters must be at least 2, got {work.iters}")
    if args.eval_every is not None and args.eval_every < 1:
        raise ConfigError(f"--eval-every must be >= 1, got {args.eval_every}")
    if any(s < 0 for s in args.seeds) or len(set(args.seeds)) != len(args.seeds):
        raise ConfigError(f"--seeds must be distinct integers >= 0, got {args.seeds}")
    unknown = [w for w in args.ways if w not in WAYS]
    if unknown:
        raise ConfigError(f"unknown way(s) {unknown} in --ways; choose from {list(WAYS)}")
    if not args.kill:
        args.kill = [(5 * args.ranks // 8, round(0.4 * work.iters))]
    ranks = [r for r, _ in args.kill]
    if len(set(ranks)) != len(ranks):
        raise ConfigError(f"--kill names rank(s) twice: {sorted(ranks)}; a rank dies once")
    for rank, at in args.kill:
        if not 0 <= rank < args.ranks or not 1 <= at < work.iters:
            raise ConfigError(f"--kill {rank}@{at}: the rank must be 0..{args.ranks - 1} "
                              f"and the iteration 1..{work.iters - 1}")
    if len(args.kill) > args.ranks - 2:
        raise ConfigError(f"--kill kills {len(args.kill)} of {args.ranks} ranks; leave at "
                          f"least 2")
    every = args.checkpoint_every or max(1, work.iters // 10)
    if not 1 <= every < work.iters:
        raise ConfigError(f"--checkpoint-every must be 1..{work.iters - 1}, got {every}")
    args.checkpoint_every = every
    for flag in ("timeout", "job_timeout"):
        if not 0 < getattr(args, flag) < float("inf"):
            raise ConfigError(f"--{flag.replace('_', '-')} must be a positive number of "
                              f"seconds")
    if args.host_cores is not None and not args.host_cores > 0:
        raise ConfigError(f"--host-cores must be a positive number of cores, got "
                          f"{args.host_cores:g}")
    args.bandwidth = check_rate("--bandwidth", args.bandwidth)
    if not args.one_host and not 2 <= args.hosts <= args.ranks:
        raise ConfigError(f"--hosts must be 2..{args.ranks} (-n), got {args.hosts}; or "
                          f"pass --one-host")
    runs = []
    for spec in args.policies.split(","):
        sync, graph, options, label = parse_run_spec(spec, "root-expander")
        runs.append((label, sync, graph if "@" in spec.split(":")[0] else None, options))
    labels = [r[0] for r in runs]
    if len(set(labels)) != len(labels):
        raise ConfigError(f"--policies lists a run twice: {args.policies}")
    return runs


def train_argv(args: argparse.Namespace, work: Workload, run, seed: int, way: str,
               out: str) -> List[str]:
    """`asapmpi train ...` of one run of `way` (the arguments after `asapmpi`): the
    workload, its policy, the kills, the outputs under `out`."""
    _, sync, graph, options = run
    argv = ["train", *work.argv(), "--sync", sync, "--seed", str(seed), "--timeout",
            str(args.timeout), "--no-progress", "--out", out,
            "--json", os.path.join(out, "summary.json"),
            "--h5", os.path.join(out, "metrics.h5"), "--average-at-end"]
    if graph:
        argv += ["--graph", graph]
    for key, value in options.items():
        argv += ["--hop", f"{key}={value}"]
    if way != "none":
        argv += [a for r, k in args.kill for a in ("--kill", f"{r}@{k}")]
    if way == "survive":
        argv += ["--survive", "--lost-shards", args.lost_shards]
    if way == "restart":
        argv += ["--checkpoint-every", str(args.checkpoint_every)]
    return argv


def check_runs(args: argparse.Namespace, work: Workload, runs, ways: Sequence[str]) -> None:
    """Each job's `asapmpi train` arguments checked as the job would check them (a
    ConfigError in one line before any job): policy options, --survive's refusals, the
    graph on the ranks at the start and, restarting, on the ranks left."""
    from ..launch import restart
    from ..train import cli as train_cli

    # `asapmpi train`'s own options (asapmpi.cli adds them so; importing asapmpi.cli
    # here would make an import cycle)
    parser = argparse.ArgumentParser(prog="asapmpi train")
    train_cli.add_arguments(parser)
    restart.add_arguments(parser)
    for run in runs:
        for way in ways:
            argv = train_argv(args, work, run, args.seeds[0], way, tempfile.gettempdir())
            try:
                configs = train_cli.configs(parser.parse_args(argv[1:]))
                train_cli.check_size(configs, args.ranks)
                if way == "restart":
                    train_cli.check_size(configs, args.ranks - len(args.kill))
            except ConfigError as exc:
                raise ConfigError(f"--policies {run[0]} ({way}): {exc}") from None


def run_job(args: argparse.Namespace, work: Workload, hosts, run, seed: int, way: str,
            folder: str) -> Dict[str, Any]:
    """One run of `way`: its summary, the deaths, the recovery and the wall seconds."""
    from ..launch.restart import run_watched, supervise

    label = run[0]
    name = f"{label.replace(':', '_').replace('=', '').replace('@', '_')}-s{seed}-{way}"
    out = os.path.join(folder, name)
    os.makedirs(out, exist_ok=True)
    program = [sys.executable, "-m", "asapmpi", *train_argv(args, work, run, seed, way, out)]
    relaunched: List[float] = []
    load = os.getloadavg()[0]
    start = time.monotonic()
    with open(os.path.join(out, "log"), "w") as log:
        def launch(size: int, env: Dict[str, str]):
            if env:
                relaunched.append(time.monotonic())
                print(f"[bench failures] {name}: relaunched on {size} ranks", file=log,
                      flush=True)
            cmd, whole = hosts.command(size, program, args.job_timeout, env,
                                       fault_tolerance=way == "survive")
            return run_watched(cmd, whole, log)

        def prepare(size: int, failed: List[int]) -> str:
            return f"resuming from the newest checkpoint (failed {failed})"

        if way == "restart":
            # the first job's stderr goes to the log; supervise's lines to this stderr
            code = supervise(f"[bench failures] {name}", args.ranks, 1, "shrink", launch,
                             prepare)
        else:
            code, _ = launch(args.ranks, {})
    seconds = time.monotonic() - start
    with open(os.path.join(out, "log"), errors="replace") as f:
        text = f.read()
    died = {int(r): float(t) for r, t in DIED.findall(text)}
    summary = _read_json(os.path.join(out, "summary.json"))
    row = {"label": label, "seed": seed, "way": way, "exit": code, "job": out,
           "job_seconds": seconds, "load_before": load, "load_after": os.getloadavg()[0],
           "died": died, "lost": [float(x) for x in LOST.findall(text)],
           "relaunched": relaunched, "summary": summary}
    row.update(_measures(row, out, work))
    return row


def _read_json(path: str) -> Optional[Dict[str, Any]]:
    try:
        with open(path) as f:
            s = json.load(f)
    except (OSError, ValueError):
        return None
    return s.get("runs", [s])[0] if isinstance(s, dict) else None


def _measures(row: Dict[str, Any], out: str, work: Workload) -> Dict[str, Any]:
    """Final accuracy, time to target (smoothed, as bench training), ranks at the end,
    recovery seconds."""
    s = row["summary"] or {}
    found: Dict[str, Any] = {"accuracy": s.get("final_test_accuracy"),
                             "averaged_accuracy": s.get("averaged_test_accuracy"),
                             "ranks_at_end": s.get("ranks"),
                             "iterations": s.get("iterations"),
                             "time_to_target_s": None, "recovery_s": None}
    try:
        from ..train import report

        result = report.read_h5(os.path.join(out, "metrics.h5"))[0]
        found["time_to_target_s"] = smoothed(result.curve(), work.target, ACCURACY)[
            "smoothed_time_to_target_s"]
    except (OSError, IndexError, KeyError, ValueError, ImportError):
        pass
    death = min(row["died"].values(), default=None)
    if death is None:
        return found
    if row["way"] == "survive":
        # from the first death to the last survivor's first step on the exchange of
        # the survivors of it (a survivor's times: one per failure it went on from)
        firsts = [times[0] for times in s.get("resumed_monotonic") or [] if times]
        if firsts:
            found["recovery_s"] = max(firsts) - death
    elif row["relaunched"]:
        found["recovery_s"] = row["relaunched"][0] - death
    return found


# ---------------------------------------------------------------------- the report

def table(rows: Sequence[Dict[str, Any]], labels: Sequence[str],
          ways: Sequence[str]) -> List[Dict[str, Any]]:
    """Per (policy, seed, way): the measures, and the accuracy against no failure."""
    out = []
    for label in labels:
        for seed in sorted({r["seed"] for r in rows}):
            mine = {r["way"]: r for r in rows if r["label"] == label and r["seed"] == seed}
            base = mine.get("none", {}).get("accuracy")
            base_avg = mine.get("none", {}).get("averaged_accuracy")
            for way in ways:
                r = mine.get(way)
                if r is None:
                    continue
                acc, avg = r["accuracy"], r.get("averaged_accuracy")
                out.append({"policy": label, "seed": seed, "way": way, "exit": r["exit"],
                            "accuracy": acc,
                            "diff_points": None if acc is None or base is None
                            else 100 * (acc - base),
                            "averaged_accuracy": avg,
                            "averaged_diff_points": None if avg is None or base_avg is None
                            else 100 * (avg - base_avg),
                            "time_to_target_s": r["time_to_target_s"],
                            "ranks_at_end": r["ranks_at_end"],
                            "iterations": r["iterations"],
                            "recovery_s": r["recovery_s"],
                            "seconds_lost_max": max(r["lost"], default=None),
                            "job_seconds": r["job_seconds"],
                            "load": [r["load_before"], r["load_after"]]})
    return out


def _f(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def format_report(report: Dict[str, Any]) -> str:
    """The text the benchmark prints."""
    w = report["workload"]
    kills = ", ".join(f"rank {r} after iteration {k}" for r, k in report["kills"])
    lines = [f"failures benchmark: {report['ranks']} ranks on {report['hosts_text']}; "
             f"{w['about']}, {w['iters']} iterations evaluated every {w['eval_every']}, "
             f"target {100 * w['target']:.1f}%; killed: {kills}; MPI: {report['mpi']}"]
    if report.get("note"):
        lines.append(report["note"])
    head = ("policy", "seed", "way", "acc %", "vs none", "avg model %", "vs none",
            "to target s", "ranks", "recovery s", "lost s", "job s", "exit", "load")
    cells = [head]
    for t in report["table"]:
        avg = t.get("averaged_accuracy")
        cells.append((t["policy"], str(t["seed"]), t["way"],
                      _f(None if t["accuracy"] is None else 100 * t["accuracy"], ".2f"),
                      _f(t["diff_points"], "+.2f"),
                      _f(None if avg is None else 100 * avg, ".2f"),
                      _f(t.get("averaged_diff_points"), "+.2f"),
                      _f(t["time_to_target_s"], ".1f"),
                      _f(t["ranks_at_end"], "d"), _f(t["recovery_s"], ".2f"),
                      _f(t["seconds_lost_max"], ".2f"), f"{t['job_seconds']:.0f}",
                      str(t["exit"]), f"{t['load'][0]:.1f}-{t['load'][1]:.1f}"))
    widths = [max(len(c[i]) for c in cells) for i in range(len(head))]
    text = ["  ".join(c.ljust(wd) for c, wd in zip(row, widths)) for row in cells]
    text.insert(1, "  ".join("-" * wd for wd in widths))
    lines += ["", *text]
    lines += ["", "acc %: the mean of the replicas' accuracies at the end; avg model %: "
                  "the accuracy of their average (--average-at-end).",
              "recovery s: survive, from the death to the last survivor's first step "
                  "on the survivors' exchange; restart, from the death to the relaunch. "
                  "Seconds depend on the load (the last column), accuracy does not."]
    return "\n".join(lines)


def _say(text: str) -> None:
    print(f"[bench failures] {text}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    """Check, set up the hosts, run every job, report."""
    from ..launch.ranks import find_mpiexec
    from ..launchers import ulfm_refusal

    work = workload_of(args)
    runs = check(args, work)
    mpiexec = find_mpiexec()
    why = ulfm_refusal(mpiexec)
    wanted = set(args.ways) | ({"restart"} if args.restarts else set())
    note = ""
    if why and "survive" in wanted:
        note = f"no survive-in-place runs, the restart path only: {why}"
        wanted = (wanted - {"survive"}) | {"restart"}
    ways = [w for w in WAYS if w in wanted]
    check_runs(args, work, runs, ways)
    if note:
        _say(note)
    hosts, _ = choose_hosts(args, _say)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    rows = []
    with tempfile.TemporaryDirectory(prefix="asapmpi-bench-failures-") as tmp:
        folder = args.keep or tmp
        os.makedirs(folder, exist_ok=True)
        with hosts:
            if hosts.budgeted:
                hosts.budget({})
            for seed in args.seeds:
                for run in runs:
                    for way in ways:
                        row = run_job(args, work, hosts, run, seed, way, folder)
                        rows.append(row)
                        _say(f"{run[0]} seed {seed} {way}: exit {row['exit']}, accuracy "
                             f"{_f(row['accuracy'], '.4f')}, ranks {row['ranks_at_end']}, "
                             f"recovery {_f(row['recovery_s'], '.2f')} s, "
                             f"{row['job_seconds']:.0f} s, load {row['load_before']:.1f}")
            hosts_text = hosts.describe()
    if not args.keep:
        for row in rows:
            del row["job"], row["summary"]      # in a temporary folder, gone
    report = {"ranks": args.ranks, "hosts": hosts.hosts, "emulated": hosts.emulated,
              "hosts_text": hosts_text, "workload": dict(work.__dict__),
              "kills": [list(k) for k in args.kill], "mpi": mpiexec, "ulfm": not why,
              "note": note, "ways": ways, "policies": [r[0] for r in runs],
              "seeds": args.seeds, "checkpoint_every": args.checkpoint_every,
              "lost_shards": args.lost_shards, "table": table(rows, [r[0] for r in runs],
                                                             ways),
              "runs": rows}
    publish(report, format_report(report), args.json)
    return 0
