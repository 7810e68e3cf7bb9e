#!/usr/bin/env bash
# The GPU checks of issue 30 in one command, on a machine with a CUDA device and no
# package registry (the mpich and mpi4py wheels travel in .whl/: see the device notes in
# docs/GPU.md).  Builds asapmpi in a virtual environment over the machine's own torch,
# runs the staged channel's tests (tests/device/test_device.py, tests/device/test_gpu.py), the
# staging benchmark (asapmpi.torch.device_job) and `asapmpi train mlp` on cuda against
# cpu.  Everything it measures lands in $OUT (default /tmp/gpu-check); about 6 minutes.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-/tmp/gpu-check}"
VENV="${ASAPMPI_GPU_VENV:-/tmp/asapmpi-gpu}"
RANKS="${RANKS:-4}"
ITERS="${ITERS:-300}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2
step() { echo "== $(date +%T) $*"; }

step "machine"
nvidia-smi -L || true
python3 -c 'import torch, sys; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.get_device_name() if torch.cuda.is_available() else "")'

step "environment and build"
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV" || exit 1
    # the machine's python3 may itself be a virtual environment (torch, CUDA, CuPy):
    # its packages come after this environment's own (mpich, mpi4py, Cython)
    python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' \
        > "$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/machine.pth"
fi
"$VENV/bin/python" -m pip install -q --no-index --no-deps --no-compile --disable-pip-version-check \
    "$ROOT"/.whl/*.whl || exit 1
(cd "$ROOT" && "$VENV/bin/python" -m pip install -q --no-index --no-build-isolation --no-deps \
    --disable-pip-version-check --editable .) || exit 1
"$VENV/bin/python" -c 'import asapmpi._core, asapmpi.torch, mpi4py.MPI as M; print(M.Get_library_version().splitlines()[0])' || exit 1

step "tests: the staged channel (stand-in and CUDA)"
(cd "$ROOT" && timeout 300 "$VENV/bin/python" -m pytest -q -rs -p no:cacheprovider \
    tests/device/test_device.py tests/device/test_gpu.py 2>&1 | tee "$OUT/tests.log")

step "benchmark: staging a 64 MB and a 16 MB float32 buffer, $RANKS ranks on one GPU"
for mb in 64 16; do
    timeout 150 "$VENV/bin/mpiexec" -n "$RANKS" "$VENV/bin/python" -m asapmpi.torch.device_job \
        --device cuda --mb "$mb" --out "$OUT/bench-${mb}MB.json" > "$OUT/bench-${mb}MB.log" 2>&1
    tail -n 12 "$OUT/bench-${mb}MB.log"
done

step "training: mlp on cuda against cpu, $RANKS ranks, $ITERS iterations"
mkdir -p /tmp/gpu-check-runs
for sync in notify_ack allreduce hop; do
    extra=()
    [ "$sync" = hop ] && extra=(--hop backup=1 --graph bidirectional-ring)
    for device in cuda cpu; do
        tag="$sync-$device"
        timeout 120 "$VENV/bin/asapmpi" train mlp -n "$RANKS" --sync "$sync" "${extra[@]}" --device "$device" \
            --iters "$ITERS" --out "/tmp/gpu-check-runs/$tag" --json "/tmp/gpu-check-runs/$tag.json" \
            > "/tmp/gpu-check-runs-$tag.log" 2>&1
        tail -n 3 "/tmp/gpu-check-runs-$tag.log" | head -n 1
    done
done
"$VENV/bin/python" - "$OUT/train.json" <<'PY'
import glob, json, os, sys
rows = {}
for path in sorted(glob.glob("/tmp/gpu-check-runs/*.json")):
    d = json.load(open(path))
    rows[os.path.basename(path)[:-5]] = {k: d.get(k) for k in (
        "final_test_accuracy", "wall_time_s", "iters_per_s", "wait_fraction", "transport")}
json.dump(rows, open(sys.argv[1], "w"), indent=1)
for name, row in rows.items():
    print(f"{name:22s} {row}")
PY
step "done"
