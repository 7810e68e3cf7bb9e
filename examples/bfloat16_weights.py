"""bfloat16 weights with and without float32 master weights, against float32.

Every rank trains the same two-layer MLP on its shard of a teacher network's labels
with DecentralizedOptimizer(SGD, lr 0.002, momentum 0.9): in float32, in bfloat16 with
float32 master weights (the default for 16-bit parameters) and in bfloat16 updated as
it is (master_weights=False); then evaluates each replica's weights in float32 on
held-out examples.  At this learning rate most updates are below half a bfloat16 unit
in the last place of their weight: plain bfloat16 rounds them away.

    .venv/bin/mpiexec -n 4 .venv/bin/python examples/bfloat16_weights.py \
        [--policies notify_ack,hop:backup=1,...] [--seeds 0,1,2] [--json out.json]
"""
import argparse
import copy
import json
import time

import torch
from mpi4py import MPI

from asapmpi.torch import DecentralizedOptimizer

#: the graph each policy runs on here (None: the policy's own)
GRAPHS = {"notify_ack": "ring", "bsp": "ring", "async": "ring",
          "hop:backup=1": "root-expander"}
RUNS = (("float32", torch.float32, None), ("bfloat16", torch.bfloat16, None),
        ("bfloat16 as it is", torch.bfloat16, False))


def held_out_losses(comm, sync: str, seed: int, steps: int, lr: float,
                    step_s: float = 0.0) -> dict:
    """{run label: this replica's held-out loss} for the three runs of RUNS; step_s:
    seconds slept per step (an emulated compute)."""
    g = torch.Generator().manual_seed(1000 + seed)
    teacher = torch.nn.Sequential(torch.nn.Linear(32, 16), torch.nn.Tanh(),
                                  torch.nn.Linear(16, 2))
    with torch.no_grad():
        for p in teacher.parameters():
            p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
        x = torch.randn(6144, 32, generator=g)
        y = teacher(x).argmax(1)
    train, test = slice(0, 4096), slice(4096, None)
    mine = torch.arange(comm.rank, 4096, comm.size)
    out = {}
    for label, dtype, master in RUNS:
        torch.manual_seed(seed)
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(),
                                    torch.nn.Linear(64, 2)).to(dtype)
        opt = DecentralizedOptimizer(torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9),
                                     GRAPHS.get(sync), sync, model=model, comm=comm,
                                     master_weights=master)
        batches = torch.Generator().manual_seed(seed * 1000 + comm.rank)
        # a global iteration count (ElasticBSP's workers step at different rates)
        while opt.iteration < steps:
            idx = mine[torch.randint(len(mine), (32,), generator=batches)]
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x[train][idx].to(dtype)).float(),
                                                     y[train][idx])
            loss.backward()
            if step_s:
                time.sleep(step_s)
            opt.step()
        opt.free()
        wide = copy.deepcopy(model).float()
        with torch.no_grad():
            out[label] = float(torch.nn.functional.cross_entropy(wide(x[test]), y[test]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", default="notify_ack,hop:backup=1,bsp,async,allreduce,"
                                              "gossip,backup_ps,elastic")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--lr", type=float, default=0.002)
    parser.add_argument("--step-ms", type=float, default=0.0,
                        help="sleep this long per step: async and gossip read whatever "
                             "version is newest, so their results depend on the ranks' "
                             "pace, which the dtype changes unless the step is longer")
    parser.add_argument("--json", help="write every rank's losses here (rank 0)")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    rows = []
    if comm.rank == 0:
        print(f"{'policy':<14} {'seed':>4} " + " ".join(f"{label:>18}" for label, *_ in RUNS)
              + "   (held-out loss, worst replica)", flush=True)
    for sync in args.policies.split(","):
        for seed in map(int, args.seeds.split(",")):
            every = comm.gather(held_out_losses(comm, sync, seed, args.steps, args.lr,
                                                args.step_ms / 1000))
            if comm.rank == 0:
                worst = {label: max(r[label] for r in every) for label, *_ in RUNS}
                rows.append({"policy": sync, "seed": seed, "ranks": every, "worst": worst})
                print(f"{sync:<14} {seed:>4} " + " ".join(f"{worst[label]:>18.4f}"
                                                         for label, *_ in RUNS), flush=True)
    if comm.rank == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
