"""Uneven shards joined: every rank trains one epoch over its own shard of a dataset
whose size the ranks do not divide, and the ranks that finish first wait in
`opt.join()` instead of timing out.

    .venv/bin/mpiexec -n 4 .venv/bin/python examples/uneven_shards.py [--examples 1282]
"""
import argparse

import torch
from mpi4py import MPI

from asapmpi.torch import DecentralizedOptimizer, ShardSampler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=1282)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--sync", default="notify_ack")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD

    # a regression problem every rank generates alike (seed 0); each trains on its shard
    # (1282 examples on 4 ranks: shards of 321, 321, 320 and 320, 11/11/10/10 batches)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.examples, 16, generator=g)
    y = x @ torch.linspace(-1, 1, 16) + 0.1 * torch.randn(args.examples, generator=g)
    data = torch.utils.data.TensorDataset(x, y)
    sampler = ShardSampler(data, shuffle=True, seed=0)
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch_size, sampler=sampler)

    model = torch.nn.Linear(16, 1)
    opt = DecentralizedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                 sync=args.sync, model=model)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        losses = []
        with opt.join():
            for xb, yb in loader:
                opt.zero_grad()
                loss = torch.nn.functional.mse_loss(model(xb).squeeze(-1), yb)
                loss.backward()
                opt.step()
                losses.append(loss.item())
        print(f"rank {comm.rank}: epoch {epoch}: {len(losses)} batches, loss "
              f"{losses[0]:.3f} -> {losses[-1]:.3f}, exchange version "
              f"{opt.exchange.version}", flush=True)
    opt.free()


if __name__ == "__main__":
    main()
