"""Host memory standing in for a device, so that CI tests the staged channel (asapmpi.device)
through the Exchange's own code path without a GPU.

A StandIn holds its "device" values in a NumPy array and brings its own ops: like a
stream, each copy happens later than it is asked for (a copy to the host when it is
waited for, a copy to the device when the device is next used or waited for), so that a
step that forgets a wait, or changes the host buffer under a queued copy, reads values
that are wrong and fails its test instead of passing by luck."""
from __future__ import annotations

import ctypes
from typing import Dict, List, Tuple

import numpy as np

from ..device.ops import DeviceOps
from ..errors import ConfigError


class StandIn:
    """A float16/float32/float64 array posing as device memory (read it with
    values())."""

    def __init__(self, values):
        self._data = np.array(values, copy=True)
        if self._data.dtype not in (np.float16, np.float32, np.float64):
            self._data = self._data.astype(np.float64)
        self.dtype = self._data.dtype
        self.size = int(self._data.size)
        self.shape = self._data.shape
        self.device = "standin:0"
        #: the device's queue: copies from the host buffer not yet made
        self.queued: List[np.ndarray] = []
        #: copies made each way (what the staged channel asked for)
        self.to_host_copies = 0
        self.to_device_copies = 0

    def __asapmpi_device_ops__(self):
        return StandInOps

    def run_queue(self) -> None:
        """Make the copies queued to this device (what later device work would see)."""
        for host in self.queued:
            self._data.reshape(-1)[...] = host
            self.to_device_copies += 1
        self.queued.clear()

    def values(self) -> np.ndarray:
        """The device's values as device work would read them now (a copy)."""
        self.run_queue()
        return self._data.copy()

    def write(self, values) -> None:
        """Device work writing the array (ordered after the queued copies)."""
        self.run_queue()
        self._data[...] = values


class StandInOps(DeviceOps):
    """DeviceOps for a StandIn: every copy deferred as a stream would defer it."""

    name = "standin"

    def __init__(self, device):
        super().__init__(device)
        self.array: StandIn = device.array
        self._host = np.zeros(self.array.size, dtype=self.array.dtype)
        self._host_pending = False
        self._stages: Dict[int, np.ndarray] = {}
        self._slot_copies: List[Tuple[int, int]] = []
        #: slot copies made (the device reduce's inputs)
        self.slot_copies = 0

    def host_buffer(self) -> np.ndarray:
        return self._host

    def to_host(self) -> None:
        # the side stream waits for the device's queue, then copies, when waited for
        self._host_pending = True

    def wait_host(self) -> None:
        if self._host_pending:
            self.array.run_queue()
            self._host[...] = self.array._data.reshape(-1)
            self.array.to_host_copies += 1
            self._host_pending = False

    def to_device(self) -> None:
        # the copy reads the host buffer when it runs, not now: the host buffer must
        # stay as it is until then (a view, not a snapshot)
        self.array.queued.append(self._host)

    def wait_device(self) -> None:
        self.array.run_queue()

    def slot_to_device(self, index: int, address: int) -> None:
        # the copy reads the slot when it runs (at wait_slots), as a DMA would
        if index not in self._stages:
            self._stages[index] = np.empty_like(self._host)
        self._slot_copies.append((index, address))

    def wait_slots(self) -> None:
        for index, address in self._slot_copies:
            ctypes.memmove(self._stages[index].ctypes.data, address, self._host.nbytes)
            self.slot_copies += 1
        self._slot_copies.clear()

    def check_wide(self, array) -> None:
        if not (isinstance(array, np.ndarray) and array.dtype == np.float32
                and array.flags.c_contiguous and array.size == self.array.size):
            raise ConfigError(f"the float32 sums of a stand-in buffer go to a "
                              f"C-contiguous float32 NumPy array of {self.array.size} "
                              f"values")

    def weighted_sum(self, w_self, inputs, wide=None) -> None:
        assert not self._slot_copies, "weighted_sum before wait_slots: stages not copied"
        self.array.run_queue()
        data = self.array._data.reshape(-1)
        if data.dtype != np.float16:
            data *= w_self
            for index, w in inputs:
                data += w * self._stages[index]
            return
        # float16: summed in float32 (as the host kernel and torch's ops do), rounded once
        acc = np.empty(data.size, dtype=np.float32) if wide is None else wide.reshape(-1)
        acc[...] = data
        acc *= np.float32(w_self)
        for index, w in inputs:
            acc += np.float32(w) * self._stages[index].astype(np.float32)
        data[...] = acc
