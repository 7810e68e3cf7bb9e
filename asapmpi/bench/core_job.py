"""The measurements of `asapmpi bench core`, on every rank of the job (the columns,
loops and targets are described in asapmpi/bench/core.py, which also analyses and
prints what this measures).

    mpiexec -n 2 python -m asapmpi.bench.core [--sizes 4K,64K,1M,16M,64M] [--repeats N]
                                              [--json FILE]
"""
from __future__ import annotations

import argparse
import itertools
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

from ..launch.faults import abort_world
from . import core
from .common import parse_sizes, publish, rma_path, size_label
from .core import (
    DEGREES,
    GB,
    GRAPH,
    KERNEL_VS_NUMPY_MIN,
    LARGE,
    NOTIFY_VERIFY_MAX,
    PUT_VS_MEMCPY_MIN,
    STEP_PHASES,
    SYNC,
    TRANSPORT,
    WAIT_TIMEOUT,
    add_arguments,
    format_report,
    size_figures,
    summarize,
)
from .timing import Timer, filled, time_memcpy


def time_put(timer: Timer, comm: MPI.Comm, nbytes: int) -> float:
    """Seconds per PutWindow.put(notify=False) of nbytes to the ring out-neighbour."""
    buf = filled(nbytes)
    with Exchange(buf, graph=GRAPH, sync=SYNC, comm=comm, transport=TRANSPORT) as ex:
        put, versions = ex.window.put, itertools.count(1)
        return timer.seconds_per_call(lambda: put(buf, next(versions), notify=False))


def time_step(timer: Timer, comm: MPI.Comm, nbytes: int) -> float:
    """Seconds per Exchange.step() (notify_ack on the ring) of nbytes."""
    buf = filled(nbytes)
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
    buf = filled(nbytes)
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
    buf = filled(nbytes)
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
    buf, inputs, weights = filled(nbytes), [filled(nbytes)], [0.5]
    return timer.seconds_per_call(lambda: kernels.weighted_sum(buf, buf, 0.5, inputs, weights))


def time_allreduce(timer: Timer, comm: MPI.Comm, nbytes: int) -> float:
    """Seconds per in-place MPI_Allreduce (sum) of nbytes."""
    buf = filled(nbytes, 0.0)  # zeros stay zeros however many sums
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
    own, out, tmp = filled(nbytes), filled(nbytes, 0.0), filled(nbytes, 0.0)
    inputs = [filled(nbytes, 1.0 + i) for i in range(d)]
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
        epilog=core.__doc__.split("\n\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
