"""Straggler benchmark (Hop section 7.3): iteration throughput of Hop's settings under
random and deterministic slowdown, at this machine's scale.

    asapmpi bench stragglers -n 8 [--graph ring-based] [--iters 120] [--compute-ms 4]
                             [--json FILE] [--trace-dir DIR] [--network]

Every rank repeats: a compute phase of --compute-ms milliseconds (a sleep, so that
oversubscribed ranks do not compete for the cores), slowed as the configuration says,
then one Hop step; until it has reached --iters iterations.  Configurations:

  none/standard          no slowdown (the baseline iteration time)
  random6x/standard      each iteration, each worker 6x slower with probability 1/n
  random6x/backup1       ... with one backup worker
  random6x/staleness5    ... with staleness bound 5 (Hop eq. (2) weights)
  det4x/standard         rank 0 always 4x slower
  det4x/backup1          ... with one backup worker
  det4x/backup1-skip2    ... and skipping iterations, jumps of at most 2
  det4x/backup1-skip10   ... and skipping iterations, jumps of at most 10

All use the same token bound max_gap (--max-gap, default 5).  Reported per
configuration: iterations per second (median over ranks of iterations reached /
time), the mean iteration time, the speedup over the standard setting under the same
slowdown, the slowdown of the iteration time against the no-slowdown baseline (Hop
reports 3.9x for one 4x-slower worker, about 1.1x with skipping), the jumps taken and the
trace check (Hop Theorem 2 / Table 1 bounds and reduce windows: 0 violations expected).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

import numpy as np

from .. import trace
from ..errors import ConfigError
from ..launch.slowdown import Slowdown
from ..outputs import output_file, output_folder
from ..reduce.graphs import GRAPHS
from .common import rma_path

if TYPE_CHECKING:
    from mpi4py import MPI

# MPI and the exchange are imported where the benchmark runs: `asapmpi --help` imports
# this module and must start no MPI


def configurations(n: int, max_gap: int, seed: int) -> Dict[str, Dict[str, Any]]:
    """name -> (hop options, slowdown), Hop's experiments."""
    random6 = Slowdown("random", factor=6.0, probability=1.0 / n, seed=seed)
    det4 = Slowdown("deterministic", factor=4.0, ranks=(0,), seed=seed)
    backup = {"max_gap": max_gap, "backup": 1}
    return {
        "none/standard": ({"max_gap": max_gap}, Slowdown()),
        "random6x/standard": ({"max_gap": max_gap}, random6),
        "random6x/backup1": (backup, random6),
        "random6x/staleness5": ({"max_gap": max_gap, "staleness": 5}, random6),
        "det4x/standard": ({"max_gap": max_gap}, det4),
        "det4x/backup1": (backup, det4),
        "det4x/backup1-skip2": (dict(backup, skip_trigger=1, max_jump=2), det4),
        "det4x/backup1-skip10": (dict(backup, skip_trigger=1, max_jump=10), det4),
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `asapmpi bench stragglers`."""
    parser.add_argument("--graph", default="ring-based", choices=sorted(GRAPHS))
    parser.add_argument("--iters", type=int, default=120, help="iterations to reach")
    parser.add_argument("--compute-ms", type=float, default=4.0,
                        help="compute phase per iteration, ms (default 4)")
    parser.add_argument("--size", type=int, default=16384,
                        help="float32 elements exchanged (default 16384)")
    parser.add_argument("--max-gap", type=int, default=5, help="token bound (default 5)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", help="comma-separated configuration names to run")
    parser.add_argument("--json", metavar="FILE", type=output_file)
    parser.add_argument("--trace-dir", metavar="DIR", type=output_folder,
                        help="save every run's trace here")


def run_one(comm: MPI.Comm, options: Dict[str, Any], slow: Slowdown,
            args: argparse.Namespace, trace_path: Optional[str]) -> Dict[str, Any]:
    """One configuration on every rank; rank 0 gets the summary."""
    from ..exchange import Exchange

    rank = comm.Get_rank()
    buf = np.zeros(args.size, dtype=np.float32)
    with Exchange(buf, graph=args.graph, sync="hop", comm=comm, timeout=120,
                  **options) as ex:
        steps = 0
        comm.Barrier()
        t0 = time.perf_counter()
        while ex.version < args.iters:
            slow.compute(rank, ex.version + 1, args.compute_ms * 1e-3)
            ex.step()
            steps += 1
        elapsed = time.perf_counter() - t0
        reached, jumps = ex.version, ex._policy.jumps
        policy, graph = ex._policy, ex.graph
        tr = ex.trace
        if trace_path:
            trace.save(trace_path, ex, comm, configuration=os.path.basename(trace_path))
        comm.Barrier()
    rows = comm.gather({"elapsed": elapsed, "reached": reached, "steps": steps,
                        "jumps": jumps, "trace": tr}, root=0)
    if rank != 0:
        return {}
    bounds = trace.gap_bounds(graph, policy.setting, policy.max_gap, policy.staleness or 0)
    traces = [r["trace"] for r in rows]
    violations = (trace.check_gaps(traces, bounds)
                  + trace.window_violations(traces, policy.setting, policy.staleness))
    rates = [r["reached"] / r["elapsed"] for r in rows]
    return {"options": options, "slowdown": slow.kind,
            "iterations_per_second": float(np.median(rates)),
            "iteration_ms": float(1e3 * np.mean([r["elapsed"] / r["reached"] for r in rows])),
            "steps_per_rank": [r["steps"] for r in rows],
            "jumps": int(sum(r["jumps"] for r in rows)),
            "trace_violations": len(violations)}


def summarize(results: Dict[str, Dict[str, Any]]) -> None:
    """Add speedups against the standard setting and slowdowns against no slowdown."""
    base = results.get("none/standard", {}).get("iteration_ms")
    for name, r in results.items():
        family = name.split("/")[0]
        standard = results.get(f"{family}/standard")
        if standard:
            r["speedup_vs_standard"] = r["iterations_per_second"] / \
                standard["iterations_per_second"]
        if base:
            r["iteration_time_vs_no_slowdown"] = r["iteration_ms"] / base


def format_report(env: Dict[str, Any], results: Dict[str, Dict[str, Any]]) -> str:
    """The table rank 0 prints."""
    lines = [f"stragglers benchmark: {env['ranks']} ranks, graph {env['graph']}, "
             f"{env['iters']} iterations, compute {env['compute_ms']:g} ms per iteration, "
             f"max_gap {env['max_gap']}, path {env['path']}", "",
             f"{'configuration':24s} {'iter/s':>8s} {'iter ms':>8s} {'vs standard':>12s} "
             f"{'vs no slowdown':>15s} {'jumps':>6s} {'trace':>6s}"]
    for name, r in results.items():
        vs_std = r.get("speedup_vs_standard")
        vs_none = r.get("iteration_time_vs_no_slowdown")
        lines.append(f"{name:24s} {r['iterations_per_second']:8.1f} {r['iteration_ms']:8.2f} "
                     f"{(f'{vs_std:.2f}x' if vs_std else '-'):>12s} "
                     f"{(f'{vs_none:.2f}x' if vs_none else '-'):>15s} {r['jumps']:6d} "
                     f"{'OK' if r['trace_violations'] == 0 else 'FAIL':>6s}")
    return "\n".join(lines)


def check(args: argparse.Namespace, n: int) -> Tuple[Dict[str, Any], List[str]]:
    """The configurations and the names to run on `n` ranks, or ConfigError in one line:
    before any rank starts (the command line) and on every rank alike."""
    from ..sync import policy

    if n < 2:
        raise ConfigError("the stragglers benchmark needs at least 2 ranks (-n)")
    if args.iters < 1 or args.compute_ms < 0 or args.size < 1:
        raise ConfigError("--iters and --size must be positive, --compute-ms >= 0")
    configs = configurations(n, args.max_gap, args.seed)
    names = list(configs) if not args.only else [c.strip() for c in args.only.split(",")]
    unknown = [c for c in names if c not in configs]
    if unknown:
        raise ConfigError(f"unknown configuration(s) {unknown}; choose from {list(configs)}")
    for name in names:
        policy("hop", **configs[name][0])      # Hop's own checks of its options
    return configs, names


def run(args: argparse.Namespace, comm: Optional[MPI.Comm] = None) -> int:
    """Run every configuration on every rank of `comm` (default COMM_WORLD); rank 0
    prints and writes --json."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD if comm is None else comm
    n = comm.Get_size()
    configs, names = check(args, n)
    if args.trace_dir and comm.Get_rank() == 0:
        os.makedirs(args.trace_dir, exist_ok=True)
    results: Dict[str, Dict[str, Any]] = {}
    for name in names:
        options, slow = configs[name]
        path = (os.path.join(args.trace_dir, name.replace("/", "_") + ".h5")
                if args.trace_dir else None)
        results[name] = run_one(comm, options, slow, args, path)
    if comm.Get_rank() != 0:
        return 0
    summarize(results)
    env = {"ranks": n, "graph": args.graph, "iters": args.iters,
           "compute_ms": args.compute_ms, "max_gap": args.max_gap, "size": args.size,
           "path": rma_path()}
    print(format_report(env, results), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"environment": env, "configurations": results}, f, indent=1)
    return 0 if all(r["trace_violations"] == 0 for r in results.values()) else 1


def main(argv: Optional[List[str]] = None) -> int:
    """`mpiexec -n N python -m asapmpi.bench.stragglers ...`"""
    parser = argparse.ArgumentParser(prog="asapmpi bench stragglers", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
