"""A user script that does not catch a NeighbourTimeoutError: rank 1 stalls, the others
time out; asapmpi's abort hook must end the job (MPI_Finalize would wait forever)."""
import time

import numpy as np
from mpi4py import MPI

import asapmpi

rank = MPI.COMM_WORLD.Get_rank()
buf = np.zeros(1000)
ex = asapmpi.Exchange(buf, graph="ring", timeout=2.0)
for k in range(10):
    if rank == 1 and k == 5:
        time.sleep(600)
    ex.step()
ex.free()
