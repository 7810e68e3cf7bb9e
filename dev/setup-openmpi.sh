#!/usr/bin/env bash
# Set up the second MPI family the tests run on, idempotently: Open MPI as a cluster user
# has it (Debian's openmpi-bin and libopenmpi-dev, with UCX; installed with apt-get when
# missing and this user may), a virtual environment in .venv-openmpi (or
# $ASAPMPI_OPENMPI_VENV) with mpi4py for that Open MPI, and asapmpi built by its mpicc.
# Prints the environment's python on the last line.
#
# mpi4py: its PyPI wheel carries a build for Open MPI's ABI (libmpi.so.40, 4.x and 5.x)
# beside MPICH's and picks the one of the libmpi it finds; it is taken when the libmpi
# it loads is the very file of this mpicc's library folder (else, or with
# ASAPMPI_MPI4PY_FROM_SOURCE=1, mpi4py is built from source by the mpicc: minutes of
# compiling on two cores, most of this set-up's time).
#
# asapmpi is built in a copy of the source tree ($VENV/src): an in-place build here
# would overwrite the MPICH build's extension modules in the checkout.  The copy holds
# the checkout's files as they are now (committed or not), refreshed on every run.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${ASAPMPI_OPENMPI_VENV:-$ROOT/.venv-openmpi}"
PY="$VENV/bin/python"
MPICC="${OPENMPI_MPICC:-/usr/bin/mpicc.openmpi}"

if ! "$MPICC" -showme:version >/dev/null 2>&1; then
    SUDO=""
    [ "$(id -u)" = 0 ] || SUDO="sudo -n"
    if ! command -v apt-get >/dev/null; then
        echo "setup-openmpi: Open MPI is missing and there is no apt-get; install Open MPI" \
             "and set OPENMPI_MPICC=/path/to/its/mpicc" >&2
        exit 1
    fi
    echo "setup-openmpi: installing Debian's openmpi-bin libopenmpi-dev" >&2
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq >&2
    $SUDO apt-get install -y -qq --no-install-recommends openmpi-bin libopenmpi-dev >&2
fi
"$MPICC" -showme:version 2>&1 | grep -q "Open MPI" || {
    echo "setup-openmpi: $MPICC is not Open MPI's mpicc; set OPENMPI_MPICC" >&2; exit 1; }
MPIEXEC="$(dirname "$MPICC")/mpiexec.openmpi"
[ -x "$MPIEXEC" ] || MPIEXEC="$(dirname "$MPICC")/mpiexec"

if [ ! -x "$PY" ]; then
    echo "setup-openmpi: creating $VENV" >&2
    python3 -m venv "$VENV"
fi
# everything the tests need but the MPICH wheel and its mpi4py, and the training
# frameworks (their tests run on MPICH only: tests/mpilaunch.py above_the_core)
grep -v -E '^(mpich|mpi4py|transformers|accelerate|lightning)==' "$ROOT/dev/requirements.txt" \
    | "$PY" -m pip install --quiet --disable-pip-version-check -r /dev/stdin >&2
MPI4PY="$(grep -E '^mpi4py==' "$ROOT/dev/requirements.txt")"
BUILT_WITH="$VENV/.mpi4py-built-with"
# the libmpi this mpicc links, resolved (Debian's folder holds a link to it)
LIBMPI="$(readlink -f "$("$MPICC" -showme:libdirs | awk '{print $1}')/libmpi.so" || true)"
loads_this_open_mpi() {
    [ -n "$LIBMPI" ] && [ "$(OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
        "$PY" -c 'import os, mpi4py; mpi4py.rc.initialize = False; from mpi4py import MPI
print([os.path.realpath(line.split()[-1]) for line in open("/proc/self/maps")
       if "libmpi.so" in line][0])' 2>/dev/null)" = "$LIBMPI" ]
}
if [ "${ASAPMPI_MPI4PY_FROM_SOURCE:-0}" = 0 ] && [ ! -f "$BUILT_WITH" ]; then
    "$PY" -m pip install --quiet --disable-pip-version-check --no-deps "$MPI4PY" >&2
    loads_this_open_mpi || echo "setup-openmpi: the binary $MPI4PY does not load" \
        "$LIBMPI; building it from source" >&2
fi
if { [ "${ASAPMPI_MPI4PY_FROM_SOURCE:-0}" != 0 ] || ! loads_this_open_mpi; } \
        && [ "$(cat "$BUILT_WITH" 2>/dev/null)" != "$MPI4PY $MPICC" ]; then
    echo "setup-openmpi: building $MPI4PY with $MPICC" >&2
    MPICC="$MPICC" "$PY" -m pip install --quiet --disable-pip-version-check \
        --no-binary mpi4py --no-build-isolation --no-cache-dir --force-reinstall --no-deps \
        "$MPI4PY" >&2
    echo "$MPI4PY $MPICC" > "$BUILT_WITH"
fi
# the mpiexec of this MPI, where the tests and asapmpi-run look first
ln -sf "$MPIEXEC" "$VENV/bin/mpiexec"

bash "$ROOT/dev/build-copy.sh" "$VENV" "$MPICC" setup-openmpi
echo "$PY"
