"""torch.distributed's gloo all_reduce on an MPI job's ranks: the baseline `asapmpi bench
reduce` times beside the exchange (asapmpi.bench.reduce_job imports it when torch is
there; torch is imported only by the bindings)."""
from __future__ import annotations

import datetime
import socket
import warnings
from typing import Callable

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI


class GlooGroup:
    """A torch.distributed process group with the gloo backend on `comm`'s ranks
    (loopback TCP store, its port chosen by rank 0); collective."""

    def __init__(self, comm: MPI.Comm, timeout: float):
        port = None
        if comm.Get_rank() == 0:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
        port = comm.bcast(port)
        torch.set_num_threads(1)     # one core per rank, as the MPI ranks have
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # a rank that never joins is an error after `timeout`, not a hang
            dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                                    rank=comm.Get_rank(), world_size=comm.Get_size(),
                                    timeout=datetime.timedelta(seconds=timeout))
        self.live = True

    def all_reduce_call(self, buf: np.ndarray) -> Callable[[], None]:
        """A callable running all_reduce on a tensor sharing `buf`'s memory."""
        tensor = torch.from_numpy(buf)
        return lambda: dist.all_reduce(tensor)

    def close(self) -> None:
        """Tear the process group down (once)."""
        if self.live:
            dist.destroy_process_group()
            self.live = False
