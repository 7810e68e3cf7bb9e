"""PEP 517 backend: setuptools, plus the embedded MPICH wheel when no site MPI is named.

`pip install .` on a fresh machine has no MPI at all; the PyPI `mpich` wheel then
supplies mpicc and libmpi to the isolated build.  `MPICC=/path/to/mpicc` selects a
site MPI instead, and the wheel is not pulled in.
"""
import os

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F401,F403  (re-export the hooks)

_EMBEDDED_MPI = "mpich>=4.1,<6"


def _mpi_requires():
    return [] if os.environ.get("MPICC") else [_EMBEDDED_MPI]


def get_requires_for_build_wheel(config_settings=None):
    """Setuptools' wheel requirements plus the embedded MPI when needed."""
    return _setuptools.get_requires_for_build_wheel(config_settings) + _mpi_requires()


def get_requires_for_build_editable(config_settings=None):
    """Setuptools' editable requirements plus the embedded MPI when needed."""
    return _setuptools.get_requires_for_build_editable(config_settings) + _mpi_requires()
