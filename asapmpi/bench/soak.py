"""`asapmpi bench soak`: does a long run stay flat?  Resident memory per rank, file
descriptors, /dev/shm and step time over many steps, one job per policy.

    asapmpi bench soak -n 4 [--runs notify_ack,hop:backup=1,...] [--steps 100000]
                       [--seconds S] [--size 64K] [--trace ring|off|file] [--samples 40]
                       [--json FILE] [--png FILE]

RUN = POLICY[@GRAPH][:OPTION=VALUE...] as in `asapmpi train --compare`.  Each run is
its own mpiexec job (asapmpi.bench.soak_job), so no run inherits another's memory.
Growth is measured after a warm-up (the first WARMUP_FRACTION of the steps, at least
rc.trace_iterations steps when traces are kept in memory, so that the trace rings are
full): the slope of a least-squares line through each rank's resident memory over the
steps, in MB per 100,000 steps, and the largest over the ranks, after taking out a
single rise between two samples that stands out (more than 3x the median change): a
pool that grows once is not growth (MPICH grows one of its own by exactly 2 MB at a
random moment of the first seconds of an async run on messages, after the warm-up of a
fast run), while memory that keeps growing shows in every interval, or in every pool
chunk after the first.  The plain slope is reported too.  Target: under
GROWTH_TARGET_MB.  Also reported: descriptors and asapmpi files in /dev/shm before and
after (equal, 0 after free), /dev/shm bytes, and the median step time at the start and
at the end of the run.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from typing import Any, Dict, List

import numpy as np

from ..errors import ConfigError
from ..outputs import output_file
from ..rc import rc
from .common import parse_sizes, publish

DEFAULT_RUNS = ("notify_ack,hop:backup=1,hop:staleness=3,hop:backup=1:skip_trigger=1,"
                "bsp,async,gossip:every=2")
TRACE_MODES = ("ring", "off", "file")
WARMUP_FRACTION = 0.2
GROWTH_TARGET_MB = 1.0       # per 100,000 steps per rank
PER = 100_000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `asapmpi bench soak`."""
    parser.add_argument("-n", "--ranks", type=int, default=4, help="ranks (default 4)")
    parser.add_argument("--runs", default=DEFAULT_RUNS,
                        help="comma-separated POLICY[@GRAPH][:OPTION=VALUE...] "
                             f"(default {DEFAULT_RUNS})")
    parser.add_argument("--graph", default="root-expander",
                        help="graph of runs that name none (default root-expander)")
    parser.add_argument("--steps", type=int, default=PER,
                        help=f"steps per run (default {PER})")
    parser.add_argument("--seconds", type=float, default=0.0,
                        help="stop a run after this long too (0: no time limit)")
    parser.add_argument("--size", default="64K", help="bytes exchanged (default 64K)")
    parser.add_argument("--trace", default="ring", choices=TRACE_MODES,
                        help="traces kept in memory at the default bound (ring), one "
                             "iteration only (off), or streamed to a file (file)")
    parser.add_argument("--samples", type=int, default=40, help="samples per run")
    parser.add_argument("--network", nargs="?", const="tcp", choices=("tcp", "ucx"),
                        help="the MPI's forced network path (TCP on loopback; ucx: Open "
                             "MPI's UCX over TCP)")
    parser.add_argument("--job-timeout", type=float, default=1800,
                        help="seconds one run may take before mpiexec ends it")
    parser.add_argument("--json", metavar="FILE", type=output_file,
                        help="write the report as JSON")
    parser.add_argument("--png", metavar="FILE", type=output_file,
                        help="plot resident memory over steps")


def check(args: argparse.Namespace) -> List[Dict[str, Any]]:
    """The runs, every option checked before any job starts (ConfigError)."""
    from ..reduce.graphs import GRAPHS
    from ..sync import policy as make_policy
    from ..train.config import parse_run_spec

    if args.ranks < 2:
        raise ConfigError(f"-n must be at least 2, got {args.ranks}")
    from ..launch.ranks import inside_mpi_job

    if inside_mpi_job():
        raise ConfigError("bench soak launches one job per run itself; run it outside "
                          "mpiexec/srun, with -n for the ranks")
    if args.steps < 1 or args.samples < 2 or not 0 <= args.seconds < float("inf"):
        raise ConfigError("--steps must be >= 1, --samples >= 2 and --seconds >= 0")
    if not 0 < args.job_timeout < float("inf"):
        raise ConfigError(f"--job-timeout must be a positive number of seconds, got "
                          f"{args.job_timeout}")
    if args.graph not in GRAPHS:
        raise ConfigError(f"unknown graph {args.graph!r}; choose one of {sorted(GRAPHS)}")
    try:
        (size,) = parse_sizes(args.size)
    except (argparse.ArgumentTypeError, ValueError) as exc:
        raise ConfigError(f"--size: {exc}") from None
    runs = []
    for text in args.runs.split(","):
        sync, graph, options, label = parse_run_spec(text, args.graph)
        make_policy(sync, **options)            # option names and values
        if sync == "allreduce":
            raise ConfigError("allreduce exchanges no slots; leave it out of --runs")
        runs.append({"label": label, "sync": sync, "graph": graph, "options": options,
                     "size": size, "steps": args.steps, "seconds": args.seconds,
                     "samples": args.samples, "trace": args.trace})
    return runs


def run_jobs(args: argparse.Namespace, runs: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """One mpiexec job per run; their results in order."""
    from ..launch.ranks import run_job

    results = []
    with tempfile.TemporaryDirectory(prefix="asapmpi-bench-soak-") as tmp:
        for i, spec in enumerate(runs):
            print(f"[asapmpi bench soak] {spec['label']}: {args.ranks} ranks, "
                  f"{spec['steps']} steps", file=sys.stderr, flush=True)
            results.append(run_job("asapmpi.bench.soak_job", args.ranks,
                                   dict(spec, folder=tmp), os.path.join(tmp, f"run{i}.json"),
                                   f"the soak of {spec['label']}", network=args.network,
                                   timeout=args.job_timeout))
    return results


def growth(rows: np.ndarray, warmup_steps: int) -> Dict[str, float]:
    """Resident-memory growth of one rank after the warm-up: least-squares slope (MB
    per 100,000 steps) with one outstanding rise taken out (module docstring), the
    plain slope, and the change from the first to the last sample after it."""
    after = rows[rows[:, 0] >= warmup_steps]
    if len(after) < 2:
        after = rows[-2:]
    steps, rss = after[:, 0], after[:, 2] / 2**20
    raw = float(np.polyfit(steps, rss, 1)[0]) if np.ptp(steps) > 0 else 0.0
    steady = rss
    rises = np.diff(rss)
    if len(rises) >= 3:
        top = int(np.argmax(rises))
        if rises[top] > 3 * np.median(np.abs(rises)):
            # one rise that stands out: a pool filled once; the rest of the run decides
            steady = rss - np.where(np.arange(len(rss)) > top, rises[top], 0.0)
    slope = float(np.polyfit(steps, steady, 1)[0]) if np.ptp(steps) > 0 else 0.0
    return {"slope_mb_per_100k": slope * PER, "raw_slope_mb_per_100k": raw * PER,
            "delta_mb": float(rss[-1] - rss[0]),
            "rss_start_mb": float(rss[0]), "rss_end_mb": float(rss[-1])}


def analyze(results: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Per run: growth per rank and its worst, descriptors, /dev/shm, step times, and
    the verdict against GROWTH_TARGET_MB."""
    rows_out = []
    for r in results:
        spec = r["spec"]
        warmup = int(WARMUP_FRACTION * r["steps"])
        if spec["trace"] != "off":      # the ring is filled in both ring and file modes
            warmup = max(warmup, min(rc.trace_iterations, r["steps"] // 2))
        per_rank = [np.asarray(p, dtype=float) for p in r["per_rank"]]
        g = [growth(p, warmup) for p in per_rank]
        worst = max(g, key=lambda x: x["slope_mb_per_100k"])
        first_step = float(np.median([p[0, 4] for p in per_rank]))
        last_step = float(np.median([p[-1, 4] for p in per_rank]))
        shm = r["shm"]
        row = {"label": spec["label"], "transport": r["transport"], "ranks": r["ranks"],
               "steps": r["steps"], "steps_per_s": r["steps"] / r["seconds"],
               "warmup_steps": warmup, "growth": g,
               "worst_slope_mb_per_100k": worst["slope_mb_per_100k"],
               "worst_delta_mb": max(x["delta_mb"] for x in g),
               "rss_mb": [worst["rss_start_mb"], worst["rss_end_mb"]],
               "fds": [int(per_rank[0][0, 3]), int(per_rank[0][-1, 3]),
                       int(r["after_free"][0]["fds"])],
               "shm_asapmpi_files": [shm[0]["asapmpi_files"], shm[-1]["asapmpi_files"],
                                     r["after_free"][0]["shm"]["asapmpi_files"]],
               "shm_mb": [shm[0]["bytes"] / 2**20, shm[-1]["bytes"] / 2**20],
               "step_us": [first_step * 1e6, last_step * 1e6],
               "trace_file": r.get("trace_file")}
        row["verdict"] = "PASS" if row["worst_slope_mb_per_100k"] < GROWTH_TARGET_MB \
            else "FAIL"
        rows_out.append(row)
    return {"runs": rows_out, "target_mb_per_100k": GROWTH_TARGET_MB,
            "raw": results}


def format_report(report: Dict[str, Any]) -> str:
    """The table printed at the end."""
    runs = report["runs"]
    if not runs:
        return "no runs"
    spec = report["raw"][0]["spec"]
    lines = [f"soak: {runs[0]['ranks']} ranks, {spec['size']} bytes, traces: "
             f"{spec['trace']}, {report['raw'][0]['path']}; growth = slope of resident "
             f"memory after the warm-up, worst rank (target < "
             f"{report['target_mb_per_100k']:g} MB per 100k steps)", "",
             f"{'run':34s} {'steps':>8s} {'steps/s':>8s} {'RSS MB':>13s} "
             f"{'MB/100k':>8s} {'fds':>11s} {'shm files':>10s} {'step us':>13s} verdict"]
    for r in runs:
        lines.append(
            f"{r['label']:34s} {r['steps']:8d} {r['steps_per_s']:8.0f} "
            f"{r['rss_mb'][0]:6.1f}>{r['rss_mb'][1]:6.1f} "
            f"{r['worst_slope_mb_per_100k']:8.3f} "
            f"{'/'.join(map(str, r['fds'])):>11s} "
            f"{'/'.join(map(str, r['shm_asapmpi_files'])):>10s} "
            f"{r['step_us'][0]:6.0f}>{r['step_us'][1]:6.0f} {r['verdict']}")
    lines.append("")
    lines.append("fds and shm files: at the first sample / the last / after free()")
    return "\n".join(lines)


def draw(report: Dict[str, Any], png: str) -> None:
    """Resident memory of the worst rank over steps, one line per run."""
    from ..plot.lines import line_chart

    series = {}
    for r, raw in zip(report["runs"], report["raw"]):
        rows = [np.asarray(p, dtype=float) for p in raw["per_rank"]]
        worst = max(range(len(rows)),
                    key=lambda i: r["growth"][i]["slope_mb_per_100k"])
        series[r["label"]] = (rows[worst][:, 0], rows[worst][:, 2] / 2**20)
    line_chart(series, png, title="resident memory of the fastest-growing rank",
               xlabel="steps", ylabel="MB")


def run(args: argparse.Namespace) -> int:
    """Measure every run, print the table, write --json and --png; 1 if a run grew."""
    runs = check(args)
    report = analyze(run_jobs(args, runs))
    publish(report, format_report(report), args.json, args.png, draw)
    return 0 if all(r["verdict"] == "PASS" for r in report["runs"]) else 1
