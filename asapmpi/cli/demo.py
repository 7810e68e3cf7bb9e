"""The exchange demo: ranks start from different vectors and mix them with NOTIFY-ACK.

Every rank starts from a vector filled with its rank; each step mixes it with the
in-neighbours' vectors.  Rank 0 prints, every few steps, how far apart the replicas
still are, and at the end the per-sender consistency counts and the time per step.
"""
from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING, Optional

import numpy as np

from ..launch.slowdown import add_arguments as slowdown_arguments
from ..launch.slowdown import from_environment, from_options
from ..outputs import output_file
from ..reduce.graphs import GRAPHS
from ..sync import POLICIES, Hop

if TYPE_CHECKING:
    from mpi4py import MPI

#: Hop's options the demo takes as flags (--max-gap ...), read by the policy's own parser
HOP_FLAGS = ("max_gap", "backup", "staleness", "skip_trigger", "max_jump")

# MPI and the exchange are imported where the demo runs: `asapmpi --help` imports this
# module and must start no MPI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `asapmpi demo`."""
    parser.add_argument("--graph", default="ring", choices=sorted(GRAPHS))
    parser.add_argument("--steps", type=int, default=200, help="exchange steps (default 200)")
    parser.add_argument("--size", type=int, default=1 << 16,
                        help="float32 elements per buffer (default 65536)")
    parser.add_argument("--checksum", action="store_true", help="checksum every payload")
    parser.add_argument("--sync", default="notify_ack",
                        choices=[p for p in sorted(POLICIES) if p != "allreduce"])
    hop = parser.add_argument_group("hop options (with --sync hop)")
    for name in HOP_FLAGS:
        option = Hop.OPTIONS.by_name[name]
        hop.add_argument(f"--{name.replace('_', '-')}", dest=name,
                         help=f"{option.help}: {option.allowed()} (default "
                              f"{option.default})")
    slow = slowdown_arguments(parser)
    slow.add_argument("--slow-seed", type=int, default=0)
    slow.add_argument("--compute-ms", type=float, default=0.0,
                      help="a compute phase of this many ms per step, slowed as asked")
    parser.add_argument("--trace", metavar="FILE", type=output_file,
                        help="hop/notify_ack: write the iteration trace to HDF5")


def check(args: argparse.Namespace) -> None:
    """Refuse bad options before any rank starts (ConfigError, one line)."""
    from ..errors import ConfigError
    from ..sync import policy

    for flag, value in (("--size", args.size), ("--steps", args.steps)):
        if value < 1:
            raise ConfigError(f"{flag} must be at least 1, got {value}")
    if args.compute_ms < 0:
        raise ConfigError(f"--compute-ms must be >= 0, got {args.compute_ms}")
    if args.sync == "hop":
        policy("hop", **hop_options(args))


def hop_options(args: argparse.Namespace) -> dict:
    """The hop flags given, as text for the policy's parser."""
    return {key: getattr(args, key) for key in HOP_FLAGS
            if getattr(args, key, None) is not None}


def run(args: argparse.Namespace, comm: Optional[MPI.Comm] = None) -> dict:
    """Run the demo on `comm` (default COMM_WORLD); rank 0 prints; returns rank 0's
    summary (others: {})."""
    from mpi4py import MPI

    from ..exchange import Exchange

    comm = MPI.COMM_WORLD if comm is None else comm
    rank, size = comm.rank, comm.size
    buf = np.full(args.size, float(rank), dtype=np.float32)
    mean = (size - 1) / 2
    report_every = max(1, args.steps // 5)
    say = print if rank == 0 else (lambda *a, **k: None)
    options = hop_options(args)
    slow = from_options(args.slowdown, args.slow_factor, args.slow_probability,
                        args.slow_ranks, args.slow_seed, size) if args.slowdown != "none" \
        else from_environment(size)         # asapmpi-run --slowdown
    with Exchange(buf, graph=args.graph, sync=args.sync, comm=comm, checksum=args.checksum,
                  **options) as ex:
        say(f"asapmpi demo: {size} ranks, graph {args.graph}, sync {ex.sync}, "
            f"{args.size} float32 ({ex.nbytes / 1e6:.2f} MB) per rank, {args.steps} steps")
        say(f"  rank 0 receives from {ex.in_neighbours}, sends to {ex.out_neighbours}, "
            f"weights {ex.weights}")
        comm.Barrier()
        t0 = time.perf_counter()
        steps = 0
        # loop to an iteration count, not a step count: with skipping (hop) ranks take
        # different numbers of steps; no collective inside the loop for the same reason
        while ex.version < args.steps:
            if args.compute_ms:
                slow.compute(rank, ex.version + 1, args.compute_ms * 1e-3)
            ex.step()
            steps += 1
            if steps % report_every == 0 or steps == 1:
                say(f"  rank 0 at iteration {ex.version:5d}: max |x - global mean| on rank 0 "
                    f"= {float(np.abs(buf - mean).max()):.3e}")
        elapsed = time.perf_counter() - t0
        spread = comm.allreduce(float(np.abs(buf - mean).max()), op=MPI.MAX)
        stats = ex.stats
        iterations = comm.gather(ex.version, root=0)
        if args.trace:
            from .. import trace

            trace.save(args.trace, ex, comm)
    totals = comm.gather(stats, root=0)
    times = comm.gather(elapsed, root=0)
    if rank != 0:
        return {}
    counts = {"consistent": 0, "torn": 0, "stale": 0, "ahead": 0}
    for per_rank in totals:
        for c in per_rank.values():
            for key in counts:
                counts[key] += c[key]
    step_ms = 1e3 * max(times) / args.steps   # per iteration reached
    say(f"  reads by all ranks: {counts['consistent']} consistent, {counts['torn']} torn, "
        f"{counts['stale']} stale, {counts['ahead']} ahead")
    say(f"  {step_ms:.3f} ms per iteration (slowest rank), final max |x - global mean| "
        f"= {spread:.3e}")
    if min(iterations) != max(iterations) or max(iterations) != args.steps:
        say(f"  iterations reached per rank: {iterations} (skipping)")
    if args.trace:
        say(f"  trace written to {args.trace} (check it: asapmpi trace check "
            f"{args.trace})")
    return {"counts": counts, "step_ms": step_ms, "spread": spread}
