#!/usr/bin/env bash
# The flake hunt (issue 50): run the multi-rank tests N times on one or both MPI
# families, optionally with a CPU hog on every core (busy loops in processes of their
# own, started and stopped here), and count each test's failures over the repeats.
#
#   bash dev/flake-hunt.sh --repeat 20 [--hog] [--family mpich|openmpi|both] [pytest args]
#   bash dev/flake-hunt.sh --repeat 5 --hog tests/exchange/test_join.py -k determin
#
# Without pytest args it runs every multi-rank test (-m "mpi and not build": about 20
# minutes a repeat on MPICH on 2 cores, 15 on Open MPI).  The junit XML of each run and
# the summary land in $OUT (default /tmp/flake-hunt).  Exit code: non-zero if any test
# failed in any repeat.  Time nothing while it runs: the hog is there to make ranks late.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-/tmp/flake-hunt}"
REPEAT=1
HOG=0
FAMILY=both
while [ $# -gt 0 ]; do
    case "$1" in
        --repeat) REPEAT="$2"; shift 2 ;;
        --hog) HOG=1; shift ;;
        --family) FAMILY="$2"; shift 2 ;;
        *) break ;;
    esac
done
case "$FAMILY" in mpich|openmpi|both) ;; *)
    echo "flake-hunt: --family must be mpich, openmpi or both, got $FAMILY" >&2; exit 2 ;;
esac
if ! [[ "$REPEAT" =~ ^[1-9][0-9]*$ ]]; then
    echo "flake-hunt: --repeat takes a whole number >= 1, got $REPEAT" >&2; exit 2
fi
SELECT=("$@")
[ ${#SELECT[@]} -eq 0 ] && SELECT=(tests)
mkdir -p "$OUT"
rm -f "$OUT"/*.xml

HOGS=()
stop_hogs() {
    for pid in "${HOGS[@]:-}"; do
        [ -n "$pid" ] && kill "$pid" 2>/dev/null || true
    done
}
trap stop_hogs EXIT INT TERM
if [ "$HOG" = 1 ]; then
    for _ in $(seq "$(nproc)"); do
        python3 -c 'while True: pass' &
        HOGS+=("$!")
    done
    echo "flake-hunt: a busy loop on each of $(nproc) cores (pids ${HOGS[*]})"
fi

run_family() {
    local family="$1" py dir
    if [ "$family" = mpich ]; then
        py="$(bash "$ROOT/dev/setup.sh")"
        dir="$ROOT"
    else
        py="$(bash "$ROOT/dev/setup-openmpi.sh")"
        # the copy Open MPI's build was made in: the checkout's extensions are MPICH's
        dir="$(dirname "$py")/../src"
        export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    fi
    for i in $(seq "$REPEAT"); do
        echo "=== $family, repeat $i of $REPEAT ($(date +%T))"
        (cd "$dir" && "$py" -m pytest -p no:cacheprovider -q -rf -m "mpi and not build" \
            --junitxml="$OUT/$family-$i.xml" "${SELECT[@]}") || true
    done
}

if [ "$FAMILY" = mpich ] || [ "$FAMILY" = both ]; then run_family mpich; fi
if [ "$FAMILY" = openmpi ] || [ "$FAMILY" = both ]; then run_family openmpi; fi
stop_hogs

python3 - "$OUT" "$REPEAT" <<'PY'
import glob
import os
import sys
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict

out, repeat = sys.argv[1], int(sys.argv[2])
failed, runs = defaultdict(Counter), Counter()
for path in sorted(glob.glob(os.path.join(out, "*.xml"))):
    family = os.path.basename(path).rsplit("-", 1)[0]
    for case in ET.parse(path).iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        runs[family, name] += 1
        if case.find("failure") is not None or case.find("error") is not None:
            failed[family][name] += 1
lines = [f"{family}: {name}: failed {n} of {runs[family, name]}"
         for family in sorted(failed) for name, n in sorted(failed[family].items())]
summary = "\n".join(lines) or f"no failures: {len(runs)} tests x {repeat} repeats"
open(os.path.join(out, "summary.txt"), "w").write(summary + "\n")
print(summary)
sys.exit(1 if lines else 0)
PY
