"""Timing on every rank of a job, the same way on all of them (asapmpi.bench.core's
docstring describes the loops), and the memory bandwidth per rank that the memory
bounds are in units of.  Used by the jobs of `asapmpi bench core` and `bench reduce`.
"""
from __future__ import annotations

import argparse
import glob
import math
import os
import statistics
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
from mpi4py import MPI

from .common import parse_sizes

Callback = Callable[[], Any]


class Timer:
    """Times a callable identically on every rank of `comm` (see the module docstring).

    Every rank must time the same callables in the same order: the loops are sized from
    the slowest rank, so collective callables (step, Allreduce) stay matched.
    """

    def __init__(self, comm: MPI.Comm, repeats: int, min_time: float = 0.02,
                 min_calls: int = 3):
        self.comm = comm
        self.repeats = repeats
        self.min_time = min_time
        self.min_calls = min_calls
        #: run after each timed loop, before the timer's own collectives (untimed):
        #: Exchange.settle while steps are timed, whose last notifies an MPI may not
        #: issue before a synchronization call (Open MPI's osc pt2pt)
        self.settle: Optional[Callback] = None

    def seconds_per_call(self, fn: Callback) -> float:
        """Median over the repeats of the slowest rank's seconds per call of fn()."""
        self._loop(fn, 1)  # warm-up: first touch of the buffers, lazy MPI setup
        calls = self._calibrate(fn)
        return statistics.median([self._loop(fn, calls) / calls for _ in range(self.repeats)])

    def interleaved(self, fns: Sequence[Callback]) -> List[List[float]]:
        """Per callable, the seconds per call of each repeat, the callables' loops taking
        turns within every repeat: a ratio of two of them per repeat compares runs
        seconds apart, so a machine that slows down for a while (shared hosts, noisy
        neighbours) moves both sides of it."""
        for fn in fns:
            self._loop(fn, 1)
        calls = [self._calibrate(fn) for fn in fns]
        out: List[List[float]] = [[] for _ in fns]
        for _ in range(self.repeats):
            for fn, n, seconds in zip(fns, calls, out):
                # one untimed call first: the loop before evicted this one's data from the
                # caches, and every loop is to be timed warm, as seconds_per_call's are
                self._loop(fn, 1)
                seconds.append(self._loop(fn, n) / n)
        return out

    def _loop(self, fn: Callback, calls: int) -> float:
        """Barrier, run fn() `calls` times; return the slowest rank's elapsed seconds."""
        self.comm.Barrier()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        elapsed = time.perf_counter() - t0
        if self.settle is not None:
            self.settle()
        return self.comm.allreduce(elapsed, op=MPI.MAX)

    def _calibrate(self, fn: Callback) -> int:
        """The number of calls for a loop of at least min_time and min_calls."""
        calls = 1
        while True:
            elapsed = self._loop(fn, calls)
            if elapsed >= self.min_time / 4:
                break
            calls *= 4
        return max(self.min_calls, math.ceil(self.min_time * calls / elapsed))


def filled(nbytes: int, value: float = 1.0) -> np.ndarray:
    return np.full(nbytes // 4, value, dtype=np.float32)


def time_memcpy(timer: Timer, nbytes: int) -> float:
    """Seconds per np.copyto of nbytes."""
    src, dst = filled(nbytes), filled(nbytes, 0.0)
    return timer.seconds_per_call(lambda: np.copyto(dst, src))


def last_level_cache_bytes() -> int:
    """Bytes of last-level cache on this host, summed over its instances (from sysfs;
    else the C library's figure for one instance; else 32 MB)."""
    caches: Dict[Tuple[int, str], int] = {}     # (level, CPUs sharing it) -> bytes
    for index in glob.glob("/sys/devices/system/cpu/cpu[0-9]*/cache/index[0-9]*"):
        try:
            level, cpus, size = (_read(index, name) for name in ("level", "shared_cpu_list",
                                                                  "size"))
            caches[(int(level), cpus)] = parse_sizes(size)[0]      # "32768K"
        except (OSError, ValueError, argparse.ArgumentTypeError):
            continue
    if caches:
        top = max(level for level, _ in caches)
        return sum(b for (level, _), b in caches.items() if level == top)
    try:
        return int(os.sysconf("SC_LEVEL3_CACHE_SIZE")) or 32 << 20
    except (ValueError, OSError):
        return 32 << 20


def _read(directory: str, name: str) -> str:
    with open(os.path.join(directory, name)) as f:
        return f.read().strip()


def stream_array_bytes(comm: MPI.Comm) -> int:
    """Bytes per array for a memory-bandwidth copy on this host: the arrays of the ranks
    that run at once (at most one per CPU) hold 4x the last-level cache, STREAM's rule
    for timing memory rather than cache; at least 8 MB, and at most an eighth of the
    memory available per rank of the host (every rank holds two such arrays, and a VM
    may report a last-level cache of hundreds of MB: 480 MB here)."""
    # the ranks of this host by name: MPICH's forced network path (MPIR_CVAR_NOLOCAL)
    # makes every rank a node of its own for COMM_TYPE_SHARED
    hosts = comm.allgather(MPI.Get_processor_name())
    on_host = hosts.count(MPI.Get_processor_name())
    running = min(on_host, os.cpu_count() or 1)
    nbytes = max(8 << 20, 4 * last_level_cache_bytes() // running)
    available = available_memory_bytes()
    if available:
        nbytes = max(8 << 20, min(nbytes, available // (8 * on_host)))
    return comm.allreduce(-(-nbytes // 4096) * 4096, op=MPI.MAX)


def available_memory_bytes() -> int:
    """MemAvailable of /proc/meminfo in bytes, or 0 where there is none."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def measure_memory_bandwidth(timer: Timer, comm: MPI.Comm) -> Dict[str, float]:
    """Bytes per second each rank moves through memory when every rank copies at once
    (np.copyto of arrays too large for the caches: read + write = 2 x bytes per copy)."""
    nbytes = stream_array_bytes(comm)
    seconds = time_memcpy(timer, nbytes)
    return {"array_bytes": nbytes, "seconds": seconds, "bytes_per_s": 2 * nbytes / seconds}
