#!/usr/bin/env bash
# Set everything up (dev/setup.sh) and run the whole test suite: serial tests, multi-rank
# tests under mpiexec (2, 4 and 8 ranks, shared-memory and forced network path) and the
# build tests (isolated pip install, MPICC, CMake).  Extra arguments go to pytest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="$(bash "$ROOT/dev/setup.sh")"
cd "$ROOT"
exec "$PY" -m pytest -p no:cacheprovider -ra "$@" tests
