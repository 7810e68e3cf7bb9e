"""The staged channel's ops for torch CUDA tensors (asapmpi.device.DeviceOps).

One pinned host tensor per staged buffer, made once; the copy to the host runs on a side
stream that first waits for the work already queued on the tensor's current stream (so
it copies the values that work leaves), and the copy back runs on the current stream (so
the work queued after it sees the reduced values).  The next copy to the host waits for
the current stream again, and with it for the copy back: the pinned buffer is never
rewritten under a copy still reading it."""
from __future__ import annotations

import ctypes
from typing import Dict

import numpy as np
import torch

from asapmpi.device.ops import DeviceOps
from asapmpi.errors import ConfigError


class TorchCudaOps(DeviceOps):
    """DeviceOps for a contiguous float32/float64 torch tensor on a CUDA device."""

    name = "torch"

    def __init__(self, device):
        super().__init__(device)
        tensor = device.array
        self.tensor = tensor.detach().view(-1)
        self.cuda = tensor.device
        self.side = torch.cuda.Stream(device=self.cuda)
        self.pinned = torch.empty(self.tensor.numel(), dtype=tensor.dtype, pin_memory=True)
        self.landed = torch.cuda.Event()        # the copy to the host is complete
        self.back = torch.cuda.Event()          # the copy to the device is complete
        self.slots_in = torch.cuda.Event()      # the slots' copies are complete
        self.bfloat16 = tensor.dtype == torch.bfloat16
        # NumPy has no bfloat16: its host buffer holds the bit patterns
        self._array = self.pinned.view(torch.int16).numpy().view(np.uint16) \
            if self.bfloat16 else self.pinned.numpy()
        self._ctype = {torch.float32: ctypes.c_float, torch.float64: ctypes.c_double,
                       torch.bfloat16: ctypes.c_int16,
                       torch.float16: ctypes.c_int16}[tensor.dtype]
        # 16-bit floats are summed in float32 (as the host reduce does), in a buffer made
        # once
        self._wide = torch.empty(self.tensor.numel(), dtype=torch.float32,
                                 device=self.cuda) if tensor.element_size() == 2 else None
        self._stages: Dict[int, torch.Tensor] = {}
        #: slot copies made (from pageable host memory: see _slot_tensor)
        self.slot_copies = 0

    def host_buffer(self) -> np.ndarray:
        return self._array

    def to_host(self) -> None:
        self.side.wait_stream(torch.cuda.current_stream(self.cuda))
        with torch.cuda.stream(self.side):
            self.pinned.copy_(self.tensor, non_blocking=True)
            self.landed.record(self.side)

    def wait_host(self) -> None:
        self.landed.synchronize()

    def to_device(self) -> None:
        stream = torch.cuda.current_stream(self.cuda)
        with torch.no_grad():
            self.tensor.copy_(self.pinned, non_blocking=True)
        self.back.record(stream)

    def wait_device(self) -> None:
        self.back.synchronize()

    def _slot_tensor(self, address: int) -> torch.Tensor:
        # a CPU tensor over the slot's payload, no copy.  Not registered with CUDA
        # (cudaHostRegister): registering a neighbour's segment, mapped read-only,
        # failed with "invalid argument" on an H100 and left an error that torch's next
        # kernel launch reported; pageable memory is copied by the driver through its
        # own staging, synchronously: the same bytes, slower
        view = torch.from_numpy(np.ctypeslib.as_array(
            (self._ctype * self.tensor.numel()).from_address(address)))
        return view.view(self.tensor.dtype) if self._wide is not None else view

    def slot_to_device(self, index: int, address: int) -> None:
        stage = self._stages.get(index)
        if stage is None:
            stage = self._stages[index] = torch.empty_like(self.tensor)
        with torch.cuda.stream(self.side):
            stage.copy_(self._slot_tensor(address))
        self.slots_in.record(self.side)
        self.slot_copies += 1

    def wait_slots(self) -> None:
        self.slots_in.synchronize()

    def check_wide(self, array) -> None:
        if not (isinstance(array, torch.Tensor) and array.dtype == torch.float32
                and array.device == self.cuda and array.is_contiguous()
                and array.numel() == self.tensor.numel()):
            raise ConfigError(f"the float32 sums of a {self.tensor.dtype} buffer on "
                              f"{self.cuda} go to a contiguous float32 tensor on "
                              f"{self.cuda} of {self.tensor.numel()} values")

    def weighted_sum(self, w_self, inputs, wide=None) -> None:
        with torch.no_grad():
            if self._wide is None:
                acc = self.tensor
            else:
                acc = (self._wide if wide is None else wide.view(-1)).copy_(self.tensor)
            acc.mul_(w_self)
            for index, w in inputs:
                acc.add_(self._stages[index], alpha=w)
            if acc is not self.tensor:
                self.tensor.copy_(acc)          # rounded to nearest even, once

    def report(self) -> dict:
        return {"slot_copies": self.slot_copies, "slots_from": "pageable host memory"}

    def close(self) -> None:
        self.back.synchronize()
        self.landed.synchronize()
        self.slots_in.synchronize()


#: what asapmpi.device.ops_for looks up for torch tensors
DEVICE_OPS = TorchCudaOps
