#!/usr/bin/env bash
# Install mpi4py for another MPI's mpicc into a venv, idempotently:
#     dev/mpi4py-for.sh VENV MPICC STAMP NAME
# (dev/setup-openmpi.sh, dev/setup-openmpi5.sh).  mpi4py's PyPI wheel carries a build for
# Open MPI's ABI (libmpi.so.40: 4.x and 5.x) beside MPICH's and picks the one of the
# libmpi it finds: it is kept when the libmpi it loads is a file of this mpicc's library
# folder.  Else, or with ASAPMPI_MPI4PY_FROM_SOURCE=1, mpi4py is built from source by the
# mpicc (minutes of compiling on two cores), once per STAMP (what it was built with).
# NAME prefixes the messages.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$1"
MPICC="$2"
STAMP="$3"
NAME="$4"
PY="$VENV/bin/python"
MPI4PY="$(grep -E '^mpi4py==' "$ROOT/dev/requirements.txt")"
BUILT_WITH="$VENV/.mpi4py-built-with"
# the files this mpicc links as libmpi, resolved (Debian's folder holds links; a wheel's
# holds copies)
LIBDIR="$("$MPICC" -showme:libdirs | awk '{print $1}')"
loads_this_mpi() {
    local loaded
    loaded="$(OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "$PY" -c '
import os, mpi4py
mpi4py.rc.initialize = False
from mpi4py import MPI
print([os.path.realpath(line.split()[-1]) for line in open("/proc/self/maps")
       if "libmpi.so" in line][0])' 2>/dev/null)" || return 1
    for lib in "$LIBDIR"/libmpi.so*; do
        [ -e "$lib" ] && [ "$(readlink -f "$lib")" = "$loaded" ] && return 0
    done
    return 1
}
if [ "${ASAPMPI_MPI4PY_FROM_SOURCE:-0}" = 0 ] && [ ! -f "$BUILT_WITH" ]; then
    "$PY" -m pip install --quiet --disable-pip-version-check --no-deps "$MPI4PY" >&2
    loads_this_mpi || echo "$NAME: the binary $MPI4PY does not load the libmpi of" \
        "$LIBDIR; building it from source" >&2
fi
if { [ "${ASAPMPI_MPI4PY_FROM_SOURCE:-0}" != 0 ] || ! loads_this_mpi; } \
        && [ "$(cat "$BUILT_WITH" 2>/dev/null)" != "$MPI4PY $STAMP" ]; then
    echo "$NAME: building $MPI4PY with $MPICC" >&2
    MPICC="$MPICC" "$PY" -m pip install --quiet --disable-pip-version-check \
        --no-binary mpi4py --no-build-isolation --no-cache-dir --force-reinstall --no-deps \
        "$MPI4PY" >&2
    echo "$MPI4PY $STAMP" > "$BUILT_WITH"
fi
