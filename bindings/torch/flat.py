"""One flat buffer behind a model's parameters: the buffer an Exchange sends and reduces.

    flat = FlatParameters(model.parameters())
    flat.array          # a NumPy view of the same memory, for asapmpi.Exchange
    p.data_ptr()        # lies inside flat.tensor for every parameter p

Every parameter's storage becomes a view of one contiguous tensor, so the exchange puts
the model straight from its own memory and reduces straight into it: no flatten or
unflatten copies per step.  The Parameter objects stay the same (optimizers and hooks
keep working); only their `.data` is re-pointed: once here, and by `rehome` when a
double-buffered Exchange moves the values to its other buffer.
"""
from __future__ import annotations

from typing import Iterable, List, Tuple

import numpy as np
import torch

from asapmpi.errors import ConfigError

#: each parameter starts on a 64-byte boundary (a cache line, an AVX-512 vector)
ALIGN_BYTES = 64
DTYPES = (torch.float32, torch.float64)


def _unique(params: Iterable[torch.Tensor]) -> List[torch.Tensor]:
    seen, out = set(), []
    for p in params:
        if not isinstance(p, torch.Tensor):
            raise ConfigError(f"parameters must be tensors, got {type(p).__name__}")
        if id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out


class FlatParameters:
    """Re-home `params` into one contiguous CPU tensor (see the module docstring).

    params: tensors (model.parameters(), or the params of an optimizer's groups); all of
        one dtype, float32 or float64, on the CPU.  Their current values are kept.
    """

    def __init__(self, params: Iterable[torch.Tensor]):
        self.params = _unique(params)
        if not self.params:
            raise ConfigError("no parameters to exchange; pass model.parameters()")
        dtypes = {p.dtype for p in self.params}
        if len(dtypes) != 1 or next(iter(dtypes)) not in DTYPES:
            raise ConfigError(f"parameters must all be float32 or all float64, got "
                              f"{sorted(str(d) for d in dtypes)}; convert the model with "
                              f".float() or .double()")
        if any(p.device.type != "cpu" for p in self.params):
            raise ConfigError("parameters must be on the CPU (one-sided MPI reads host "
                              "memory); move the model with .cpu()")
        self.dtype = self.params[0].dtype
        step = ALIGN_BYTES // self.params[0].element_size()
        self.spans: List[Tuple[int, int]] = []
        offset = 0
        for p in self.params:
            self.spans.append((offset, p.numel()))
            offset += -(-p.numel() // step) * step
        self.tensor = torch.zeros(offset, dtype=self.dtype)
        with torch.no_grad():
            for p, (start, count) in zip(self.params, self.spans):
                self.tensor[start:start + count].view_as(p).copy_(p.detach())
        #: the same memory as a NumPy array: what asapmpi.Exchange sends and reduces
        self.array = self.tensor.numpy()
        #: the process-private buffer the parameters started in
        self.home = self.array
        # per buffer the parameters may live in: (its tensor, one view per parameter)
        self._views = {}
        self.rehome(self.array)

    def rehome(self, array: np.ndarray) -> None:
        """Point every parameter at its span of `array` (a buffer of this layout, such
        as a double-buffered Exchange's `buffer`).  Cheap when already there; the views
        of each buffer are made once."""
        if array is self.array and self._views:
            return
        entry = self._views.get(id(array))
        if entry is None or entry[0] is not array:
            if array.shape != self.home.shape or array.dtype != self.home.dtype:
                raise ConfigError(f"a buffer of {array.shape} {array.dtype} cannot hold "
                                  f"this model's {self.home.shape} {self.home.dtype}")
            tensor = torch.from_numpy(array)
            views = [tensor[start:start + count].view_as(p)
                     for p, (start, count) in zip(self.params, self.spans)]
            entry = self._views[id(array)] = (array, tensor, views)
        _, self.tensor, views = entry
        self.array = array
        for p, view in zip(self.params, views):
            p.data = view

    def forget_other_homes(self) -> None:
        """Drop the views of every buffer but the current one (they keep its memory
        mapped: an exchange's shared memory, after the exchange was freed)."""
        self._views = {id(self.array): self._views[id(self.array)]}

    @property
    def numel(self) -> int:
        """Elements in the flat buffer (padding included)."""
        return int(self.tensor.numel())

    @property
    def nbytes(self) -> int:
        """Bytes in the flat buffer (padding included)."""
        return int(self.array.nbytes)

    def check(self) -> None:
        """Raise ConfigError if a parameter no longer lives in the flat buffer (its .data
        was replaced, for example by assigning a new tensor)."""
        lo = self.tensor.data_ptr()
        size = self.tensor.element_size()
        for i, (p, (start, count)) in enumerate(zip(self.params, self.spans)):
            if p.data_ptr() != lo + start * size or p.numel() != count:
                raise ConfigError(f"parameter {i} (shape {tuple(p.shape)}) was moved out of "
                                  f"the exchange buffer; update it in place "
                                  f"(p.data.copy_(...)) instead of replacing p.data")

    def copy_from(self, values: np.ndarray) -> None:
        """Overwrite every parameter from a flat array of the same layout."""
        src = np.asarray(values)
        if src.shape != self.array.shape:
            raise ConfigError(f"a flat parameter array of {src.shape} does not fit this "
                              f"model's {self.array.shape}")
        self.array[...] = src

    def __repr__(self):
        return (f"FlatParameters({len(self.params)} tensors, {self.numel} x {self.dtype}, "
                f"{self.nbytes} bytes)")
