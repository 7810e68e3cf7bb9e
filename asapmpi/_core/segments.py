"""Shared-memory segments for the shared-memory transport: each rank's own slots.

Every rank maps a segment of its own slots read-write, and the segments of its
in-neighbours read-only, so that a neighbour's update is reduced straight from the
sender's memory.  The segments are files in /dev/shm, unlinked as soon as every rank has
mapped them (a crash leaves nothing behind), and their memory lives as long as anything
maps it: a NumPy view of a slot stays valid after the Exchange is freed.  That is why
they are not part of the MPI window (MPI_Win_free would unmap memory the user may still
hold); the window keeps the control words, whose notifies and acks order the accesses.
"""
from __future__ import annotations

import mmap
import os
import tempfile
import uuid
from typing import List, Optional, Sequence

from mpi4py import MPI

from ..errors import ConfigError

#: where segments are created: a RAM file system, so mapping one is mapping memory
SHM_DIR = "/dev/shm"


def _directory() -> str:
    return SHM_DIR if os.path.isdir(SHM_DIR) else tempfile.gettempdir()


def _create(nbytes: int) -> tuple:
    """(path, read-write mapping) of a new segment of nbytes, reserved up front: a full
    /dev/shm then fails here with ENOSPC, not later with SIGBUS on first touch."""
    path = os.path.join(_directory(), f"asapmpi-{os.getpid()}-{uuid.uuid4().hex}")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.posix_fallocate(fd, 0, nbytes)
        return path, mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
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


class SharedSegments:
    """This rank's segment (`own`, read-write) and its in-neighbours' (`peers`, read-only,
    in in-neighbour order), every segment `nbytes` long.  Creating is collective over
    comm, whose ranks must share one host; a failure on any rank raises on every rank."""

    def __init__(self, comm: MPI.Comm, nbytes: int, in_ranks: Sequence[int]):
        nbytes = max(int(nbytes), mmap.PAGESIZE)
        path: Optional[str] = None
        problem = None
        self.own: Optional[mmap.mmap] = None
        self.peers: List[mmap.mmap] = []
        try:
            path, self.own = _create(nbytes)
        except OSError as exc:
            problem = (f"cannot create a {nbytes}-byte shared-memory segment in "
                       f"{_directory()} ({exc.strerror}); free space there, or pass "
                       f"transport='put'")
        paths = comm.allgather((path, problem))
        try:
            for r, (_, prob) in enumerate(paths):
                if prob:
                    raise ConfigError(prob if r == comm.Get_rank() else f"rank {r}: {prob}")
            problem = None
            try:
                self.peers = [_attach(paths[i][0], nbytes) for i in in_ranks]
            except OSError as exc:
                problem = (f"cannot map a neighbour's shared-memory segment "
                           f"({exc.strerror}); pass transport='put'")
            # nobody unlinks before everybody has mapped what it needs
            problems = comm.allgather(problem)
            for r, prob in enumerate(problems):
                if prob:
                    raise ConfigError(prob if r == comm.Get_rank() else f"rank {r}: {prob}")
        except BaseException:
            self.close()
            raise
        finally:
            if path is not None:
                # after the second allgather (or on an error) nobody opens it any more
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
        self.nbytes = nbytes

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
