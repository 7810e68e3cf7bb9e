"""One job of `asapmpi bench soak`: one policy stepping for a long time, sampled.

    mpiexec -n N python -m asapmpi.bench.soak_job SPEC_JSON OUT_JSON

SPEC_JSON: sync, graph, options (the policy's), size (bytes of float32), steps, seconds
(0: no time limit; the first of the two limits ends the run: every rank stops at the
step count rank 0 reached), samples, trace ("ring": rc.trace_iterations kept in memory;
"off": one iteration kept; "file": streamed to a trace file, then merged), folder (for
the trace file).  Every rank takes `samples` samples, evenly spaced in steps, of: the
step count, seconds since the start, resident memory (/proc/self/statm), open file
descriptors and the median step time since the previous sample; rank 0 also samples
/dev/shm (bytes used, asapmpi's and every file).  Rank 0 writes OUT_JSON.
"""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Dict, List

import numpy as np
from mpi4py import MPI

from .. import collectives
from ..exchange import Exchange
from ..launch.shm_leftovers import OWNERS, SHM_DIR
from ..rc import rc
from .common import rma_path

PAGE = os.sysconf("SC_PAGE_SIZE")
#: steps between two checks of the time limit (one allreduce: every rank stops together)
LIMIT_CHECK_EVERY = 1000


def resident_bytes() -> int:
    """This process's resident memory."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def open_descriptors() -> int:
    """This process's open file descriptors."""
    return len(os.listdir("/proc/self/fd"))


def shm_usage() -> Dict[str, int]:
    """/dev/shm: bytes in use, files, and files asapmpi would name (asapmpi-*)."""
    if not os.path.isdir(SHM_DIR):
        return {"bytes": 0, "files": 0, "asapmpi_files": 0, "library_files": 0}
    st = os.statvfs(SHM_DIR)
    names = os.listdir(SHM_DIR)
    return {"bytes": (st.f_blocks - st.f_bfree) * st.f_frsize, "files": len(names),
            "asapmpi_files": sum(n.startswith("asapmpi-") for n in names),
            "library_files": sum(any(n.startswith(p) for p in OWNERS) for n in names)}


def soak(comm: MPI.Comm, spec: Dict[str, Any]) -> Dict[str, Any]:
    """Run the spec on every rank; the samples of every rank on rank 0."""
    rank = comm.Get_rank()
    if spec["trace"] == "off":
        rc.trace_iterations = 1
    trace_file = os.path.join(spec["folder"], "soak-trace.h5") \
        if spec["trace"] == "file" else None
    buf = np.zeros(spec["size"] // 4, dtype=np.float32)
    buf[:] = rank
    steps, seconds, samples = spec["steps"], spec["seconds"], spec["samples"]
    every = max(1, steps // samples)
    rows: List[List[float]] = []
    shm: List[Dict[str, int]] = []
    times = np.zeros(every)
    with Exchange(buf, graph=spec["graph"], sync=spec["sync"], comm=comm, timeout=60,
                  trace_file=trace_file, **spec["options"]) as ex:
        transport = ex.transport
        collectives.barrier(comm, 60, "the start of the soak")
        start = time.perf_counter()
        last = start
        done = 0
        limit = steps
        while done < limit:
            ex.step()
            now = time.perf_counter()
            times[done % every] = now - last
            last = now
            done += 1
            if seconds and done % LIMIT_CHECK_EVERY == 0 and limit == steps:
                # stop together at the first step count after the time ran out
                over = comm.allreduce(now - start > seconds, op=MPI.LOR)
                if over:
                    limit = done
            if done % every == 0 or done == limit:
                rows.append([done, now - start, resident_bytes(), open_descriptors(),
                             float(np.median(times[:min(done, every)]))])
                if rank == 0:
                    shm.append(shm_usage())
        elapsed = time.perf_counter() - start
    # after free(): what a finished exchange leaves behind
    after = {"rss": resident_bytes(), "fds": open_descriptors(),
             "shm": shm_usage() if rank == 0 else None}
    gathered = collectives.gather(comm, {"rows": rows, "after": after}, 60,
                                  "the soak's samples")
    if rank != 0:
        return {}
    out = {"spec": spec, "ranks": comm.Get_size(), "transport": transport,
           "path": rma_path(), "steps": done, "seconds": elapsed,
           "columns": ["step", "seconds", "rss_bytes", "fds", "step_seconds"],
           "per_rank": [g["rows"] for g in gathered],
           "after_free": [g["after"] for g in gathered], "shm": shm}
    if trace_file:
        from .. import trace

        setting = getattr(ex._policy, "setting", None)
        checked = trace.check_file(trace_file) if setting else None
        out["trace_file"] = {"bytes": os.path.getsize(trace_file),
                             "iterations": checked["iterations"] if checked else None,
                             "gap_violations": len(checked["gap_violations"])
                             if checked else None}
        os.unlink(trace_file)
    return out


def main(argv=None) -> int:
    """Entry point: run SPEC_JSON, write OUT_JSON on rank 0."""
    argv = sys.argv[1:] if argv is None else argv
    spec, out = json.loads(argv[0]), argv[1]
    comm = MPI.COMM_WORLD
    result = soak(comm, spec)
    if comm.Get_rank() == 0:
        with open(out, "w") as f:
            json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
