"""Run one scenario on every rank: `run.py NAME '{"kwarg": ...}'`, NAME a function of
scenarios.py (torch_scenarios.py for torch_*), or `MODULE:FUNCTION` for a scenario
whose body lives beside its test in tests/MODULE.py.

A rank whose scenario raises prints its traceback and aborts the whole job, so the
launcher sees a non-zero exit instead of the other ranks waiting forever.  Rank 0
prints every rank's result, one line each.
"""
import importlib
import json
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from mpi4py import MPI

from asapmpi.launch.faults import abort_world

import scenarios


def main() -> None:
    name, kwargs = sys.argv[1], json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    comm = MPI.COMM_WORLD
    try:
        # torch is imported only by the scenarios that train
        if ":" in name:
            sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
            module_name, name = name.split(":", 1)
            module = importlib.import_module(module_name)
        else:
            module = importlib.import_module("torch_scenarios") \
                if name.startswith("torch_") else scenarios
        result = getattr(module, name)(comm, **kwargs)
    except BaseException:  # noqa: BLE001  (any failure must abort the whole job)
        sys.stderr.write(f"[rank {comm.rank}] scenario {name} failed:\n{traceback.format_exc()}")
        abort_world(1)
    # one writer: Open MPI forwards a rank's output in pieces, and a long line of one
    # rank could be cut by another's
    every = comm.gather(result, root=0)
    if comm.rank == 0:
        for rank, res in enumerate(every):
            sys.stdout.write(f"ASAPMPI-RESULT {rank} {json.dumps(res)}\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
