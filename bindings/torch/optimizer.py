"""DecentralizedOptimizer: any torch.optim optimizer plus an asapmpi Exchange.

    opt = DecentralizedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1,
                                                 momentum=0.9),
                                 graph="root-expander", sync="notify_ack", period=1,
                                 model=model)
    sched = torch.optim.lr_scheduler.StepLR(opt, 10)   # the wrapper is an Optimizer
    for x, y in batches:
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()            # apply the gradients, and every `period` steps mix the
                              # parameters (and the model's buffers) with the neighbours'
        sched.step()

The optimizer's trainable parameters (and, with model= and buffers="mix", the model's
floating-point buffers) are moved into one flat buffer (FlatParameters) that the
Exchange sends from and reduces into, zero-copy.  On one host the Exchange is
double-buffered: the parameters live in its shared memory and move between its two
buffers at every mix (no copy at all); `free()` brings them back to private memory.

Buffers (model.buffers(), given model=):

- "mix" (default): floating-point buffers (BatchNorm's running statistics) are mixed
  with the parameters; the others (num_batches_tracked) take rank 0's values at every
  mix under the policies whose ranks mix in lockstep (LOCKSTEP), else at the start only;
- "broadcast": every buffer takes rank 0's values at every mix (LOCKSTEP policies only);
- "local": buffers are left alone.

Frozen parameters (requires_grad=False) are not exchanged: they take rank 0's values at
the start (with broadcast=True) and no step changes them.  Tied parameters (one
Parameter used by two modules) are exchanged once and stay tied.

Two computation graphs (Hop section 3.2):

- serial (default): Compute, Appl, Send, Rec, Reduce: gradients are computed on and
  applied to the same parameters;
- parallel: Send at the start of an iteration, Compute on the same parameters, then Rec,
  Reduce, and Appl the gradients to the reduced parameters: the neighbours' transfers
  overlap the compute, at the price of gradients computed on pre-reduce parameters.

Local steps with an outer optimizer (DiLoCo; NoLoCo-like over gossip and sparse graphs),
docs/LOWCOMM.md:

    opt = DecentralizedOptimizer(torch.optim.AdamW(model.parameters(), lr=1e-3),
                                 sync="allreduce", outer="diloco", local_steps=50,
                                 outer_lr=0.7, outer_momentum=0.9, model=model)

The wrapped optimizer takes 50 local steps; then the exchange mixes the weights (as
period=50 does) and an outer Nesterov step moves the round's start weights along the
mixed pseudo-gradient (bindings/torch/outer.py); the next round starts there.
"""
from __future__ import annotations

import contextlib
from collections import OrderedDict
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple

import numpy as np
import torch
from mpi4py import MPI

import asapmpi
from asapmpi.errors import ConfigError
from asapmpi.outer import policy_refusal
from asapmpi.outer import resolve as resolve_outer

from .flat import FlatParameters, PackedTensors, common_device, host_bcast
from .master import MasterWeights, wants_masters
from .outer import OuterOptimizer
from .paramset import ParameterSet

MODES = ("serial", "parallel")
BUFFERS = ("mix", "broadcast", "local")
#: policies whose ranks all mix at the same iterations, so that a broadcast from rank 0 at
#: every mix costs no waiting the exchange does not already do (hop, async, gossip and
#: the parameter servers let ranks drift apart: a collective per mix would undo that)
LOCKSTEP = tuple(name for name, cls in asapmpi.sync.POLICIES.items() if cls.lockstep)
#: optimizer steps between two checks that the parameters still live in the buffer
CHECK_EVERY = 64


def _no_step(closure=None):
    return None


def broadcast_parameters(flat: FlatParameters, comm: Optional[MPI.Comm] = None,
                         root: int = 0) -> None:
    """Give every rank `root`'s parameters (one MPI_Bcast of the flat buffer; on a CUDA
    device through one host copy)."""
    comm = MPI.COMM_WORLD if comm is None else comm
    host_bcast(flat.tensor, comm, root)


def _split(optimizer: torch.optim.Optimizer, model: Optional[torch.nn.Module],
           buffers: str) -> Tuple[List, List, List, List]:
    """(trainable parameters, frozen parameters, buffers to mix, buffers to broadcast)."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    trainable = [p for p in params if p.requires_grad]
    # frozen parameters are often left out of the optimizer: the model has them all
    extra = [] if model is None else list(model.parameters())
    known = {id(p) for p in params}
    astray = [tuple(p.shape) for p in extra if p.requires_grad and id(p) not in known]
    if astray:
        raise ConfigError(f"the model's parameters of shapes {astray} require gradients "
                          f"but are in no parameter group of the optimizer, so nothing "
                          f"would keep them equal across ranks; add them to the optimizer "
                          f"or call requires_grad_(False) on them")
    frozen = list({id(p): p for p in params + extra if not p.requires_grad}.values())
    found = [] if model is None or buffers == "local" else list(model.buffers())
    if buffers == "mix":
        mixed = [b for b in found if b.is_floating_point()]
        return trainable, frozen, mixed, [b for b in found if not b.is_floating_point()]
    return trainable, frozen, [], found


def _bcast_tensor(t: torch.Tensor, comm: MPI.Comm, root: int = 0) -> None:
    """MPI_Bcast one tensor of any dtype and device, in place, as bytes."""
    with torch.no_grad():
        dense = t.detach().contiguous()
        host_bcast(dense, comm, root)
        if dense.data_ptr() != t.data_ptr():
            t.copy_(dense)


def _shared(name: str, doc: str) -> property:
    """A property reading and writing the wrapped optimizer's attribute `name`."""
    return property(lambda self: getattr(self.optimizer, name),
                    lambda self, value: setattr(self.optimizer, name, value), doc=doc)


class DecentralizedOptimizer(torch.optim.Optimizer):
    """Wrap `optimizer` so that its step also mixes the parameters over an Exchange.

    optimizer: any torch.optim.Optimizer; its trainable parameters (all groups) are
        exchanged.
    graph, sync, weights, timeout, checksum, policy options: as asapmpi.Exchange.
        sync="backup_ps": the server rank only averages (its optimizer never steps);
        the workers' steps are averaged at the server.
    fault_tolerance: as asapmpi.Exchange (Open MPI 5 under mpiexec --with-ft ulfm): a
        dead rank is survived in place, and this optimizer goes on on the survivors'
        communicator (`comm` afterwards; average_replicas() averages over them).  The
        default double_buffer is then False (not carried over a failure yet).
    period: mix every `period` optimizer steps (default 1: every step).
    outer: "diloco" for local steps with an outer optimizer (module docstring,
        docs/LOWCOMM.md): every `local_steps` steps the exchange mixes the weights,
        then a Nesterov step (`outer_lr`, default 0.7; `outer_momentum`, default 0.9)
        on the mixed pseudo-gradient (the round's start weights minus the mixed ones)
        gives the next round's start.  Over allreduce this is DiLoCo; over gossip,
        one peer or an expander graph it is NoLoCo-like (the mixing keeps the replicas
        together, the outer step acts on the neighbours' mean pseudo-gradient).  Not
        with elastic or backup_ps (a server rank that only averages).  `self.outer`
        holds its state (OuterOptimizer), state_dict() keeps it.
    local_steps: the inner steps per round (H) with outer; it is the period (pass
        period= alone or the same value).
    mode: "serial" or "parallel" (module docstring).
    broadcast: start every rank from rank 0's parameters and buffers (default True).
    comm: the communicator (default COMM_WORLD).
    model: the module the parameters belong to: its buffers are handled as `buffers`
        says and its frozen parameters broadcast at the start.
    buffers: "mix" (default), "broadcast" or "local" (module docstring).
    double_buffer: as asapmpi.Exchange (default True here for a model on the CPU: the
        parameters' storage alternates between the exchange's two buffers; the Parameter
        objects stay).  A model on a CUDA device keeps its flat buffer there, staged by
        the Exchange through pinned host memory (asapmpi.device).
    master_weights: step the wrapped optimizer on float32 copies of bfloat16 or float16
        parameters (bindings/torch/master.py): the model and the exchange keep the
        16-bit values, no update is rounded away.  Default: on for 16-bit parameters;
        False exchanges and updates them as they are.

    It is a torch.optim.Optimizer whose `param_groups`, `state` and `defaults` are the
    wrapped optimizer's (the same objects): learning-rate schedulers and gradient
    scalers take the wrapper itself.  With a GradScaler, a step whose gradients hold
    inf or NaN skips this rank's update but not its mix (its neighbours wait for every
    mix), as GradScaler's contract for optimizers with `_step_supports_amp_scaling`
    allows.  Creating, freeing and the first step are collective.
    `iteration` counts optimizer steps, including those a Hop worker skipped when it
    jumped ahead.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, graph=None,
                 sync: str = "notify_ack", *, period: Optional[int] = None,
                 mode: str = "serial", broadcast: bool = True,
                 comm: Optional[MPI.Comm] = None, model: Optional[torch.nn.Module] = None,
                 buffers: str = "mix", master_weights: Optional[bool] = None,
                 outer: Optional[str] = None, local_steps: Optional[int] = None,
                 outer_lr: Optional[float] = None, outer_momentum: Optional[float] = None,
                 **exchange_options):
        if isinstance(optimizer, DecentralizedOptimizer):
            raise ConfigError("optimizer is a DecentralizedOptimizer already; wrap the "
                              "plain torch.optim optimizer once")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise ConfigError(f"optimizer must be a torch.optim.Optimizer, got "
                              f"{type(optimizer).__name__}")
        outer_settings, period = resolve_outer(outer, local_steps, period, outer_lr,
                                               outer_momentum, "DecentralizedOptimizer")
        period = 1 if period is None else period
        if isinstance(period, bool) or not isinstance(period, int) or period < 1:
            raise ConfigError(f"period must be an integer >= 1, got {period!r}")
        if mode not in MODES:
            raise ConfigError(f"mode must be one of {MODES}, got {mode!r}")
        if buffers not in BUFFERS:
            raise ConfigError(f"buffers must be one of {BUFFERS}, got {buffers!r}")
        if model is not None and not isinstance(model, torch.nn.Module):
            raise ConfigError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        self._init_hooks()
        self.optimizer = optimizer
        self.period = period
        self.mode = mode
        self.buffers = buffers
        self.comm = MPI.COMM_WORLD if comm is None else comm
        problem, layout = None, None
        # the policy's name, also when sync is written with its options ("hop:backup=1")
        name = sync.split(":", 1)[0] if isinstance(sync, str) else getattr(sync, "name", sync)
        try:
            trainable, self.frozen, mixed, side = _split(optimizer, model, buffers)
            if mixed and mode == "parallel":
                raise ConfigError("mode='parallel' computes while the buffer is being sent, "
                                  "and a forward pass in train mode writes the model's "
                                  "buffers (BatchNorm statistics): pass buffers='broadcast' "
                                  "or 'local', or mode='serial'")
            if buffers == "broadcast" and side and name not in LOCKSTEP:
                raise ConfigError(f"buffers='broadcast' is a collective at every mix, which "
                                  f"sync={sync!r} lets ranks reach at different times; use "
                                  f"buffers='mix' or 'local', or sync in {LOCKSTEP}")
            common_device(self.frozen, "frozen parameters")
            policy = asapmpi.sync.POLICIES.get(name) if isinstance(name, str) else None
            refusal = policy_refusal(policy, sync) if outer_settings else None
            if refusal:
                raise ConfigError(f"outer={outer!r}: {refusal}")
            if getattr(policy, "global_iterations", False) and (period, mode) != (1, "serial"):
                raise ConfigError(f"sync={sync!r} decides itself when each worker "
                                  f"synchronizes: use period=1 and mode='serial'")
            self.flat = FlatParameters(trainable, mixed)
            masters = wants_masters(master_weights, self.flat, optimizer)
            self.side = PackedTensors(side)
            layout = (self.side.nbytes, [tuple(p.shape) for p in self.frozen])
        except ConfigError as exc:
            problem = str(exc)
        # one rank's bad parameters or a period that differs across ranks must fail on
        # every rank, before the Exchange's own collective checks could wait for it
        outer_key = outer_settings.key() if outer_settings else None
        seen = self.comm.allgather((problem, period, mode, buffers, outer_key, layout))
        for r, (p, *_) in enumerate(seen):
            if p:
                raise ConfigError(p if r == self.comm.Get_rank() else f"rank {r}: {p}")
        if len({tuple(row[1:5]) for row in seen}) > 1:
            shown = ", ".join(f"rank {r}: period={per} mode={m} buffers={b} outer={o}"
                              for r, (_, per, m, b, o, _) in enumerate(seen))
            raise ConfigError(f"every rank must pass the same period, mode, buffers and "
                              f"outer settings; got {shown}")
        if len({repr(lay) for *_, lay in seen}) > 1:
            raise ConfigError("the ranks' models differ in their frozen parameters or "
                              "non-mixed buffers; build the same model on every rank")
        # on a CUDA device the Exchange stages the flat tensor through pinned host memory
        # (fault_tolerance=True does not carry double buffering over a failure yet)
        self._survived = 0 if exchange_options.get("fault_tolerance") else None
        if self._survived is not None and self.side.tensors and name in LOCKSTEP:
            # (after a failure the survivors' broadcasts would be a step apart); the
            # same on every rank, before the Exchange's collective creation
            raise ConfigError("fault_tolerance=True does not carry buffers='broadcast' "
                              "over a failure yet; use buffers='mix' or 'local'")
        exchange_options.setdefault("double_buffer", self.flat.device.type == "cpu"
                                    and self._survived is None)
        if self.flat.exchange_dtype:
            exchange_options.setdefault("dtype", self.flat.exchange_dtype)
        self.exchange = asapmpi.Exchange(self.flat.array, graph, sync, self.comm,
                                         **exchange_options)
        self.flat.rehome(self.exchange.buffer)
        # the broadcasts of buffers get a communicator of their own: nothing else's
        # collectives can interleave with them
        self._side_comm = self.comm.Dup()
        #: whether the buffers outside the flat one take rank 0's values at every mix
        self.broadcast_each_mix = bool(self.side.tensors) and name in LOCKSTEP

        if broadcast:
            broadcast_parameters(self.flat, self.exchange.comm)
            for p in self.frozen:
                _bcast_tensor(p, self._side_comm)
            self.side.bcast(self._side_comm)
        #: the float32 masters the wrapped optimizer steps on, or None
        self.master = None
        if masters and self.exchange.role == "server":
            # a parameter server only averages (its buffer, which its workers read, is
            # left alone); it rounds its average with error feedback from the float32
            # sums (asapmpi/sync/feedback.py)
            self._server_sums = np.zeros(self.flat.numel, dtype=np.float32)
            self.exchange.keep_float32_mix(self._server_sums)
        elif masters:
            self.master = MasterWeights(optimizer, self.flat, self.exchange)
        #: the outer optimizer (outer=), or None
        self.outer = None if outer_settings is None else OuterOptimizer(
            outer_settings, self.flat.params_numel, self.flat.dtype, self.flat.device)
        # the first round's start is taken at the first step (the weights may still be
        # written after wrapping: pretrained weights loaded into the model)
        self._round_pending = self.outer is not None
        self.iteration = 0
        self._sent = False
        self._bytes_before_send = 0
        #: the model's tensors when wrapped: a layer added or a parameter replaced later
        #: would never be exchanged (refused at the next step)
        self._tensors = None if model is None else ParameterSet(model, buffers != "local")

    #: GradScaler.step() then always calls step(), telling it `found_inf` (and
    #: `grad_scale` while the gradients are still scaled) instead of skipping the call,
    #: which would skip this rank's mix and leave its neighbours waiting
    _step_supports_amp_scaling = True

    def _init_hooks(self) -> None:
        # what torch.optim.Optimizer.__init__ sets up, but for parameter groups and state,
        # which stay the wrapped optimizer's (that __init__ would build new ones)
        self._optimizer_step_pre_hooks = OrderedDict()
        self._optimizer_step_post_hooks = OrderedDict()
        self._optimizer_state_dict_pre_hooks = OrderedDict()
        self._optimizer_state_dict_post_hooks = OrderedDict()
        self._optimizer_load_state_dict_pre_hooks = OrderedDict()
        self._optimizer_load_state_dict_post_hooks = OrderedDict()
        self._patch_step_function()

    # ------------------------------------------------------------------ training

    # read and written through: the wrapped optimizer's load_state_dict replaces its
    # lists, and a scheduler holding the wrapper must see the new ones
    param_groups = _shared("param_groups", "The wrapped optimizer's parameter groups "
                                           "(learning rates live here).")
    state = _shared("state", "The wrapped optimizer's per-parameter state.")
    defaults = _shared("defaults", "The wrapped optimizer's default hyperparameters.")

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        """Refused: the exchange's buffer is laid out once, at creation."""
        raise ConfigError("the exchange buffer is laid out when the DecentralizedOptimizer "
                          "is created; add the group to the torch optimizer before wrapping")

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the gradients, as torch.optim.Optimizer.zero_grad (with master
        weights, the 16-bit parameters' too)."""
        self.optimizer.zero_grad(set_to_none=set_to_none)
        if self.master is not None:
            self.master.clear_grads()

    def _mixes(self, iteration: int) -> bool:
        return iteration % self.period == 0

    def step(self, closure=None):
        """One optimizer step (iteration + 1); on every `period`-th, the exchange too.
        Returns what the wrapped optimizer's step returned (the closure's loss)."""
        target = self.iteration + 1
        if self._round_pending:
            self._begin_rounds()
        if self._tensors is not None:
            self._tensors.check()       # an integer compare unless torch registered more
        if target % CHECK_EVERY == 1:
            # a parameter re-homed since (p.data = ...) would no longer mix; checking
            # loops over every parameter, so not on every step
            self.check()
        # a parameter server only averages what its workers send: no optimizer step
        apply = self._update if self.exchange.role != "server" else _no_step
        if self.mode == "serial":
            loss = apply(closure)
            if self._mixes(target):
                self.flat.rehome(self.exchange.step())
                self._mixed()
        else:
            if self._mixes(target):
                if not self._sent:      # first iteration (or after a resume): send now
                    self.exchange.send()
                # the gradients were computed on the sent buffer; Appl updates the result
                self.flat.rehome(self.exchange.receive())
                self._mixed()
                self._sent = False
            loss = apply(closure)
            if self._mixes(target + 1):
                # Send(k+1) at the start of the next iteration, before its Compute
                self._bytes_before_send = self.exchange.bytes_sent
                self.exchange.send()
                self._sent = True
        self.iteration = target
        if self._survived is not None and len(self.exchange.survivals) != self._survived:
            self._after_survival()
        if self.exchange.global_iterations:
            # between supersteps the global count stands still while workers step on
            self.iteration = self.exchange.version
        elif self._mixes(target):
            # a Hop worker that jumped ahead has completed more exchanges than steps
            self.iteration = max(self.iteration, self.exchange.version * self.period)
        return loss

    def _update(self, closure=None):
        """The wrapped optimizer's step, unless a GradScaler found inf or NaN gradients
        (then nothing: the mix goes on); gradients it left scaled are unscaled first,
        as GradScaler.unscale_ would (multiplied by the float32 reciprocal).  With master
        weights: the masters take what was written into the 16-bit parameters since the
        last step (a loaded state_dict, an in-place write; nothing otherwise) and their
        gradients, the optimizer steps
        on them, the parameters get them rounded."""
        if self.master is not None:
            self.master.absorb()
            self.master.grads_in()
        found_inf = getattr(self, "found_inf", None)
        if found_inf is not None and float(found_inf) > 0:
            return None
        grad_scale = getattr(self, "grad_scale", None)
        if grad_scale is not None:
            inverse = grad_scale.double().reciprocal().float()
            with torch.no_grad():
                for group in self.param_groups:
                    for p in group["params"]:
                        if p.grad is not None:
                            p.grad.mul_(inverse)
        loss = self.optimizer.step(closure)
        if self.master is not None:
            self.master.push()
        return loss

    def _weights(self) -> torch.Tensor:
        # what the wrapped optimizer updates: the float32 masters, or the parameters'
        # part of the flat buffer the model lives in now
        if self.master is not None:
            return self.master.tensor
        return self.flat.tensor[:self.flat.params_numel]

    def _begin_rounds(self) -> None:
        # the outer optimizer's first round starts from the weights as they are now
        if self.master is not None:
            # a write since wrapping reaches the masters first; push() makes the next
            # absorb find nothing (the parameters already hold these values)
            self.master.absorb()
            self.master.push()
        self.outer.begin(self._weights())
        self._round_pending = False

    def _mixed(self) -> None:
        if self.master is not None:
            # at once, not at the next update: a checkpoint between the two holds the
            # mix in its masters (the float32 sums are this step's only)
            self.master.absorb(mixed=True)
        if self.outer is not None:
            # on the masters with master weights, so that the parameters get the result
            # rounded by push() as after any update
            self.outer.step(self._weights())
        if self.master is not None:
            self.master.push()
        if self.broadcast_each_mix:
            self.side.bcast(self._side_comm)

    def meet(self, what: str = "a meeting of the optimizer's ranks") -> None:
        """Collective, between steps: a barrier over the ranks (Exchange.meet); with
        fault_tolerance=True a failure seen there is survived first (`comm` becomes the
        survivors')."""
        self.exchange.meet(what)
        if self._survived is not None and len(self.exchange.survivals) != self._survived:
            self._after_survival()

    def _after_survival(self) -> None:
        """The exchange survived a failure (fault_tolerance=True): go on on its shrunk
        communicator.  The old side communicator has a dead rank: never freed (a
        collective), kept referenced."""
        self._survived = len(self.exchange.survivals)
        self._abandoned_comms = [*getattr(self, "_abandoned_comms", []), self._side_comm]
        self.comm = self.exchange.comm
        # no collective here: a survivor whose step the recovery ended gets here one
        # exchange step before the others, who make theirs again with it
        self._side_comm = None

    def check(self) -> None:
        """Raise ConfigError if a tensor left the exchange's or the broadcast buffer, the
        model (given model=) has other parameters or buffers than when it was wrapped, or
        a frozen parameter (not exchanged) was unfrozen."""
        if self._tensors is not None:
            self._tensors.check(always=True)
        self.flat.check()
        self.side.check()
        thawed = [tuple(p.shape) for p in self.frozen if p.requires_grad]
        if thawed:
            raise ConfigError(f"parameters of shapes {thawed} were frozen when the "
                              f"DecentralizedOptimizer was created and are not exchanged; "
                              f"create it after unfreezing them")

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> Dict[str, Any]:
        """The wrapped optimizer's state_dict plus the iteration, the exchange state and
        (with outer=) the outer optimizer's (its tensors as CPU copies); the parameters
        themselves are the model's: save model.state_dict() too."""
        exchange = self.exchange.state_dict()
        if self._sent:
            # parallel mode: Send(k+1) is out already; a resumed run sends it again
            # (it restarts from these parameters), so it is not counted here
            exchange["bytes_sent"] = self._bytes_before_send
        state = {"optimizer": self.optimizer.state_dict(), "exchange": exchange,
                 "iteration": self.iteration, "period": self.period, "mode": self.mode}
        if self.master is not None:
            state["master"] = self.master.state_dict()
        if self.outer is not None:
            state["outer"] = self.outer.state_dict()
        return state

    def load_state_dict(self, state: Mapping[str, Any], regroup: bool = False) -> None:
        """Continue from state_dict(); before the first step, on every rank alike.  With
        `regroup` the state may be another rank's, of a job of another size or graph
        (Exchange.load_state_dict)."""
        for key in ("optimizer", "exchange", "iteration", "period", "mode"):
            if key not in state:
                raise ConfigError(f"optimizer state has no {key!r}; pass what "
                                  f"DecentralizedOptimizer.state_dict() returned")
        if (self.outer is not None) != ("outer" in state):
            raise ConfigError(f"the checkpoint was written "
                              f"{'with' if 'outer' in state else 'without'} an outer "
                              f"optimizer, this optimizer has "
                              f"{'one' if self.outer is not None else 'none'}; pass the "
                              f"same outer= as when it was written")
        if (state["period"], state["mode"]) != (self.period, self.mode):
            raise ConfigError(f"the checkpoint was written with period={state['period']}, "
                              f"mode={state['mode']!r}; this optimizer has "
                              f"period={self.period}, mode={self.mode!r}")
        if (self.master is not None) != ("master" in state):
            raise ConfigError("the checkpoint was written with master weights "
                              f"{'on' if 'master' in state else 'off'}, this optimizer has "
                              f"them {'on' if self.master is not None else 'off'}; pass the "
                              f"same master_weights")
        if self.outer is not None:
            self.outer.load_state_dict(state["outer"])
            self._round_pending = not self.outer.started
        self.exchange.load_state_dict(state["exchange"], regroup=regroup)
        self.optimizer.load_state_dict(state["optimizer"])
        if self.master is not None:
            self.master.load_state_dict(state["master"])
        self.iteration = int(state["iteration"])
        self.check()

    # ------------------------------------------------------------------ uneven inputs

    @contextlib.contextmanager
    def join(self) -> Iterator[None]:
        """Uneven inputs, as torch DDP's Join: wrap the training loop on every rank,
        ``with opt.join(): for batch in my_shard: ... opt.step()``.  A rank whose loop
        ends first keeps stepping with no gradients of its own (its replica follows the
        training ranks' mix and leaves theirs, its optimizer state untouched) until
        every rank's loop has ended, then every rank steps on to one final version
        (Exchange.join).  With outer=, its outer steps go on at every round's end with
        the mixed pseudo-gradient, as everyone's.  Nothing happens while an
        exception leaves the block (the job is ending)."""
        yield
        self.join_now()

    def join_now(self) -> int:
        """This rank's loop has ended (what leaving a ``with opt.join():`` block does;
        for training loops run by a framework, called from its end-of-epoch hook): step
        along without gradients until every rank has joined, then on to the final
        version, which it returns."""
        return self.exchange.join(step=self._shadow_step)

    def _shadow_step(self) -> None:
        # no gradients: the wrapped optimizer skips every parameter, the exchange mixes
        self.zero_grad(set_to_none=True)
        self.step()

    def average_replicas(self) -> float:
        """Give every rank the mean over the ranks of the parameters and mixed buffers
        (the float32 masters too): one MPI_Allreduce of the flat buffer, waited for by
        polling.  Collective, between steps: at the end of training, so that every rank
        holds the consensus model that decentralized SGD's guarantees are about.
        Returns the largest difference this rank's values had from the mean.  The
        outer optimizer's state (outer=) is left alone: this ends training."""
        from .. import collectives

        gap = 0.0
        tensors = [self.flat.tensor] + ([self.master.tensor] if self.master is not None else [])
        for tensor in tensors:
            host = tensor.detach().to("cpu", torch.float64)
            total = host.numpy().copy()
            # past the deadline the request and `total` go to the leftovers: a late
            # rank's contribution must not land in memory reused since
            collectives.allreduce(self.comm, MPI.IN_PLACE, total, MPI.SUM,
                                  self.exchange.timeout, "the allreduce of average_replicas()")
            mean = torch.from_numpy(total / self.comm.Get_size())
            if host.numel():
                gap = max(gap, float((host - mean).abs().max()))
            with torch.no_grad():
                tensor.copy_(mean.to(tensor.device, tensor.dtype))
        if self.master is not None:
            self.master.push()          # the parameters: the mean masters, rounded
        return gap

    # ------------------------------------------------------------------ lifetime

    def free(self) -> None:
        """Free the exchange (collective); the parameters end in private memory."""
        self.exchange.free()
        if self._side_comm is not None:
            self._side_comm.Free()
        # free() copied the final values into the buffer the exchange was created with
        self.flat.rehome(self.flat.home)
        self.flat.forget_other_homes()

    def __enter__(self) -> "DecentralizedOptimizer":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        # as Exchange: no collective free while an exception propagates
        if exc_type is None:
            self.free()

    def __repr__(self):
        outer = "" if self.outer is None else f", outer={self.outer!r}"
        return (f"DecentralizedOptimizer({type(self.optimizer).__name__}, "
                f"sync={self.exchange.sync!r}, mode={self.mode!r}, period={self.period}"
                f"{outer}, iteration {self.iteration})")
