"""What this host offers device buffers, for `asapmpi doctor`: the CUDA devices torch sees,
whether the MPI library says it can take device pointers (MPIX_Query_cuda_support, an
extension of Open MPI and MPICH), and the path an Exchange takes for a device buffer."""
from __future__ import annotations

import ctypes
from typing import List, Optional, Tuple

from ..rc import rc


def cuda_devices() -> Tuple[bool, str]:
    """(torch sees a CUDA device, what it sees), without failing where torch is absent."""
    try:
        import torch
    except ImportError:
        return False, "torch is not installed (pip install '.[torch]')"
    if not torch.cuda.is_available():
        return False, f"none (torch {torch.__version__}: torch.cuda.is_available() is False)"
    names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return True, f"{len(names)}: " + ", ".join(f"cuda:{i} {n}" for i, n in enumerate(names))


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
