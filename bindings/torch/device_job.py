"""One job of the staged device channel's benchmark (issue 30; with the bindings: it
makes torch tensors on the device), on every rank at once:

    mpiexec -n 4 python -m asapmpi.torch.device_job --device cuda --mb 64 --out OUT.json

  floor    one copy each way between the device buffer and its pinned host buffer
           (the staged channel's own ops: to_host, wait_host, to_device, wait_device),
           every rank copying at once: the physical floor of staging
  staged   Exchange.step() on the device buffer (sync, graph as given), reduced on the
           device; the device synchronized at the end of each timed loop
  staged_host_reduce
           the same with asapmpi.rc.device_reduce off: reduced on the host, copied back
  host     Exchange.step() on a host buffer of the same size: the host channel alone
and the torn/stale reads the staged exchange counted.  Each figure is the median over
`repeats` loops of the slowest rank's seconds per call; rank 0 writes OUT.json.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np
from mpi4py import MPI


def _time_loop(comm: MPI.Comm, calls: int, body, sync) -> float:
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(calls):
        body()
    sync()
    return comm.allreduce(time.perf_counter() - t0, op=MPI.MAX) / calls


def main(argv=None) -> int:
    """Run the benchmark on COMM_WORLD; rank 0 prints and writes the JSON record."""
    import torch

    import asapmpi
    from asapmpi import Exchange
    from asapmpi.device import Stager, device_buffer
    from asapmpi.outputs import output_file

    parser = argparse.ArgumentParser(prog="python -m asapmpi.torch.device_job")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--mb", type=float, default=64.0, help="buffer size, MB")
    parser.add_argument("--sync", default="notify_ack")
    parser.add_argument("--graph", default="ring")
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=output_file)
    args = parser.parse_args(argv)
    comm = MPI.COMM_WORLD
    count = int(args.mb * 2**20) // 4
    device = torch.device(args.device)
    sync_device = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    dev = torch.full((count,), float(comm.rank), dtype=torch.float32, device=device)
    host = np.full(count, float(comm.rank), dtype=np.float32)
    record = {"ranks": comm.Get_size(), "bytes": count * 4, "sync": args.sync,
              "graph": args.graph, "device": str(device),
              "name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "floor": []}
    if device.type == "cuda":
        stager = Stager(device_buffer(torch.empty(count, device=device)))

        def copies():
            stager.ops.to_host()
            stager.ops.wait_host()
            stager.ops.to_device()
            stager.ops.wait_device()
    opts = {"graph": args.graph} if args.sync != "allreduce" else {}
    staged_buffer = dev if device.type == "cuda" else dev.numpy()
    dev_h = dev.clone()
    opts = {"graph": args.graph} if args.sync != "allreduce" else {}
    loops = {}
    with Exchange(staged_buffer, sync=args.sync, comm=comm, timeout=120, **opts) as staged, \
            Exchange(host, sync=args.sync, comm=comm, timeout=120, **opts) as plain:
        asapmpi.rc.device_reduce = False
        with Exchange(dev_h if device.type == "cuda" else dev_h.numpy(), sync=args.sync,
                      comm=comm, timeout=120, **opts) as staged_h:
            asapmpi.rc.device_reduce = True
            if device.type == "cuda":
                loops["floor"] = (copies, sync_device)
            loops.update({"staged": (staged.step, sync_device),
                          "staged_host_reduce": (staged_h.step, sync_device),
                          "host": (plain.step, lambda: None)})
            for body, _ in loops.values():      # warm-up
                for _ in range(3):
                    body()
            for _ in range(args.repeats):
                for key, (body, done) in loops.items():
                    record.setdefault(key, []).append(_time_loop(comm, args.calls, body, done))
            stats = staged.stats
            record["reads"] = {k: sum(s[k] for s in stats.values())
                               for k in ("consistent", "torn", "stale", "ahead")}
            record["transport"] = staged.transport
            record["staging"] = staged.staging
            record["staging_host_reduce"] = staged_h.staging
    if device.type == "cuda":
        stager.close()
    for key in ("floor", "staged", "staged_host_reduce", "host"):
        if record.get(key):
            record[key + "_median_s"] = statistics.median(record[key])
    if record.get("floor_median_s"):
        for key in ("staged", "staged_host_reduce"):
            record[key + "_over_floor"] = record[key + "_median_s"] / record["floor_median_s"]
    if comm.Get_rank() == 0:
        print(json.dumps(record, indent=1), flush=True)
        if args.out:
            with open(args.out, "w", encoding="utf-8") as f:
                json.dump(record, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
