"""Reproducer: MPICH's active-message RMA crashes on puts of 16 KB and more.

    MPIR_CVAR_NOLOCAL=1 MPIR_CVAR_CH4_NETMOD=ofi FI_PROVIDER=tcp FI_TCP_IFACE=lo \
    MPIR_CVAR_CH4_OFI_ENABLE_RMA=0 mpiexec -n 3 python dev/repro/mpich_am_rma_large_put.py 16384

No asapmpi code: a window from MPI_Win_allocate, lock_all, every rank puts NBYTES to
its two successors and flushes, 200 times.  With MPICH 5.0.2 (the PyPI wheel) on
libfabric's tcp provider, 3 or more ranks die with SIGSEGV for NBYTES >= 16384;
16000 works, 2 ranks work.  MPIR_CVAR_CH4_OFI_AM_LONG_FORCE_PIPELINE=1,
MPIR_CVAR_CH4_OFI_RNDV_PROTOCOL=pipeline, MPIR_CVAR_CH4_OFI_NUM_AM_BUFFERS=64 and
MPIR_CVAR_CH4_OFI_EAGER_THRESHOLD=131072 do not help.  The same family as
pmodels/mpich#7884 (SIGSEGV in mpidig_rma_callbacks.c, MPI_Get with
MPIR_CVAR_CH4_OFI_ENABLE_RMA=0, a 16336-byte AM payload).  asapmpi works around it by
putting pieces of at most asapmpi.rc.AM_RMA_MAX_TRANSFER bytes on that path.
"""
import sys

import numpy as np
from mpi4py import MPI


def main() -> int:
    """Put NBYTES (argv[1], default 16384) to the next two ranks ITERS times (argv[2])."""
    nbytes = int(sys.argv[1]) if len(sys.argv) > 1 else 16384
    iters = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    win = MPI.Win.Allocate(nbytes * size, comm=comm)
    src = np.ones(nbytes, np.uint8)
    win.Lock_all()
    for k in range(iters):
        for target in {(rank + 1) % size, (rank + 2) % size} - {rank}:
            win.Put(src, target, target=rank * nbytes)
        win.Flush_all()
        if k % 10 == 0:
            comm.Barrier()
    win.Unlock_all()
    win.Free()
    if rank == 0:
        print(f"ok: {iters} rounds of {nbytes}-byte puts on {size} ranks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
