"""A user script that runs until it is interrupted: `interrupted.py FLAGDIR SYNC [stall]`.

Every rank steps an Exchange (a neighbour timeout of 60 s) with no end; rank 1 computes
10 ms a step in Python, so that the others wait for it in the core.  After 20 steps each
rank writes its pid into FLAGDIR/rank-R (for the test to signal it) and goes on; with
`stall`, rank 1 then stops stepping (asleep for 10 minutes), and the others wait in the
core for a version that does not come.
"""
import os
import sys
import time

import numpy as np
from mpi4py import MPI

import asapmpi

flags, sync = sys.argv[1], sys.argv[2]
stall = sys.argv[3:] == ["stall"]
rank = MPI.COMM_WORLD.Get_rank()
buf = np.zeros(1 << 14, dtype=np.float32)
ex = asapmpi.Exchange(buf, graph=None if sync == "gossip" else "ring", sync=sync,
                      timeout=60.0)
while True:
    if rank == 1:
        time.sleep(0.01)
    buf += 1.0
    ex.step()
    if ex.version == 20:
        with open(os.path.join(flags, f"rank-{rank}.tmp"), "w") as f:
            f.write(str(os.getpid()))
        os.rename(os.path.join(flags, f"rank-{rank}.tmp"), os.path.join(flags, f"rank-{rank}"))
        if stall and rank == 1:
            time.sleep(600)
