"""Core benchmark: slot-window puts, the NOTIFY-ACK step and the fused reduce kernel.

    mpiexec -n 2 python -m asapmpi.bench.core [--sizes 4K,64K,1M,16M,64M] [--repeats N]
                                              [--json FILE]

Every figure is for a float32 buffer of SIZE bytes (K = 1024, M = 1024**2) on every
rank, all ranks working at the same time.  A timed callable is warmed up, then run in
loops of at least --min-time seconds (default 20 ms) and at least 3 calls, with a
barrier before every loop.  The time of one call is the slowest rank's loop time divided
by the number of calls; every figure is the MEDIAN of --repeats such loops.
GB/s = 1e9 bytes per second, per rank.

1. Transfers, on graph "ring" (rank r sends to rank r+1; every rank sends and receives):
  memcpy     np.copyto(dst, src) of SIZE bytes: the host's copy bandwidth, the physical
             limit of a put within one host.  GB/s = SIZE / time.
  put        PutWindow.put(buf, version, notify=False) to the out-neighbour with
             versions 1, 2, ...: the header, payload and footer puts and one
             MPI_Win_flush_all; no notify, no wait, no reduce.  The window is
             Exchange(buf, graph="ring").window.  GB/s = SIZE / time.
  step       Exchange.step() with sync "notify_ack": wait for the previous ack, put,
             notify, wait for the in-neighbour's notify, verified fused reduce into buf,
             ack; the whole protocol.  GB/s = SIZE (payload sent per step) / time.
  reduce     kernels.weighted_sum(buf, buf, 1/2, [x], [1/2]) on NumPy arrays: the reduce
             of a ring step (one input, in place) without any verification.
  verified   SlotWindow.reduce of the ring slot into buf, in place: the reduce plus
             the header/footer version checks (the slot holds a complete version 1,
             read again and again).  In --json also "slot_reduce": the plain kernel
             over the same slot memory (a zero-copy view), the baseline of the checks.
             reduce, verified, slot_reduce: GB/s in --json is 2*SIZE read / time.
  allreduce  comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM).  GB/s = SIZE / time.

2. Ratios (PASS/FAIL for SIZE >= 1 MB on the shared-memory path, where the targets are
   stated; other sizes and the network path are shown without a verdict):
  put/memcpy          memcpy time / put time; target >= 0.70.
  (notify+verify)/put what the protocol's notify and the slot verification add to the
                      raw put of a step: (notify phase + max(0, verified - reduce)) /
                      put phase; verified and plain reduce over the same slot memory,
                      the phases timed inside the step loop (2b); target <= 10%.
  notify/put          the notify phase alone / the put phase.
  verified/plain - 1  verified reduce / plain kernel over the same slot - 1.
  waits of step       share of the step spent waiting for acks and notifies and
                      acknowledging: synchronization with the neighbours (skew), not a
                      cost of notifying or verifying.
  step/(put+red) - 1  step time / (put time + reduce time) - 1, all from tight loops.
                      Inside a step the buffer, the slot and the neighbour's writes no
                      longer share the caches as they do in a tight loop, so this also
                      shows memory effects; 2b shows where the time goes.
  step/allreduce      step time / MPI_Allreduce time of the same buffer.

2b. A step by phase: wait_ack, put (payload, header, footer, flush), notify
  (accumulate + flush), wait_notify, reduce (verified, fused), ack; each the mean over
  the steps the timer ran on a rank, maximum over ranks.

3. Fused kernel vs NumPy, without MPI (every rank runs it at once), d = 1, 2, 4 inputs:
  kernel     kernels.weighted_sum(out, own, w0, [x1..xd], [w1..wd]), out separate.
  numpy      w0*own + w1*x1 + ... + wd*xd: the allocating expression a user writes.
  in-place   np.multiply(own, w0, out=out), then per input np.multiply(x, w, out=tmp)
             and np.add(out, tmp, out=out), with a preallocated tmp.
  GB/s = (d + 1) * SIZE (input bytes read) / time.  kernel/numpy and kernel/in-place =
  NumPy time / kernel time; target >= 1.0 for every d and every size.

--json FILE writes every median, GB/s figure, ratio and verdict, the MPI library version
line and the path: "network" when MPIR_CVAR_NOLOCAL=1, else "shared-memory".
"""
from __future__ import annotations

import argparse
import glob
import itertools
import json
import math
import os
import statistics
import sys
import time
import traceback
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import mpi4py
import numpy as np
from mpi4py import MPI

import asapmpi
from asapmpi import Exchange
from asapmpi._core import kernels
from asapmpi._core.mpiabi import library_version
from asapmpi.faults import abort_world
from asapmpi.launchers import network_forced

DEFAULT_SIZES = "4K,64K,1M,16M,64M"
DEGREES = (1, 2, 4)
GRAPH = "ring"
SYNC = "notify_ack"
#: this benchmark measures MPI_Put; `asapmpi bench reduce` measures every transport
TRANSPORT = "put"
GB = 1e9
LARGE = 1 << 20  # the transfer targets apply from 1 MB up
PUT_VS_MEMCPY_MIN = 0.70
NOTIFY_VERIFY_MAX = 0.10
WAIT_TIMEOUT = 120.0
#: the phases of a NOTIFY-ACK step, in order (asapmpi/sync/notify_ack.py)
STEP_PHASES = ("wait_ack", "put", "notify", "wait_notify", "reduce", "ack")
KERNEL_VS_NUMPY_MIN = 1.0
#: bytes each transfer's GB/s counts, in units of SIZE
BYTES_FACTOR = {"memcpy": 1, "put": 1, "step": 1, "reduce": 2, "verified_reduce": 2,
                "slot_reduce": 2, "allreduce": 1}
KERNEL_VARIANTS = ("kernel", "numpy", "numpy_inplace")
_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}

Callback = Callable[[], Any]


# ---------------------------------------------------------------------- arguments

def parse_sizes(text: str) -> List[int]:
    """'4K,64K,1M' -> [4096, 65536, 1048576]: bytes, each a positive multiple of 4."""
    sizes = []
    for item in text.split(","):
        token = item.strip().upper()
        token = token[:-1] if token.endswith("B") else token
        mult = _UNITS.get(token[-1:], 1)
        digits = token[:-1] if token[-1:] in _UNITS else token
        try:
            nbytes = int(digits) * mult
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"bad size {item!r}; write e.g. 4K, 1M, 4096") from None
        if nbytes <= 0 or nbytes % 4:
            raise argparse.ArgumentTypeError(f"size {item!r} must be a positive multiple "
                                             f"of 4 bytes (float32)")
        sizes.append(nbytes)
    return sizes


def publish(report: Dict[str, Any], text: str, json_path: Optional[str] = None,
            png_path: Optional[str] = None,
            draw: Optional[Callable[[Dict[str, Any], str], Any]] = None) -> None:
    """Print a benchmark's `text`, write its `report` to `json_path` and draw it to
    `png_path` with `draw`, each when asked for."""
    print(text, flush=True)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(report, f, indent=1)
            f.write("\n")
    if png_path and draw is not None:
        draw(report, png_path)


def positive(kind: type) -> Callable[[str], Any]:
    """An argparse type: a finite number of `kind` above zero."""
    def convert(text: str) -> Any:
        value = kind(text)
        if not 0 < value < math.inf:        # nan and inf too
            raise argparse.ArgumentTypeError(f"must be a finite positive number, got {text}")
        return value
    convert.__name__ = kind.__name__
    return convert


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the benchmark's options to `parser` (for `python -m` and `asapmpi bench core`)."""
    parser.add_argument("--sizes", type=parse_sizes, default=DEFAULT_SIZES,
                        help=f"comma-separated buffer sizes in bytes, K/M/G suffixes "
                             f"(default {DEFAULT_SIZES})")
    parser.add_argument("--repeats", type=positive(int), default=5,
                        help="timed loops per figure; the median is reported (default 5)")
    parser.add_argument("--min-time", type=positive(float), default=0.02,
                        help="seconds each timed loop lasts at least (default 0.02)")
    parser.add_argument("--json", metavar="FILE", default=None,
                        help="also write every median and ratio to FILE as JSON")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="rank 0 reports each size on stderr as it starts")


# ---------------------------------------------------------------------- timing

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


# ---------------------------------------------------------------------- measurements

def _filled(nbytes: int, value: float = 1.0) -> np.ndarray:
    return np.full(nbytes // 4, value, dtype=np.float32)


def time_memcpy(timer: Timer, nbytes: int) -> float:
    """Seconds per np.copyto of nbytes."""
    src, dst = _filled(nbytes), _filled(nbytes, 0.0)
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
    for timing memory rather than cache; at least 8 MB."""
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    running = min(local.Get_size(), os.cpu_count() or 1)
    local.Free()
    nbytes = max(8 << 20, 4 * last_level_cache_bytes() // running)
    return comm.allreduce(-(-nbytes // 4096) * 4096, op=MPI.MAX)


def measure_memory_bandwidth(timer: Timer, comm: MPI.Comm) -> Dict[str, float]:
    """Bytes per second each rank moves through memory when every rank copies at once
    (np.copyto of arrays too large for the caches: read + write = 2 x bytes per copy)."""
    nbytes = stream_array_bytes(comm)
    seconds = time_memcpy(timer, nbytes)
    return {"array_bytes": nbytes, "seconds": seconds, "bytes_per_s": 2 * nbytes / seconds}


def time_put(timer: Timer, comm: MPI.Comm, nbytes: int) -> float:
    """Seconds per PutWindow.put(notify=False) of nbytes to the ring out-neighbour."""
    buf = _filled(nbytes)
    with Exchange(buf, graph=GRAPH, sync=SYNC, comm=comm, transport=TRANSPORT) as ex:
        put, versions = ex.window.put, itertools.count(1)
        return timer.seconds_per_call(lambda: put(buf, next(versions), notify=False))


def time_step(timer: Timer, comm: MPI.Comm, nbytes: int) -> float:
    """Seconds per Exchange.step() (notify_ack on the ring) of nbytes."""
    buf = _filled(nbytes)
    with Exchange(buf, graph=GRAPH, sync=SYNC, comm=comm, transport=TRANSPORT) as ex:
        return timer.seconds_per_call(ex.step)


def _ring_weights(ex: Exchange) -> Tuple[float, np.ndarray]:
    """(self weight, in-neighbour weights) of an Exchange, in reduce order."""
    return ex.weights[ex.rank], np.array([ex.weights[r] for r in ex.in_neighbours])


def time_step_phases(timer: Timer, comm: MPI.Comm, nbytes: int) -> Dict[str, float]:
    """Seconds per phase of a NOTIFY-ACK step, timed inside the step loop.

    The step runs as its phases (wait for acks, put without notify, notify, wait for the
    notifies, verified reduce, ack), so every phase sees the caches and skew of a real
    step.  Each figure is this rank's mean over every call the timer made, then the
    maximum over ranks.
    """
    buf = _filled(nbytes)
    with Exchange(buf, graph=GRAPH, sync=SYNC, comm=comm, transport=TRANSPORT) as ex:
        win, (w_self, weights) = ex.window, _ring_weights(ex)
        totals = dict.fromkeys(STEP_PHASES, 0.0)
        calls = [0]

        def phased_step() -> None:
            k = calls[0] + 1
            marks = [time.perf_counter()]
            win.wait_acks(k - 1, WAIT_TIMEOUT)
            marks.append(time.perf_counter())
            win.put(buf, k, k, notify=False)
            marks.append(time.perf_counter())
            win.notify(k)
            marks.append(time.perf_counter())
            win.wait_notifies(k, WAIT_TIMEOUT)
            marks.append(time.perf_counter())
            win.reduce(buf, w_self, weights, k, k, k)
            marks.append(time.perf_counter())
            win.ack(k)
            marks.append(time.perf_counter())
            for name, a, b in zip(STEP_PHASES, marks, marks[1:]):
                totals[name] += b - a
            calls[0] = k

        timer.seconds_per_call(phased_step)
        return {name: comm.allreduce(t / calls[0], op=MPI.MAX) for name, t in totals.items()}


def time_slot_reduces(timer: Timer, comm: MPI.Comm, nbytes: int) -> Dict[str, float]:
    """Seconds per reduce of the ring slot into buf, in place, two ways over the same
    memory: SlotWindow.reduce (header/footer checked) and the plain fused kernel on a
    zero-copy view of the slot.  Their difference is the cost of verification."""
    buf = _filled(nbytes)
    with Exchange(buf, graph=GRAPH, sync=SYNC, comm=comm, transport=TRANSPORT) as ex:
        win, (w_self, weights) = ex.window, _ring_weights(ex)
        win.put(buf, 1, 1)
        win.wait_notifies(1, WAIT_TIMEOUT)
        slot = win.payload(0, 1)
        try:
            seconds = {
                "verified_reduce": timer.seconds_per_call(
                    lambda: win.reduce(buf, w_self, weights, 1, 1, 1)),
                "slot_reduce": timer.seconds_per_call(
                    lambda: kernels.weighted_sum(buf, buf, w_self, [slot], weights)),
            }
        finally:
            slot.release()
        comm.Barrier()  # nobody frees while a neighbour still reads
        return seconds


def time_reduce(timer: Timer, nbytes: int) -> float:
    """Seconds per in-place one-input weighted_sum: a ring step's reduce, unverified."""
    buf, inputs, weights = _filled(nbytes), [_filled(nbytes)], [0.5]
    return timer.seconds_per_call(lambda: kernels.weighted_sum(buf, buf, 0.5, inputs, weights))


def time_allreduce(timer: Timer, comm: MPI.Comm, nbytes: int) -> float:
    """Seconds per in-place MPI_Allreduce (sum) of nbytes."""
    buf = _filled(nbytes, 0.0)  # zeros stay zeros however many sums
    return timer.seconds_per_call(lambda: comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM))


def numpy_expression(own: np.ndarray, w0: float, inputs: Sequence[np.ndarray],
                     weights: Sequence[float]) -> np.ndarray:
    """w0*own + w1*x1 + ...: the allocating NumPy expression a user would write."""
    result = w0 * own
    for w, x in zip(weights, inputs):
        result = result + w * x
    return result


def numpy_inplace(out: np.ndarray, own: np.ndarray, w0: float, inputs: Sequence[np.ndarray],
                  weights: Sequence[float], tmp: np.ndarray) -> None:
    """out = w0*own + w1*x1 + ... without allocating: the products go through tmp."""
    np.multiply(own, w0, out=out)
    for w, x in zip(weights, inputs):
        np.multiply(x, w, out=tmp)
        np.add(out, tmp, out=out)


def time_kernels(timer: Timer, nbytes: int, d: int) -> Dict[str, float]:
    """Seconds per call of the fused kernel, the NumPy expression and in-place NumPy."""
    own, out, tmp = _filled(nbytes), _filled(nbytes, 0.0), _filled(nbytes, 0.0)
    inputs = [_filled(nbytes, 1.0 + i) for i in range(d)]
    w0 = 1.0 / (d + 1)
    weights = [w0] * d
    calls = {
        "kernel": lambda: kernels.weighted_sum(out, own, w0, inputs, weights),
        "numpy": lambda: numpy_expression(own, w0, inputs, weights),
        "numpy_inplace": lambda: numpy_inplace(out, own, w0, inputs, weights, tmp),
    }
    return {name: timer.seconds_per_call(fn) for name, fn in calls.items()}


def measure_size(timer: Timer, comm: MPI.Comm, nbytes: int) -> Dict[str, Any]:
    """Median seconds of every transfer and kernel variant for one buffer size."""
    seconds = {
        "memcpy": time_memcpy(timer, nbytes),
        "put": time_put(timer, comm, nbytes),
        "step": time_step(timer, comm, nbytes),
        "reduce": time_reduce(timer, nbytes),
        "allreduce": time_allreduce(timer, comm, nbytes),
    }
    seconds.update(time_slot_reduces(timer, comm, nbytes))
    phases = time_step_phases(timer, comm, nbytes)
    kernel_seconds = {d: time_kernels(timer, nbytes, d) for d in DEGREES}
    return {"seconds": seconds, "phases": phases, "kernel_seconds": kernel_seconds}


# ---------------------------------------------------------------------- derived figures

def _verdict(ok: bool, applies: bool = True) -> Optional[str]:
    return ("PASS" if ok else "FAIL") if applies else None


def kernel_figures(nbytes: int, d: int, seconds: Dict[str, float]) -> Dict[str, Any]:
    """GB/s of input read, kernel/NumPy ratios and verdicts for one kernel degree."""
    read = (d + 1) * nbytes
    ratios = {"vs_numpy": seconds["numpy"] / seconds["kernel"],
              "vs_numpy_inplace": seconds["numpy_inplace"] / seconds["kernel"]}
    return {
        "seconds": seconds,
        "gbps": {k: read / t / GB for k, t in seconds.items()},
        "ratios": ratios,
        "checks": {k: _verdict(r >= KERNEL_VS_NUMPY_MIN) for k, r in ratios.items()},
    }


def size_figures(nbytes: int, measured: Dict[str, Any]) -> Dict[str, Any]:
    """The JSON record of one size: medians, GB/s, ratios and verdicts."""
    s, ph = measured["seconds"], measured["phases"]
    verify = max(0.0, s["verified_reduce"] - s["slot_reduce"])
    ratios = {
        "put_vs_memcpy": s["memcpy"] / s["put"],
        # what the protocol's notify and the slot verification add to the raw put of
        # the same step (waits are synchronization, reported apart)
        "notify_verify_overhead": (ph["notify"] + verify) / ph["put"],
        "notify_overhead": ph["notify"] / ph["put"],
        "verify_overhead": s["verified_reduce"] / s["slot_reduce"] - 1.0,
        "wait_share": (ph["wait_ack"] + ph["wait_notify"] + ph["ack"]) / sum(ph.values()),
        "step_vs_put_plus_reduce": s["step"] / (s["put"] + s["reduce"]) - 1.0,
        "step_vs_allreduce": s["step"] / s["allreduce"],
    }
    # the transfer targets are stated for the shared-memory path; on the network path
    # the figures are reported without a verdict
    large = nbytes >= LARGE and rma_path() == "shared-memory"
    return {
        "size_bytes": nbytes,
        "label": size_label(nbytes),
        "seconds": s,
        "step_phase_seconds": ph,
        "gbps": {k: BYTES_FACTOR[k] * nbytes / t / GB for k, t in s.items()},
        "ratios": ratios,
        "checks": {
            "put_vs_memcpy": _verdict(ratios["put_vs_memcpy"] >= PUT_VS_MEMCPY_MIN, large),
            "notify_verify_overhead": _verdict(
                ratios["notify_verify_overhead"] <= NOTIFY_VERIFY_MAX, large),
        },
        "kernels": {str(d): kernel_figures(nbytes, d, t)
                    for d, t in measured["kernel_seconds"].items()},
    }


def summarize(records: Sequence[Dict[str, Any]]) -> Dict[str, Optional[str]]:
    """Overall verdict per target: PASS when every size it applies to passes."""
    verdicts: Dict[str, List[Optional[str]]] = {
        "put_vs_memcpy": [r["checks"]["put_vs_memcpy"] for r in records],
        "notify_verify_overhead": [r["checks"]["notify_verify_overhead"] for r in records],
        "kernel_vs_numpy": [v for r in records for k in r["kernels"].values()
                            for v in k["checks"].values()],
    }
    return {name: _verdict("FAIL" not in vs, any(vs)) for name, vs in verdicts.items()}


def rma_path() -> str:
    """'network' when the MPI is told not to use shared memory for local ranks
    ('network (UCX)' when that is Open MPI's UCX), else 'shared-memory'."""
    if not network_forced():
        return "shared-memory"
    return "network (UCX)" if os.environ.get("OMPI_MCA_pml") == "ucx" else "network"


def environment(comm: MPI.Comm, args: argparse.Namespace) -> Dict[str, Any]:
    """What the figures were measured on: ranks, path, library versions, settings."""
    return {
        "benchmark": "asapmpi.bench.core",
        "ranks": comm.Get_size(),
        "graph": GRAPH,
        "sync": SYNC,
        "dtype": "float32",
        "path": rma_path(),
        "mpi_library": library_version(),
        "versions": {"asapmpi": asapmpi.__version__, "mpi4py": mpi4py.__version__,
                     "numpy": np.__version__, "python": sys.version.split()[0]},
        "repeats": args.repeats,
        "min_time_s": args.min_time,
        "statistic": "median over repeats of the slowest rank's seconds per call",
        "gb": GB,
        "targets": {"put_vs_memcpy_min": PUT_VS_MEMCPY_MIN,
                    "notify_verify_overhead_max": NOTIFY_VERIFY_MAX,
                    "kernel_vs_numpy_min": KERNEL_VS_NUMPY_MIN,
                    "transfer_targets_from_bytes": LARGE},
    }


# ---------------------------------------------------------------------- formatting

def size_label(nbytes: int) -> str:
    """4096 -> '4 KB', 1048576 -> '1 MB' (binary units)."""
    for unit, mult in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if nbytes >= mult and nbytes % mult == 0:
            return f"{nbytes // mult} {unit}"
    return f"{nbytes} B"


def format_time(t: float) -> str:
    return f"{t * 1e6:.1f} us" if t < 1e-3 else f"{t * 1e3:.2f} ms"


def _ratio(value: float, verdict: Optional[str]) -> str:
    return f"{value:.2f} {verdict or '-':>4}"


def _percent(value: float, verdict: Optional[str] = None, show: bool = True) -> str:
    text = f"{100 * value:+.1f}%"
    return f"{text} {verdict or '-':>4}" if show else text


def render_table(title: str, columns: Sequence[Tuple[str, str]], rows: Sequence[Sequence[str]]
            ) -> List[str]:
    """A fixed-width table: two header lines per column, first column left-aligned."""
    widths = [max(len(c[0]), len(c[1]), *(len(r[i]) for r in rows))
              for i, c in enumerate(columns)]

    def line(cells: Sequence[str]) -> str:
        first = cells[0].ljust(widths[0])
        return "  ".join([first] + [c.rjust(w) for c, w in zip(cells[1:], widths[1:])])

    return ["", title, line([c[0] for c in columns]), line([c[1] for c in columns]),
            "-" * len(line([c[0] for c in columns]))] + [line(r) for r in rows]


def transfer_table(records: Sequence[Dict[str, Any]]) -> List[str]:
    """Table 1: GB/s and time per call of every transfer."""
    columns = [("size", ""), ("memcpy", "GB/s"), ("put", "GB/s"), ("put", "time"),
               ("step", "GB/s"), ("step", "time"), ("reduce", "time"), ("verified", "time"),
               ("allreduce", "GB/s"), ("allreduce", "time")]
    rows = [[r["label"], f"{r['gbps']['memcpy']:.2f}", f"{r['gbps']['put']:.2f}",
             format_time(r["seconds"]["put"]), f"{r['gbps']['step']:.2f}",
             format_time(r["seconds"]["step"]),
             format_time(r["seconds"]["reduce"]), format_time(r["seconds"]["verified_reduce"]),
             f"{r['gbps']['allreduce']:.2f}", format_time(r["seconds"]["allreduce"])]
            for r in records]
    return render_table("1. Transfers, per rank (GB/s = SIZE / time per call; reduce = one-input "
                        "in-place weighted_sum; verified = the same from a slot, checked)",
                        columns, rows)


def ratio_table(records: Sequence[Dict[str, Any]]) -> List[str]:
    """Table 2: put/memcpy and what the protocol adds to a put, with verdicts."""
    columns = [("size", ""), ("put/memcpy", f">= {PUT_VS_MEMCPY_MIN:.2f}"),
               ("(notify+verify)/put", f"<= {100 * NOTIFY_VERIFY_MAX:.0f}%"),
               ("notify/put", ""), ("verified/plain", "reduce - 1"),
               ("waits", "of step"), ("step/(put+red)", "- 1"), ("step/", "allreduce")]
    rows = [[r["label"], _ratio(r["ratios"]["put_vs_memcpy"], r["checks"]["put_vs_memcpy"]),
             _percent(r["ratios"]["notify_verify_overhead"],
                      r["checks"]["notify_verify_overhead"]),
             _percent(r["ratios"]["notify_overhead"], show=False),
             _percent(r["ratios"]["verify_overhead"], show=False),
             f"{100 * r['ratios']['wait_share']:.0f}%",
             _percent(r["ratios"]["step_vs_put_plus_reduce"], show=False),
             f"{r['ratios']['step_vs_allreduce']:.2f}"] for r in records]
    return render_table(f"2. Ratios (verdicts for sizes >= {size_label(LARGE)} on shared memory; "
                        f"'-' = no target)",
                        columns, rows)


def phase_table(records: Sequence[Dict[str, Any]]) -> List[str]:
    """Table 2b: where a step's time goes, phases timed inside the step loop."""
    columns = [("size", "")] + [(name, "time") for name in STEP_PHASES]
    rows = [[r["label"]] + [format_time(r["step_phase_seconds"][name]) for name in STEP_PHASES]
            for r in records]
    return render_table("2b. A NOTIFY-ACK step by phase (mean per step, slowest rank; reduce is "
                        "verified)", columns, rows)


def kernel_table(records: Sequence[Dict[str, Any]]) -> List[str]:
    """Table 3: fused kernel vs NumPy, GB/s of input read and speed ratios."""
    columns = [("size", ""), ("d", ""), ("kernel", "GB/s"), ("numpy", "GB/s"),
               ("in-place", "GB/s"), ("kernel/numpy", f">= {KERNEL_VS_NUMPY_MIN:.1f}"),
               ("kernel/in-place", f">= {KERNEL_VS_NUMPY_MIN:.1f}")]
    rows = []
    for r in records:
        for d, k in r["kernels"].items():
            rows.append([r["label"], d] + [f"{k['gbps'][v]:.2f}" for v in KERNEL_VARIANTS]
                        + [_ratio(k["ratios"][c], k["checks"][c])
                           for c in ("vs_numpy", "vs_numpy_inplace")])
    return render_table("3. Fused kernel vs NumPy, no MPI (GB/s = (d+1)*SIZE input read / time; "
                        "ratio = NumPy time / kernel time)", columns, rows)


def format_report(report: Dict[str, Any]) -> str:
    """The human-readable report rank 0 prints."""
    env, records, summary = report["environment"], report["sizes"], report["summary"]
    loops = f"{env['repeats']} loop" + ("s" if env["repeats"] != 1 else "")
    head = [f"asapmpi core benchmark: {env['ranks']} ranks, graph {env['graph']}, sync "
            f"{env['sync']}, {env['dtype']}, path {env['path']}",
            f"{env['mpi_library']}; asapmpi {env['versions']['asapmpi']}, mpi4py "
            f"{env['versions']['mpi4py']}, numpy {env['versions']['numpy']}",
            f"each figure: median of {loops} (>= {env['min_time_s'] * 1e3:g} ms and >= 3 "
            f"calls, barrier first) of the slowest rank's time per call; GB = 1e9 B"]
    goals = [(f"put/memcpy >= {PUT_VS_MEMCPY_MIN:.2f} (>= 1 MB, shared memory)", "put_vs_memcpy"),
             (f"(notify + verification)/put <= {100 * NOTIFY_VERIFY_MAX:.0f}% "
              f"(>= 1 MB, shared memory)",
              "notify_verify_overhead"),
             (f"fused kernel >= NumPy (every size, d = {', '.join(map(str, DEGREES))})",
              "kernel_vs_numpy")]
    width = max(len(text) for text, _ in goals)
    targets = ["", "Targets:"] + [f"  {text.ljust(width)}  {summary[key] or 'n/a'}"
                                  for text, key in goals]
    return "\n".join(head + transfer_table(records) + ratio_table(records)
                     + phase_table(records) + kernel_table(records) + targets)


# ---------------------------------------------------------------------- entry points

def benchmark(comm: MPI.Comm, sizes: Sequence[int], timer: Timer,
              progress: Optional[Callable[[str], None]] = None) -> List[Dict[str, Any]]:
    """Measure every size on every rank of `comm`; return one record per size."""
    records = []
    for nbytes in sizes:
        if progress:
            progress(f"measuring {size_label(nbytes)}")
        records.append(size_figures(nbytes, measure_size(timer, comm, nbytes)))
    return records


def _progress(message: str) -> None:
    print(f"[asapmpi bench core] {message}", file=sys.stderr, flush=True)


def _abort(comm: MPI.Comm) -> None:
    """Report this rank's exception and abort the job so no rank waits forever."""
    sys.stderr.write(f"[rank {comm.Get_rank()}] asapmpi bench core failed:\n"
                     f"{traceback.format_exc()}")
    abort_world(1)


def run(args: argparse.Namespace) -> int:
    """Run the benchmark on MPI.COMM_WORLD; rank 0 prints the report and writes --json."""
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    if comm.Get_size() < 2:
        if rank == 0:
            print("asapmpi bench core needs at least 2 ranks: mpiexec -n 2 python -m "
                  "asapmpi.bench.core", file=sys.stderr)
        return 2
    sizes = args.sizes if isinstance(args.sizes, list) else parse_sizes(args.sizes)
    try:
        timer = Timer(comm, args.repeats, args.min_time)
        verbose = rank == 0 and getattr(args, "verbose", False)
        records = benchmark(comm, sizes, timer, _progress if verbose else None)
    except Exception:
        _abort(comm)
        raise
    if rank == 0:
        report = {"environment": environment(comm, args), "sizes": records,
                  "summary": summarize(records)}
        publish(report, format_report(report), args.json)
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Command line entry point: parse `argv` (default sys.argv[1:]) and run."""
    parser = argparse.ArgumentParser(
        prog="mpiexec -n 2 python -m asapmpi.bench.core",
        description="Benchmark the asapmpi core against memcpy, MPI_Allreduce and NumPy.",
        epilog=__doc__.split("\n\n", 2)[2], formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
