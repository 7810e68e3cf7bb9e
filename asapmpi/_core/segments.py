"""Shared-memory segments for the shared-memory transport: each rank's own slots.

Every rank maps a segment of its own slots read-write, and the segments of its
in-neighbours read-only, so that a neighbour's update is reduced straight from the
sender's memory.  A segment is anonymous shared memory (memfd_create): it has no name in
/dev/shm, so a job whose ranks are killed at any moment leaves nothing behind.  Its
neighbours open it through /proc/OWNER/fd/FD while the owner holds the descriptor (from
the first to the second allgather of the creation).  Where /proc does not allow that
(a hardened kernel) or memfd is missing, every rank falls back to files in /dev/shm that
are unlinked as soon as every rank has mapped them (a rank killed in between leaves its
file: `asapmpi doctor --clean` removes those).  A segment's memory lives as long as
anything maps it: a NumPy view of a slot stays valid after the Exchange is freed.  That
is why they are not part of the MPI window (MPI_Win_free would unmap memory the user may
still hold); the window keeps the control words, whose notifies and acks order the
accesses.
"""
from __future__ import annotations

import mmap
import os
import tempfile
import uuid
from typing import List, Optional, Sequence, Tuple

from mpi4py import MPI

from ..errors import ConfigError

#: where file-backed segments are created: a RAM file system, so mapping one is mapping
#: memory
SHM_DIR = "/dev/shm"
#: name prefix of file-backed segments (asapmpi-PID-UUID)
FILE_PREFIX = "asapmpi-"


def _directory() -> str:
    return SHM_DIR if os.path.isdir(SHM_DIR) else tempfile.gettempdir()


def _reserve(fd: int, nbytes: int) -> mmap.mmap:
    # reserved up front: a full /dev/shm (or memory cgroup) fails here with ENOSPC, not
    # later with SIGBUS on first touch
    os.posix_fallocate(fd, 0, nbytes)
    return mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)


def _create_anonymous(nbytes: int) -> Tuple[str, int, mmap.mmap]:
    """(name peers open, descriptor to keep open until they did, read-write mapping)."""
    fd = os.memfd_create("asapmpi-segment", os.MFD_CLOEXEC)
    try:
        return f"/proc/{os.getpid()}/fd/{fd}", fd, _reserve(fd, nbytes)
    except BaseException:
        os.close(fd)
        raise


def _create_file(nbytes: int) -> Tuple[str, int, mmap.mmap]:
    """(path, -1, read-write mapping) of a new file in /dev/shm, to be unlinked once
    every neighbour mapped it."""
    path = os.path.join(_directory(), f"{FILE_PREFIX}{os.getpid()}-{uuid.uuid4().hex}")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        return path, -1, _reserve(fd, nbytes)
    except BaseException:
        os.unlink(path)
        raise
    finally:
        os.close(fd)


def _attach(path: str, nbytes: int) -> mmap.mmap:
    fd = os.open(path, os.O_RDONLY)
    try:
        return mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ)
    finally:
        os.close(fd)


def _raise_first(problems: Sequence[Optional[str]], rank: int) -> None:
    for r, prob in enumerate(problems):
        if prob:
            raise ConfigError(prob if r == rank else f"rank {r}: {prob}")


class SharedSegments:
    """This rank's segment (`own`, read-write) and its in-neighbours' (`peers`, read-only,
    in in-neighbour order), every segment `nbytes` long.  Creating is collective over
    comm, whose ranks must share one host; a failure on any rank raises on every rank."""

    def __init__(self, comm: MPI.Comm, nbytes: int, in_ranks: Sequence[int]):
        nbytes = max(int(nbytes), mmap.PAGESIZE)
        self.own: Optional[mmap.mmap] = None
        self.peers: List[mmap.mmap] = []
        self.nbytes = nbytes
        anonymous = hasattr(os, "memfd_create")
        if not all(comm.allgather(anonymous)):
            anonymous = False
        if anonymous and self._share(comm, nbytes, in_ranks, _create_anonymous):
            self.kind = "anonymous"
            return
        # memfd missing somewhere, or /proc/PID/fd not openable: named files
        self._share(comm, nbytes, in_ranks, _create_file, last=True)
        self.kind = "file"

    def _share(self, comm: MPI.Comm, nbytes: int, in_ranks: Sequence[int], create,
               last: bool = False) -> bool:
        """Create this rank's segment with `create` and map the in-neighbours'; False
        (nothing kept) when some rank could not map one and `last` is not set."""
        name: Optional[str] = None
        fd = -1
        problem = None
        try:
            name, fd, self.own = create(nbytes)
        except OSError as exc:
            problem = (f"cannot create a {nbytes}-byte shared-memory segment "
                       f"({exc.strerror}); free memory or space in {_directory()}, or "
                       f"pass transport='put'")
        names = comm.allgather((name, problem))
        try:
            _raise_first([prob for _, prob in names], comm.Get_rank())
            problem = None
            try:
                self.peers = [_attach(names[i][0], nbytes) for i in in_ranks]
            except OSError as exc:
                problem = (f"cannot map a neighbour's shared-memory segment "
                           f"({exc.strerror}); pass transport='put'")
            # nobody closes or unlinks before everybody has mapped what it needs
            problems = comm.allgather(problem)
            if any(problems) and not last:
                self.close()
                return False
            _raise_first(problems, comm.Get_rank())
        except BaseException:
            self.close()
            raise
        finally:
            if fd >= 0:
                os.close(fd)        # the mappings keep the memory
            elif name is not None:
                # after the second allgather (or on an error) nobody opens it any more
                try:
                    os.unlink(name)
                except FileNotFoundError:
                    pass
        return True

    def close(self) -> None:
        """Drop this object's mappings.  Memory still viewed (a NumPy array of a slot)
        stays mapped until the last view is gone."""
        for m in [self.own, *self.peers]:
            if m is None:
                continue
            try:
                m.close()
            except BufferError:
                pass        # exported (viewed): unmapped when the last view dies
        self.own, self.peers = None, []
