#!/usr/bin/env bash
# Set everything up (dev/setup.sh) and run the main job on the embedded MPICH: the
# straggler scenario of `asapmpi bench training` on its compute-bound workload (an MLP,
# where a slow host decides).  8 ranks on 4 emulated hosts with 10 Gbit links and a CPU
# budget each (network namespaces shaped by tc, a cgroup CPU quota per host: needs root;
# otherwise every rank on this host, slow ranks spinning, and the report says so), the
# last host with a quarter of the others' CPU (0.55 cores each, the slow one 0.1375:
# 1.79 of this machine's 2 cores); allreduce against synchronous SGD with backup
# workers and Hop with a backup worker and iteration skipping, the two policies that
# reached the target soonest on every seed of the 5-seed benchmark (docs/BENCHMARKS.md,
# where load-balanced allreduce is compared too: it adds a minute here).  It ends with
# the table, the per-seed rows and a one-line reading, and writes
# asapmpi-runs/demo/training.png.
# Extra arguments go to `asapmpi bench training` (e.g. --seeds 0,1,2 --repeats 2, or
# --one-host).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="$(bash "$ROOT/dev/setup.sh")"
cd "$ROOT"
OUT="$ROOT/asapmpi-runs/demo"
mkdir -p "$OUT"
exec "$PY" -m asapmpi bench training -n 8 --hosts 4 --bandwidth 10gbit --workload mlp \
    --scenarios straggler-host --seeds 0 --host-cores 0.55 \
    --policies allreduce,backup_ps:backup=2,hop:backup=1:max_gap=8:skip_trigger=1:max_jump=8 \
    --json "$OUT/training.json" --png "$OUT/training.png" --keep "$OUT/jobs" "$@"
