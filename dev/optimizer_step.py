"""Seconds per DecentralizedOptimizer.step() with nothing else in the loop (given
gradients, no forward pass): the slowest rank's best of three 40-step loops, for
before/after checks of the wrapper's per-step overhead.

    .venv/bin/mpiexec -n 2 .venv/bin/python dev/optimizer_step.py [--dtype bfloat16]
        [--width 2048] [--sync notify_ack]
"""
import argparse
import time

import torch
from mpi4py import MPI

from asapmpi.torch import DecentralizedOptimizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16",
                                                                 "float16"])
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--sync", default="notify_ack")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    torch.manual_seed(0)
    w = args.width
    model = torch.nn.Sequential(torch.nn.Linear(w, w), torch.nn.Linear(w, w // 2)).to(
        getattr(torch, args.dtype))
    opt = DecentralizedOptimizer(torch.optim.SGD(model.parameters(), lr=1e-3), "complete",
                                 args.sync, model=model, comm=comm, timeout=60)
    grads = [torch.randn_like(p) for p in model.parameters()]

    def step():
        for p, g in zip(model.parameters(), grads):
            p.grad = g.clone()
        opt.step()

    for _ in range(10):
        step()
    best = float("inf")
    for _ in range(3):
        comm.Barrier()
        start = time.perf_counter()
        for _ in range(40):
            step()
        best = min(best, (time.perf_counter() - start) / 40)
    worst = comm.reduce(best, op=MPI.MAX)
    opt.free()
    if comm.rank == 0:
        count = sum(p.numel() for p in model.parameters())
        print(f"{count / 1e6:.1f}M {args.dtype} parameters, {args.sync}: "
              f"{worst * 1e3:.2f} ms/step")


if __name__ == "__main__":
    main()
