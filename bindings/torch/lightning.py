"""PyTorch Lightning, decentralized: a strategy whose ranks each train a replica and mix
it through asapmpi (as Lightning carried strategies for Horovod, and lightning-bagua
one for Bagua).

    from asapmpi.torch.lightning import DecentralizedStrategy

    trainer = lightning.Trainer(strategy=DecentralizedStrategy(sync="notify_ack",
                                                               graph="root-expander"),
                                accelerator="cpu", devices=1, max_epochs=3)
    trainer.fit(module, train_loader, val_loader)

Run it with mpiexec, one process per rank, `devices=1` each.  The strategy

- wraps the module's optimizer (one; configure_optimizers) in a DecentralizedOptimizer
  with the module as its model (its buffers mixed as `buffers=` says); learning-rate
  schedulers go on working on it;
- tells Lightning it is distributed (global_rank, world_size from the communicator), so
  that Lightning gives each rank a DistributedSampler shard of the training and
  validation data and reseeds it per epoch; `self.log(..., sync_dist=True)` averages a
  metric over the ranks (MPI), and only rank 0 prints and logs;
- gives every rank its own checkpoint folder (`rankNNNNN` inside the checkpoint
  callback's), written by every rank: its replica, its optimizer and exchange state.
  `trainer.fit(ckpt_path=PATH)` takes a checkpoint of any rank's folder and resumes
  each rank from its own (not from rank 0's weights);
- when fitting ends (not by an exception), averages the replicas once (one allreduce:
  every rank ends with the consensus model; `average_at_end=False` keeps each rank's
  own) and frees the exchange (collective).
"""
from __future__ import annotations

import os
import re
from typing import Any, Dict, Optional

import numpy as np
import torch
from mpi4py import MPI

from ..errors import ConfigError
from ..extras import require as _require

_require("lightning", "lightning", "asapmpi.torch.lightning")

from lightning.fabric.utilities import rank_zero as _fabric_rank_zero  # noqa: E402
from lightning.pytorch.strategies import ParallelStrategy  # noqa: E402
from lightning.pytorch.utilities import rank_zero as _rank_zero  # noqa: E402

from .optimizer import DecentralizedOptimizer  # noqa: E402

#: a checkpoint folder of one rank
RANK_DIR = re.compile(r"^rank\d{5}$")


def rank_dir(rank: int) -> str:
    """The folder name of rank `rank`'s checkpoints."""
    return f"rank{rank:05d}"


class DecentralizedStrategy(ParallelStrategy):
    """A Lightning strategy over asapmpi (module docstring).  sync, graph: as
    DecentralizedOptimizer; comm: the communicator (default MPI.COMM_WORLD); device:
    this rank's device ("cpu", or a CUDA device); exchange_options: more
    DecentralizedOptimizer and Exchange options (period=, timeout=, buffers=,
    master_weights=, and local steps with an outer optimizer: outer="diloco",
    local_steps=, outer_lr=, outer_momentum=; docs/LOWCOMM.md); average_at_end: average
    the replicas when fitting ends."""

    strategy_name = "asapmpi"

    #: restore a checkpoint after setup(): the checkpoint callbacks' folders are per
    #: rank and the optimizer is wrapped by then, so both take their state as saved
    restore_checkpoint_after_setup = True

    def __init__(self, sync: str = "notify_ack", graph=None, comm=None, device="cpu",
                 average_at_end: bool = True, **exchange_options):
        self._device = torch.device(device)
        super().__init__(parallel_devices=[self._device])
        self.comm = MPI.COMM_WORLD if comm is None else comm
        self.sync, self.graph = sync, graph
        self.exchange_options: Dict[str, Any] = exchange_options
        self.average_at_end = bool(average_at_end)
        #: before average_replicas() at the end: the largest gap of this replica to
        #: the ranks' mean (None until then)
        self.replica_gap: Optional[float] = None
        #: the DecentralizedOptimizer while fitting, else None
        self.decentralized: Optional[DecentralizedOptimizer] = None
        self._failed = False

    @property
    def root_device(self) -> torch.device:
        """This rank's one device."""
        return self._device

    def model_to_device(self) -> None:
        """The module onto this rank's device."""
        self.model.to(self.root_device)

    @property
    def global_rank(self) -> int:
        """This rank in the communicator."""
        return self.comm.Get_rank()

    @property
    def local_rank(self) -> int:
        """0: every rank is a process of its own with one device."""
        return 0

    @property
    def node_rank(self) -> int:
        """This rank (each process its own 'node' as Lightning counts)."""
        return self.comm.Get_rank()

    @property
    def world_size(self) -> int:
        """The communicator's size."""
        return self.comm.Get_size()

    @property
    def is_distributed(self) -> bool:
        """Lightning then gives each rank its DistributedSampler shard."""
        return True

    @property
    def distributed_sampler_kwargs(self) -> Dict[str, int]:
        """This rank's shard: rank `global_rank` of `world_size`."""
        return {"num_replicas": self.world_size, "rank": self.global_rank}

    @property
    def is_global_zero(self) -> bool:
        """Rank 0 prints and logs."""
        return self.global_rank == 0

    def setup_environment(self) -> None:
        """Lightning's rank-zero helpers learn this process's rank."""
        _rank_zero.rank_zero_only.rank = _fabric_rank_zero.rank_zero_only.rank = \
            self.global_rank
        super().setup_environment()

    def setup(self, trainer) -> None:
        """Per-rank checkpoint folders, then the optimizer wrapped (collective)."""
        for callback in trainer.checkpoint_callbacks:
            path = getattr(callback, "dirpath", None)
            if path is not None and not RANK_DIR.match(os.path.basename(os.path.normpath(path))):
                callback.dirpath = os.path.join(path, rank_dir(self.global_rank))
        super().setup(trainer)

    def setup_optimizers(self, trainer) -> None:
        """The module's optimizer, wrapped in a DecentralizedOptimizer."""
        super().setup_optimizers(trainer)
        if len(self.optimizers) != 1:
            raise ConfigError(f"DecentralizedStrategy mixes the replicas through one "
                              f"optimizer; configure_optimizers returned "
                              f"{len(self.optimizers)}: return one (its parameter groups "
                              f"may differ)")
        # (a resumed rank's own replica is loaded after this: restore_checkpoint_after_setup)
        self.decentralized = DecentralizedOptimizer(
            self.optimizers[0], self.graph, self.sync, comm=self.comm,
            model=self.lightning_module, **self.exchange_options)
        self.optimizers = [self.decentralized]

    def load_checkpoint(self, checkpoint_path, weights_only=None) -> Dict[str, Any]:
        """This rank's checkpoint of the same name: `checkpoint_path` may be any rank's
        (or one outside rank folders)."""
        path = os.path.normpath(str(checkpoint_path))
        folder, name = os.path.split(path)
        mine = rank_dir(self.global_rank)
        if RANK_DIR.match(os.path.basename(folder)):
            path = os.path.join(os.path.dirname(folder), mine, name)
        elif os.path.exists(os.path.join(folder, mine, name)):
            path = os.path.join(folder, mine, name)
        return super().load_checkpoint(path, weights_only=weights_only)

    def save_checkpoint(self, checkpoint, filepath, storage_options=None) -> None:
        """Every rank writes its own (into its rank folder)."""
        self.checkpoint_io.save_checkpoint(checkpoint, filepath,
                                           storage_options=storage_options)

    def remove_checkpoint(self, filepath) -> None:
        """Every rank removes its own."""
        self.checkpoint_io.remove_checkpoint(filepath)

    def barrier(self, name: Optional[str] = None) -> None:
        """Every rank arrives (polling with back-off; a missing rank is named)."""
        from .. import collectives
        from ..rc import rc

        collectives.arrive(self.comm, rc.timeout_startup, f"Lightning's barrier {name or ''}")

    def broadcast(self, obj, src: int = 0):
        """Rank `src`'s object on every rank."""
        return self.comm.bcast(obj, root=src)

    def reduce(self, tensor, group=None, reduce_op="mean"):
        """The sum or mean over the ranks of a tensor (a metric logged with
        sync_dist=True); anything else as it is."""
        if not isinstance(tensor, torch.Tensor):
            return tensor
        op = str(reduce_op).lower().rsplit(".", 1)[-1]
        if op not in ("mean", "sum", "avg"):
            raise ConfigError(f"DecentralizedStrategy reduces with mean or sum, got "
                              f"{reduce_op!r}")
        values = tensor.detach().to("cpu", torch.float64).numpy()
        total = np.empty_like(values)
        self.comm.Allreduce(np.ascontiguousarray(values), total, op=MPI.SUM)
        if op in ("mean", "avg"):
            total /= self.world_size
        return torch.as_tensor(total, dtype=tensor.dtype, device=tensor.device)

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        """Every rank's decision, and-ed (all) or or-ed."""
        votes = np.array(self.comm.allgather(bool(decision)))
        return bool(votes.all()) if all else bool(votes.any())

    def all_gather(self, tensor, group=None, sync_grads: bool = False):
        """Every rank's tensor, stacked along a new first dimension."""
        parts = self.comm.allgather(tensor.detach().cpu())
        return torch.stack(parts).to(tensor.device)

    def on_exception(self, exception: BaseException) -> None:
        """The run ends by an exception: no collective at teardown (the other ranks
        may be gone)."""
        self._failed = True

    def teardown(self) -> None:
        """Average the replicas (average_at_end) and free the exchange, both collective
        and only when fitting ended normally; then Lightning's teardown."""
        if self.decentralized is not None and not self._failed:
            if self.average_at_end:
                self.replica_gap = self.decentralized.average_replicas()
            self.decentralized.free()
        self.decentralized = None
        self._failed = False
        super().teardown()
