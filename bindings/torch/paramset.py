"""Whether a model's tensors are still the ones a DecentralizedOptimizer laid out.

The exchange's flat buffer is laid out once, from the parameters (and mixed buffers) the
model had when it was wrapped.  A layer added afterwards (`model.add_module`, an
attribute set to a new module), a parameter replaced (`layer.weight = Parameter(...)`)
or a buffer registered later is in no buffer the exchange sends: its replicas drift
apart silently.  Looking for that on every step would loop over every parameter; instead
torch's global registration hooks count every module, parameter and buffer registered
in the process (a handful of integer increments, at model-building time only), and a
step compares the model's tensors with those it was wrapped with only when that count
moved.
"""
from __future__ import annotations

from typing import Tuple

import torch

from asapmpi.errors import ConfigError


class _Registered:
    """Modules, parameters and buffers registered in this process since the hooks were
    installed (once per process: the hooks are global, the count serves every
    ParameterSet)."""

    count = 0
    hooks = None

    @classmethod
    def bump(cls, *args) -> None:
        cls.count += 1

    @classmethod
    def watch(cls) -> None:
        if cls.hooks is None:
            hooks = torch.nn.modules.module
            cls.hooks = (hooks.register_module_module_registration_hook(cls.bump),
                         hooks.register_module_parameter_registration_hook(cls.bump),
                         hooks.register_module_buffer_registration_hook(cls.bump))


class ParameterSet:
    """The parameters (and, with `buffers`, the buffers) of `model` when it was wrapped;
    check() raises ConfigError once they are other tensors."""

    def __init__(self, model: torch.nn.Module, buffers: bool):
        _Registered.watch()
        self.model = model
        self.buffers = buffers
        self.ids = self._ids()
        self._seen = _Registered.count

    def _ids(self) -> Tuple[Tuple[int, ...], Tuple[int, ...]]:
        params = tuple(id(p) for p in self.model.parameters())
        return params, tuple(id(b) for b in self.model.buffers()) if self.buffers else ()

    def check(self, always: bool = False) -> None:
        """Refuse a model whose tensors changed since it was wrapped (compared only when
        something was registered since the last look, unless `always`)."""
        if not always and _Registered.count == self._seen:
            return
        self._seen = _Registered.count
        now = self._ids()
        if now == self.ids:
            return
        kind = 0 if now[0] != self.ids[0] else 1
        what = ("parameters", "buffers")[kind]
        before, after = set(self.ids[kind]), set(now[kind])
        raise ConfigError(f"the model's {what} changed after the DecentralizedOptimizer "
                          f"was created ({len(after - before)} added or replaced, "
                          f"{len(before - after)} gone): the exchange's buffer is laid out "
                          f"once, so they would not be exchanged; wrap the model's "
                          f"optimizer again after changing the model")
