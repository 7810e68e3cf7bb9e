"""Run one scenario on every rank: `run.py NAME '{"kwarg": ...}'`, NAME a function of
scenarios.py (torch_scenarios.py for torch_*), or `MODULE:FUNCTION` for a scenario
whose body lives beside its test in tests/<layer>/MODULE.py; or several, one after the
other: `run.py CASES '{"cases": {"key": [NAME, {"kwarg": ...}], ...}}'`, each rank's result
a dict of theirs by key.

A rank whose scenario raises prints its traceback and aborts the whole job, so the
launcher sees a non-zero exit instead of the other ranks waiting forever.  Rank 0
prints every rank's result, one line each.
"""
import glob
import importlib
import json
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from mpi4py import MPI

from asapmpi.launch.faults import abort_world

import scenarios


def _test_module(module_name: str):
    """The test module `module_name` (tests/<layer>/<module_name>.py), imported from
    its folder as pytest imports it: by its file name alone."""
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    found = glob.glob(os.path.join(tests, "*", module_name + ".py"))
    if len(found) != 1:
        raise LookupError(f"no single tests/*/{module_name}.py: {found}")
    # tests/ too: the test modules import its helpers (mpilaunch, ompi5)
    for folder in (tests, os.path.dirname(found[0])):
        if folder not in sys.path:
            sys.path.insert(0, folder)
    return importlib.import_module(module_name)


def scenario(name: str):
    """The scenario function called `name` (see the module docstring)."""
    # torch is imported only by the scenarios that train
    if ":" in name:
        module_name, name = name.split(":", 1)
        return getattr(_test_module(module_name), name)
    module = importlib.import_module("torch_scenarios") if name.startswith("torch_") \
        else scenarios
    return getattr(module, name)


def main() -> None:
    name, kwargs = sys.argv[1], json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    comm = MPI.COMM_WORLD
    # CASES: {"cases": {key: [name, kwargs]}}, each scenario after the other in this job
    # (one start of the ranks and their imports for all), the results by key
    cases = kwargs["cases"] if name == "CASES" else {None: [name, kwargs]}
    result = {}
    for key, (name, kw) in cases.items():
        try:
            result[key] = scenario(name)(comm, **kw)
        except BaseException:  # noqa: BLE001  (any failure must abort the whole job)
            sys.stderr.write(f"[rank {comm.rank}] scenario {name} failed:\n"
                             f"{traceback.format_exc()}")
            abort_world(1)
        if len(cases) > 1:
            comm.Barrier()      # the next case starts on every rank after this one
    if None in result:
        result = result[None]
    # one writer: Open MPI forwards a rank's output in pieces, and a long line of one
    # rank could be cut by another's
    every = comm.gather(result, root=0)
    if comm.rank == 0:
        for rank, res in enumerate(every):
            sys.stdout.write(f"ASAPMPI-RESULT {rank} {json.dumps(res)}\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
