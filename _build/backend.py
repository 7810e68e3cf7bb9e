"""PEP 517 backend: setuptools, plus the embedded MPICH wheel when no site MPI is named.

`pip install .` on a fresh machine has no MPI at all; the PyPI `mpich` wheel then
supplies mpicc and libmpi to the isolated build.  `MPICC=/path/to/mpicc` selects a
site MPI instead, and the wheel is not pulled in.
"""
import os

from setuptools.build_meta import *  # noqa: F403  (re-export the hooks)

_EMBEDDED_MPI = "mpich>=4.1,<6"


def _mpi_requires():
    return [] if os.environ.get("MPICC") else [_EMBEDDED_MPI]


# Setuptools' own get_requires_* hooks would run setup.py, which needs an mpicc: in an
# isolated build that is the very wheel these hooks are asked for, not installed yet, so
# setup.py would exit with "no mpicc found".  setup.py declares no setup_requires, so
# setuptools would add nothing beyond pyproject's [build-system] requires anyway.


def get_requires_for_build_wheel(config_settings=None):
    """The embedded MPI when needed (pyproject's requires cover the rest)."""
    return _mpi_requires()


def get_requires_for_build_editable(config_settings=None):
    """The embedded MPI when needed (pyproject's requires cover the rest)."""
    return _mpi_requires()
