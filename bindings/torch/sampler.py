"""Per-rank shards of a dataset, in the spirit of torch's DistributedSampler, with the
uneven tail kept: rank r of n gets examples r, r + n, r + 2n, ... of each epoch's
permutation, so the first N mod n ranks hold one example more.  DistributedSampler pads
(repeats examples) or drops the tail to make every shard equal; here nothing is
repeated or lost, and the ranks whose shards end first wait in `opt.join()`
(DecentralizedOptimizer.join) while the others finish.  With even=True every shard
is as long as the longest, its tail repeating the first examples of the epoch's
permutation (as DistributedSampler pads): for training loops that a framework runs
(asapmpi.torch.hf), where every rank must step as often.

    sampler = ShardSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=32, sampler=sampler)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        with opt.join():
            for x, y in loader:
                ...
"""
from __future__ import annotations

from typing import Iterator, Optional, Sized, Union

import torch

from asapmpi.errors import ConfigError


class ShardSampler(torch.utils.data.Sampler):
    """Indices of this rank's shard of a dataset of `dataset` examples (a Sized, or its
    length): rank `rank` of `size` (default: the communicator's, MPI.COMM_WORLD), the
    epoch's permutation when `shuffle` (seeded by seed + epoch, the same on every rank),
    every size-th example from `rank`.  Shards differ by at most one example; with
    `even`, none (module docstring)."""

    def __init__(self, dataset: Union[Sized, int], rank: Optional[int] = None,
                 size: Optional[int] = None, shuffle: bool = True, seed: int = 0,
                 comm=None, even: bool = False):
        total = dataset if isinstance(dataset, int) else len(dataset)
        if rank is None or size is None:
            from mpi4py import MPI

            comm = MPI.COMM_WORLD if comm is None else comm
            rank = comm.Get_rank() if rank is None else rank
            size = comm.Get_size() if size is None else size
        if size < 1 or not 0 <= rank < size:
            raise ConfigError(f"ShardSampler needs 0 <= rank < size, got rank {rank} of "
                              f"{size}")
        if total < size:
            raise ConfigError(f"a dataset of {total} examples leaves ranks of {size} with "
                              f"none; use fewer ranks or more data")
        self.total, self.rank, self.size = int(total), int(rank), int(size)
        self.shuffle, self.seed, self.epoch = bool(shuffle), int(seed), 0
        self.even = bool(even)

    def set_epoch(self, epoch: int) -> None:
        """Use epoch `epoch`'s permutation (call it before each epoch, on every rank)."""
        self.epoch = int(epoch)

    def __len__(self) -> int:
        if self.even:
            return (self.total + self.size - 1) // self.size
        return (self.total - self.rank + self.size - 1) // self.size

    def __iter__(self) -> Iterator[int]:
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.total, generator=g)
        else:
            order = torch.arange(self.total)
        if self.even:
            padded = len(self) * self.size
            order = torch.cat([order, order[:padded - self.total]])
        return iter(order[self.rank::self.size].tolist())
