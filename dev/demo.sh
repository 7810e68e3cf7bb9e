#!/usr/bin/env bash
# Set everything up (dev/setup.sh) and run the main job on the embedded MPICH: a short
# 4-rank SVM training that compares global averaging (allreduce), NOTIFY-ACK over the
# root expander and Hop with a backup worker, ending with the comparison table.  Extra
# arguments go to `asapmpi train svm` (e.g. -n 8 --iters 1000 --network).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="$(bash "$ROOT/dev/setup.sh")"
cd "$ROOT"
exec "$PY" -m asapmpi train svm -n 4 --iters 300 --out "$ROOT/asapmpi-runs/demo" \
    --compare allreduce,notify_ack,hop:backup=1 "$@"
