"""Check, before the extension loads, that it and mpi4py agree on the MPI library."""
from __future__ import annotations

import glob
import importlib
import os

from asapmpi.errors import MPIMismatchError


def build_config():
    """Return the build record module (MPI_ABI, MPICC, VERSION, ...), or None."""
    try:
        return importlib.import_module("asapmpi._core._build_config")
    except ImportError:
        return None


def library_version() -> str:
    """The first line of the loaded MPI library's version, printable: Open MPI's string
    ends in a NUL (which HDF5 refuses in an attribute) and MPICH's in a newline."""
    from mpi4py import MPI

    text = MPI.Get_library_version().replace("\0", "").strip()
    return " ".join(text.splitlines()[0].split()) if text else "unknown MPI library"


def runtime_abi() -> tuple[str, str]:
    """Return (ABI family, library version line) of the MPI that mpi4py loaded."""
    version = library_version()
    try:
        from mpi4py import _mpiabi

        abi = _mpiabi._get_mpiabi()  # mpi4py >= 4.1 wheels: "mpich", "openmpi", "mpiabi"
    except (ImportError, AttributeError, RuntimeError):
        abi = "openmpi" if "Open MPI" in version else "mpich"
    return abi, version


def check_mpi_abi() -> None:
    """Raise MPIMismatchError if the core was built for another MPI ABI than mpi4py's."""
    config = build_config()
    if config is None:
        raise MPIMismatchError(
            "asapmpi._core has no build record (_build_config.py): the extension was not "
            "built; reinstall with 'pip install .' or build with CMake"
        )
    abi, version = runtime_abi()
    if abi != config.MPI_ABI:
        built = built_library(config)
        other = (f", or run with MPI4PY_LIBMPI={built} (mpi4py then loads the library "
                 f"asapmpi was built against)") if built else ""
        raise MPIMismatchError(
            f"asapmpi._core was built against the {config.MPI_ABI} ABI ({config.MPICC}) but "
            f"mpi4py loaded the {abi} ABI ({version}); rebuild asapmpi with "
            f"MPICC=<the mpicc of the MPI mpi4py uses>{other}"
        )


def built_library(config) -> str:
    """The MPI library file asapmpi was linked against (its build record's folders and
    names, the versioned file first), or "" when none is found there."""
    for folder in getattr(config, "LIBRARY_DIRS", []):
        for name in getattr(config, "LIBRARIES", []):
            found = sorted(glob.glob(os.path.join(folder, f"lib{name}.so*")),
                           key=lambda path: (-len(path), path))
            if found:
                return found[0]
    return ""
