"""What this host offers device buffers, for `asapmpi doctor`: the CUDA devices the driver sees,
whether the MPI library says it can take device pointers (MPIX_Query_cuda_support, an
extension of Open MPI and MPICH), and the path an Exchange takes for a device buffer."""
from __future__ import annotations

import ctypes
from typing import List, Optional, Tuple

from ..rc import rc

#: the CUDA driver's library (the NVIDIA driver installs it; no toolkit or torch needed)
CUDA_DRIVER = "libcuda.so.1"


def cuda_devices(library: str = CUDA_DRIVER) -> Tuple[bool, str]:
    """(the CUDA driver sees a device, what it sees), asked of the driver itself
    (cuInit, cuDeviceGetCount, cuDeviceGetName through ctypes): the core imports no
    torch (it is asapmpi.torch's), and a host without the driver is told so."""
    try:
        cuda = ctypes.CDLL(library)
    except OSError:
        return False, f"none (no CUDA driver: {library} cannot be loaded)"
    status = cuda.cuInit(0)
    if status != 0:
        return False, f"none (cuInit failed: CUresult {status})"
    count = ctypes.c_int(0)
    status = cuda.cuDeviceGetCount(ctypes.byref(count))
    if status != 0 or count.value == 0:
        return False, f"none (cuDeviceGetCount: {count.value} devices, CUresult {status})"
    names = []
    for i in range(count.value):
        device, name = ctypes.c_int(0), ctypes.create_string_buffer(256)
        if cuda.cuDeviceGet(ctypes.byref(device), i) == 0 and \
                cuda.cuDeviceGetName(name, len(name), device) == 0:
            names.append(f"cuda:{i} {name.value.decode(errors='replace')}")
        else:
            names.append(f"cuda:{i} (name not reported)")
    return True, f"{count.value}: " + ", ".join(names)


def _loaded_mpi_library() -> Optional[str]:
    # the libmpi mpi4py loaded (RTLD_LOCAL: its symbols are not in the global scope)
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            for line in maps:
                path = line.split()[-1]
                if "/libmpi" in path and ".so" in path:
                    return path
    except OSError:
        pass
    return None


def mpi_cuda_support() -> str:
    """What the loaded MPI library answers to MPIX_Query_cuda_support, in words."""
    from mpi4py import MPI  # noqa: F401  (loads the library)

    path = _loaded_mpi_library()
    if path is None:
        return "unknown (the MPI library was not found among the loaded ones)"
    query = getattr(ctypes.CDLL(path), "MPIX_Query_cuda_support", None)
    if query is None:
        return f"not reported ({path} has no MPIX_Query_cuda_support)"
    query.restype = ctypes.c_int
    return "yes (MPIX_Query_cuda_support)" if query() else \
        "no (MPIX_Query_cuda_support says 0)"


def device_checks() -> List[Tuple[str, bool, str]]:
    """(check, passed, detail) rows on device buffers: informative, never failing."""
    has_cuda, devices = cuda_devices()
    reduce = "on the device" if rc.device_reduce else "on the host (rc.device_reduce off)"
    path = (f"staged through pinned host memory, reduced {reduce} (asapmpi.device); "
            f"device pointers are not handed to MPI") if has_cuda else \
        "none: device buffers need a CUDA device"
    return [("CUDA devices", True, devices), ("MPI CUDA support", True, mpi_cuda_support()),
            ("device buffer path", True, path)]
