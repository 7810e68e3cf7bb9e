"""Float32 master weights for a model kept in bfloat16 or float16.

A 16-bit parameter loses every update smaller than half its unit in the last place
(bfloat16: 2**-9 of its value): plain SGD on bfloat16 weights stalls once lr * grad is
that small, on one rank as on many.  Here the wrapped optimizer steps on float32 copies
(the masters); the model keeps its 16-bit parameters, which are what the forward pass
reads and what the exchange sends, and after every update they get the masters rounded.

What the exchange changed reaches the masters as a difference: right after each mix,

    master += mix - rounded

where `rounded` is what this rank sent (the masters rounded to 16 bits by the last
push, kept beside them) and `mix` the exchange's weighted sum of its own and its
neighbours' 16-bit values, in float32 as the reduce computed it before rounding
(Exchange.keep_float32_mix).  With doubly stochastic weights the masters' mean then
moves exactly as their updates say: the parts of the masters below 16-bit precision
(each under one unit in the last place) are never rounded away, and replicas agree to
within them.  Rounding the mix first would not do: it drops the replicas' disagreements
below half a unit, ties to even, so the mean drifts (bfloat16, SGD at a small learning
rate: 30% higher held-out loss than float32, against the same loss with the float32
mix).  The sums are kept where the reduce runs: on the host, or on the CUDA device of a
reduce on the device (Exchange.float32_mix_on_device).  Where a mix's float32 sums were
not kept (a device buffer's reduce run on the host for checksum=), the mixed parameters
stand in for `mix`.

A value written into the parameters between steps by anything but the exchange (a
loaded state_dict, `p.fill_()` under no_grad, `p.data.copy_()`, a re-initialisation)
replaces its master: before each update the parameters are compared with `rounded`,
byte for byte (one memcmp on the host, about 0.5 ms for 6.3M bfloat16 values), and
every element that differs takes its master from the parameter.  No version counter
can stand in for that comparison: each Parameter's `.data` is a view with a counter of
its own, and a write through `p.data` bumps none that outlives the statement.  In
mode="parallel" a write made between steps is already in the buffer the next receive
mixes: it reaches the masters through the mix, weighted as the exchange weighs this
rank's own values.
"""
from __future__ import annotations

import ctypes
from typing import List

import torch

from asapmpi.errors import ConfigError

from .flat import FlatParameters

#: the parameter dtypes that get masters when master_weights is left to decide
HALF = (torch.bfloat16, torch.float16)

_memcmp = ctypes.CDLL(None).memcmp
_memcmp.restype = ctypes.c_int
_memcmp.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two contiguous tensors of one dtype, shape and device hold the same
    bytes (on the host one memcmp with the GIL released, on a device torch.equal of
    the bytes): unlike ==, -0.0 differs from 0.0 and a NaN equals itself."""
    if a.device.type == "cpu":
        return _memcmp(a.data_ptr(), b.data_ptr(), a.numel() * a.element_size()) == 0
    return torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


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
        self.count = flat.params_numel
        #: the masters, laid out as the parameters' part of the flat buffer
        self.tensor = torch.empty(self.count, dtype=torch.float32, device=flat.device)
        #: the masters rounded to the parameters' dtype by the last push: what the
        #: parameters hold unless something wrote them since (module docstring)
        self.rounded = torch.empty(self.count, dtype=flat.dtype, device=flat.device)
        self.params: List[torch.nn.Parameter] = [
            torch.nn.Parameter(self.tensor[start:start + count].view_as(p))
            for p, (start, count) in zip(flat.params, flat.spans)]
        self.pull()
        #: the exchange's float32 sums of every reduce, before rounding: where the
        #: reduce runs (the host, or the device of a reduce on the device)
        self.exchange = exchange
        if exchange.float32_mix_on_device:
            self.wide = torch.zeros(flat.numel, dtype=torch.float32, device=flat.device)
            exchange.keep_float32_mix(self.wide)
        else:
            self.wide = torch.zeros(flat.numel, dtype=torch.float32)
            exchange.keep_float32_mix(self.wide.numpy())
        self._mixes = exchange.float32_mixes
        #: elements of the parameters that absorb() found written and took (a count
        #: over the masters' life, for tests and reports)
        self.writes_taken = 0
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
            half = self._half()
            self.tensor.copy_(half)
            self.rounded.copy_(half)

    def _unwritten(self) -> bool:
        # the parameters hold what the last push wrote, byte for byte
        return same_bytes(self._half(), self.rounded)

    def absorb(self, mixed: bool = False) -> None:
        """Carry into the masters what changed the 16-bit parameters since the last
        push: after a mix (`mixed`), the float32 sums of the one reduce since, else the
        mixed parameters' difference from what was sent; between steps, every value
        written into the parameters replaces its master (module docstring).  Then push()
        (the optimizer does it after each mix and update), so that a second absorb finds
        nothing."""
        mixes = self.exchange.float32_mixes
        with torch.no_grad():
            if mixes == self._mixes + 1:
                # master += mix - rounded, in the float32 sums' own buffer (the next
                # reduce overwrites it anyway): two passes, nothing allocated
                mix = self.wide[:self.count]
                if self.tensor.device != mix.device:
                    mix = mix.to(self.tensor.device)
                mix.sub_(self.rounded)
                self.tensor.add_(mix)
            elif self._unwritten():
                pass                # nothing wrote the parameters since the push
            elif mixed or mixes != self._mixes:
                # reduces whose float32 sums were not kept: the parameters stand in
                self.tensor.add_(self._half().float().sub_(self.rounded))
            else:
                self._take_writes()
        self._mixes = mixes

    def _take_writes(self) -> None:
        # each parameter whose bytes differ from what was pushed: its written elements
        # replace their masters (the residual below 16 bits belonged to the old value)
        half = self._half()
        for start, count in self.flat.spans[:len(self.flat.params)]:
            now, was = half[start:start + count], self.rounded[start:start + count]
            if same_bytes(now, was):
                continue
            written = now.ne(was)
            self.writes_taken += int(written.sum())
            master = self.tensor[start:start + count]
            master.copy_(torch.where(written, now.float(), master))

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
            self.rounded.copy_(self.tensor)
            self._half().copy_(self.rounded)

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
            # the parameters loaded beside them are these rounded: not a write
            self.rounded.copy_(self.tensor)
