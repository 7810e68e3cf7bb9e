"""A user script whose rank 0 makes its Exchange on MPI_COMM_SELF while the others make
theirs on MPI_COMM_WORLD (issue 49): ranks 1.. wait in the creation's agreement for a
rank 0 that finishes alone.  Rank 0 ends only once every other rank's arrival message
waits for it (probed, not received): the moment at which, before the fix, its
MPI_Finalize failed on those unmatched messages and hydra killed the others without a
word.  Ordered by those messages, not by time."""
import sys
import time

import numpy as np
from mpi4py import MPI

import asapmpi
from asapmpi.collectives import ARRIVE_TAG

world = MPI.COMM_WORLD
rank = world.Get_rank()
buf = np.full(64, float(rank))
if rank == 0:
    with asapmpi.Exchange(buf, comm=MPI.COMM_SELF, timeout=60) as ex:
        ex.step()
    deadline = time.monotonic() + 60
    while not all(world.Iprobe(source=r, tag=ARRIVE_TAG) for r in range(1, world.size)):
        if time.monotonic() > deadline:
            sys.exit("rank 0: the other ranks never reached their Exchange")
        time.sleep(0.01)
    print("rank 0: ends", flush=True)
else:
    # on MPI_COMM_WORLD: the agreement waits for rank 0, up to 60 s
    asapmpi.Exchange(buf, timeout=60)
    print(f"rank {rank}: made an Exchange without rank 0", flush=True)
