"""Recognising device memory among the buffers an Exchange is given, without importing a
framework: torch tensors by their own attributes, anything else by
``__cuda_array_interface__`` (CuPy, Numba) or DLPack's ``__dlpack_device__``."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from ..errors import ConfigError

#: DLPack device types (dlpack.h): host memory, and the CUDA ones
DL_CPU, DL_CUDA, DL_CUDA_HOST, DL_CUDA_MANAGED = 1, 2, 3, 13
#: what a device buffer may hold: the element types of host buffers (asapmpi.dtypes)
DTYPES = {"float32": 4, "float64": 8, "bfloat16": 2, "float16": 2}
_TYPESTR = {"<f4": "float32", "<f8": "float64", "<f2": "float16"}


@dataclass(frozen=True)
class DeviceBuffer:
    """A device array an Exchange was given: the object itself, where it lives and what
    it holds."""

    array: Any          #: the user's array (a torch tensor, a CuPy array, ...)
    framework: str      #: "torch", "cupy", ... or what the array's own ops are named
    device: str         #: "cuda:0", ...
    dtype: str          #: "float32" or "float64"
    count: int          #: elements

    @property
    def nbytes(self) -> int:
        """Bytes the array holds."""
        return self.count * DTYPES[self.dtype]


def _framework(array: Any) -> str:
    return type(array).__module__.partition(".")[0]


def _check(framework: str, dtype: str, count: int, contiguous: bool, readonly: bool) -> None:
    if dtype not in DTYPES:
        raise ConfigError(f"a {framework} device buffer must be float32, float64, "
                          f"bfloat16 or float16, got {dtype}; convert it with .float() "
                          f"or .double()")
    if not contiguous:
        raise ConfigError(f"a {framework} device buffer must be contiguous; pass "
                          f".contiguous() (torch) or ascontiguousarray (CuPy)")
    if readonly:
        raise ConfigError(f"the {framework} device buffer is read-only: step() reduces "
                          f"into it")
    if count == 0:
        raise ConfigError("buffer is empty; pass at least one element")


def _torch_buffer(array: Any) -> Optional[DeviceBuffer]:
    # torch's own attributes: __cuda_array_interface__ refuses tensors that require grad
    if array.device.type == "cpu":
        return None
    if array.device.type != "cuda":
        raise ConfigError(f"device buffers must be CUDA tensors, got one on "
                          f"{array.device.type}; move it with .cuda() or .cpu()")
    dtype = str(array.dtype).rpartition(".")[2]
    _check("torch", dtype, int(array.numel()), bool(array.is_contiguous()), False)
    return DeviceBuffer(array, "torch", str(array.device), dtype, int(array.numel()))


def device_buffer(array: Any) -> Optional[DeviceBuffer]:
    """None for host memory (an Exchange then takes the buffer as it is); a DeviceBuffer
    for a contiguous float32/float64 CUDA array, or an array that brings its own device
    ops (``__asapmpi_device_ops__``); ConfigError, in one line, for device memory the
    Exchange cannot take."""
    framework = _framework(array)
    own = getattr(array, "__asapmpi_device_ops__", None)
    if own is not None:
        return DeviceBuffer(array, own().name, array.device, str(array.dtype),
                            int(array.size))
    if framework == "torch" and hasattr(array, "is_cuda"):
        return _torch_buffer(array)
    interface = getattr(array, "__cuda_array_interface__", None)
    if interface is not None:
        shape, strides = tuple(interface["shape"]), interface.get("strides")
        count = 1
        for n in shape:
            count *= int(n)
        dtype = _TYPESTR.get(interface["typestr"], interface["typestr"])
        contiguous = strides is None or _c_strides(shape, DTYPES.get(dtype, 1)) == \
            tuple(strides)
        readonly = bool(interface["data"][1])
        _check(framework, dtype, count, contiguous, readonly)
        index = getattr(getattr(array, "device", None), "id", 0)
        return DeviceBuffer(array, framework, f"cuda:{index}", dtype, count)
    dl_device = getattr(array, "__dlpack_device__", None)
    if dl_device is not None and not hasattr(array, "__buffer__") and \
            not _has_buffer_protocol(array):
        kind, index = dl_device()
        if kind not in (DL_CPU, DL_CUDA_HOST):
            raise ConfigError(f"a {framework} buffer on DLPack device type {kind} "
                              f"(index {index}) is neither host memory nor a CUDA array "
                              f"asapmpi can stage; pass a torch tensor or CuPy array")
    return None


def _has_buffer_protocol(array: Any) -> bool:
    try:
        memoryview(array).release()
    except TypeError:
        return False
    return True


def _c_strides(shape, itemsize: int):
    strides, step = [], itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= int(n)
    return tuple(reversed(strides))
