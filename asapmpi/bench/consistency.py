"""Consistency benchmark (ASAP Figure 8): how many inputs of each reduce are the current,
whole version, per synchronization policy, and at what throughput.

    asapmpi bench consistency -n 8 --graph complete --sync bsp,async,notify_ack \
        --size 1M --iters 1250 [--network] [--json F] [--png F] [--h5 F]

Every rank runs `iters` iterations of: a simulated compute phase (the buffer is refilled
with this rank's value for the iteration, then the rank sleeps a random time of up to
--jitter-us microseconds, seeded per rank, so writers and readers overlap as they do in
training), then Exchange.step().  After each step the status of every input of the
reduce is recorded: consistent (the whole current version), torn (a read that overlapped
a write, or a failed check), stale (a whole older version, 0 = never written) or ahead (a
whole newer version).  Two distributions are reported per policy: inputs per reduce that
were *whole* (not torn, ever written: what ASAP Figure 8 counts as "correct buffers") and
inputs that were the *current* version (consistent: the stronger property).  bsp and
notify_ack reduce only current inputs; async reduces every whole version.  Throughput
is reduces per second per rank over the timed loop.  What is measured is what is
printed; nothing is tuned per policy.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

import numpy as np

from ..outputs import output_file
from ..reduce.graphs import GRAPHS
from .common import parse_sizes, rma_path

if TYPE_CHECKING:
    from mpi4py import MPI

# MPI, the exchange and the window's status codes are imported where the benchmark runs:
# `asapmpi --help` imports this module and must start no MPI
DEFAULT_POLICIES = "bsp,async,notify_ack"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `asapmpi bench consistency`."""
    parser.add_argument("--graph", default="complete", choices=sorted(GRAPHS))
    parser.add_argument("--sync", default=DEFAULT_POLICIES,
                        help=f"comma-separated policies (default {DEFAULT_POLICIES})")
    parser.add_argument("--size", default="1M", help="bytes per buffer (default 1M)")
    parser.add_argument("--iters", type=int, default=1000, help="iterations per rank")
    parser.add_argument("--jitter-us", type=float, default=200.0,
                        help="largest random compute delay per iteration, us (default 200)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds a wait on a neighbour may take")
    parser.add_argument("--checksum", action="store_true", help="checksum every payload")
    parser.add_argument("--json", metavar="FILE", type=output_file,
                        help="write the summary as JSON")
    parser.add_argument("--png", metavar="FILE", type=output_file,
                        help="draw the distribution as a bar chart")
    parser.add_argument("--h5", metavar="FILE", type=output_file,
                        help="write per-rank records to HDF5")


def run_policy(comm: MPI.Comm, sync: str, args: argparse.Namespace,
               nbytes: int) -> Dict[str, Any]:
    """Run one policy on every rank; return this rank's records."""
    from ..exchange import Exchange

    rng = np.random.default_rng([args.seed, comm.rank, len(sync)])
    delays = rng.uniform(0, args.jitter_us * 1e-6, args.iters)
    buf = np.zeros(nbytes // 4, dtype=np.float32)
    with Exchange(buf, graph=args.graph, sync=sync, comm=comm, timeout=args.timeout,
                  checksum=args.checksum) as ex:
        win = ex.window
        status = np.zeros((args.iters, len(ex.in_neighbours)), dtype=np.int8)
        versions = np.zeros((args.iters, len(ex.in_neighbours)), dtype=np.int64)
        seconds = np.zeros(args.iters)
        comm.Barrier()
        start = time.perf_counter()
        for k in range(args.iters):
            buf.fill(comm.rank * 1e6 + k)     # the "compute": writes the whole buffer
            time.sleep(delays[k])
            t0 = time.perf_counter()
            ex.step()
            seconds[k] = time.perf_counter() - t0
            status[k] = win.last_status()
            versions[k] = win.last_versions     # version of each untorn input read
        elapsed = time.perf_counter() - start
        comm.Barrier()   # nobody frees its window while a neighbour may still write to it
        in_neighbours = list(ex.in_neighbours)
    return {"status": status, "versions": versions, "step_seconds": seconds,
            "elapsed": elapsed, "in_neighbours": in_neighbours}


def least(degree: int) -> int:
    """The "at least" column: d - 2 inputs (ASAP Figure 8 reports 5 or more of 7), at
    least 1."""
    return max(degree - 2, 1)


def summarize(records: List[Dict[str, Any]], iters: int) -> Dict[str, Any]:
    """Distribution of consistent inputs per reduce, status totals and throughput."""
    # STATUS: consistent, torn, stale, ahead
    from .._core import CONSISTENT, TORN
    from .._core import STATUS_NAMES as STATUS

    degree = max(len(r["in_neighbours"]) for r in records)
    current = np.zeros(degree + 1, dtype=np.int64)
    whole = np.zeros(degree + 1, dtype=np.int64)
    totals = np.zeros(len(STATUS), dtype=np.int64)
    for r in records:
        status = r["status"]
        current += np.bincount((status == CONSISTENT).sum(axis=1), minlength=degree + 1)
        ok = (status != TORN) & (r["versions"] > 0)
        whole += np.bincount(ok.sum(axis=1), minlength=degree + 1)
        totals += np.bincount(status.ravel(), minlength=len(STATUS))
    reduces = int(current.sum())
    percent = (100.0 * current / max(reduces, 1)).tolist()
    whole_percent = (100.0 * whole / max(reduces, 1)).tolist()
    low = least(degree)
    return {
        "in_degree": degree,
        "reduces": reduces,
        "distribution_percent": percent,
        "whole_distribution_percent": whole_percent,
        "all_consistent_percent": percent[degree],
        "at_least_percent": float(sum(percent[low:])),
        "whole_all_percent": whole_percent[degree],
        "whole_at_least_percent": float(sum(whole_percent[low:])),
        "inputs": dict(zip(STATUS, map(int, totals))),
        "reduces_per_second_per_rank": float(np.median([iters / r["elapsed"]
                                                        for r in records])),
        "median_step_ms": float(1e3 * np.median(np.concatenate(
            [r["step_seconds"] for r in records]))),
    }


def format_report(env: Dict[str, Any], results: Dict[str, Dict[str, Any]]) -> str:
    """The human-readable table."""
    d = max(r["in_degree"] for r in results.values())
    lines = [f"consistency benchmark: {env['ranks']} ranks, graph {env['graph']} (in-degree "
             f"{d}), {env['size_bytes']} bytes float32, {env['iters']} iterations per rank, "
             f"compute jitter <= {env['jitter_us']:g} us, path {env['path']}",
             "",
             f"{'':24s} {'':8s} {'whole inputs':>19s} {'current inputs':>19s}",
             f"{'policy':24s} {'reduces':>8s} {'all ' + str(d):>9s} "
             f"{'>=' + str(least(d)) + ' of ' + str(d):>9s} {'all ' + str(d):>9s} "
             f"{'>=' + str(least(d)) + ' of ' + str(d):>9s} {'torn':>7s} {'stale':>7s} "
             f"{'ahead':>7s} {'reduces/s':>10s} {'step ms':>8s}"]
    for name, r in results.items():
        i = r["inputs"]
        lines.append(f"{name:24s} {r['reduces']:8d} {r['whole_all_percent']:8.1f}% "
                     f"{r['whole_at_least_percent']:8.1f}% "
                     f"{r['all_consistent_percent']:8.1f}% "
                     f"{r['at_least_percent']:8.1f}% {i['torn']:7d} {i['stale']:7d} "
                     f"{i['ahead']:7d} {r['reduces_per_second_per_rank']:10.1f} "
                     f"{r['median_step_ms']:8.3f}")
    for key, title in (("whole_distribution_percent", "whole (untorn) inputs per reduce, "
                        "% of reduces (ASAP Figure 8's measure):"),
                       ("distribution_percent", "current-version inputs per reduce, "
                        "% of reduces:")):
        lines += ["", title, f"{'policy':24s} " + " ".join(f"{c:>6d}" for c in range(d + 1))]
        for name, r in results.items():
            lines.append(f"{name:24s} " + " ".join(f"{p:6.1f}" for p in r[key]))
    return "\n".join(lines)


def write_h5(path: str, env: Dict[str, Any], per_policy: Dict[str, List[Dict[str, Any]]]):
    """Per-rank records: /<policy>/status [rank, iteration, input] (0 consistent, 1 torn,
    2 stale, 3 ahead), versions (the version of each untorn input read, 0 for torn or
    never written), step_seconds [rank, iteration], in_neighbours (padded with -1) and
    elapsed seconds per rank."""
    import h5py

    from .._core import STATUS_NAMES as STATUS

    with h5py.File(path, "w") as f:
        for key, value in env.items():
            f.attrs[key] = value
        f.attrs["status_codes"] = ",".join(STATUS)
        for name, records in per_policy.items():
            g = f.create_group(name)
            degree = max(len(r["in_neighbours"]) for r in records)
            status = np.full((len(records), env["iters"], degree), -1, dtype=np.int8)
            nbrs = np.full((len(records), degree), -1, dtype=np.int32)
            for rank, r in enumerate(records):
                status[rank, :, :r["status"].shape[1]] = r["status"]
                nbrs[rank, :len(r["in_neighbours"])] = r["in_neighbours"]
            g.create_dataset("status", data=status, compression="gzip")
            versions = np.zeros(status.shape, dtype=np.int64)
            for rank, r in enumerate(records):
                versions[rank, :, :r["versions"].shape[1]] = r["versions"]
            g.create_dataset("versions", data=versions, compression="gzip")
            g.create_dataset("step_seconds", data=np.stack([r["step_seconds"] for r in records]))
            g.create_dataset("in_neighbours", data=nbrs)
            g.create_dataset("elapsed_seconds", data=[r["elapsed"] for r in records])


def check(args: argparse.Namespace, ranks: int) -> Tuple[List[str], int]:
    """The policies and the bytes per buffer of a run on `ranks` ranks, or ConfigError in
    one line: before any rank starts (the command line) and on every rank alike."""
    from ..errors import ConfigError
    from ..sync import policy

    policies = [p.strip() for p in args.sync.split(",") if p.strip()]
    if not policies:
        raise ConfigError(f"--sync names no policy: {args.sync!r}")
    for name in policies:
        policy(name)            # an unknown name says which there are
    try:
        (nbytes,) = parse_sizes(args.size) if isinstance(args.size, str) else (args.size,)
    except (argparse.ArgumentTypeError, ValueError) as exc:
        raise ConfigError(f"--size: {exc}") from None
    if args.iters < 1:
        raise ConfigError(f"--iters must be at least 1, got {args.iters}")
    if ranks < 2:
        raise ConfigError("the consistency benchmark needs at least 2 ranks (-n)")
    return policies, nbytes


def run(args: argparse.Namespace, comm: Optional[MPI.Comm] = None) -> int:
    """Run the benchmark on every rank of `comm` (default COMM_WORLD); rank 0 reports."""
    from mpi4py import MPI

    from .._core.mpiabi import library_version

    comm = MPI.COMM_WORLD if comm is None else comm
    policies, nbytes = check(args, comm.Get_size())
    per_policy = {sync: comm.gather(run_policy(comm, sync, args, nbytes), root=0)
                  for sync in policies}
    if comm.Get_rank() != 0:
        return 0
    env = {"ranks": comm.Get_size(), "graph": args.graph, "size_bytes": nbytes,
           "iters": args.iters, "jitter_us": args.jitter_us, "seed": args.seed,
           "path": rma_path(),
           "mpi_library": library_version()}
    results = {name: summarize(records, args.iters) for name, records in per_policy.items()}
    print(format_report(env, results), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"environment": env, "policies": results}, f, indent=1)
    if args.h5:
        write_h5(args.h5, env, per_policy)
    if args.png:
        from ..plot.bars import bar_chart

        d = max(r["in_degree"] for r in results.values())
        bar_chart([str(c) for c in range(d + 1)],
                  {n: r["whole_distribution_percent"] for n, r in results.items()}, args.png,
                  title=f"whole inputs per reduce: {env['ranks']} ranks, {args.graph}, "
                        f"{env['path']}",
                  ylabel="% of reduces", xlabel=f"whole (untorn) inputs reduced (of {d})",
                  ymax=100)
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    """`mpiexec -n N python -m asapmpi.bench.consistency ...`"""
    parser = argparse.ArgumentParser(prog="asapmpi bench consistency", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
