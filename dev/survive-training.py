"""Issue 31's first target, measured: `asapmpi bench failures` (asapmpi/bench/failures.py)
with the settings of docs/FAILURES.md's table: `asapmpi train mlp --survive` on 8 ranks
over 4 emulated hosts on Open MPI 5 (ULFM), rank 5 killed after iteration 120 of 300
(40%, an evaluation mark: evaluated every 60), against the same run with no failure.

    .venv-openmpi5/bin/python dev/survive-training.py --seeds 0,1,2 --out /tmp/survive

Run it with the Open MPI 5 environment's python (dev/setup-openmpi5.sh), as root (the
emulated hosts), from anywhere but the checkout (its python must import the environment's
build of asapmpi, not the checkout's).  Any other option goes to the benchmark as it is
(--restarts, --kill 5@130, --one-host, --lost-shards drop ...).  Writes
OUT/survive-training.json and keeps each job's output in OUT.
"""
from __future__ import annotations

import argparse
import os
import sys

from asapmpi.cli import main as asapmpi


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--policies", default="notify_ack,hop:backup=1,gossip")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--out", required=True)
    args, rest = p.parse_known_args()
    os.makedirs(args.out, exist_ok=True)
    # Open MPI refuses root without these (the emulated hosts need root)
    os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    return asapmpi(["bench", "failures", "-n", "8", "--hosts", "4", "--workload", "mlp",
                    "--iters", "300", "--eval-every", "60", "--timeout", "60",
                    "--policies", args.policies, "--seeds", args.seeds,
                    *(rest if any(a.startswith("--kill") for a in rest)
                      else ["--kill", "5@120", *rest]),
                    "--keep", args.out,
                    "--json", os.path.join(args.out, "survive-training.json")])


if __name__ == "__main__":
    sys.exit(main())
