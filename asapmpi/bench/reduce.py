"""`asapmpi bench reduce`: time per averaging step against MPI_Allreduce, torch.distributed
(gloo) and the memory-bandwidth bound, with the performance targets as PASS/FAIL.

    asapmpi bench reduce [--sizes 4K,...,64M] [--ranks 2,4,8] [--paths shm,net]
                         [--graphs complete,root-expander,ring,exponential]
                         [--policies notify_ack,bsp,async,hop] [--json FILE] [--png FILE]

Started outside an MPI job it runs one mpiexec job per (path, ranks) with the embedded
MPI (`net` = MPICH's network path forced: TCP on loopback) and reports them together;
started inside one (mpiexec, srun) it measures that job's ranks and path only.

Every figure is seconds per call: the slowest rank's loop time / calls, median over
--repeats loops (asapmpi.bench.timing.Timer), float32 buffers of SIZE bytes on every rank.
Ratios are time / reference; every policy's step loops take turns with an Allreduce's
in every repeat (and notify_ack's, the bound's policy, with a bandwidth copy's on shared
memory), and its ratios to MPI_Allreduce and to the bound are the medians of the ratios
per repeat (a host that slows down for a while then moves both sides of a ratio; the
allreduce column is then the median of the loops that took turns with the policy's).
  step         Exchange(buf, graph, sync=POLICY).step(): the whole averaging step
               (sends, waits, verified reduce into buf) as a training loop calls it.
  allreduce    comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM) through mpi4py, same MPI.
  gloo         torch.distributed.all_reduce(tensor on buf), gloo backend.
  exchange     the MPI's own exchange of the graph: an MPI_Irecv from every
               in-neighbour, an MPI_Isend of buf to every out-neighbour, MPI_Waitall,
               through mpi4py (no asapmpi).  An averaging step sends these messages at
               least, so exchange / Allreduce is what the MPI and the machine make of
               the graph's traffic, and step / exchange what the policy adds to it
               (its waits, acks, verified reduce and Python).  Every policy's loops
               take turns with its exchange as with the Allreduce.  backup_ps's and
               elastic's is a round of their star: the server receives every worker's
               buffer, then sends to every worker (its parameters need them all).
               gossip's (a pull from a random peer per step) is a Sendrecv with a
               peer: every rank receives one buffer and sends one, the pairs a
               rotation by an offset drawn per call (the floor of one pull each).
               Each ratio to it is shown with its run-to-run spread: the lowest and
               highest of the per-repeat ratios.  "mixed per step": gossip's models
               mixed per rank and step (a pull mixes one; a push what arrived: a step
               fast because its models waited or were replaced shows it here).
  bound        the memory-bandwidth bound of a step on shared memory: the bytes any
               averaging step must move, reading the d_in in-neighbours' updates and
               the rank's own buffer and writing the buffer back ((d_in + 2) * SIZE),
               at the job's memory bandwidth per rank (np.copyto of arrays that
               together hold 4x the last-level cache, STREAM's rule for timing memory
               rather than cache, every rank copying at once):
                   bound = (d_in + 2) * SIZE / bandwidth
               Getting the updates there (puts, or the one copy of the shared-memory
               transport) is overhead the ratio includes.  Where a step's data fits the
               caches it can come out under this bound.
  copy bound   the same bytes at the speed of np.copyto of SIZE itself, every rank at
               once: memcpy(SIZE) * (d_in + 2) / 2.  Up to a few MB that copy runs
               within one core's caches, while a step reads what other cores wrote,
               so this is a cache bound, shown for comparison (x_copy in --json).
Targets (PASS/FAIL):
  T1  shared memory, 8 ranks, 16 MB, root-expander, notify_ack: step <= 1.0x allreduce
  T2  ... the same step <= 0.5x gloo
  T3  shared memory, SIZE >= 1 MB, every graph and rank count, notify_ack: step <= 1.4x
      bound (the table marks every such row; T3 is their worst)
  T4  network path, 8 ranks, 64 KB, root-expander, notify_ack: step <= 2.0x allreduce
  T5  Open MPI, UCX over TCP (--paths ucx), 8 ranks, 64 KB, root-expander: notify_ack,
      hop:backup=1, bsp and async step <= 1.0x allreduce; gossip, backup_ps and elastic
      (on their star; elastic's "step" is a superstep) <= 2.0x
  T6  MPICH's network path, 8 ranks, 64 KB, root-expander, hop:backup=1: <= 1.0x
A target whose configuration was not in the sweep is "not measured"; a network target's
line also shows the MPI's own exchange of the graph against the same Allreduce.
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..errors import ConfigError
from ..outputs import output_file
from .common import format_time, parse_sizes, positive, publish, render_table, size_label
from .runs import OWN_GRAPH_POLICIES, policy_of, policy_specs, split_spec

DEFAULT_SIZES = "4K,16K,64K,256K,1M,4M,16M,64M"
DEFAULT_RANKS = "2,4,8"
PATHS = {"shm": "shared-memory", "net": "network", "ucx": "network (UCX)"}
#: the forced network path (asapmpi.launchers.NETWORKS) of each
NETWORK_OF = {"shm": None, "net": "tcp", "ucx": "ucx"}
DEFAULT_GRAPHS = "complete,root-expander,ring,exponential"
DEFAULT_POLICIES = "notify_ack,bsp,async,hop"
MAIN_POLICY, MAIN_GRAPH = "notify_ack", "root-expander"
LARGE = 1 << 20
BOUND_MAX = 1.4
#: the cluster stacks' targets (issue 14): 8 ranks, 64 KB, root expander, the MPI's
#: forced network path; (policy, limit) against MPI_Allreduce on the same stack
NETWORK_TARGETS = {
    ("network (UCX)", "openmpi"): (("notify_ack", 1.0), ("hop:backup=1", 1.0),
                                   ("bsp", 1.0), ("async", 1.0), ("gossip", 2.0),
                                   ("backup_ps", 2.0), ("elastic", 2.0)),
    ("network", "mpich"): (("hop:backup=1", 1.0),),
}
TARGETS = (
    # name, path, MPI family (None: any), ranks, size, policy, against, limit
    ("T1", "shared-memory", None, 8, 16 << 20, MAIN_POLICY, "allreduce", 1.0),
    ("T2", "shared-memory", None, 8, 16 << 20, MAIN_POLICY, "gloo", 0.5),
    ("T4", "network", None, 8, 64 << 10, MAIN_POLICY, "allreduce", 2.0),
    *((f"T5 {policy}" if family == "openmpi" else f"T6 {policy}", path, family, 8,
       64 << 10, policy, "allreduce", limit)
      for (path, family), rows in NETWORK_TARGETS.items() for policy, limit in rows),
)


# ---------------------------------------------------------------------- arguments

def _names(allowed: Sequence[str], what: str):
    def convert(text: str) -> List[str]:
        names = [t.strip() for t in text.split(",") if t.strip()]
        bad = [n for n in names if n not in allowed]
        if bad or not names:
            raise argparse.ArgumentTypeError(
                f"unknown {what} {', '.join(bad) or repr(text)}; choose from "
                f"{','.join(allowed)}")
        return list(dict.fromkeys(names))
    convert.__name__ = what
    return convert


def _rank_counts(text: str) -> List[int]:
    try:
        counts = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 2:
        raise argparse.ArgumentTypeError(f"--ranks takes rank counts >= 2 such as 2,4,8, "
                                         f"got {text!r}")
    return list(dict.fromkeys(counts))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the benchmark's options to `parser` (`asapmpi bench reduce`)."""
    from ..reduce import GRAPHS

    parser.add_argument("--sizes", type=parse_sizes, default=DEFAULT_SIZES,
                        help=f"buffer sizes in bytes, K/M suffixes (default {DEFAULT_SIZES})")
    parser.add_argument("--ranks", type=_rank_counts, default=DEFAULT_RANKS,
                        help=f"rank counts, one job each (default {DEFAULT_RANKS}; inside "
                             f"an MPI job: that job's size)")
    parser.add_argument("--paths", type=_names(list(PATHS), "path"), default="shm,net",
                        help="shm (shared memory), net (the MPI's network path, TCP on "
                             "loopback) and/or ucx (Open MPI: UCX over TCP) (default "
                             "shm,net)")
    # "hierarchical" needs the hosts, found by the Exchange: not a fixed graph to sweep
    parser.add_argument("--graphs", type=_names(sorted(set(GRAPHS) - {"hierarchical"}),
                                                "graph"),
                        default=DEFAULT_GRAPHS, help=f"(default {DEFAULT_GRAPHS})")
    parser.add_argument("--policies", type=policy_specs, default=DEFAULT_POLICIES,
                        help=f"POLICY[:OPTION=VALUE...] runs, comma-separated, such as "
                             f"hop:backup=1 (default {DEFAULT_POLICIES}); backup_ps runs "
                             f"on its own star")
    parser.add_argument("--repeats", type=positive(int), default=5,
                        help="timed loops per figure; the median is reported (default 5)")
    parser.add_argument("--min-time", type=positive(float), default=0.02,
                        help="seconds each timed loop lasts at least (default 0.02)")
    parser.add_argument("--no-gloo", action="store_true",
                        help="skip torch.distributed's gloo all_reduce")
    parser.add_argument("--timeout", type=positive(float), default=120.0,
                        help="neighbour timeout of the exchanges, seconds (default 120)")
    parser.add_argument("--job-timeout", type=positive(float), default=3600.0,
                        help="kill a job (one path and rank count) after this many "
                             "seconds (default 3600)")
    parser.add_argument("--json", metavar="FILE", default=None, type=output_file,
                        help="write every figure, ratio and verdict to FILE")
    parser.add_argument("--png", metavar="FILE", default=None, type=output_file,
                        help="draw step time / MPI_Allreduce over size, one panel per job")
    parser.add_argument("--strict", action="store_true",
                        help="exit 1 when a measured target FAILs")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="report each size on stderr as it starts")


def check(args: argparse.Namespace) -> None:
    """ConfigError, before any job starts, for graphs that do not exist (or do not
    connect every rank) on a requested rank count, and for a policy whose options do not
    fit one of them (hop:backup=1 on a ring: each rank has one in-neighbour)."""
    from ..reduce import graph

    for n in args.ranks:
        for name in args.graphs:
            g = graph(name, n)
            if not g.is_strongly_connected():
                raise ConfigError(f"graph {name!r} is not strongly connected on {n} ranks; "
                                  f"drop it from --graphs or change --ranks")
            for run in args.policies:
                if split_spec(run)[0] in OWN_GRAPH_POLICIES:
                    continue            # timed on their own graph, not on this one
                try:
                    policy_of(run).validate(g, 0)
                except ConfigError as exc:
                    raise ConfigError(f"{run} on {name} ({n} ranks): {exc}; drop one of "
                                      f"them from --policies or --graphs") from None


def spec_of(args: argparse.Namespace) -> Dict[str, Any]:
    """What each job measures (JSON-serializable)."""
    return {"sizes": args.sizes, "graphs": args.graphs, "policies": args.policies,
            "repeats": args.repeats, "min_time": args.min_time, "gloo": not args.no_gloo,
            "timeout": args.timeout, "verbose": args.verbose,
            "paired_policies": [MAIN_POLICY]}


# ---------------------------------------------------------------------- running

def run_jobs(args: argparse.Namespace) -> List[Dict[str, Any]]:
    """One mpiexec job per (path, ranks); their results in that order."""
    from ..launch.ranks import run_job

    spec = spec_of(args)
    jobs = []
    with tempfile.TemporaryDirectory(prefix="asapmpi-bench-reduce-") as tmp:
        for path in args.paths:
            for n in args.ranks:
                if args.verbose:
                    print(f"[asapmpi bench reduce] {PATHS[path]}, {n} ranks", file=sys.stderr,
                          flush=True)
                jobs.append(run_job("asapmpi.bench.reduce_job", n, spec,
                                    os.path.join(tmp, f"{path}-{n}.json"),
                                    f"the {PATHS[path]} job on {n} ranks",
                                    network=NETWORK_OF[path], timeout=args.job_timeout))
    return jobs


def run(args: argparse.Namespace) -> int:
    """Measure, print the report and the verdicts, write --json and --png."""
    from ..launch.ranks import inside_mpi_job

    check(args)
    if inside_mpi_job():
        from mpi4py import MPI

        from . import reduce_job

        comm = MPI.COMM_WORLD
        result = reduce_job.measure(comm, spec_of(args),
                                    progress=reduce_job._progress if args.verbose and
                                    comm.Get_rank() == 0 else None)
        if comm.Get_rank() != 0:
            return 0
        jobs = [result]
    else:
        jobs = run_jobs(args)
    report = analyze(jobs)
    publish(report, format_report(report), args.json, args.png, draw)
    failed = any(t["verdict"] == "FAIL" for t in report["targets"])
    return 1 if args.strict and failed else 0


# ---------------------------------------------------------------------- analysis

def bound_seconds(nbytes: int, d_in: int, bytes_per_s: float) -> float:
    """The memory-bandwidth bound of one step (see the module docstring)."""
    return (d_in + 2) * nbytes / bytes_per_s


def copy_bound_seconds(memcpy: float, d_in: int) -> float:
    """The same traffic at the speed of a copy of SIZE (see the module docstring)."""
    return memcpy * (d_in + 2) / 2


def paired_ratios(paired: Dict[str, List[float]], nbytes: int, d_in: int,
                  array_bytes: int) -> Tuple[float, Optional[float]]:
    """(step / Allreduce, step / memory bound): medians of the ratios of the loops that
    ran in turn in each repeat; the bound of a repeat comes from its own bandwidth copy
    of 2 x array_bytes (None where no copy was timed: off shared memory)."""
    per_allreduce = [s / a for s, a in zip(paired["step"], paired["allreduce"])]
    if "stream" not in paired:
        return statistics.median(per_allreduce), None
    per_bound = [s / bound_seconds(nbytes, d_in, 2 * array_bytes / t)
                 for s, t in zip(paired["step"], paired["stream"])]
    return statistics.median(per_allreduce), statistics.median(per_bound)


def _ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return a / b if a is not None and b else None


def exchange_ratios(step: Dict[str, Any]) -> Dict[str, Any]:
    """The MPI exchange the step took turns with: "exchange" (the median of its loops),
    "x_exchange" (step / exchange) and "exchange_x_allreduce" (exchange / Allreduce),
    the medians of the per-repeat ratios, each ratio's "..._range" [lowest, highest]
    of them (the run-to-run spread); all None where no exchange ran beside the step."""
    paired = step.get("paired", {})
    if "exchange" not in paired:
        return dict.fromkeys(("exchange", "x_exchange", "exchange_x_allreduce",
                              "x_exchange_range", "exchange_x_allreduce_range"))
    per_step = [s / x for s, x in zip(paired["step"], paired["exchange"])]
    per_allreduce = [x / a for x, a in zip(paired["exchange"], paired["allreduce"])]
    return {"exchange": statistics.median(paired["exchange"]),
            "x_exchange": statistics.median(per_step),
            "exchange_x_allreduce": statistics.median(per_allreduce),
            "x_exchange_range": [min(per_step), max(per_step)],
            "exchange_x_allreduce_range": [min(per_allreduce), max(per_allreduce)]}


def analyze(jobs: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """Rows (one per job, size, graph, policy) with ratios, and the target verdicts."""
    rows = []
    for job in jobs:
        for rec in job["records"]:
            for graph, steps in rec["steps"].items():
                deg = job["degrees"][graph]
                bound = bound_seconds(rec["size"], deg["in"],
                                      job["memory_bandwidth"]["bytes_per_s"])
                copy_bound = copy_bound_seconds(rec["memcpy"], deg["in"])
                for policy, step in steps.items():
                    seconds = step["seconds"]
                    checked = (job["path"] == "shared-memory" and rec["size"] >= LARGE
                               and policy == MAIN_POLICY)
                    x_allreduce = _ratio(seconds, rec["allreduce"])
                    allreduce = rec["allreduce"]
                    x_bound = seconds / bound
                    if "paired" in step:        # ratios per repeat (see the docstring)
                        allreduce = statistics.median(step["paired"]["allreduce"])
                        x_allreduce, paired_bound = paired_ratios(
                            step["paired"], rec["size"], deg["in"],
                            job["memory_bandwidth"]["array_bytes"])
                        x_bound = paired_bound or x_bound
                    floors = exchange_ratios(step)
                    floor = step.get("floor_graph") if floors["x_exchange"] is not None \
                        else None
                    rows.append({
                        "path": job["path"], "ranks": job["ranks"], "size": rec["size"],
                        "family": mpi_family(job.get("mpi_library", "")),
                        "graph": graph, "policy": policy, "seconds": seconds,
                        "transport": step["transport"],
                        "mixed_per_step": step.get("mixed_per_step"),
                        "allreduce": allreduce, "gloo": rec["gloo"],
                        "memcpy": rec["memcpy"], "bound": bound, "copy_bound": copy_bound,
                        "x_allreduce": x_allreduce,
                        "x_gloo": _ratio(seconds, rec["gloo"]), "x_bound": x_bound,
                        "x_copy": seconds / copy_bound,
                        **floors, "floor_graph": floor,
                        "graph_exchange": rec.get("exchange", {}).get(graph),
                        "bound_verdict": (("PASS" if x_bound <= BOUND_MAX else "FAIL")
                                          if checked else None)})
    return {"jobs": [{k: v for k, v in j.items() if k != "records"} for j in jobs],
            "records": [dict(r, path=j["path"], ranks=j["ranks"]) for j in jobs
                        for r in j["records"]],
            "rows": rows, "targets": targets(rows)}


def _find(rows, path, ranks, size, graph=MAIN_GRAPH, policy=MAIN_POLICY, family=None):
    for r in rows:
        if (r["path"], r["ranks"], r["size"], r["graph"], r["policy"]) == \
                (path, ranks, size, graph, policy) and family in (None, r.get("family")):
            return r
    return None


def mpi_family(library: str) -> str:
    """"openmpi" or "mpich" (MPICH and its derivatives) from the library's version."""
    return "openmpi" if "Open MPI" in library else "mpich"


def targets(rows: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The verdict of every target (see the module docstring)."""
    out = []
    for name, path, family, ranks, size, policy, against, limit in TARGETS:
        row = _find(rows, path, ranks, size, policy=policy, family=family)
        value = row and row[f"x_{against}"]
        stack = {"openmpi": "Open MPI ", "mpich": "MPICH "}.get(family, "")
        what = (f"{stack}{path}, {ranks} ranks, {size_label(size)}, {MAIN_GRAPH}, {policy}: "
                f"step / {'MPI_Allreduce' if against == 'allreduce' else 'gloo all_reduce'}")
        out.append({"name": name, "what": what, "limit": limit, "value": value,
                    "exchange_x_allreduce": row and row.get("exchange_x_allreduce"),
                    "floor_graph": row and row.get("floor_graph"),
                    "verdict": "not measured" if value is None else
                    ("PASS" if value <= limit else "FAIL")})
    checked = [r for r in rows if r["bound_verdict"]]
    worst = max(checked, key=lambda r: r["x_bound"]) if checked else None
    what = (f"shared-memory, >= {size_label(LARGE)}, every graph and rank count, "
            f"{MAIN_POLICY}: step / memory bound (worst of {len(checked)}"
            + (f": {worst['ranks']} ranks, {size_label(worst['size'])}, {worst['graph']})"
               if worst else ")"))
    out.insert(2, {"name": "T3", "what": what, "limit": BOUND_MAX,
                   "value": worst and worst["x_bound"],
                   "failed": sum(r["bound_verdict"] == "FAIL" for r in checked),
                   "verdict": "not measured" if worst is None else
                   ("PASS" if worst["x_bound"] <= BOUND_MAX else "FAIL")})
    return out


# ---------------------------------------------------------------------- report

def _x(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.2f}x"


def job_tables(report: Dict[str, Any], job: Dict[str, Any]) -> List[str]:
    """Times and ratios of one job: rows (size, graph), a column per policy."""
    rows = [r for r in report["rows"] if (r["path"], r["ranks"]) == (job["path"],
                                                                     job["ranks"])]
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    keys = list(dict.fromkeys((r["size"], r["graph"]) for r in rows))
    by = {(r["size"], r["graph"], r["policy"]): r for r in rows}
    columns = ([("size", ""), ("graph", ""), ("d", "in/out"), ("bound", "memory"),
                ("MPI", "Allreduce"), ("MPI", "exchange"), ("gloo", "all_reduce")]
               + [(p, "step") for p in policies])
    times = []
    for size, graph in keys:
        first = by[(size, graph, policies[0])]
        deg = job["degrees"][graph]
        times.append([size_label(size), graph, f"{deg['in']}/{deg['out']}",
                      format_time(first["bound"]), format_time(first["allreduce"]),
                      _time(_graph_exchange(by, size, graph, policies)),
                      _time(first["gloo"])]
                     + [format_time(by[(size, graph, p)]["seconds"]) for p in policies])
    transports = {p: sorted({r["transport"] for r in rows if r["policy"] == p})
                  for p in policies}
    bandwidth = job["memory_bandwidth"]
    title = (f"{job['path']}, {job['ranks']} ranks: seconds per call (transport: "
             + ", ".join(f"{p} {'/'.join(t)}" for p, t in transports.items())
             + f"); memory bandwidth {bandwidth['bytes_per_s'] / 1e9:.1f} GB/s per rank "
             f"(copies of {size_label(bandwidth['array_bytes'])}, all ranks at once)")
    lines = render_table(title, columns, times)
    columns = ([("size", ""), ("graph", "")] + [(p, "/Allreduce") for p in policies]
               + [(MAIN_POLICY, "/gloo"), (MAIN_POLICY, "/copy bound"),
                  (MAIN_POLICY, f"/bound <= {BOUND_MAX}")])
    ratios = []
    for size, graph in keys:
        main = by.get((size, graph, MAIN_POLICY))
        ratios.append([size_label(size), graph]
                      + [_x(by[(size, graph, p)]["x_allreduce"]) for p in policies]
                      + ([_x(main["x_gloo"]), _x(main["x_copy"]),
                          f"{_x(main['x_bound'])} {main['bound_verdict'] or '-':>4}"]
                         if main else ["-", "-", "-"]))
    lines += render_table(f"{job['path']}, {job['ranks']} ranks: ratios (< 1: faster than "
                          f"the reference)", columns, ratios)
    floors = [[size_label(r["size"]), r["graph"], r["policy"], r["floor_graph"],
               format_time(r["exchange"]),
               _spread(r["exchange_x_allreduce"], r.get("exchange_x_allreduce_range")),
               _spread(r["x_exchange"], r.get("x_exchange_range")),
               "-" if r.get("mixed_per_step") is None else f"{r['mixed_per_step']:.2f}"]
              for r in rows if r["x_exchange"] is not None]
    if floors:
        # gossip: models mixed per rank and step (a pull mixes one; pushes what arrived)
        columns = [("size", ""), ("graph", ""), ("policy", ""), ("exchange", "of"),
                   ("MPI", "exchange"), ("exchange", "/Allreduce (spread)"),
                   ("step", "/exchange (spread)"), ("mixed", "per step")]
        lines += render_table(f"{job['path']}, {job['ranks']} ranks: the MPI's own exchange "
                              f"of each policy's messages without asapmpi (gossip: a "
                              f"Sendrecv with a random peer), timed beside the step; the "
                              f"spread is the lowest and highest ratio of a repeat",
                              columns, floors)
    return lines


def _spread(value: Optional[float], extent: Optional[Sequence[float]]) -> str:
    """A median ratio with its spread over the repeats: "1.23x (1.10-1.41)"."""
    if value is None or not extent:
        return _x(value)
    return f"{value:.2f}x ({extent[0]:.2f}-{extent[1]:.2f})"


def _time(seconds: Optional[float]) -> str:
    return "-" if seconds is None else format_time(seconds)


def _graph_exchange(by: Dict[Tuple[int, str, str], Dict[str, Any]], size: int, graph: str,
                    policies: Sequence[str]) -> Optional[float]:
    """The seconds of (size, graph)'s own exchange: the loops of the first policy that
    took turns with it (they ran beside the Allreduce's), else the exchange timed on
    its own."""
    rows = [by[(size, graph, p)] for p in policies]
    paired = [r["exchange"] for r in rows if r["floor_graph"] == graph]
    return paired[0] if paired else rows[0]["graph_exchange"]


def format_report(report: Dict[str, Any]) -> str:
    """The whole report: environment, per-job tables, target verdicts."""
    jobs = report["jobs"]
    lines = ["asapmpi bench reduce: seconds per averaging step (median over repeats, "
             "slowest rank)"]
    if jobs:
        lines.append(f"MPI: {jobs[0]['mpi_library']}; gloo: {jobs[0]['gloo']}")
    for job in jobs:
        lines += job_tables(report, job)
    lines += ["", "Targets"]
    for t in report["targets"]:
        value = "-" if t["value"] is None else f"{t['value']:.2f}x"
        extra = f" ({t['failed']} rows FAIL)" if t.get("failed") else ""
        if t.get("exchange_x_allreduce") is not None:
            extra += (f"; the MPI's own exchange of the {t['floor_graph']}: "
                      f"{t['exchange_x_allreduce']:.2f}x")
        lines.append(f"  {t['name']} {t['verdict']:>12}  {value:>7} (<= {t['limit']}x)  "
                     f"{t['what']}{extra}")
    return "\n".join(lines)


def draw(report: Dict[str, Any], path: str) -> str:
    """PNG: per job, time / MPI_Allreduce over log2(size / 1 KB): notify_ack per graph
    and the memory bound of the root expander (gloo, 10-100x, would flatten the rest:
    it is in the tables)."""
    from ..plot.lines import line_panels

    panels = []
    for job in report["jobs"]:
        rows = [r for r in report["rows"] if (r["path"], r["ranks"]) == (job["path"],
                                                                         job["ranks"])]
        series: Dict[str, Any] = {}
        for r in rows:
            x = math.log2(r["size"] / 1024)
            if r["policy"] == MAIN_POLICY:
                xs, ys = series.setdefault(f"{MAIN_POLICY}@{r['graph']}", ([], []))
                xs.append(x)
                ys.append(r["x_allreduce"])
            if r["policy"] == MAIN_POLICY and r["graph"] == MAIN_GRAPH:
                xs, ys = series.setdefault(f"memory bound {MAIN_GRAPH}", ([], []))
                xs.append(x)
                ys.append(r["bound"] / r["allreduce"])
        panels.append((series, f"{job['path']}, {job['ranks']} ranks: log2(size / 1 KB)"))
    return line_panels(panels, path, title="step time / MPI_Allreduce time",
                       panel_width=420)
