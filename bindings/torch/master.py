"""Float32 master weights for a model kept in bfloat16 or float16.

A 16-bit parameter loses every update smaller than half its unit in the last place
(bfloat16: 2**-9 of its value): plain SGD on bfloat16 weights stalls once lr * grad is
that small, on one rank as on many.  Here the wrapped optimizer steps on float32 copies
(the masters); the model keeps its 16-bit parameters, which are what the forward pass
reads and what the exchange sends, and after every update they get the masters rounded.

What the exchange changed reaches the masters as a difference: before each update,

    master += mix - float32(round16(master))

where round16(master) is what this rank sent and `mix` the exchange's weighted sum of
its own and its neighbours' 16-bit values, in float32 as the reduce computed it before
rounding (Exchange.keep_float32_mix).  With doubly stochastic weights the masters' mean
then moves exactly as their updates say: the parts of the masters below 16-bit
precision (each under one unit in the last place) are never rounded away, and replicas
agree to within them.  Rounding the mix first would not do: it drops the replicas'
disagreements below half a unit, ties to even, so the mean drifts (bfloat16, SGD at a
small learning rate: 30% higher held-out loss than float32, against the same loss with
the float32 mix).  Where the reduce ran elsewhere (on a CUDA device) or not at all, the
parameters themselves stand in for the mix: zero when nothing wrote them since they
were rounded, the new values when a state_dict was loaded into the model.  On the host
that stand-in (three passes and two allocations) runs only when something wrote the
parameters: a reduce is counted by the exchange, and every other write (a loaded
state_dict, a user's in-place change) goes through torch and bumps the tensor's version
counter; on a device it always runs.
"""
from __future__ import annotations

from typing import List

import torch

from asapmpi.errors import ConfigError

from .flat import FlatParameters

#: the parameter dtypes that get masters when master_weights is left to decide
HALF = (torch.bfloat16, torch.float16)


def wants_masters(master_weights, flat: FlatParameters,
                  optimizer: torch.optim.Optimizer) -> bool:
    """Whether the parameters of `flat` get float32 masters: `master_weights` as the
    user passed it (None: for 16-bit parameters); ConfigError for a choice that cannot
    work."""
    if master_weights not in (None, True, False):
        raise ConfigError(f"master_weights must be True, False or None (on for 16-bit "
                          f"parameters), got {master_weights!r}")
    if master_weights and flat.dtype not in HALF:
        raise ConfigError(f"master_weights=True keeps float32 copies of bfloat16 or "
                          f"float16 parameters; these are {flat.dtype}: leave "
                          f"master_weights out")
    wanted = master_weights is not False and flat.dtype in HALF
    if wanted and optimizer.state:
        raise ConfigError("the optimizer has state already (it stepped, or a state_dict "
                          "was loaded): wrap it before its first step and load the "
                          "DecentralizedOptimizer's state_dict instead (with master "
                          "weights its state belongs to the float32 masters)")
    return wanted


class MasterWeights:
    """Float32 masters for the parameters of `flat`, put in `optimizer`'s parameter
    groups in place of the 16-bit parameters (create it before the first step)."""

    def __init__(self, optimizer: torch.optim.Optimizer, flat: FlatParameters, exchange):
        self.flat = flat
        # the parameters come first in the flat buffer, the mixed buffers after them
        # (those stay 16-bit: the forward pass writes them, no optimizer does)
        last_start, last_count = flat.spans[len(flat.params) - 1]
        self.count = last_start + last_count
        #: the masters, laid out as the parameters' part of the flat buffer
        self.tensor = torch.empty(self.count, dtype=torch.float32, device=flat.device)
        self.params: List[torch.nn.Parameter] = [
            torch.nn.Parameter(self.tensor[start:start + count].view_as(p))
            for p, (start, count) in zip(flat.params, flat.spans)]
        # on the host every write to the parameters is a counted reduce or a torch op
        # (module docstring); a device's reduce writes through its own views
        self._watch_version = flat.device.type == "cpu"
        self._rounded_at = -1       # the parameters' version when last rounded from us
        self.pull()
        #: the exchange's float32 sums of every reduce, before rounding (on the host)
        self.exchange = exchange
        self.wide = torch.zeros(flat.numel, dtype=torch.float32)
        exchange.keep_float32_mix(self.wide.numpy())
        self._mixes = exchange.float32_mixes
        index = {id(p): m for p, m in zip(flat.params, self.params)}
        for group in optimizer.param_groups:
            group["params"] = [index.get(id(p), p) for p in group["params"]]

    def _half(self) -> torch.Tensor:
        # the parameters' part of the buffer the model lives in now
        return self.flat.tensor[:self.count]

    def pull(self) -> None:
        """Set the masters to the parameters' values (at the start, or after a
        broadcast): their residuals start at zero."""
        with torch.no_grad():
            self.tensor.copy_(self._half())
        self._rounded()

    def _rounded(self) -> None:
        # the parameters now equal the masters rounded: remember their version
        self._rounded_at = self._half()._version

    def absorb(self) -> None:
        """Carry into the masters what changed the 16-bit parameters since they were
        rounded from them: the float32 mix of the one reduce since (module docstring),
        else the parameters' own change (none, or a loaded state_dict).  Then push()
        (the optimizer does it after each mix), so that a second absorb finds nothing."""
        mixes = self.exchange.float32_mixes
        if (mixes == self._mixes and self._watch_version
                and self._half()._version == self._rounded_at):
            return                  # nothing wrote the parameters since they were rounded
        with torch.no_grad():
            if mixes == self._mixes + 1:
                now = self.wide[:self.count].to(self.tensor.device, copy=True)
            else:
                now = self._half().float()
            self._mixes = mixes
            now.sub_(self.tensor.to(self.flat.dtype).float())
            self.tensor.add_(now)

    def grads_in(self) -> None:
        """Give each master its parameter's gradient in float32 (None where none)."""
        with torch.no_grad():
            for p, m in zip(self.flat.params, self.params):
                if p.grad is None:
                    m.grad = None
                elif m.grad is None:
                    m.grad = p.grad.float()
                else:
                    m.grad.copy_(p.grad)

    def clear_grads(self) -> None:
        """Drop the 16-bit parameters' gradients (the masters' are the optimizer's)."""
        for p in self.flat.params:
            p.grad = None

    def push(self) -> None:
        """Round the masters into the 16-bit parameters (what the next forward pass
        reads and the next mix sends)."""
        with torch.no_grad():
            self._half().copy_(self.tensor)
        self._rounded()

    def state_dict(self) -> torch.Tensor:
        """The masters, for a checkpoint (the model's state_dict holds only their
        16-bit roundings)."""
        return self.tensor.detach().cpu().clone()

    def load_state_dict(self, values) -> None:
        """Continue from state_dict()'s masters (a tensor, or its NumPy array)."""
        values = torch.as_tensor(values)
        if tuple(values.shape) != (self.count,):
            raise ConfigError(f"the checkpoint's master weights hold {tuple(values.shape)} "
                              f"values, this model {self.count}; load a checkpoint of the "
                              f"same model")
        with torch.no_grad():
            self.tensor.copy_(values)
