"""Fixtures shared by the test modules."""
import os

import pytest

from asapmpi import shm_leftovers


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
