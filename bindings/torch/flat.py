"""One flat buffer behind a model's parameters: the buffer an Exchange sends and reduces.

    flat = FlatParameters(model.parameters(), buffers=[bn.running_mean, bn.running_var])
    flat.array          # what asapmpi.Exchange takes: a NumPy view of the same memory
                        # on the CPU, the flat tensor itself on a CUDA device
    p.data_ptr()        # lies inside flat.tensor for every parameter p (and buffer)

Every tensor's storage becomes a view of one contiguous tensor, so the exchange puts
the model straight from its own memory and reduces straight into it: no flatten or
unflatten copies per step.  The Parameter objects stay the same (optimizers and hooks
keep working); only their `.data` is re-pointed: once here, and by `rehome` when a
double-buffered Exchange moves the values to its other buffer.

PackedTensors does the same for tensors of any dtypes in one byte buffer, so that one
MPI_Bcast carries them all (integer buffers such as BatchNorm's num_batches_tracked).
"""
from __future__ import annotations

from typing import Iterable, List, Tuple

import numpy as np
import torch

from asapmpi.errors import ConfigError

#: each parameter starts on a 64-byte boundary (a cache line, an AVX-512 vector)
ALIGN_BYTES = 64
DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


#: what the exchange can send, said by every error about it
SUPPORTED = ("asapmpi.torch exchanges tensors on the CPU or one CUDA device, all float32, "
             "all float64, all bfloat16 or all float16")


def _unique(params: Iterable[torch.Tensor], skip=()) -> List[torch.Tensor]:
    # tied (shared) parameters are one object listed twice: they get one span
    seen, out = {id(t) for t in skip}, []
    for p in params:
        if not isinstance(p, torch.Tensor):
            raise ConfigError(f"parameters must be tensors, got {type(p).__name__}")
        if id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out


def common_device(tensors: Iterable[torch.Tensor], what: str = "parameters") -> torch.device:
    """The one device every tensor is on (the CPU when there are none): the CPU, or a
    CUDA device whose buffers an Exchange stages through pinned host memory
    (asapmpi.device); ConfigError for tensors spread over devices or on another kind."""
    devices = sorted({str(t.device) for t in tensors})
    if len(devices) > 1:
        raise ConfigError(f"{SUPPORTED}; got {what} on {', '.join(devices)}: move the "
                          f"whole model to one device with .to(device)")
    device = torch.device(devices[0]) if devices else torch.device("cpu")
    if device.type not in ("cpu", "cuda"):
        raise ConfigError(f"{SUPPORTED}; got {what} on {device}: move the model with "
                          f".cpu() or .cuda()")
    return device


def host_bcast(tensor: torch.Tensor, comm, root: int = 0) -> None:
    """MPI_Bcast a contiguous tensor in place as bytes; a device tensor through a host
    copy (at set-up only, never per step)."""
    flat = tensor.detach().reshape(-1).view(torch.uint8)
    if flat.device.type == "cpu":
        comm.Bcast(flat.numpy(), root=root)
        return
    host = flat.cpu()
    comm.Bcast(host.numpy(), root=root)
    with torch.no_grad():
        flat.copy_(host)


def _check_views(tensors: List[torch.Tensor], views: List[torch.Tensor], where: str) -> None:
    for i, (t, view) in enumerate(zip(tensors, views)):
        if t.data_ptr() != view.data_ptr() or t.numel() != view.numel():
            raise ConfigError(f"tensor {i} (shape {tuple(t.shape)}) was moved out of "
                              f"{where}; update it in place (p.data.copy_(...)) instead of "
                              f"replacing p.data or converting the model")


class FlatParameters:
    """Re-home `params` into one contiguous tensor on their device (see the module
    docstring).

    params: tensors (model.parameters(), or the params of an optimizer's groups); all of
        one dtype, float32 or float64, on the CPU or one CUDA device.  Their current
        values are kept; a tensor listed twice (tied parameters) gets one span.
    buffers: more tensors of the same dtype, placed after the parameters and mixed with
        them (a model's floating-point buffers: BatchNorm's running statistics).
    """

    def __init__(self, params: Iterable[torch.Tensor], buffers: Iterable[torch.Tensor] = ()):
        self.params = _unique(params)
        if not self.params:
            raise ConfigError("no parameters to exchange; pass model.parameters() (with "
                              "requires_grad=True: frozen ones are not exchanged)")
        self.buffers = _unique(buffers, skip=self.params)
        #: parameters, then buffers: every tensor that lives in the flat buffer
        self.tensors = self.params + self.buffers
        #: the device the flat buffer lives on
        self.device = common_device(self.tensors)
        dtypes = {p.dtype for p in self.params}
        if len(dtypes) != 1 or next(iter(dtypes)) not in DTYPES:
            raise ConfigError(f"{SUPPORTED}: got parameters of "
                              f"{', '.join(sorted(str(d) for d in dtypes))}; convert the "
                              f"model with .float(), .double(), .bfloat16() or .half()")
        self.dtype = self.params[0].dtype
        other = sorted({str(b.dtype) for b in self.buffers} - {str(self.dtype)})
        if other:
            raise ConfigError(f"buffers mixed with the parameters must be {self.dtype} as "
                              f"they are, got {other}; convert the model with .float() or "
                              f".double(), or pass buffers='broadcast' or 'local'")
        step = ALIGN_BYTES // self.params[0].element_size()
        self.spans: List[Tuple[int, int]] = []
        offset = 0
        for p in self.tensors:
            self.spans.append((offset, p.numel()))
            offset += -(-p.numel() // step) * step
        self.tensor = torch.zeros(offset, dtype=self.dtype, device=self.device)
        with torch.no_grad():
            for p, (start, count) in zip(self.tensors, self.spans):
                self.tensor[start:start + count].view_as(p).copy_(p.detach())
        #: the Exchange's dtype= for this buffer: "bfloat16" (its bit patterns travel as
        #: 2-byte integers: NumPy has no bfloat16), else None (read from the buffer)
        self.exchange_dtype = "bfloat16" if self.dtype == torch.bfloat16 else None
        #: what asapmpi.Exchange sends and reduces: the same memory as a NumPy array on
        #: the CPU, the tensor itself on a CUDA device (staged by the Exchange)
        self.array = self._numpy(self.tensor) if self.device.type == "cpu" else self.tensor
        #: the process-private buffer the parameters started in
        self.home = self.array
        # per buffer the parameters may live in: (its tensor, one view per parameter)
        self._views = {}
        self.rehome(self.array)

    def rehome(self, array) -> None:
        """Point every parameter at its span of `array` (a buffer of this layout, such
        as a double-buffered Exchange's `buffer`; on a CUDA device, the flat tensor
        itself).  Cheap when already there; the views of each buffer are made once."""
        if array is self.array and self._views:
            return
        entry = self._views.get(id(array))
        if entry is None or entry[0] is not array:
            if tuple(array.shape) != tuple(self.home.shape) or \
                    str(array.dtype).rpartition(".")[2] != str(self.home.dtype).rpartition(".")[2]:
                raise ConfigError(f"a buffer of {tuple(array.shape)} {array.dtype} cannot "
                                  f"hold this model's {tuple(self.home.shape)} "
                                  f"{self.home.dtype}")
            tensor = array if isinstance(array, torch.Tensor) else self._tensor(array)
            views = [tensor[start:start + count].view_as(p)
                     for p, (start, count) in zip(self.tensors, self.spans)]
            entry = self._views[id(array)] = (array, tensor, views)
        _, self.tensor, views = entry
        self.array = array
        for p, view in zip(self.tensors, views):
            p.data = view

    def _numpy(self, tensor: torch.Tensor) -> np.ndarray:
        # the same memory as NumPy: bfloat16 as its bit patterns
        if tensor.dtype == torch.bfloat16:
            return tensor.view(torch.int16).numpy().view(np.uint16)
        return tensor.numpy()

    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        # the inverse of _numpy: a tensor of this buffer's dtype over the same memory
        if self.dtype == torch.bfloat16:
            return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(array)

    def forget_other_homes(self) -> None:
        """Drop the views of every buffer but the current one (they keep its memory
        mapped: an exchange's shared memory, after the exchange was freed)."""
        self._views = {id(self.array): self._views[id(self.array)]}

    @property
    def params_numel(self) -> int:
        """Elements of the parameters' part of the flat buffer (they come first, the
        mixed buffers after them), padding between them included."""
        start, count = self.spans[len(self.params) - 1]
        return start + count

    @property
    def numel(self) -> int:
        """Elements in the flat buffer (padding included)."""
        return int(self.tensor.numel())

    @property
    def nbytes(self) -> int:
        """Bytes in the flat buffer (padding included)."""
        return int(self.tensor.numel() * self.tensor.element_size())

    def check(self) -> None:
        """Raise ConfigError if a tensor no longer lives in the flat buffer (its .data
        was replaced, for example by assigning a new tensor)."""
        _check_views(self.tensors, self._views[id(self.array)][2], "the exchange buffer")

    def copy_from(self, values: np.ndarray) -> None:
        """Overwrite every parameter from a flat array of the same layout."""
        src = np.asarray(values)
        if src.shape != tuple(self.array.shape):
            raise ConfigError(f"a flat parameter array of {src.shape} does not fit this "
                              f"model's {tuple(self.array.shape)}")
        if isinstance(self.array, np.ndarray):
            self.array[...] = src
        else:
            with torch.no_grad():
                self.tensor.copy_(self._tensor(np.ascontiguousarray(src)))

    def __repr__(self):
        return (f"FlatParameters({len(self.params)} parameters, {len(self.buffers)} "
                f"buffers, {self.numel} x {self.dtype}, {self.nbytes} bytes)")


class PackedTensors:
    """Re-home tensors of any dtypes into one byte buffer on their device, so that one
    MPI_Bcast carries them all (zero-copy on the CPU, one host copy each way on a CUDA
    device); the tensor objects stay the same."""

    def __init__(self, tensors: Iterable[torch.Tensor]):
        self.tensors = _unique(tensors)
        self.device = common_device(self.tensors, "buffers")
        spans, offset = [], 0
        for t in self.tensors:
            nbytes = t.numel() * t.element_size()
            spans.append((offset, nbytes))
            # 64-byte starts keep every view aligned for its dtype
            offset += -(-nbytes // ALIGN_BYTES) * ALIGN_BYTES
        self.tensor = torch.zeros(offset, dtype=torch.uint8, device=self.device)
        self.views = []
        with torch.no_grad():
            for t, (start, nbytes) in zip(self.tensors, spans):
                view = self.tensor[start:start + nbytes].view(t.dtype).view(t.shape)
                view.copy_(t.detach())
                t.data = view
                self.views.append(view)

    @property
    def nbytes(self) -> int:
        """Bytes in the buffer (padding included)."""
        return int(self.tensor.numel())

    def bcast(self, comm, root: int = 0) -> None:
        """Give every rank of `comm` `root`'s values (collective; nothing when empty)."""
        if self.tensors:
            host_bcast(self.tensor, comm, root)

    def check(self) -> None:
        """Raise ConfigError if a tensor no longer lives in the buffer."""
        _check_views(self.tensors, self.views, "the broadcast buffer")

    def __repr__(self):
        return f"PackedTensors({len(self.tensors)} tensors, {self.nbytes} bytes)"
