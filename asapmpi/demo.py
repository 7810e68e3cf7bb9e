"""The exchange demo: ranks start from different vectors and mix them with NOTIFY-ACK.

Every rank starts from a vector filled with its rank; each step mixes it with the
in-neighbours' vectors.  Rank 0 prints, every few steps, how far apart the replicas
still are, and at the end the per-sender consistency counts and the time per step.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
from mpi4py import MPI

from .exchange import Exchange
from .reduce.graphs import GRAPHS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `asapmpi demo`."""
    parser.add_argument("--graph", default="ring", choices=sorted(GRAPHS))
    parser.add_argument("--steps", type=int, default=200, help="exchange steps (default 200)")
    parser.add_argument("--size", type=int, default=1 << 16,
                        help="float32 elements per buffer (default 65536)")
    parser.add_argument("--checksum", action="store_true", help="checksum every payload")


def run(args: argparse.Namespace, comm: MPI.Comm = MPI.COMM_WORLD) -> dict:
    """Run the demo on `comm`; rank 0 prints; returns rank 0's summary (others: {})."""
    rank, size = comm.rank, comm.size
    buf = np.full(args.size, float(rank), dtype=np.float32)
    mean = (size - 1) / 2
    report_every = max(1, args.steps // 5)
    say = print if rank == 0 else (lambda *a, **k: None)
    with Exchange(buf, graph=args.graph, comm=comm, checksum=args.checksum) as ex:
        say(f"asapmpi demo: {size} ranks, graph {args.graph}, sync {ex.sync}, "
            f"{args.size} float32 ({ex.nbytes / 1e6:.2f} MB) per rank, {args.steps} steps")
        say(f"  rank 0 receives from {ex.in_neighbours}, sends to {ex.out_neighbours}, "
            f"weights {ex.weights}")
        comm.Barrier()
        t0 = time.perf_counter()
        for k in range(1, args.steps + 1):
            ex.step()
            if k % report_every == 0 or k == 1:
                spread = comm.allreduce(float(np.abs(buf - mean).max()), op=MPI.MAX)
                say(f"  step {k:5d}: max |x - global mean| = {spread:.3e}")
        elapsed = time.perf_counter() - t0
        stats = ex.stats
    totals = comm.gather(stats, root=0)
    times = comm.gather(elapsed, root=0)
    if rank != 0:
        return {}
    counts = {"consistent": 0, "torn": 0, "stale": 0, "ahead": 0}
    for per_rank in totals:
        for c in per_rank.values():
            for key in counts:
                counts[key] += c[key]
    step_ms = 1e3 * max(times) / args.steps
    say(f"  reads by all ranks: {counts['consistent']} consistent, {counts['torn']} torn, "
        f"{counts['stale']} stale, {counts['ahead']} ahead")
    say(f"  {step_ms:.3f} ms per step (slowest rank), final spread {spread:.3e}")
    return {"counts": counts, "step_ms": step_ms, "spread": spread}
