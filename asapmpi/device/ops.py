"""What a framework provides for the staged channel (DeviceOps), and where an Exchange
finds it for a device array.

The ops of a framework live with its binding (torch: asapmpi.torch.device, the only code
that imports torch); an array type of one's own can bring its ops through
``__asapmpi_device_ops__`` (asapmpi.testing.device does, with host memory standing in
for the device, so that CI tests the staged channel without a GPU)."""
from __future__ import annotations

import importlib
from typing import Type

import numpy as np

from ..errors import ConfigError
from .buffers import DeviceBuffer

#: framework -> the module that defines its DEVICE_OPS (imported on first use)
PROVIDERS = {"torch": "asapmpi.torch.device"}


class DeviceOps:
    """One device buffer's staging: a pinned host buffer of the same size, made once,
    and the two copies between them, each ordered with the device's own work.

    to_host() queues device -> host after the device work queued so far (a side stream:
    it may overlap compute queued later); wait_host() blocks until it landed.
    to_device() queues host -> device before any device work queued later (the device's
    current stream); the host buffer must not change until wait_device() or the next
    to_host(), which the ops order after it."""

    #: what the ops are called in reports and errors
    name = "device"

    def __init__(self, device: DeviceBuffer):
        self.device = device

    def host_buffer(self) -> np.ndarray:
        """The pinned host array the host channel sends from and reduces into."""
        raise NotImplementedError

    def to_host(self) -> None:
        """Queue the copy of the device array into the host buffer."""
        raise NotImplementedError

    def wait_host(self) -> None:
        """Block until the last to_host() copy is in the host buffer."""
        raise NotImplementedError

    def to_device(self) -> None:
        """Queue the copy of the host buffer into the device array."""
        raise NotImplementedError

    def wait_device(self) -> None:
        """Block until the last to_device() copy is done."""
        raise NotImplementedError

    # the reduce on the device (asapmpi.device.reduce): one stage per in-neighbour

    def slot_to_device(self, index: int, address: int) -> None:
        """Queue the copy of the payload at host `address` (a verified slot, the
        buffer's size) into device stage `index` (made on first use)."""
        raise NotImplementedError

    def wait_slots(self) -> None:
        """Block until every slot_to_device() copy is done (the slots may then be
        checked again and released)."""
        raise NotImplementedError

    def weighted_sum(self, w_self: float, inputs, wide=None) -> None:
        """device = w_self * device + sum of w * stage[index] over `inputs` ((index, w)
        pairs), in the device's stream order.  A 16-bit buffer is summed in float32 and
        rounded once; with `wide` (a float32 array that check_wide accepted) the float32
        sums are left there too (float32 master weights take the mix from them)."""
        raise NotImplementedError

    def check_wide(self, array) -> None:
        """ConfigError unless `array` can take weighted_sum's float32 sums: a
        contiguous float32 array of the ops' framework, on the device, one value per
        element of the buffer."""
        raise ConfigError(f"the {self.name} device ops keep no float32 sums")

    def report(self) -> dict:
        """What the ops did that a user may want to know (how slots were copied)."""
        return {}

    def close(self) -> None:
        """Release what the ops hold (the pinned buffer's registration, streams)."""


def ops_for(device: DeviceBuffer) -> DeviceOps:
    """The DeviceOps for `device`: the array's own, or its framework's (imported now);
    ConfigError naming the framework when none provides them."""
    own = getattr(device.array, "__asapmpi_device_ops__", None)
    if own is not None:
        cls: Type[DeviceOps] = own()
        return cls(device)
    module = PROVIDERS.get(device.framework)
    if module is None:
        raise ConfigError(f"asapmpi stages device buffers of {sorted(PROVIDERS)}, not of "
                          f"{device.framework}; pass a torch tensor (torch.as_tensor(x, "
                          f"device='cuda') shares the memory through DLPack)")
    return importlib.import_module(module).DEVICE_OPS(device)
