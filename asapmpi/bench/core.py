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
import sys
from typing import Any, Dict, List, Optional, Sequence

from ..outputs import output_file
from .common import format_time, parse_sizes, positive, render_table, rma_path, size_label

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


# ---------------------------------------------------------------------- arguments

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the benchmark's options to `parser` (for `python -m` and `asapmpi bench core`)."""
    parser.add_argument("--sizes", type=parse_sizes, default=DEFAULT_SIZES,
                        help=f"comma-separated buffer sizes in bytes, K/M/G suffixes "
                             f"(default {DEFAULT_SIZES})")
    parser.add_argument("--repeats", type=positive(int), default=5,
                        help="timed loops per figure; the median is reported (default 5)")
    parser.add_argument("--min-time", type=positive(float), default=0.02,
                        help="seconds each timed loop lasts at least (default 0.02)")
    parser.add_argument("--json", metavar="FILE", default=None, type=output_file,
                        help="also write every median and ratio to FILE as JSON")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="rank 0 reports each size on stderr as it starts")


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


# ---------------------------------------------------------------------- formatting

def _ratio(value: float, verdict: Optional[str]) -> str:
    return f"{value:.2f} {verdict or '-':>4}"


def _percent(value: float, verdict: Optional[str] = None, show: bool = True) -> str:
    text = f"{100 * value:+.1f}%"
    return f"{text} {verdict or '-':>4}" if show else text


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


if __name__ == "__main__":
    # `python -m asapmpi.bench.core` measures: the job's module runs on the ranks (this
    # module, which describes and reports, starts no MPI)
    from .core_job import main

    sys.exit(main())
