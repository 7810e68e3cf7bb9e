"""Optional dependencies: the core needs only mpi4py, NumPy and h5py; the training demos,
the plots and the PyTorch bindings come with the extras `asapmpi[train]`, `asapmpi[plot]`
and `asapmpi[torch]` (declared in pyproject.toml).  A missing one is reported in one line
naming the `pip install` to run.

    sparse = require("scipy.sparse", "train", "reading LIBSVM files")
"""
from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType
from typing import Iterable, List

from .errors import ConfigError

# Import names whose distribution is called differently on PyPI.
_DISTRIBUTIONS = {"sklearn": "scikit-learn"}


class MissingExtra(ConfigError, ImportError):
    """An optional dependency is not installed; the message names the `pip install`.

    A ConfigError, so that the command line prints it as one line (exit code 2), and an
    ImportError, so that code probing for the dependency keeps working.
    """


def _message(modules: Iterable[str], extra: str, what: str, otherwise: str) -> str:
    names = ", ".join(dict.fromkeys(_DISTRIBUTIONS.get(m.split(".")[0], m.split(".")[0])
                                    for m in modules))
    tail = f" ({otherwise})" if otherwise else ""
    return f"{what} needs {names}: pip install 'asapmpi[{extra}]'{tail}"


def require(module: str, extra: str, what: str, otherwise: str = "") -> ModuleType:
    """Import and return `module`, or raise MissingExtra: "`what` needs `module`: pip
    install 'asapmpi[`extra`]'" (plus "(`otherwise`)" when given)."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingExtra(_message([module], extra, what, otherwise)) from None


def missing(modules: Iterable[str]) -> List[str]:
    """The modules of `modules` that cannot be imported (found without importing them,
    so that checking torch costs nothing)."""
    absent = []
    for module in modules:
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # a blocked parent, or sys.modules[name] = None
            found = False
        if not found:
            absent.append(module)
    return absent


def check(modules: Iterable[str], extra: str, what: str) -> None:
    """Raise MissingExtra naming every module of `modules` that is not installed."""
    absent = missing(modules)
    if absent:
        raise MissingExtra(_message(absent, extra, what, ""))
