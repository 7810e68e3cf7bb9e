"""Hugging Face `transformers.Trainer`, decentralized: one Trainer per rank, the
optimizer a DecentralizedOptimizer.

    import asapmpi.torch.hf as asap_hf          # before TrainingArguments (see below)
    from transformers import TrainingArguments

    args = TrainingArguments(output_dir="out", per_device_train_batch_size=16, ...)
    trainer = asap_hf.DecentralizedTrainer(model=model, args=args,
                                           train_dataset=data, sync="notify_ack",
                                           graph="root-expander")
    trainer.train()                   # frees the exchange at the end (collective)

Run it with mpiexec.  What the Trainer needs changed, and where it is done:

- accelerate (which TrainingArguments and Trainer start) reads the MPI launcher's
  variables (PMI_SIZE, OMPI_COMM_WORLD_SIZE, ...), believes it runs distributed and
  starts torch.distributed, which fails without MASTER_ADDR.  Importing this module
  initialises MPI and then removes those variables from the environment (kept in
  LAUNCHER_ENV): each rank's accelerate sees one process.  Import it before creating
  TrainingArguments.
- Each rank's Trainer believes it is alone (world size 1): DecentralizedTrainer gives
  each rank its shard of the training set (ShardSampler with even=True, seeded by
  args.seed and the epoch: every rank steps as often, as DistributedSampler pads, so
  that checkpoints of every rank lie at the same step of the same epoch), logs and
  shows progress on rank 0 only, and writes its checkpoints to
  `output_dir/rankNNNNN` (its replica, its optimizer and exchange state, its RNG):
  `resume_from_checkpoint=True` resumes each rank from its own.
- The optimizer Trainer creates (AdamW by default, `optim=`) is wrapped in a
  DecentralizedOptimizer with `sync`, `graph` and the exchange options given; pass
  `optimizers=(DecentralizedOptimizer(...), scheduler)` to build it yourself.

When train() ends (not by an exception) the replicas are averaged once (one
allreduce: every rank holds the consensus model; `average_at_end=False` keeps each
rank's own) and the exchange is freed.  Evaluation runs on each rank's replica; rank 0
logs its metrics.
"""
from __future__ import annotations

import os
from typing import Any, Dict, Optional

from mpi4py import MPI

from ..extras import require as _require

#: the launcher variables accelerate reads to decide it runs distributed
LAUNCHER_VARIABLES = ("PMI_SIZE", "PMI_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK",
                      "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
                      "MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_RANK",
                      "MV2_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_SIZE",
                      "MPI_LOCALRANKID", "MPI_LOCALNRANKS")
#: what hide_launcher_from_accelerate() took out of os.environ
LAUNCHER_ENV: Dict[str, str] = {}


def hide_launcher_from_accelerate() -> Dict[str, str]:
    """Remove the MPI launcher's rank and size variables from os.environ (MPI is
    initialised already and does not read them again), so that accelerate, and through
    it TrainingArguments and Trainer, sees one process per rank instead of starting
    torch.distributed.  Returns what was removed (also in LAUNCHER_ENV).  Done when
    this module is imported."""
    for name in LAUNCHER_VARIABLES:
        if name in os.environ:
            LAUNCHER_ENV[name] = os.environ.pop(name)
    return dict(LAUNCHER_ENV)


hide_launcher_from_accelerate()
# (importing transformers starts nothing of accelerate; TrainingArguments does)
_require("accelerate", "hf", "asapmpi.torch.hf")
transformers = _require("transformers", "hf", "asapmpi.torch.hf")

from .optimizer import DecentralizedOptimizer  # noqa: E402
from .sampler import ShardSampler  # noqa: E402


class DecentralizedTrainer(transformers.Trainer):
    """A transformers.Trainer whose ranks mix their replicas through asapmpi (module
    docstring).  sync, graph: as DecentralizedOptimizer; comm: the communicator
    (default MPI.COMM_WORLD); exchange_options: more DecentralizedOptimizer and
    Exchange options (period=, timeout=, buffers=, master_weights=, and local steps
    with an outer optimizer: outer="diloco", local_steps=, outer_lr=, outer_momentum=;
    docs/LOWCOMM.md);
    average_at_end: average the replicas when train() ends.  The other arguments are
    the Trainer's."""

    def __init__(self, *args, sync: str = "notify_ack", graph=None, comm=None,
                 exchange_options: Optional[Dict[str, Any]] = None,
                 average_at_end: bool = True, **kwargs):
        self.comm = MPI.COMM_WORLD if comm is None else comm
        self.sync, self.graph = sync, graph
        self.exchange_options = dict(exchange_options or {})
        self.average_at_end = bool(average_at_end)
        #: before the average at the end of train(): the largest gap of this replica to
        #: the ranks' mean (None until then)
        self.replica_gap: Optional[float] = None
        #: the DecentralizedOptimizer (once created; None after train() freed it)
        self.decentralized: Optional[DecentralizedOptimizer] = None
        if self.comm.Get_rank() != 0:
            transformers.logging.set_verbosity_error()
            transformers.logging.disable_progress_bar()
        self._resuming = False
        super().__init__(*args, **kwargs)
        rank_dir = f"rank{self.comm.Get_rank():05d}"
        if os.path.basename(os.path.normpath(self.args.output_dir)) != rank_dir:
            self.args.output_dir = os.path.join(self.args.output_dir, rank_dir)
        given = self.optimizer
        if given is not None:
            if not isinstance(given, DecentralizedOptimizer):
                from ..errors import ConfigError

                raise ConfigError("DecentralizedTrainer(optimizers=(opt, scheduler)) needs "
                                  "opt to be a DecentralizedOptimizer; pass the torch "
                                  "optimizer's settings through TrainingArguments instead")
            self.decentralized = given

    def create_optimizer(self, model=None):
        """The Trainer's optimizer, wrapped in a DecentralizedOptimizer (collective)."""
        if self.optimizer is None:
            inner = super().create_optimizer(model)
            options = dict(self.exchange_options)
            # a resumed rank continues from its own replica, not rank 0's
            options.setdefault("broadcast", not self._resuming)
            self.optimizer = self.decentralized = DecentralizedOptimizer(
                inner, self.graph, self.sync, comm=self.comm,
                model=self.model if model is None else model, **options)
        return self.optimizer

    def _get_train_sampler(self, train_dataset=None):
        """This rank's shard of the training set, reshuffled per epoch, as long as
        every other rank's."""
        dataset = self.train_dataset if train_dataset is None else train_dataset
        if dataset is None or not hasattr(dataset, "__len__"):
            return super()._get_train_sampler(train_dataset)
        return ShardSampler(dataset, comm=self.comm, shuffle=True, seed=self.args.seed,
                            even=True)

    def is_world_process_zero(self) -> bool:
        """Rank 0 logs and shows progress (every rank saves its own checkpoints)."""
        return self.comm.Get_rank() == 0

    def is_local_process_zero(self) -> bool:
        """Rank 0, as is_world_process_zero (the progress bar and printed logs)."""
        return self.comm.Get_rank() == 0

    def train(self, *args, **kwargs):
        """Trainer.train, then the replicas averaged (average_at_end) and the exchange
        freed (collective): evaluate() and save_model() go on working on this rank's
        replica."""
        resume = kwargs.get("resume_from_checkpoint", args[0] if args else None)
        self._resuming = resume not in (None, False)
        # an exception leaves the exchange as it is: freeing is collective, and the
        # other ranks may be gone (the job is ending)
        result = super().train(*args, **kwargs)
        if self.average_at_end and self.decentralized is not None:
            self.replica_gap = self.decentralized.average_replicas()
        self.free()
        return result

    def free(self) -> None:
        """Free the DecentralizedOptimizer's exchange (collective; train() does it).
        A later train() builds a new optimizer."""
        if self.decentralized is not None:
            self.decentralized.free()
            self.decentralized = None
            self.optimizer = None
            self.lr_scheduler = None
