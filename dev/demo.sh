#!/usr/bin/env bash
# Set everything up (dev/setup.sh) and run the main job on the embedded MPICH: a short
# straggler scenario of `asapmpi bench training`.  8 ranks on 4 emulated hosts with 1 Gbit
# links (network namespaces shaped by tc: needs root; otherwise every rank on this host,
# and the report says so), the last host's ranks 4x slower; allreduce against NOTIFY-ACK,
# Hop with a backup worker (and iteration skipping) and synchronous SGD with backup
# workers.  It ends with the table and a one-line reading of it.  Extra arguments go to
# `asapmpi bench training` (e.g. --seeds 0,1,2 --iters 600, or --one-host).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="$(bash "$ROOT/dev/setup.sh")"
cd "$ROOT"
OUT="$ROOT/asapmpi-runs/demo"
mkdir -p "$OUT"
exec "$PY" -m asapmpi bench training -n 8 --hosts 4 --workload small \
    --scenarios straggler-host --seeds 0 \
    --policies allreduce,notify_ack@ring,hop:backup=1,hop:backup=1:skip_trigger=1:max_jump=4,backup_ps:backup=2 \
    --json "$OUT/training.json" --png "$OUT/training.png" --keep "$OUT/jobs" "$@"
