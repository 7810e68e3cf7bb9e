"""asapmpi._core: MPI and memory.  Slot windows on MPI RMA and the fused reduce kernels.

Importing this package first loads mpi4py.MPI (which maps libmpi into the process), then
checks that the extension was built against the MPI ABI mpi4py loaded, and only then
loads the extension modules, so that a mismatch is a clear error instead of a crash.
"""
from .mpiabi import check_mpi_abi

check_mpi_abi()

from . import kernels  # noqa: E402
from .layout import Layout  # noqa: E402
from .slotwin import (  # noqa: E402
    AHEAD,
    AWAIT_MODES,
    CONSISTENT,
    ROW_WORDS_MAX,
    STALE,
    STATUS_NAMES,
    TORN,
    MailboxWindow,
    MessageWindow,
    NewestWindow,
    PushWindow,
    PutWindow,
    SharedWindow,
    SlotStore,
    SlotWindow,
    WordPeek,
)

__all__ = [
    "AHEAD", "AWAIT_MODES", "CONSISTENT", "ROW_WORDS_MAX", "STALE", "STATUS_NAMES", "TORN",
    "Layout", "MailboxWindow", "MessageWindow", "NewestWindow", "PushWindow", "PutWindow",
    "SharedWindow", "SlotStore", "SlotWindow", "WordPeek",
    "check_mpi_abi", "kernels",
]
