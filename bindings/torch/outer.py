"""The outer optimizer of local-step training (DiLoCo, Douillard et al. 2023): the step
DecentralizedOptimizer(outer="diloco", local_steps=H) takes after each round's exchange.

A round is H steps of the wrapped (inner) optimizer from the weights theta_start, then
the exchange, which mixes the weights through the chosen policy as period=H does (the
flat parameter buffer is what is sent: no second buffer, no extra bytes), then

    delta       = theta_start - theta_mixed          (the mixed pseudo-gradient)
    m           = mu * m + delta
    theta_start = theta_start - lr * (delta + mu * m)    (torch.optim.SGD, nesterov=True)

and the weights are set to theta_start: the next round starts there.  Mixing is linear,
so over an exact mean (allreduce) with theta_start the same on every rank, delta is the
mean of the ranks' own pseudo-gradients: DiLoCo.  Over gossip, one peer or an expander
graph (notify_ack, hop, bsp) it is the pseudo-gradient averaged with the neighbours
only, whose mixing also pulls the replicas' theta_start together: NoLoCo-like (NoLoCo's
own outer step adds a term towards the neighbours' weights, not built here).

The update is computed as theta_mixed - ((lr - 1) * delta + lr * mu * m), the same value
up to rounding, and exactly theta_mixed when lr = 1 and mu = 0: then the outer optimizer
is period=H, bit for bit.  Everything happens in place in two preallocated tensors
(theta_start and m, float32; float64 for float64 weights): nothing is allocated per
step or per round.
"""
from __future__ import annotations

from typing import Any, Dict, Mapping

import torch

from asapmpi.errors import ConfigError
from asapmpi.outer import OuterSettings


class OuterOptimizer:
    """Nesterov momentum on the mixed pseudo-gradient of a flat weight tensor of
    `numel` elements on `device` of `dtype` (module docstring).  `lr` and `momentum`
    may be changed between rounds (a schedule); a checkpoint keeps them."""

    def __init__(self, settings: OuterSettings, numel: int, dtype: torch.dtype,
                 device: torch.device):
        self.method = settings.method
        self.lr = settings.lr
        self.momentum = settings.momentum
        wide = torch.float64 if dtype == torch.float64 else torch.float32
        #: the weights at the start of this round (between rounds: the outer iterate)
        self.start = torch.zeros(numel, dtype=wide, device=device)
        #: the momentum buffer m
        self.buffer = torch.zeros(numel, dtype=wide, device=device)
        #: outer steps taken
        self.rounds = 0
        #: whether `start` holds the weights (taken at the first step after creation or
        #: a state_dict written before it: a write into the parameters after wrapping,
        #: such as loading pretrained weights, belongs to the first round's start)
        self.started = False

    def begin(self, weights: torch.Tensor) -> None:
        """The first round starts from `weights`."""
        with torch.no_grad():
            self.start.copy_(weights)
        self.started = True

    def step(self, weights: torch.Tensor) -> None:
        """The outer step after a round's exchange: `weights` (the mixed parameters,
        theta_mixed) become the new theta_start, in place."""
        if not self.started:
            raise ConfigError("the outer optimizer stepped before its first round began; "
                              "call DecentralizedOptimizer.step(), not this method")
        start, m = self.start, self.buffer
        with torch.no_grad():
            delta = start.sub_(weights)         # theta_start's memory holds delta now
            m.mul_(self.momentum).add_(delta)
            keep, push = self.lr - 1.0, self.lr * self.momentum
            # skipped when both vanish: theta_mixed stays as it is, -0.0 included
            if keep or push:
                delta.mul_(keep).add_(m, alpha=push)
                weights.sub_(delta)
            start.copy_(weights)
        self.rounds += 1

    def state_dict(self) -> Dict[str, Any]:
        """The outer state for a checkpoint: theta_start, m (CPU copies), the rounds,
        the hyperparameters."""
        return {"method": self.method, "lr": self.lr, "momentum": self.momentum,
                "rounds": self.rounds, "started": self.started,
                "start": self.start.detach().cpu().clone(),
                "buffer": self.buffer.detach().cpu().clone()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from state_dict() (tensors or NumPy arrays); the hyperparameters are
        the checkpoint's, as torch optimizers take their groups' from theirs."""
        missing = [k for k in ("method", "lr", "momentum", "rounds", "started", "start",
                               "buffer") if k not in state]
        if missing:
            raise ConfigError(f"the checkpoint's outer state lacks {missing}; pass what "
                              f"DecentralizedOptimizer.state_dict() returned")
        if state["method"] != self.method:
            raise ConfigError(f"the checkpoint was written with outer={state['method']!r}, "
                              f"this optimizer has outer={self.method!r}; pass the same outer")
        start, buffer = torch.as_tensor(state["start"]), torch.as_tensor(state["buffer"])
        if start.shape != self.start.shape or buffer.shape != self.buffer.shape:
            raise ConfigError(f"the checkpoint's outer state holds {tuple(start.shape)} "
                              f"values, this model {tuple(self.start.shape)}; load a "
                              f"checkpoint of the same model")
        with torch.no_grad():
            self.start.copy_(start)
            self.buffer.copy_(buffer)
        self.lr, self.momentum = float(state["lr"]), float(state["momentum"])
        self.rounds, self.started = int(state["rounds"]), bool(state["started"])

    def __repr__(self):
        return (f"OuterOptimizer({self.method}, lr={self.lr:g}, momentum={self.momentum:g}, "
                f"{self.rounds} rounds)")
