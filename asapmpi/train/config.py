"""A training run's configuration, checked before any communication, and the run specs
of --compare ("POLICY[@GRAPH][:OPTION=VALUE...]")."""
from __future__ import annotations

import math
import os
import re
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Dict, List, Optional, Tuple

from ..errors import ConfigError
from ..options import Option, Options
from ..outer import OPTIONS as OUTER_OPTIONS
from ..outer import policy_refusal
from ..outer import resolve as resolve_outer
from ..reduce.graphs import GRAPHS
from ..sync import POLICIES
from ..sync import policy as make_policy
from ..sync.spec import parse_options
from ..transports import TRANSPORTS
from .loadbalance import DEFAULT_EVERY, check_every
from .loadbalance import check as check_balance
from .metric import metric_of

MODELS = ("svm", "cnn", "mlp", "lm")
OPTIMIZERS = ("sgd", "momentum", "adam")
MODES = ("serial", "parallel")
#: the language model's default target: a held-out loss (nats/char) that allreduce every
#: step reached at two thirds of a 400-iteration run on 4 ranks at the defaults (2.30 at
#: iteration 260, 2.22 at the end; seed 0, measured on a shared 2-core machine)
LM_TARGET = 2.3
#: the parameters' element types a demo trains in
DTYPES = ("float32", "bfloat16", "float16")
#: what each demo trains on by default, and its learning rate and target (test accuracy;
#: the language model's: held-out loss in nats per character, lower is better)
DEFAULTS = {
    "svm": {"data": "synthetic-svm", "lr": 0.5, "optimizer": "sgd", "target": 0.90,
            "batch_size": 32},
    "cnn": {"data": "digits", "lr": 0.05, "optimizer": "momentum", "target": 0.90,
            "batch_size": 32},
    "mlp": {"data": "synthetic-svm", "lr": 0.05, "optimizer": "momentum", "target": 0.88,
            "batch_size": 256},
    "lm": {"data": "stdlib", "lr": 3e-3, "optimizer": "adam", "target": LM_TARGET,
           "batch_size": 32, "width": 64, "layers": 2, "heads": 4, "context": 64},
}
#: the sizes of the models that have them (--width: the MLP's hidden units, the language
#: model's width; --layers, --heads, --context: the language model's only)
SIZE_DEFAULTS = {"width": 512}
LM_SIZES = ("layers", "heads", "context")
#: what a dataset changes of its demo's defaults.  synthetic-rcv1: bigger steps (its
#: weights of a million features each see few rows), and a target near the plateau its
#: runs of a few thousand iterations reach (pass --iters 4000 or so)
DATA_DEFAULTS = {
    "synthetic-rcv1": {"lr": 4.0, "target": 0.885},
}
#: policies a user may train with: every one offered by name
TRAINABLE = tuple(sorted(POLICIES))


#: options of a run spec that belong to the trainer, not to the policy: the policy object
#: and its Exchange never see them (load balancing: asapmpi.train.loadbalance; the outer
#: optimizer: asapmpi.outer, "allreduce:outer=diloco:local_steps=20"; the parameters'
#: element type, "notify_ack:dtype=bfloat16"), declared and parsed as a policy's are
#: (asapmpi.options)
TRAINER = Options(
    Option("balance", bool, False, "load balancing of minibatch sizes (LB-BSP)"),
    Option("balance_every", int, DEFAULT_EVERY, "own steps between re-balances", low=1),
    Option("transport", str, "auto", "the Exchange's transport", choices=TRANSPORTS),
    Option("dtype", str, "float32", "the parameters' element type", choices=DTYPES),
    *OUTER_OPTIONS,
)
TRAINER_OPTIONS = tuple(o.name for o in TRAINER)


def parse_run_spec(spec: str, default_graph: str) -> Tuple[str, str, Dict[str, Any], str]:
    """"hop@ring:backup=1:max_gap=3" -> ("hop", "ring", {"backup": 1, "max_gap": 3},
    label).  The graph defaults to `default_graph`.  The trainer's options (balance=1,
    balance_every=K) are checked and left out of the policy's options: see parse_run."""
    sync, graph, options, _, label = parse_run(spec, default_graph)
    return sync, graph, options, label


def parse_run(spec: str, default_graph: str
              ) -> Tuple[str, str, Dict[str, Any], Dict[str, Any], str]:
    """"allreduce:balance=1" -> (sync, graph, policy options, trainer options (the
    TrainConfig fields they set: {"balance": True}), label); the label stays as written."""
    text = spec.strip()
    if not text:
        raise ConfigError("an empty run in --compare; write POLICY[@GRAPH][:OPTION=VALUE]")
    head, *opts = text.split(":")
    sync, _, graph = head.partition("@")
    if sync not in TRAINABLE:
        raise ConfigError(f"unknown sync policy {sync!r} in {spec!r}; choose one of "
                          f"{list(TRAINABLE)}")
    if graph and graph not in GRAPHS:
        raise ConfigError(f"unknown graph {graph!r} in {spec!r}; choose one of "
                          f"{sorted(GRAPHS)}")
    policy_options, trainer = split_options(parse_options(opts, f"in {spec!r}"),
                                            f"in {spec!r}")
    return sync, graph or default_graph, policy_options, trainer, text


def split_options(options: Dict[str, Any], where: str
                  ) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """{"backup": 1, "balance": 1} -> ({"backup": 1}, {"balance": True}): the policy's
    options and the trainer's (TRAINER_OPTIONS, as TrainConfig fields), checked."""
    policy_options = {k: v for k, v in options.items() if k not in TRAINER_OPTIONS}
    trainer = TRAINER.parse("train", {k: v for k, v in options.items()
                                      if k in TRAINER_OPTIONS}, defaults=False, where=where)
    return policy_options, trainer


#: settings a resumed run may change (everything else must match the checkpoint)
RESUMABLE_CHANGES = frozenset({"iters", "resume", "kill_rank", "kill_at", "kill_in", "kills",
                               "kill_signal", "stop_for", "survive", "lost_shards", "out",
                               "average_at_end",
                               "threads", "timeout", "eval_every",
                               "checkpoint_every", "keep", "target", "device"})

#: where --kill-in kills the rank: just before the run's first (start) or last (end)
#: collective (fault injection for the tests of their deadlines), (step, with
#: --kill-at K) inside the exchange of iteration K + 1, after its send and before its
#: receive: its out-neighbours may hold its last model, it never takes theirs,
#: (checkpoint, with --kill-at K) halfway through writing its checkpoint of iteration K,
#: (free) at the end, as the exchange is freed, after the final gathers, or (with
#: --survive and another rank's --kill) in its recovery from that failure: (shrink)
#: right after the shrink, while the survivors make their exchange, or (recovery) once
#: that exchange is made and before its first step on it
KILL_POINTS = (None, "start", "end", "step", "checkpoint", "free", "shrink", "recovery")
#: --lost-shards: what the survivors of --survive do with a dead rank's data shard
LOST_SHARDS = ("reassign", "drop")
#: the policies whose exchange survives a dead rank in place (asapmpi.exchange.survive,
#: tested with the trainer: tests/train/test_survive_train.py)
SURVIVING_POLICIES = ("notify_ack", "hop", "gossip", "backup_ps")
#: how --kill-in ends the rank: SIGKILL (dead: the launcher may end the job itself) or
#: SIGSTOP (alive but silent forever: only the others' deadlines can end the job)
KILL_SIGNALS = ("kill", "stop")


@dataclass
class TrainConfig:
    """Everything one training run needs (see `asapmpi train --help`)."""

    model: str = "svm"
    data: Optional[str] = None
    test_data: Optional[str] = None
    data_options: Dict[str, Any] = field(default_factory=dict)
    sync: str = "notify_ack"
    graph: str = "root-expander"
    policy_options: Dict[str, Any] = field(default_factory=dict)
    label: str = ""
    period: int = 1
    mode: str = "serial"
    iters: int = 400
    batch_size: Optional[int] = None
    lr: Optional[float] = None
    lam: float = 1e-4
    optimizer: Optional[str] = None
    eval_every: int = 20
    target: Optional[float] = None
    seed: int = 0
    checkpoint_every: int = 0
    keep: int = 2
    out: str = "asapmpi-runs"
    resume: bool = False
    timeout: Optional[float] = None
    slowdown: str = "none"
    slow_factor: float = 6.0
    slow_probability: float = 0.0
    slow_ranks: Tuple[int, ...] = ()
    threads: int = 0
    #: where the model computes: "cpu", or "cuda" / "cuda:N" (the Exchange stages the
    #: parameters through pinned host memory: asapmpi.device)
    device: str = "cpu"
    #: the model's parameters' element type: float32, bfloat16 or float16 (exchanged as
    #: they are, reduced in float32: asapmpi.dtypes)
    dtype: str = "float32"
    #: the MLP's hidden units (default 512), the language model's width (default 64)
    width: Optional[int] = None
    #: the language model's blocks, attention heads and context in characters
    #: (defaults 2, 4, 64; refused for the other models)
    layers: Optional[int] = None
    heads: Optional[int] = None
    context: Optional[int] = None
    kill_rank: Optional[int] = None
    kill_at: Optional[int] = None
    kill_in: Optional[str] = None
    #: --kill RANK@ITER: (rank, iteration) pairs, each rank dying after its iteration
    #: (several ranks; instead of kill_rank/kill_at)
    kills: Tuple[Tuple[int, int], ...] = ()
    kill_signal: str = "kill"
    #: --kill-signal stop: SIGCONT after this many seconds (0: stopped for good)
    stop_for: float = 0.0
    #: survive a dead rank in place (ULFM: Open MPI 5; asapmpi.exchange.survive): the
    #: survivors shrink the graph and go on; a lost rank's data shard is re-split among
    #: them (lost_shards "reassign") or dropped ("drop")
    survive: bool = False
    lost_shards: str = "reassign"
    #: after the last iteration, average the replicas (one allreduce:
    #: DecentralizedOptimizer.average_replicas) and evaluate that model too
    #: (averaged_test_<metric> in the summary, with the largest gap of a replica from it)
    average_at_end: bool = False
    #: load balancing (LB-BSP): per-rank batch sizes from measured paces, re-balanced
    #: every `balance_every` own steps (asapmpi.train.loadbalance); a trainer option on every
    #: policy, never passed to the policy
    balance: bool = False
    balance_every: int = 20
    #: the Exchange's transport (transport=FAMILY in a run spec): "auto" measures the
    #: candidates at creation and takes the faster (Exchange's docstring)
    transport: str = "auto"
    #: local steps with an outer optimizer (--outer diloco --local-steps H, or
    #: outer=diloco:local_steps=H in a run spec; asapmpi.outer, docs/LOWCOMM.md): the
    #: exchange every H steps, then an outer Nesterov step.  Resolved, period is H
    outer: Optional[str] = None
    local_steps: Optional[int] = None
    outer_lr: Optional[float] = None
    outer_momentum: Optional[float] = None

    def resolved(self) -> "TrainConfig":
        """Defaults of the chosen demo filled in, every field checked (ConfigError)."""
        if self.model not in MODELS:
            raise ConfigError(f"unknown model {self.model!r}; choose one of {MODELS}")
        d = DEFAULTS[self.model]
        d = {**d, **DATA_DEFAULTS.get(self.data or d["data"], {})}
        given = [name for name in LM_SIZES if getattr(self, name) is not None]
        if self.model != "lm" and given:
            raise ConfigError(f"--{given[0]} sizes the lm demo, not {self.model}; drop it")
        sizes = {name: d.get(name) if getattr(self, name) is None else getattr(self, name)
                 for name in LM_SIZES}
        cfg = replace(self, data=self.data or d["data"], lr=d["lr"] if self.lr is None
                      else self.lr, optimizer=self.optimizer or d["optimizer"],
                      target=d["target"] if self.target is None else self.target,
                      batch_size=d["batch_size"] if self.batch_size is None
                      else self.batch_size,
                      width=d.get("width", SIZE_DEFAULTS["width"]) if self.width is None
                      else self.width,
                      label=self.label or self.sync, **sizes)
        settings, _ = cfg._outer()
        if settings is not None:
            cfg = replace(cfg, period=settings.local_steps, local_steps=settings.local_steps,
                          outer_lr=settings.lr, outer_momentum=settings.momentum)
        cfg.check()
        return cfg

    def _outer(self):
        # --period's default (1) cannot be told from a --period 1 given: only another
        # period counts as given (it must then equal --local-steps)
        return resolve_outer(self.outer, self.local_steps,
                             None if self.period == 1 else self.period, self.outer_lr,
                             self.outer_momentum, "asapmpi train")

    def check(self) -> None:
        """Refuse bad values with a message that says what to change."""
        for name in ("iters", "eval_every", "period", "batch_size", "keep", "width",
                     *(LM_SIZES if self.model == "lm" else ())):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be an integer >= 1, "
                                  f"got {value!r}")
        if self.checkpoint_every < 0:
            raise ConfigError(f"--checkpoint-every must be >= 0 (0: only at the end), got "
                              f"{self.checkpoint_every}")
        for name in ("lr", "lam"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ConfigError(f"--{name} must be a finite number >= 0, got {value!r}")
        metric_of(self.model).check_target(self.target)
        if self.model == "lm":
            self._check_lm()
        elif self.data == "stdlib":
            raise ConfigError(f"--data stdlib is text for the lm demo; leave --data out "
                              f"for {self.model} (default {DEFAULTS[self.model]['data']})")
        if self.optimizer not in OPTIMIZERS:
            raise ConfigError(f"unknown optimizer {self.optimizer!r}; choose one of "
                              f"{OPTIMIZERS}")
        if self.mode not in MODES:
            raise ConfigError(f"--mode must be one of {MODES}, got {self.mode!r}")
        if self.sync not in TRAINABLE:
            raise ConfigError(f"unknown sync policy {self.sync!r}; choose one of "
                              f"{list(TRAINABLE)}")
        if self.graph not in GRAPHS:
            raise ConfigError(f"unknown graph {self.graph!r}; choose one of {sorted(GRAPHS)}")
        make_policy(self.sync, **self.policy_options)    # option names and values
        for key in ("rank", "size"):
            if key in self.data_options:
                raise ConfigError(f"--data-option {key}: every rank loads its own shard of "
                                  f"the job's ranks; drop the option")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError(f"--seed must be an integer >= 0, got {self.seed!r}")
        if self.policy_options.get("skip_trigger") is not None and (
                self.checkpoint_every or self.resume):
            raise ConfigError("checkpoints need every rank to pass the same iterations, "
                              "but hop's skip_trigger lets ranks jump over them; drop "
                              "--checkpoint-every/--resume or skip_trigger")
        if self._outer()[0] is not None and policy_refusal(POLICIES[self.sync], self.sync):
            raise ConfigError(f"--outer {self.outer}: "
                              f"{policy_refusal(POLICIES[self.sync], self.sync)}")
        if self.sync in ("backup_ps", "elastic") and (self.mode != "serial"
                                                       or self.period != 1):
            raise ConfigError(f"{self.sync} runs the serial computation graph and decides "
                              f"when workers synchronize; drop --mode/--period")
        if self.kill_in not in KILL_POINTS:
            raise ConfigError(f"--kill-in must be one of {KILL_POINTS[1:]}, got "
                              f"{self.kill_in!r}")
        if self.kill_signal not in KILL_SIGNALS:
            raise ConfigError(f"--kill-signal must be one of {KILL_SIGNALS}, got "
                              f"{self.kill_signal!r}")
        if (self.kill_in is not None or self.kill_at is not None) and self.kill_rank is None:
            raise ConfigError("--kill-at/--kill-in need --kill-rank (which rank dies)")
        if self.kill_in in ("shrink", "recovery"):
            if not (self.survive and self.kills) or self.kill_at is not None \
                    or self.kill_rank in [r for r, _ in self.kills]:
                raise ConfigError(f"--kill-in {self.kill_in} kills --kill-rank R in its "
                                  "recovery from another rank's death: add --survive and "
                                  "--kill RANK@ITER for that death (another rank than R), "
                                  "no --kill-at")
        elif self.kills and self.kill_rank is not None:
            raise ConfigError("--kill RANK@ITER names every rank that dies: drop "
                              "--kill-rank/--kill-at or --kill")
        doomed = [r for r, _ in self.kills]
        if len(set(doomed)) != len(doomed) or any(r < 0 or k < 0 for r, k in self.kills):
            raise ConfigError(f"--kill: each rank at most once, ranks and iterations >= 0; "
                              f"got {', '.join(f'{r}@{k}' for r, k in self.kills)}")
        if not (isinstance(self.stop_for, (int, float)) and math.isfinite(self.stop_for)
                and self.stop_for >= 0):
            raise ConfigError(f"--stop-for must be a number of seconds >= 0, got "
                              f"{self.stop_for!r}")
        if self.stop_for and self.kill_signal != "stop":
            raise ConfigError("--stop-for continues a rank stopped by --kill-signal stop; "
                              "add it or drop --stop-for")
        if self.kill_in == "step" and self.kill_at is None:
            raise ConfigError("--kill-in step needs --kill-at K (the rank dies inside the "
                              "exchange of iteration K + 1)")
        if self.kill_in == "checkpoint" and not (
                self.kill_at is not None and self.checkpoint_every
                and 1 <= self.kill_at <= self.iters
                and (self.kill_at % self.checkpoint_every == 0 or self.kill_at == self.iters)):
            # (no checkpoint is written at 0 or past --iters: the rank would never die)
            raise ConfigError("--kill-in checkpoint needs --checkpoint-every N and --kill-at "
                              "K, a multiple of N or --iters, 1 <= K <= --iters (the rank "
                              "dies writing its checkpoint of iteration K)")
        self._check_survive()
        check_every(self.balance_every, "(--balance-every)")
        if self.balance:
            check_balance(self.batch_size, self.balance_every)
        if self.threads < 0:
            raise ConfigError(f"--threads must be >= 0 (0: cores / ranks on the host), got "
                              f"{self.threads}")
        if not re.fullmatch(r"cpu|cuda(:[0-9]+)?", self.device):
            raise ConfigError(f"--device must be cpu, cuda or cuda:N, got {self.device!r}")
        if self.dtype not in DTYPES:
            raise ConfigError(f"--dtype must be one of {', '.join(DTYPES)}, got "
                              f"{self.dtype!r}")

    def _check_survive(self) -> None:
        """--survive's options, and the settings it cannot carry over a failure."""
        if self.lost_shards not in LOST_SHARDS:
            raise ConfigError(f"--lost-shards must be one of {', '.join(LOST_SHARDS)}, got "
                              f"{self.lost_shards!r}")
        if not self.survive:
            return
        cannot = None
        if self.sync not in SURVIVING_POLICIES:
            cannot = (f"--sync {self.sync} (the policies that survive: "
                      f"{', '.join(SURVIVING_POLICIES)})")
        elif self.device != "cpu":
            cannot = f"--device {self.device} (a model on a device)"
        elif self.balance:
            cannot = "--balance (its speed board spans every rank)"
        elif self.outer is not None:
            cannot = f"--outer {self.outer} (its rounds are not carried over)"
        elif self.kill_in in ("start", "end"):
            cannot = (f"--kill-in {self.kill_in} (the run's {self.kill_in} collective "
                      f"spans every rank: a death there ends the job)")
        if cannot:
            raise ConfigError(f"--survive cannot carry {cannot} over a failure; drop one "
                              f"of them")

    def _check_lm(self) -> None:
        """The language model's sizes fit together and its data is text."""
        if self.width % self.heads:
            raise ConfigError(f"--width {self.width} is not a multiple of --heads "
                              f"{self.heads}: every head gets width / heads dimensions")
        if self.context < 2:
            raise ConfigError(f"--context must be at least 2 characters, got "
                              f"{self.context}")
        if "context" in self.data_options:
            raise ConfigError("--data-option context: the lm demo's windows are --context "
                              "characters; pass --context instead")
        if self.data != "stdlib":
            raise ConfigError(f"the lm demo trains on text: --data stdlib (the default), "
                              f"not {self.data!r}")

    def run_label(self) -> str:
        """A folder-safe name of this run's checkpoints: the model and the label."""
        return "".join(c if c.isalnum() or c in "-_=." else "_"
                       for c in f"{self.model}-{self.label}")

    def checkpoint_root(self) -> str:
        """The folder of this run's checkpoints (one subfolder per rank)."""
        return os.path.join(self.out, "checkpoints", self.run_label())

    def resume_mismatch(self, saved: Dict[str, Any]) -> Optional[str]:
        """Why a checkpoint written with configuration `saved` cannot be resumed by this
        run ("was written with lr=0.5, this run has lr=0.25; ..."), or None."""
        mine = self.as_dict()
        for key in sorted(set(saved) | set(mine)):
            if key not in RESUMABLE_CHANGES and saved.get(key) != mine.get(key):
                return (f"was written with {key}={saved.get(key)!r}, this run has "
                        f"{key}={mine.get(key)!r}; resume with the same settings or "
                        f"write to another --out")
        return None

    def as_dict(self) -> Dict[str, Any]:
        """JSON-friendly copy (for HDF5 attributes and the summary)."""
        out = asdict(self)
        out["slow_ranks"] = list(self.slow_ranks)
        return out


def runs_from(base: TrainConfig, compare: Optional[str]) -> List[TrainConfig]:
    """The runs of a command: the base configuration, or one per --compare spec."""
    if not compare:
        return [base.resolved()]
    runs, labels = [], set()
    for spec in compare.split(","):
        sync, graph, options, trainer, label = parse_run(spec, base.graph)
        if label in labels:
            raise ConfigError(f"--compare lists {label!r} twice")
        labels.add(label)
        runs.append(replace(base, sync=sync, graph=graph, policy_options=options,
                            label=label, **trainer).resolved())
    return runs
