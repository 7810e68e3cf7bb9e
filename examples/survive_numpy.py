"""A NumPy training loop that survives a dead rank: logistic regression, each rank on its
shard, the replicas mixed by an `Exchange(..., fault_tolerance=True)`; a rank killed
mid-run (--kill-rank R --kill-at K: SIGKILL before its step K + 1) and the survivors
shrink the graph, take the dead rank's shard over (re-split) and go on.  Open MPI 5 with
ULFM (docs/FAILURES.md):

    .venv-openmpi5/bin/mpiexec --with-ft ulfm --oversubscribe --mca osc ^ucx -n 8 \\
        .venv-openmpi5/bin/python examples/survive_numpy.py --kill-rank 5 --kill-at 160

The survivors' first rank prints the final test accuracy (the mean over the replicas,
and the worst) and, with --json FILE, writes it with the survivals and, per survivor,
when it ended its first step after the failure (CLOCK_MONOTONIC; the victim prints the
time it died on the same clock).
"""
import argparse
import json
import os
import signal
import sys
import time

import numpy as np
from mpi4py import MPI

from asapmpi import Exchange


def make_data(examples: int, features: int, seed: int):
    """A linearly separable problem with 10% of the labels flipped (about 90% is the
    best a linear model does), alike on every rank: train and test sets."""
    rng = np.random.default_rng(seed)
    teacher = rng.standard_normal(features)
    x = rng.standard_normal((examples + 4096, features))
    y = (x @ teacher > 0).astype(np.float64)
    flip = rng.random(len(y)) < 0.1
    y[flip] = 1 - y[flip]
    return x[:examples], y[:examples], x[examples:], y[examples:]


def accuracy(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> float:
    """The share of examples the model labels right."""
    return float(np.mean((x @ w > 0) == (y > 0.5)))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--examples", type=int, default=16384)
    p.add_argument("--features", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.5)
    p.add_argument("--sync", default="notify_ack")
    p.add_argument("--graph", default="ring")
    p.add_argument("--seed", type=int, default=0, help="the data's and the batches'")
    p.add_argument("--kill-rank", type=int)
    p.add_argument("--kill-at", type=int)
    p.add_argument("--timeout", type=float, default=30.0)
    p.add_argument("--json")
    args = p.parse_args()

    rank = MPI.COMM_WORLD.Get_rank()
    x, y, x_test, y_test = make_data(args.examples, args.features, args.seed)
    w = np.zeros(args.features)
    ex = Exchange(w, graph=args.graph, sync=args.sync, timeout=args.timeout,
                  fault_tolerance=True)
    shard = {"x": x[rank::ex.size], "y": y[rank::ex.size]}
    resumed = []

    def survived(record) -> str:
        # the whole training set re-split over the survivors (ex is the new exchange)
        me, size = ex.comm.Get_rank(), ex.comm.Get_size()
        shard.update(x=x[me::size], y=y[me::size])
        resumed.append(None)        # the end of the next step, below
        return f"data re-split over {size} ranks: {len(shard['y'])} examples here"

    ex.on_survival = survived
    rng = np.random.default_rng([args.seed, rank])
    while ex.version < args.steps:
        if rank == args.kill_rank and ex.version == args.kill_at:
            print(f"rank {rank}: fault injection: SIGKILL before step {ex.version + 1} "
                  f"(CLOCK_MONOTONIC {time.monotonic():.6f})", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        pick = rng.integers(0, len(shard["y"]), args.batch_size)
        xb, yb = shard["x"][pick], shard["y"][pick]
        p_hat = 1 / (1 + np.exp(-(xb @ w)))
        w -= args.lr * xb.T @ (p_hat - yb) / args.batch_size     # in place: the buffer
        ex.step()
        if resumed and resumed[-1] is None:
            resumed[-1] = time.monotonic()
    mine = accuracy(w, x_test, y_test)
    comm = ex.comm          # the survivors' communicator after a failure
    found = comm.gather({"accuracy": mine, "resumed": resumed}, root=0)
    if comm.Get_rank() == 0:
        accs = [f["accuracy"] for f in found]
        summary = {"ranks": comm.Get_size(), "steps": ex.version,
                   "accuracy": float(np.mean(accs)), "accuracy_min": min(accs),
                   "survivals": ex.survivals,
                   "resumed_monotonic": [f["resumed"] for f in found]}
        print(f"{comm.Get_size()} ranks, {ex.version} steps: test accuracy "
              f"{100 * summary['accuracy']:.2f}% (worst replica "
              f"{100 * summary['accuracy_min']:.2f}%)", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(summary, f, indent=1)
    ex.free()
    return 0


if __name__ == "__main__":
    sys.exit(main())
