#!/usr/bin/env bash
# Set up the second MPI family the tests run on, idempotently: Open MPI as a cluster user
# has it (Debian's openmpi-bin and libopenmpi-dev, with UCX; installed with apt-get when
# missing and this user may), a virtual environment in .venv-openmpi (or
# $ASAPMPI_OPENMPI_VENV) with mpi4py for that Open MPI, and asapmpi built by its mpicc.
# Prints the environment's python on the last line.
#
# mpi4py: its PyPI wheel where it loads this mpicc's libmpi, else built from source by
# the mpicc (dev/mpi4py-for.sh: the source build is most of this set-up's time).
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
bash "$ROOT/dev/mpi4py-for.sh" "$VENV" "$MPICC" "$MPICC" setup-openmpi
# the mpiexec of this MPI, where the tests and asapmpi-run look first
ln -sf "$MPIEXEC" "$VENV/bin/mpiexec"

bash "$ROOT/dev/build-copy.sh" "$VENV" "$MPICC" setup-openmpi
echo "$PY"
