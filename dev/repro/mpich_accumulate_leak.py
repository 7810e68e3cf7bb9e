"""Reproducer: MPICH keeps 128 bytes of heap per MPI_Accumulate on its shared-memory path.

    mpiexec -n 4 python dev/repro/mpich_accumulate_leak.py [OP] [OPS]

No asapmpi code: a window from MPI_Win_allocate, lock_all(MODE_NOCHECK), every rank
writes one int64 word of its successor OPS times (default 20000) with OP and flushes
every 16 operations; rank 0 prints how much its heap ([heap] in /proc/self/smaps) grew
per operation after a warm-up of 3000.  With MPICH 5.0.2 (the PyPI wheel) on shared
memory: OP=acc (MPI_Accumulate, REPLACE or SUM, MPI_INT64_T or MPI_LONG) and gacc
(MPI_Get_accumulate) grow by 128 bytes per operation, for the life of the window, also
when every operation is flushed at once; fop (MPI_Fetch_and_op) and put grow by 0.  On
the forced network path (MPIR_CVAR_NOLOCAL=1 MPIR_CVAR_CH4_NETMOD=ofi FI_PROVIDER=tcp)
acc grows by 0.2 bytes per operation.  asapmpi writes its notify, ack and control words
with MPI_Fetch_and_op for that reason (asapmpi/_core/slotwin.pyx, _lazy_word).
"""
import re
import sys

import numpy as np
from mpi4py import MPI

WARMUP = 3000


def heap_kb() -> int:
    """Resident kilobytes of this process's [heap] mapping."""
    total, current = 0, None
    with open("/proc/self/smaps") as f:
        for line in f:
            if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
                current = line.split()[-1]
            elif line.startswith("Rss:") and current == "[heap]":
                total += int(line.split()[1])
    return total


def main() -> int:
    """Run OP (argv[1]: acc, gacc, fop or put) OPS times (argv[2])."""
    op = sys.argv[1] if len(sys.argv) > 1 else "acc"
    ops = int(sys.argv[2]) if len(sys.argv) > 2 else 20000
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    win = MPI.Win.Allocate(4096, 1, comm=comm)
    win.Lock_all(MPI.MODE_NOCHECK)
    words, result = np.zeros(16, np.int64), np.zeros(16, np.int64)
    target = (rank + 1) % size

    def one(i: int) -> None:
        w, r = words[i % 16:i % 16 + 1], result[i % 16:i % 16 + 1]
        w[0] = i
        if op == "acc":
            win.Accumulate([w, MPI.INT64_T], target, target=(0, 1, MPI.INT64_T),
                           op=MPI.REPLACE)
        elif op == "gacc":
            win.Get_accumulate([w, MPI.INT64_T], [r, MPI.INT64_T], target,
                               target=(0, 1, MPI.INT64_T), op=MPI.REPLACE)
        elif op == "fop":
            win.Fetch_and_op(w, r, target, 0, op=MPI.REPLACE)
        elif op == "put":
            win.Put([w, MPI.INT64_T], target, target=(0, 1, MPI.INT64_T))
        else:
            raise SystemExit(f"OP must be acc, gacc, fop or put, not {op!r}")
        if i % 16 == 15:
            win.Flush_all()

    for i in range(WARMUP):
        one(i)
    before = heap_kb()
    for i in range(WARMUP, WARMUP + ops):
        one(i)
    grown = heap_kb() - before
    win.Flush_all()
    comm.Barrier()
    if rank == 0:
        print(f"{MPI.Get_library_version().splitlines()[0]}")
        print(f"{op}: heap +{grown} KB over {ops} operations = "
              f"{grown * 1024 / ops:.1f} bytes per operation")
    win.Unlock_all()
    win.Free()
    return 0


if __name__ == "__main__":
    sys.exit(main())
