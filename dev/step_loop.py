"""Seconds per Exchange.step() with nothing else in the loop: the slowest rank's best of
three loops after a warm-up, for before/after checks of per-step overhead.

    .venv/bin/mpiexec -n 8 .venv/bin/python dev/step_loop.py [SYNC] [--steps 1500]
        [--floats 16384] [--graph root-expander] [--transport auto]
        [--double-buffer]

(the network path: run under the environment asapmpi.launchers.network_env gives).
Not for elastic: its server takes more steps than its workers, so a loop of the same
count on every rank ends with the server waiting for versions no worker sends (the
trainer ends such runs with Exchange.join); `asapmpi bench reduce` times it.
"""
import argparse
import time

import numpy as np
from mpi4py import MPI

import asapmpi


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sync", nargs="?", default="notify_ack")
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--floats", type=int, default=16384)
    parser.add_argument("--graph", default="root-expander")
    parser.add_argument("--transport", default="auto",
                        help="the channel family (put, shared, messages): one window "
                             "class per run")
    parser.add_argument("--double-buffer", action="store_true")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    buf = np.zeros(args.floats, dtype=np.float32)
    extra = {"double_buffer": True} if args.double_buffer else {}
    with asapmpi.Exchange(buf, graph=args.graph, sync=args.sync, comm=comm,
                          timeout=60, transport=args.transport, **extra) as ex:
        for _ in range(200):
            ex.step()
        best = float("inf")
        for _ in range(3):
            # a collective of our own: first what a neighbour may wait for (an elastic
            # server waits for a worker's held-back newest version: docs/CLUSTERS.md)
            ex.settle()
            comm.Barrier()
            start = time.perf_counter()
            for _ in range(args.steps):
                ex.step()
            best = min(best, (time.perf_counter() - start) / args.steps)
        ex.settle()
    worst = comm.reduce(best, op=MPI.MAX)
    if comm.rank == 0:
        print(f"{args.sync} {ex.transport} {type(ex._win).__name__} "
              f"{worst * 1e6:.1f} us/step {asapmpi.__file__}")


if __name__ == "__main__":
    main()
