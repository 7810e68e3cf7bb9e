"""Fixtures shared by the test modules."""
import os

import mpi4py
import pytest

from asapmpi.launch import shm_leftovers

from mpilaunch import STACK

if STACK == "openmpi":
    # The tests start their ranks with mpiexec; this process needs no MPI.  Initialized
    # here (by a test module importing mpi4py.MPI), Open MPI would start as a singleton
    # and put its PMIx variables into the C environment, which every process started
    # without env= inherits: an mpiexec started with them exits 1 at once.
    mpi4py.rc.initialize = False
    mpi4py.rc.finalize = False


@pytest.fixture
def shm_cleaned():
    """Remove the shared-memory files that a test's killed ranks left in /dev/shm (the
    MPI library's: MPICH keeps mpich_shm_* of a killed job), and only those: files that
    appeared during the test and that no process maps or holds open."""
    before = set(os.listdir(shm_leftovers.SHM_DIR)) \
        if os.path.isdir(shm_leftovers.SHM_DIR) else set()
    yield
    left = [f for f in shm_leftovers.stale_files(min_age=0)
            if os.path.basename(f["path"]) not in before]
    shm_leftovers.clean(left)
