#!/usr/bin/env bash
# Set everything up (dev/setup.sh) and run the main job: the multi-rank exchange demo on
# the embedded MPICH.  Extra arguments go to `asapmpi demo` (e.g. -n 8 --graph complete).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="$(bash "$ROOT/dev/setup.sh")"
cd "$ROOT"
exec "$PY" -m asapmpi demo -n 4 "$@"
