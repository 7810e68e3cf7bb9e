"""The training loop of the demos (`asapmpi train svm|cnn|mlp|lm`), one run on every rank of
`comm`: data sharded by rank, a DecentralizedOptimizer, periodic evaluation, progress,
checkpoints, resume, slowdown injection, load balancing (--balance: per-rank batch sizes
and samples-weighted gradients, asapmpi.train.loadbalance); returns the gathered metrics on
rank 0."""
from __future__ import annotations

import collections
import contextlib
import functools
import math
import os
import resource
import signal
import statistics
import sys
import time
from dataclasses import replace
from typing import Any, Callable, List, Optional

import numpy as np
import torch
from mpi4py import MPI

from asapmpi import collectives
from asapmpi.errors import AsapError, ConfigError
from asapmpi.launch.slowdown import from_environment, from_options, hold
from asapmpi.rc import rc
from asapmpi.sync import POLICIES
from asapmpi.train import data as datasets
from asapmpi.train import resume_plan
from asapmpi.train.checkpoint import CheckpointDir
from asapmpi.train.config import TrainConfig
from asapmpi.train.loadbalance import Balancer, SpeedBoard
from asapmpi.train.metric import metric_of
from asapmpi.train.progress import ProgressBar
from asapmpi.train.report import MetricsLog, RunResult

from . import models, state
from .optimizer import DecentralizedOptimizer

#: sparse data with more columns than this is fed to the model as sparse tensors
SPARSE_COLUMNS = 8192
#: the language model's warm-up: this fraction of --iters
LM_WARMUP = 0.05


def place_on_host(comm: MPI.Comm) -> tuple:
    """(this rank's index among its host's ranks, their number) (collective)."""
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return local.Get_rank(), local.Get_size()
    finally:
        local.Free()


def threads_per_rank(host_ranks: int, requested: int) -> int:
    """`requested`, or the host's cores shared among its `host_ranks` ranks:
    oversubscribed ranks that each start a full thread pool only fight for the cores."""
    if requested:
        return requested
    return max(1, (os.cpu_count() or 1) // host_ranks)


def make_optimizer(cfg: TrainConfig, model: torch.nn.Module) -> torch.optim.Optimizer:
    """The base optimizer; the SVM's L2 term is weight decay on its weights only."""
    decay = cfg.lam if cfg.model == "svm" else 0.0
    groups = [{"params": [p for n, p in model.named_parameters() if not n.endswith("bias")],
               "weight_decay": decay},
              {"params": [p for n, p in model.named_parameters() if n.endswith("bias")],
               "weight_decay": 0.0}]
    if cfg.optimizer == "adam":
        return torch.optim.Adam(groups, lr=cfg.lr)
    return torch.optim.SGD(groups, lr=cfg.lr,
                           momentum=0.9 if cfg.optimizer == "momentum" else 0.0)


def learning_rate(cfg: TrainConfig, iteration: int) -> float:
    """SVM: Bottou's schedule eta0 / (1 + lambda eta0 t); MLP: cosine from lr to 0 over
    --iters (at a constant rate decentralized replicas kept disagreeing by several points
    at the end of the run, while allreduce's one model kept improving); LM: a linear
    warm-up over the first LM_WARMUP of the run (Adam's first steps on a transformer
    are its largest), then the same cosine; CNN: constant."""
    if cfg.model == "svm":
        return cfg.lr / (1.0 + cfg.lam * cfg.lr * iteration)
    if cfg.model == "lm":
        warmup = max(1, round(LM_WARMUP * cfg.iters))
        if iteration < warmup:
            return cfg.lr * (iteration + 1) / warmup
    if cfg.model in ("mlp", "lm"):
        return 0.5 * cfg.lr * (1.0 + math.cos(math.pi * min(iteration, cfg.iters) / cfg.iters))
    return cfg.lr


def _sparse_batches(x) -> bool:
    """Whether batches of `x` go to the model as sparse tensors (wide sparse data)."""
    return datasets.is_sparse(x) and x.shape[1] > SPARSE_COLUMNS


class _Data:
    """A rank's view of the dataset: its shard of the training set (all it loads or
    generates: datasets.load), the test set."""

    def __init__(self, cfg: TrainConfig, rank: int, size: int):
        #: where batches go, and in which element type: the model's
        self.device = compute_device(cfg.device)
        self.dtype = getattr(torch, cfg.dtype)
        options = dict(cfg.data_options)
        if cfg.test_data:
            options["test_path"] = cfg.test_data
        if cfg.model == "lm":
            options["context"] = cfg.context      # the windows are the model's context
        self.ds = datasets.load(cfg.data, rank=rank, size=size, **options)
        if cfg.model == "svm" and self.ds.n_classes != 2:
            raise ConfigError(f"the SVM demo is binary but {cfg.data} has "
                              f"{self.ds.n_classes} classes; use `asapmpi train cnn`")
        if cfg.model == "mlp" and _sparse_batches(self.ds.x_train):
            raise ConfigError(f"the MLP demo takes dense batches of at most {SPARSE_COLUMNS} "
                              f"features, but {cfg.data} has {self.ds.n_features}; use "
                              f"`asapmpi train svm` or --data-option n_features=2000")
        #: text windows (the language model): byte values, fed as int64 indices
        self.text = cfg.model == "lm"
        if cfg.model == "cnn" and len(self.ds.shape) != 3:
            raise ConfigError(f"the CNN demo needs images (C, H, W), but {cfg.data} has "
                              f"examples of shape {self.ds.shape}; use `asapmpi train svm`")
        # positions in this rank's own rows: the data set holds no other training rows
        self.shard = np.arange(len(self.ds.y_train))
        if cfg.batch_size > len(self.shard):
            raise ConfigError(f"--batch-size {cfg.batch_size} exceeds this rank's shard of "
                              f"{len(self.shard)} examples; use a smaller batch or fewer "
                              f"ranks")

    def agree(self, comm: MPI.Comm, timeout: float) -> None:
        """Collective, once every rank loaded its shard: the columns and labels all ranks
        use (a rank's byte range of a LIBSVM file may lack the widest row or a label:
        datasets.conform), then the test set as tensors."""
        summaries = collectives.allgather(comm, datasets.shard_summary(self.ds), timeout,
                                          "the shape of every rank's data")
        self.summaries = summaries
        self.ds = datasets.conform(self.ds, summaries)
        self.x_test = self._dense(self.ds.x_test, np.arange(len(self.ds.y_test))).to(self.device)
        self.y_test = torch.from_numpy(np.asarray(self.ds.y_test,
                                                  dtype=np.int64)).to(self.device)
        # in slices of this many windows, so that a larger --data-option eval_windows
        # does not hold all its activations at once
        self.eval_slice = 256

    def reshard(self, cfg: TrainConfig, rank: int, size: int) -> None:
        """This rank's shard of the whole training set split over `size` ranks (the
        survivors of a failure, --lost-shards reassign), loaded on its own: no
        collective.  Conformed to the columns and labels every rank agreed on at the
        start (the new shard is part of the same data) and its own; the test set
        stays."""
        options = dict(cfg.data_options)
        if cfg.test_data:
            options["test_path"] = cfg.test_data
        if cfg.model == "lm":
            options["context"] = cfg.context
        ds = datasets.load(cfg.data, rank=rank, size=size, **options)
        total = self.ds.train_rows_total
        ds = datasets.conform(ds, [*self.summaries, datasets.shard_summary(ds)])
        self.ds = replace(self.ds, x_train=ds.x_train, y_train=ds.y_train, shard=ds.shard,
                          train_rows_total=total)
        self.shard = np.arange(len(self.ds.y_train))

    def _dense(self, x, index) -> torch.Tensor:
        """Examples `index` as a tensor: dense, or sparse (COO) for wide sparse data,
        whose dense batches would cost more than the model (RCV1: 47k columns), or the
        bytes of text windows as int64 indices."""
        if self.text:
            return torch.from_numpy(np.asarray(x[index], dtype=np.int64))
        if _sparse_batches(x):
            if self.dtype != torch.float32:
                raise ConfigError(f"--dtype {str(self.dtype)[6:]} needs dense examples, and "
                                  f"this data is fed as sparse tensors; leave --dtype out")
            batch = x[index].tocoo()
            where = torch.from_numpy(np.stack([batch.row, batch.col]).astype(np.int64))
            return torch.sparse_coo_tensor(where, torch.from_numpy(batch.data), batch.shape,
                                           check_invariants=False)
        rows = x[index].toarray() if datasets.is_sparse(x) else x[index]
        return torch.from_numpy(np.ascontiguousarray(rows, dtype=np.float32)).to(self.dtype)

    def batch(self, cfg: TrainConfig, iteration: int, rank: int, span=None):
        """The minibatch of `iteration`: a pure function of it (resumes draw the same);
        with `span` (cursor, size), the `size` examples after the `cursor` this rank drew
        before (load balancing: sizes change from step to step)."""
        idx = datasets.batch_indices(self.shard, cfg.batch_size, iteration, cfg.seed, rank) \
            if span is None else datasets.batch_span(self.shard, *span, cfg.seed, rank)
        x = self._dense(self.ds.x_train, idx)
        y = torch.from_numpy(np.asarray(self.ds.y_train[idx], dtype=np.int64))
        if self.device.type != "cpu":
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
        return x, y


def compute_device(name: str) -> torch.device:
    """The torch device of --device; ConfigError in one line when torch has no such
    CUDA device here."""
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"--device {name}: torch sees no CUDA device on this host "
                              f"(torch.cuda.is_available() is False); leave --device out "
                              f"to train on the CPU")
        if (device.index or 0) >= torch.cuda.device_count():
            raise ConfigError(f"--device {name}: this host has "
                              f"{torch.cuda.device_count()} CUDA device(s)")
    return device


def _accuracy(model, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float((model.predict(model(x)) == y).double().mean())


def evaluate_metric(model, data: "_Data") -> float:
    """`model`'s test accuracy on `data`'s test set (the language model: its held-out
    loss)."""
    if data.text:
        return heldout_loss(model, data.x_test, data.y_test, data.eval_slice)
    return _accuracy(model, data.x_test, data.y_test)


def heldout_loss(model, x: torch.Tensor, y: torch.Tensor, slice_size: int = 256) -> float:
    """The language model's mean cross-entropy per character (nats) on the held-out
    windows x (inputs) and y (next bytes), computed in slices of windows and summed in
    float64, so the value does not depend on the slicing beyond float32 rounding."""
    total = 0.0
    with torch.no_grad():
        for start in range(0, len(x), slice_size):
            xs, ys = x[start:start + slice_size], y[start:start + slice_size]
            total += float(model.loss(model(xs), ys)) * ys.numel()
    return total / y.numel()


def train(cfg: TrainConfig, comm: Optional[MPI.Comm] = None, progress: bool = True,
          clock_budget: Optional[Callable[[], Any]] = None,
          before_free: Optional[Callable[[RunResult], None]] = None) -> Optional[RunResult]:
    """Run `cfg` on every rank of `comm` (collective).  Rank 0 returns the RunResult with
    every rank's metrics; the others return None.  `before_free`, when given, gets that
    RunResult on rank 0 once every metric is gathered, before the exchange is freed (a
    collective that a rank dead at the very end can fail: the caller keeps the run's
    report first).

    `clock_budget`, when given, makes this rank's CPU budget or None (raising AsapError
    for a bad set-up, agreed on like bad data): an object with ``split(index_on_host,
    ranks_on_host)``, ``enter()``, ``leave()`` and ``paused()`` that the loop enters while
    its clock runs.  `asapmpi train` passes the emulated hosts' cgroups
    (asapmpi.launch.budget.ClockBudget.from_environment); the trainer itself knows no
    emulation."""
    comm = MPI.COMM_WORLD if comm is None else comm
    rank, size = comm.Get_rank(), comm.Get_size()
    # every collective of the run has a deadline: a rank that died or hangs outside MPI
    # is named by the others instead of hanging them (asapmpi.collectives)
    timeout = cfg.timeout or rc.timeout
    if cfg.survive:
        # before any communication: one line on every rank alike (no ULFM here, or a
        # launch without it)
        from asapmpi.exchange import survive

        survive.check_available()
    _maybe_die(cfg, rank, "start")
    collectives.barrier(comm, max(timeout, rc.timeout_startup), "the start of the run")
    host_index, host_ranks = place_on_host(comm)
    torch.set_num_threads(threads_per_rank(host_ranks, cfg.threads))
    torch.manual_seed(cfg.seed)
    problem = None
    try:
        budget = clock_budget() if clock_budget is not None else None
        if budget:
            budget.split(host_index, host_ranks)
        data = _Data(cfg, rank, size)
        slow = from_options(cfg.slowdown, cfg.slow_factor, cfg.slow_probability,
                            cfg.slow_ranks, cfg.seed, size) if cfg.slowdown != "none" \
            else from_environment(size)       # asapmpi-run --slowdown
    except (AsapError, TypeError, ValueError) as exc:
        problem = str(exc)
    # a file missing on one host must not leave the other ranks waiting in the Exchange;
    # reading the data may take a while on some ranks
    _agree(comm, problem, max(timeout, rc.timeout_startup), "the check of every rank's data")
    # every rank passed the check: any ConfigError of the agreement is the same on all
    data.agree(comm, max(timeout, rc.timeout_startup))
    model = models.build(cfg.model, data.ds.shape, data.ds.n_classes, cfg.width,
                         cfg.layers, cfg.heads).to(data.device, data.dtype)
    # policies that average over everybody or fix their own topology take no graph
    policy = POLICIES[cfg.sync]
    fixed = not policy.uses_window or hasattr(policy, "topology")
    opt = DecentralizedOptimizer(
        make_optimizer(cfg, model), None if fixed else cfg.graph,
        cfg.sync, period=cfg.period, mode=cfg.mode, comm=comm, timeout=cfg.timeout,
        transport=cfg.transport, outer=cfg.outer, local_steps=cfg.local_steps,
        outer_lr=cfg.outer_lr, outer_momentum=cfg.outer_momentum,
        **({"fault_tolerance": True} if cfg.survive else {}), **cfg.policy_options)
    ckpts = CheckpointDir(cfg.checkpoint_root(), rank, cfg.keep)
    log, elapsed, resumed_loop = MetricsLog(metric_of(cfg.model)), 0.0, None
    if cfg.resume:
        tree = _load_checkpoint(cfg, ckpts, comm, model, opt, timeout)
        if tree is not None:
            log = MetricsLog.from_arrays(tree["metrics"])
            elapsed = float(tree["elapsed_s"])
            resumed_loop = tree["loop"]
    else:
        removed = ckpts.clear()
        if rank == 0:
            # an older job of more ranks left folders this one does not write: a later
            # resume would count them as ranks of this run
            _remove_beyond(ckpts.root, size, cfg.keep)
        if removed and rank == 0:
            print(f"asapmpi: starting {cfg.label!r} afresh (no --resume): removed the old "
                  f"checkpoints under {ckpts.root}", flush=True)

    bar = ProgressBar(cfg.iters, cfg.label, metric=metric_of(cfg.model)) \
        if progress and rank == 0 else None
    with _balancer(cfg, comm, opt, data, timeout) as balancer:
        loop = _Loop(cfg, opt, model, data, log, ckpts, slow, rank, bar, balancer)
        loop.budget = budget
        if cfg.survive:
            opt.exchange.on_survival = loop.survived
            if cfg.kill_in == "shrink" and cfg.kill_rank == rank:
                # fault injection: a second death, right after the shrink of the
                # survivors' recovery from the first, while they make their exchange
                survive.after_shrink = functools.partial(
                    die, cfg, rank, "right after the shrink of its recovery, before the "
                    "survivors' exchange is made")
        if resumed_loop:
            loop.restore(resumed_loop)
        # the clocks of all ranks start together
        collectives.barrier(comm, timeout, "the start of the clocks")
        try:
            loop.run(elapsed)
        finally:
            if bar:
                bar.close()
        _maybe_die(cfg, rank, "end")
        if cfg.survive:
            # a rank that ended its iterations before it learned of a death (gossip
            # waits for no particular peer) joins the survivors' recovery here, not in
            # a collective over the dead rank below
            opt.meet("the end of the run")
        # the survivors' communicator after a failure survived (--survive), else comm
        comm = opt.comm
        averaged = _averaged(opt, model, data, comm, timeout) if cfg.average_at_end \
            else None
        logs = collectives.gather(comm, log.arrays(), timeout, "the final gather of metrics")
        # where each rank ran and the most memory it held (bench training reports both)
        places = collectives.gather(comm, (MPI.Get_processor_name(), peak_rss_bytes()),
                                    timeout, "the final gather of hosts and memory")
        balances = collectives.gather(comm, balancer.report(), timeout,
                                      "the final gather of batch sizes") \
            if balancer else None
        resumed = collectives.gather(comm, loop.resumed, timeout,
                                     "the final gather of recovery times") \
            if opt.exchange.survivals else None
    reports = comm.Get_rank() == 0          # (a survivors' communicator goes with free())

    def result() -> RunResult:
        extra = {"sync": cfg.sync, "graph": opt.exchange.graph.name,
                 "transport": opt.exchange.transport_report.get("chosen"),  # None: no window
                 "transport_reason": opt.exchange.transport_report.get("reason"),
                 "model_bytes": opt.flat.nbytes,
                 "policy_report": opt.exchange.report,
                 "hosts": [host for host, _ in places],
                 "peak_rss_bytes": [peak for _, peak in places]}
        if data.ds.about is not None:
            extra["corpus"] = data.ds.about           # which text, to compare runs by
        if cfg.survive:
            # the failures survived (this rank's records), and when each survivor ended
            # its first step mixed on the survivors' exchange (CLOCK_MONOTONIC: one
            # clock on one machine, emulated hosts included), per failure
            extra.update({"survivals": list(opt.exchange.survivals),
                          "lost_shards": cfg.lost_shards, "resumed_monotonic": resumed})
        if averaged is not None:
            extra.update({f"averaged_test_{metric_of(cfg.model).key}": averaged[0],
                          "replica_gap_max": averaged[1]})
        if balances:
            extra.update({"batch_sizes": [b["batch_size"] for b in balances],
                          "mean_batch_sizes": [b["mean_batch_size"] for b in balances],
                          "rebalances": [b["rebalances"] for b in balances],
                          "paces_s": [b["pace_s"] for b in balances],
                          "global_batch": balancer.global_batch})
        return RunResult(cfg.label, cfg.as_dict(), logs, cfg.target, extra=extra,
                         metric=metric_of(cfg.model).key)

    if reports and before_free is not None:
        before_free(result())
    _maybe_die(cfg, rank, "free")
    opt.free()
    # after free(): a death there was survived too (--survive), and the summary says so
    return result() if reports else None


def _averaged(opt, model, data: "_Data", comm: MPI.Comm, timeout: float):
    """--average-at-end (collective): every replica replaced by the mean over the ranks
    (DecentralizedOptimizer.average_replicas: one allreduce), and that model's test
    accuracy (lm: held-out loss), the same on every rank; on rank 0 also the largest
    gap of a replica's value from the mean (gathered), else None."""
    gap = opt.average_replicas()
    value = evaluate_metric(model, data)
    gaps = collectives.gather(comm, gap, timeout, "the final gather of the replicas' gaps")
    return value, (max(gaps) if gaps else None)


class _NoBalancer:
    """What the loop holds when --balance is off: nothing to measure or free."""

    def __bool__(self) -> bool:
        return False

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None


class _Balanced:
    """A Balancer over its SpeedBoard, freed (collectively) when the run ends normally."""

    def __init__(self, board: SpeedBoard, balancer: Balancer):
        self.board, self.balancer = board, balancer

    def __enter__(self) -> Balancer:
        return self.balancer

    def __exit__(self, kind, value, traceback) -> None:
        self.board.__exit__(kind, value, traceback)


def _balancer(cfg: TrainConfig, comm: MPI.Comm, opt, data: _Data, timeout: float):
    """Collective: the run's Balancer (--balance) as a context, or one that holds None.
    A parameter server computes nothing: it takes no batch and is left out; a batch never
    exceeds the smallest shard of the ranks that compute."""
    if not cfg.balance:
        return _NoBalancer()
    computes = opt.exchange.role != "server"
    board = SpeedBoard(comm, computes, timeout)
    shards = collectives.allgather(comm, len(data.shard) if computes else None, timeout,
                                   "the shard sizes of the ranks that balance")
    cap = min(m for m in shards if m is not None)
    return _Balanced(board, Balancer(board, cfg.batch_size, cfg.balance_every, cap))


def peak_rss_bytes() -> int:
    """The most resident memory this process has held so far (Linux: ru_maxrss in KB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _maybe_die(cfg: TrainConfig, rank: int, where: str) -> None:
    """Fault injection (--kill-rank R --kill-in start|end|free [--kill-signal stop]):
    die as a killed process, or stop for good (the job's end kills a stopped process
    too)."""
    if cfg.kill_rank == rank and cfg.kill_in == where:
        die(cfg, rank, "as its exchange is freed" if where == "free"
            else f"before the run's {where} collective")


def die(cfg: TrainConfig, rank: int, where: str) -> None:
    """Fault injection: this rank SIGKILLs itself (--kill-signal kill), or SIGSTOPs itself
    for good or for --stop-for seconds (a helper process sends SIGCONT), saying so first
    in one line with the time (CLOCK_MONOTONIC: benchmarks time the recovery from it)."""
    stop = cfg.kill_signal == "stop"
    what = (f"SIGSTOP for {cfg.stop_for:g} s" if cfg.stop_for else "SIGSTOP") if stop \
        else "SIGKILL"
    print(f"asapmpi: rank {rank}: fault injection: {what} {where} (CLOCK_MONOTONIC "
          f"{time.monotonic():.6f})", file=sys.stderr, flush=True)
    if stop and cfg.stop_for:
        import subprocess

        subprocess.Popen(["sh", "-c", f"sleep {cfg.stop_for}; kill -CONT {os.getpid()}"],
                         start_new_session=True)
    os.kill(os.getpid(), signal.SIGSTOP if stop else signal.SIGKILL)


class _DyingInStep:
    """The exchange's step of a rank that dies inside it (--kill-in step): its send,
    then the death, never its receive."""

    def __init__(self, exchange, cfg: TrainConfig, rank: int, iteration: int):
        self.exchange, self.cfg, self.rank, self.iteration = exchange, cfg, rank, iteration

    def __call__(self):
        self.exchange.send()
        die(self.cfg, self.rank, f"inside the exchange of iteration {self.iteration}, "
                                 f"after its send")
        del self.exchange.step                  # (--stop-for: the rank goes on)
        return self.exchange.receive()


def _agree(comm: MPI.Comm, problem: Optional[str], timeout: float, what: str) -> None:
    """Collective: raise the same ConfigError on every rank if any rank had a problem
    (NeighbourTimeoutError naming the ranks that never arrived within `timeout`)."""
    for r, p in enumerate(collectives.allgather(comm, problem, timeout, what)):
        if p:
            raise ConfigError(p if r == comm.Get_rank() else f"rank {r}: {p}")


def _load_checkpoint(cfg: TrainConfig, ckpts: CheckpointDir, comm: MPI.Comm, model,
                     opt: DecentralizedOptimizer, timeout: float) -> Optional[dict]:
    """Collective: restore every rank from the newest iteration the ranks saved, each
    from the replica the resume plan gives it (asapmpi.train.resume_plan: its own, or
    another rank's when the job that wrote them had another size or lost ranks: a
    restart after a failure), or return None (nothing saved: start afresh).  A
    checkpoint that cannot be read or was written by another configuration is a
    ConfigError on every rank."""
    rank, size = comm.Get_rank(), comm.Get_size()
    root = ckpts.root
    # each rank lists its own folder (no shared file system needed when nothing moves);
    # rank 0 also the folders of old ranks beyond this job's size (a shrink)
    mine = (os.path.isdir(ckpts.folder), resume_plan.saved_iterations(root, rank, cfg.keep))
    beyond = {r: resume_plan.saved_iterations(root, r, cfg.keep)
              for r in resume_plan.rank_folders(root) if r >= size} if rank == 0 else {}
    every = collectives.allgather(comm, (mine, beyond), timeout,
                                  "the agreement on a checkpoint to resume from")
    saved = {r: its for r, ((has, its), _) in enumerate(every) if has}
    saved.update(every[0][1])
    # the same inputs on every rank: the same plan, or the same ConfigError
    plan = resume_plan.plan(saved, size, lost_ranks(), root)
    if plan is None:
        if rank == 0:
            print(f"asapmpi: no checkpoint of {cfg.label!r} under {root}; starting from "
                  f"iteration 0", flush=True)
        return None
    source = CheckpointDir(root, plan.sources[rank], cfg.keep)
    problem, tree = None, None
    try:
        tree = source.load(plan.iteration)
        mismatch = cfg.resume_mismatch(tree["config"])
        if mismatch:
            raise ConfigError(f"the checkpoint at iteration {plan.iteration} under {root} "
                              f"{mismatch}")
        state.load_module_state(model, tree["model"])
        opt.load_state_dict({**tree["trainer"],
                             "optimizer": state.load_optimizer_state(tree["optimizer"])},
                            regroup=plan.regrouped)
        state.set_rng_state(tree["rng"]["torch"])
    except (ConfigError, KeyError, RuntimeError, ValueError) as exc:
        problem = f"cannot resume from {source.path(plan.iteration)}: {exc}"
        if plan.regrouped and not os.path.exists(source.path(plan.iteration)):
            problem += ("; a resume on other ranks reads other ranks' checkpoints: put "
                        "--out on a file system every rank sees")
    # also the barrier after which no rank reads another's folder any more
    _agree(comm, problem, timeout, "the check of every rank's checkpoint")
    # what a resumed run abandons: checkpoints newer than its start, which a later
    # restart must not mix with the resumed run's
    ckpts.drop_after(plan.iteration)
    if plan.regrouped:
        # the folders become this job's: every rank saves the replica it took as its
        # own (with this exchange's size and graph), then the old ranks beyond this
        # job's size go; a failure in between leaves whole replicas either way
        tree = {**tree, **_trainer_tree(opt)}
        ckpts.save(plan.iteration, tree)
        collectives.barrier(comm, timeout, "the saves of the regrouped replicas")
        if rank == 0:
            _remove_beyond(root, size, cfg.keep)
    if rank == 0:
        print(f"asapmpi: {cfg.label!r} resumes from iteration {plan.iteration}"
              + (f" ({plan.describe()})" if plan.regrouped else ""), flush=True)
    return tree


def lost_ranks() -> List[int]:
    """The ranks of the job before a restart that asapmpi-run's --restarts found failed
    (ASAPMPI_RESTART_LOST), or none."""
    from asapmpi.launch.restart import lost_from_environment

    return lost_from_environment()


def _remove_beyond(root: str, size: int, keep: int) -> None:
    """Remove the checkpoints of old ranks >= `size` (and their folders, when empty)."""
    for r in resume_plan.rank_folders(root):
        if r >= size:
            old = CheckpointDir(root, r, keep)
            old.clear()
            with contextlib.suppress(OSError):
                os.rmdir(old.folder)


def _trainer_tree(opt: DecentralizedOptimizer) -> dict:
    """The optimizer's part of a checkpoint tree: "trainer" and "optimizer"."""
    trainer = opt.state_dict()
    if "master" in trainer:
        trainer["master"] = trainer["master"].numpy()
    if "outer" in trainer:
        trainer["outer"] = {k: v.numpy() if torch.is_tensor(v) else v
                            for k, v in trainer["outer"].items()}
    return {"optimizer": state.optimizer_state(trainer.pop("optimizer")),
            "trainer": trainer}


class _Loop:
    """The iterations of one run, with its clocks (evaluation and checkpoint time are
    not training time), evaluations, checkpoints and the fault injector."""

    def __init__(self, cfg, opt, model, data, log, ckpts, slow, rank, bar, balancer=None):
        self.cfg, self.opt, self.model, self.data = cfg, opt, model, data
        self.log, self.ckpts, self.slow, self.rank, self.bar = log, ckpts, slow, rank, bar
        self.loss_sum, self.loss_n = 0.0, 0
        self.last_eval = (opt.iteration, 0.0)       # (iteration, training seconds)
        # recent compute seconds per sample (slowdown: a slowed rank holds its batch
        # times their median, so the hold follows a batch size that load balancing moves)
        self.computes = collections.deque(maxlen=64)
        self.steps = opt.iteration                    # optimizer steps this rank took
        self.balancer = balancer or None              # asapmpi.train.loadbalance.Balancer
        self.cursor = self.steps * cfg.batch_size     # examples drawn so far (balance)
        # the emulated host's CPU budget, entered while the clock runs (None: the process
        # stays where it was started; train's clock_budget)
        self.budget = None
        #: --survive: per failure survived, when this rank ended its first step mixed on
        #: the survivors' exchange (CLOCK_MONOTONIC); the records still waiting for it
        self.resumed: List[float] = []
        self._awaiting: List[dict] = []
        #: --kill-in checkpoint: the iteration whose checkpoint this rank dies writing
        self._dies_writing: Optional[int] = None

    def survived(self, record: dict) -> str:
        """The exchange survived a failure (--survive; called inside the step, no
        collective): the dead ranks' data shards re-split among the survivors
        (--lost-shards reassign: each loads its shard of the whole data set for the new
        size) or dropped; the text for the survivor's line."""
        self._awaiting.append(record)
        ex = self.opt.exchange
        lost = ", ".join(str(r) for r in record["failed"])
        if self.cfg.kill_in == "recovery" and self.cfg.kill_rank == self.rank:
            # fault injection: a second death, while the survivors recover from the
            # first (their exchange made, its first step not taken)
            die(self.cfg, self.rank, f"in its recovery from the failure of rank(s) {lost}")
        if not record["failed"]:
            return "data shards unchanged"
        before = len(self.data.shard)
        if self.cfg.lost_shards == "drop":
            return (f"data: the shard(s) of rank(s) {lost} dropped, {before} examples "
                    f"kept here")
        self.data.reshard(self.cfg, ex.rank, ex.size)
        return (f"data: the shard(s) of rank(s) {lost} reassigned, the whole set re-split "
                f"over {ex.size} ranks: {len(self.data.shard)} examples here (was "
                f"{before})")

    def loop_state(self) -> dict:
        """The loop's own state: the running loss and the last evaluation."""
        return {"loss_sum": self.loss_sum, "loss_n": self.loss_n,
                "last_eval": list(self.last_eval), "steps": self.steps,
                "cursor": self.cursor}

    def restore(self, state: dict) -> None:
        """Continue from state()."""
        self.loss_sum, self.loss_n = float(state["loss_sum"]), int(state["loss_n"])
        self.last_eval = tuple(state["last_eval"])
        self.steps = int(state["steps"])
        self.cursor = int(state.get("cursor", self.steps * self.cfg.batch_size))

    def now(self) -> float:
        """Training seconds so far (pauses excluded)."""
        return time.perf_counter() - self.t0

    def run(self, elapsed: float) -> None:
        """Iterate to cfg.iters, evaluating at every crossed mark; inside the emulated
        host's CPU budget, if it has one, while the clock runs."""
        self.t0 = time.perf_counter() - elapsed
        if not self.log.rows:
            self.evaluate(0)
        if self.budget:
            self.budget.enter()
        try:
            self._iterate()
        finally:
            if self.budget:
                self.budget.leave()

    def _iterate(self) -> None:
        cfg, opt = self.cfg, self.opt
        dies = cfg.kill_rank == self.rank and cfg.kill_at is not None
        kill_at = cfg.kill_at if dies else None
        for rank, at in cfg.kills:          # --kill RANK@ITER (refused with --kill-rank)
            if rank == self.rank:
                dies, kill_at = True, at
        # --kill-in step: inside the exchange of iteration kill_at + 1, after its send (in
        # parallel mode the step ends with the next iteration's send: dying after it is
        # the same)
        in_step = dies and cfg.kill_in == "step" and cfg.mode == "serial"
        # --kill-in checkpoint: inside checkpoint(), halfway through the file
        self._dies_writing = kill_at if dies and cfg.kill_in == "checkpoint" else None
        dies = dies and self._dies_writing is None
        while opt.iteration < cfg.iters:
            before = opt.iteration
            if in_step and before >= cfg.kill_at:
                dies = in_step = False
                opt.exchange.step = _DyingInStep(opt.exchange, cfg, self.rank, before + 1)
            self.one_iteration(self.steps)
            self.steps += 1
            after = opt.iteration
            while self._awaiting and opt.exchange.version > self._awaiting[0]["resumed_at"]:
                self._awaiting.pop(0)
                self.resumed.append(time.monotonic())
            if after >= cfg.iters:
                # the last evaluation gets a mark of its own when iters is not a multiple
                self.evaluate(-(-cfg.iters // cfg.eval_every))
            elif after // cfg.eval_every > before // cfg.eval_every:
                self.evaluate(after // cfg.eval_every)
            if cfg.checkpoint_every and (after // cfg.checkpoint_every
                                         > before // cfg.checkpoint_every):
                self.checkpoint()
            if dies and not in_step and after >= kill_at:
                # fault injection (resume and survive tests): die as a killed process
                # does, after the iteration (--kill-in step: inside the next exchange)
                dies = False
                die(cfg, self.rank, f"after iteration {after}")
        if not self.ckpts.iterations() or self.ckpts.iterations()[-1] != opt.iteration:
            self.checkpoint()

    def one_iteration(self, iteration: int) -> None:
        """Compute, (slowdown), Appl and the exchange (DecentralizedOptimizer.step).
        `iteration` is this rank's own step count: it picks the batch and the learning
        rate (the global iteration may jump (hop) or stand still (elastic))."""
        cfg, opt, model, balancer = self.cfg, self.opt, self.model, self.balancer
        server = opt.exchange.role == "server"
        if balancer:
            # the size of this step (publishes this rank's pace and re-balances on
            # schedule); a server takes no batch
            size = balancer.before_step(iteration)
            if not server:
                x, y = self.data.batch(cfg, iteration, self.rank, (self.cursor, size))
                self.cursor += size
        else:
            x, y = self.data.batch(cfg, iteration, self.rank)
        lr = learning_rate(cfg, iteration)
        for group in opt.param_groups:
            group["lr"] = lr
        if server:
            opt.step()          # a parameter server computes nothing: it averages
            return
        started = time.perf_counter()
        opt.zero_grad()
        loss = model.loss(model(x), y)
        # samples-weighted averaging: this rank's mean gradient counts b_i / B in the
        # replicas' average, not 1 / n (asapmpi.train.loadbalance)
        (loss * balancer.loss_scale if balancer else loss).backward()
        self.computes.append((time.perf_counter() - started) / len(y))
        factor = self.slow.factor_for(self.rank, iteration + 1)
        if factor > 1.0:
            # a slowed worker computes `factor` times as long as it usually does: the
            # median of recent computes, not this one, which a context switch on an
            # oversubscribed host may have stretched already; busy, not asleep
            # (slowdown.hold)
            hold(statistics.median(self.computes) * len(y) * (factor - 1.0))
        if balancer:
            # the pace balancing sees includes the hold, as a slow host's compute would
            balancer.record(time.perf_counter() - started, len(y))
        opt.step()
        self.loss_sum += float(loss.detach())
        self.loss_n += 1

    def _paused(self, work) -> None:
        start = time.perf_counter()
        with self.budget.paused() if self.budget else contextlib.nullcontext():
            work()
        self.t0 += time.perf_counter() - start

    def evaluate(self, mark: int) -> None:
        """Test accuracy (lm: held-out loss) of this replica; a metrics row; the
        progress bar."""
        def work():
            acc = evaluate_metric(self.model, self.data)
            t, it = self.now(), self.opt.iteration
            it0, t_prev = self.last_eval
            rate = (it - it0) / (t - t_prev) if t > t_prev else 0.0
            loss = self.loss_sum / self.loss_n if self.loss_n else float("nan")
            self.log.add(mark, it, t, loss, acc, rate, self.opt.exchange.bytes_sent,
                         self.opt.exchange.wait_seconds)
            self.loss_sum, self.loss_n = 0.0, 0
            self.last_eval = (it, t)
            if self.bar:
                self.bar.update(it, it / t if t > 0 else 0.0, loss, acc,
                                force=it >= self.cfg.iters)
        self._paused(work)

    def checkpoint(self) -> None:
        """This rank's model, optimizer and exchange state, iteration, RNG and metrics."""
        def work():
            tree = {"model": state.module_state(self.model),
                    **_trainer_tree(self.opt),
                    "rng": {"torch": state.rng_state()},
                    "metrics": self.log.arrays(),
                    "loop": self.loop_state(),
                    "elapsed_s": self.now(),
                    "iteration": self.opt.iteration,
                    "config": self.cfg.as_dict()}
            iteration = self.opt.iteration
            midway = None
            if self._dies_writing == iteration:
                def midway():
                    die(self.cfg, self.rank,
                        f"halfway through writing its checkpoint of iteration {iteration}")
            self.ckpts.save(iteration, tree, midway)
        self._paused(work)
