"""ElasticBSP barrier selection benchmark (Zhao et al., ICDM'19, Table II).

    asapmpi bench zipline [--workers 10,100,1000] [--R 15,150] [--repeats 10] [--seed 0]
                          [--input cumulative|uniform|...|all] [--budget 20] [--json FILE]

One process, no MPI.  For every n (workers) x R (predicted iterations) of the grid it
generates predicted iteration end times of one or more input families (--input, a
comma-separated list or `all`; INPUTS below, each a generator function whose docstring
says what it makes): by default `cumulative`, like the paper's "realistic scenarios"
(per worker a base interval uniform in [0.8, 1.2] s times a speed factor uniform in
[1, 3], each iteration jittered by up to +-10 %, all workers starting together after
the last barrier); `uniform` (sorted uniform rows), `homogeneous` (cumulative, all
workers of one speed), `sorted` (worker p's ends all after worker p-1's), `lockstep`
(every worker's j-th end before any worker's (j+1)-th), `all-ties` (every row the same
values) and `one-outlier` (one worker far behind the rest); `realistic` and `random`
are the old names of `cumulative` and `uniform`.  It times ZipLine, FullGridScan and
GridScan of asapmpi.sync.zipline on the same matrix: the median over --repeats calls
after one untimed warm-up call, in microseconds, next to the paper's Table II (average
of 10 trials on a Xeon E5-2620 v3).  It also reports the spread each algorithm found
against the optimum (ZipLine is exact: GridScan's heuristic gap, and FullGridScan's when
it misses), and checks the goal "ZipLine at n=1000, R=150 in under 3 ms" on every
family.

A configuration whose single call is estimated (from the previous size, with the
implementation's complexity) to exceed --budget seconds is skipped and the estimate
reported; otherwise calls are repeated while they fit in the budget, so FullGridScan at
the largest sizes may be timed on fewer repeats (the table says how many).

Exit status: 0; 1 if the goal was measured and missed on a family, or if an algorithm
found a smaller spread than ZipLine (ZipLine would not be optimal).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from ..errors import ConfigError
from ..outputs import output_file
from ..sync.zipline import Choice, full_gridscan, gridscan, zipline

#: (key, name in the table, function, work model used to extrapolate a call's time)
ALGORITHMS: Tuple[Tuple[str, str, Callable, Callable[[int, int], float]], ...] = (
    ("zipline", "ZipLine", zipline, lambda n, r: n * r * math.log2(n + 1)),
    ("full_gridscan", "FullGridScan", full_gridscan,
     lambda n, r: n * n * r * math.log2(r + 1)),
    ("gridscan", "GridScan", gridscan, lambda n, r: n * r * math.log2(r + 1)),
)

#: The paper's Table II ("computation time of algorithms in microseconds/µs"), in
#: microseconds, per (workers, R): average of 10 trials on a 24x Xeon E5-2620 v3.
PAPER_US: Dict[str, Dict[Tuple[int, int], float]] = {
    "zipline": {(10, 15): 1.49e2, (10, 150): 1.32e3, (100, 15): 6.37e3,
                (100, 150): 4.99e4, (1000, 15): 2.53e5, (1000, 150): 2.38e6},
    "full_gridscan": {(10, 15): 1.54e3, (10, 150): 4.67e4, (100, 15): 8.13e4,
                      (100, 150): 2.15e6, (1000, 15): 4.04e6, (1000, 150): 2.07e8},
    "gridscan": {(10, 15): 1.68e2, (10, 150): 5.50e3, (100, 15): 1.11e3,
                 (100, 150): 4.38e4, (1000, 15): 7.45e3, (1000, 150): 2.57e5},
}

#: the goal: ZipLine at this many workers and R under this many seconds (median)
GOAL_WORKERS, GOAL_R, GOAL_SECONDS = 1000, 150, 3e-3


def _int_list(text: str) -> List[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got "
                                         f"{text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one integer")
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `asapmpi bench zipline`."""
    parser.add_argument("--workers", type=_int_list, default=[10, 100, 1000],
                        help="comma-separated worker counts n (default 10,100,1000)")
    parser.add_argument("--R", type=_int_list, default=[15, 150],
                        help="comma-separated predicted iterations per worker "
                             "(default 15,150)")
    parser.add_argument("--repeats", type=int, default=10,
                        help="timed calls per algorithm and size; the median is reported "
                             "(default 10)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--input", default="cumulative",
                        help="input families, comma-separated, or 'all': "
                             f"{', '.join(INPUTS)} ('realistic' and 'random' are the "
                             "old names of cumulative and uniform); default cumulative")
    parser.add_argument("--budget", type=float, default=20.0,
                        help="seconds per algorithm and size: fewer repeats beyond it, "
                             "skipped if one call would exceed it (default 20)")
    parser.add_argument("--json", metavar="FILE", type=output_file, help="write every number here")


def cumulative_ends(n: int, r: int, rng: np.random.Generator) -> np.ndarray:
    """Workers of different speeds (the paper's realistic scenarios): each worker's ends
    are the cumulative sum of its intervals, a base interval U[0.8, 1.2] s times a
    speed factor U[1, 3], each iteration jittered by U[0.9, 1.1]; n x r, seconds since
    the last barrier."""
    interval = rng.uniform(0.8, 1.2, n) * rng.uniform(1.0, 3.0, n)
    jitter = rng.uniform(0.9, 1.1, (n, r))
    return np.cumsum(interval[:, None] * jitter, axis=1)


def uniform_ends(n: int, r: int, rng: np.random.Generator) -> np.ndarray:
    """Sorted uniform rows: r end times per worker drawn from [0, 100) s and sorted, so
    every row spans the same range and none runs out early."""
    return np.sort(rng.uniform(0.0, 100.0, (n, r)), axis=1)


def homogeneous_ends(n: int, r: int, rng: np.random.Generator) -> np.ndarray:
    """Workers of one speed: cumulative sums of intervals U[0.9, 1.1] s, so the rows
    stay interleaved and many windows are nearly as good as the best (the k-way merge
    of 18ab137 popped 147,299 of the 150,000 points at 1000 x 150)."""
    return np.cumsum(rng.uniform(0.9, 1.1, (n, r)), axis=1)


def sorted_ends(n: int, r: int, rng: np.random.Generator) -> np.ndarray:
    """Rows already in global order: worker p's ends lie in [100 p, 100 (p + 1)) s, all
    after worker p-1's (the matrix read row by row is sorted).  The best window runs
    from the first worker's last end to the last worker's first end."""
    return 100.0 * np.arange(n)[:, None] + uniform_ends(n, r, rng)


def lockstep_ends(n: int, r: int, rng: np.random.Generator) -> np.ndarray:
    """Rows in lockstep: every worker's j-th end before any worker's (j+1)-th, the
    workers in one order every round (the matrix read column by column is sorted, the
    other global order): end j of worker p at j + (p + u) / n s, u from U[0, 1).  Every
    window of n consecutive ends is nearly as good as the best, so no point can be
    ruled out cheaply."""
    return (np.arange(r)[None, :] + (np.arange(n)[:, None] + rng.uniform(0.0, 1.0, (n, r)))
            / n)


def all_ties_ends(n: int, r: int, rng: np.random.Generator) -> np.ndarray:
    """Every row the same values: one sorted uniform row of r ends for all workers, so
    each timestamp appears n times and every column is a window of spread 0."""
    return np.repeat(uniform_ends(1, r, rng), n, axis=0)


def one_outlier_ends(n: int, r: int, rng: np.random.Generator) -> np.ndarray:
    """Sorted uniform rows with worker n // 2 1000 s behind: its first end is above
    every end of the others, so the window's end stays on it."""
    ends = uniform_ends(n, r, rng)
    ends[n // 2] += 1000.0
    return ends


#: --input: the input families, each a generator (n, r, rng) -> n x r predicted ends
INPUTS: Dict[str, Callable[[int, int, np.random.Generator], np.ndarray]] = {
    "cumulative": cumulative_ends, "uniform": uniform_ends,
    "homogeneous": homogeneous_ends, "sorted": sorted_ends, "lockstep": lockstep_ends,
    "all-ties": all_ties_ends, "one-outlier": one_outlier_ends}
#: old names of --input families
ALIASES = {"realistic": "cumulative", "random": "uniform"}


def describe_input(kind: str) -> str:
    """The first sentence of the family's generator docstring, for the report."""
    doc = " ".join((INPUTS[kind].__doc__ or "").split())
    return doc.split(": ")[0].split(". ")[0].rstrip(".")


def parse_inputs(text: str) -> List[str]:
    """--input's families, old names resolved, in order, each once; 'all' is every
    family.  ConfigError for an unknown name."""
    names: List[str] = []
    for word in (w.strip() for w in str(text).split(",")):
        if not word:
            continue
        found = list(INPUTS) if word == "all" else [ALIASES.get(word, word)]
        for name in found:
            if name not in INPUTS:
                raise ConfigError(f"--input {word!r} is not an input family; choose from "
                                  f"{', '.join(INPUTS)}, all (or a comma-separated list)")
            if name not in names:
                names.append(name)
    if not names:
        raise ConfigError(f"--input needs at least one input family: "
                          f"{', '.join(INPUTS)} or all")
    return names


def _check_args(args: argparse.Namespace) -> List[str]:
    """ConfigError for a bad option; the input families to run."""
    for name in ("workers", "R"):
        values = getattr(args, name)
        if not values or any(int(v) < 1 for v in values):
            raise ConfigError(f"--{name} needs integers >= 1, got {values!r}")
    if args.repeats < 1:
        raise ConfigError(f"--repeats must be at least 1, got {args.repeats}")
    if not args.budget > 0:
        raise ConfigError(f"--budget must be a positive number of seconds, got "
                          f"{args.budget}")
    return parse_inputs(args.input)


def _time_calls(fn: Callable, ends: np.ndarray, repeats: int, budget: float,
                estimate: Optional[float]) -> Dict[str, Any]:
    """Time ``fn(ends)``: skipped if ``estimate`` (s) exceeds the budget; else a warm-up
    call (which is also a sample when it is long enough for warm-up not to matter), then
    calls while they fit in the budget."""
    if estimate is not None and estimate > budget:
        return {"status": "skipped", "estimated_us": estimate * 1e6, "repeats": 0,
                "choice": None}
    start = time.perf_counter()
    choice = fn(ends)
    first = time.perf_counter() - start
    samples = [first] if first > 0.5 else []    # long calls: warm-up is negligible
    spent = first
    while len(samples) < repeats and spent + first <= budget:
        start = time.perf_counter()
        fn(ends)
        took = time.perf_counter() - start
        samples.append(took)
        spent += took
    if not samples:                             # the budget allows the warm-up only
        samples = [first]
    us = [s * 1e6 for s in samples]
    return {"status": "ok", "median_us": float(np.median(us)), "min_us": min(us),
            "mean_us": float(np.mean(us)), "runs_us": us, "repeats": len(us),
            "estimated_us": None if estimate is None else estimate * 1e6,
            "choice": choice}


def measure(workers: List[int], rs: List[int], repeats: int, seed: int,
            budget: float, kind: str = "cumulative") -> List[Dict[str, Any]]:
    """Every configuration of the grid (n ascending, then R), ends generated by
    INPUTS[kind]: timings and spreads."""
    results = []
    last_seen: Dict[str, Tuple[float, float]] = {}     # key -> (seconds, work) measured
    for n in sorted({int(w) for w in workers}):
        for r in sorted({int(x) for x in rs}):
            ends = INPUTS[kind](n, r, np.random.default_rng([seed, n, r]))
            row: Dict[str, Any] = {"workers": n, "R": r, "algorithms": {}}
            for key, _, fn, work in ALGORITHMS:
                estimate = None
                if key in last_seen:
                    seconds, seen_work = last_seen[key]
                    estimate = seconds * work(n, r) / seen_work
                res = _time_calls(fn, ends, repeats, budget, estimate)
                if res["status"] == "ok":
                    last_seen[key] = (res["median_us"] * 1e-6, work(n, r))
                res["paper_us"] = PAPER_US[key].get((n, r))
                row["algorithms"][key] = res
            optimum = row["algorithms"]["zipline"]["choice"].spread
            row["optimal_spread"] = optimum
            for res in row["algorithms"].values():
                choice: Optional[Choice] = res.pop("choice")
                if choice is None:
                    res.update(spread=None, barrier=None, gap=None, ratio=None,
                               optimal=None)
                    continue
                res.update(spread=choice.spread, barrier=choice.barrier,
                           gap=choice.spread - optimum,
                           ratio=choice.spread / optimum if optimum > 0 else None,
                           optimal=bool(choice.spread == optimum))
            results.append(row)
    return results


def _fmt_us(x: Optional[float]) -> str:
    """Like the paper: 3 significant digits, 1.49e2 style from 1000 up."""
    if x is None:
        return "-"
    if x < 1000:
        return f"{x:.3g}"
    mantissa, exponent = f"{x:.2e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def _fmt_ratio(x: float) -> str:
    return f"{x:.3g}x" if x < 1000 else f"{x:.0f}x"


def format_report(results: List[Dict[str, Any]], goal: Dict[str, Any],
                  repeats: int, kind: str = "cumulative") -> str:
    """The tables: times (ours vs the paper), spreads and gaps, the goal."""
    width = 11
    heads = [f"n={row['workers']}" for row in results]
    heads2 = [f"R={row['R']}" for row in results]
    lines = ["ElasticBSP barrier selection (Zhao et al. Table II): time per call, "
             "microseconds",
             f"ours: median of up to {repeats} calls on this machine; paper: mean of 10 "
             "trials on a Xeon E5-2620 v3;",
             f"input: {kind} ({describe_input(kind)})",
             "paper/ours: how many times faster ours is",
             " " * 24 + "".join(h.rjust(width) for h in heads),
             " " * 24 + "".join(h.rjust(width) for h in heads2)]
    notes = []
    for key, name, _, _ in ALGORITHMS:
        ours, paper, ratio = [], [], []
        for row in results:
            res = row["algorithms"][key]
            if res["status"] == "skipped":
                ours.append("skip")
                notes.append(f"{name} at n={row['workers']}, R={row['R']} skipped: one "
                             f"call estimated at {res['estimated_us'] / 1e6:.0f} s")
            else:
                mark = "" if res["repeats"] == repeats else f"[{res['repeats']}]"
                ours.append(_fmt_us(res["median_us"]) + mark)
                if mark:
                    notes.append(f"{name} at n={row['workers']}, R={row['R']}: "
                                 f"{res['repeats']} call(s) within the budget")
            paper.append(_fmt_us(res["paper_us"]))
            ratio.append("-" if res["status"] == "skipped" or res["paper_us"] is None
                         else _fmt_ratio(res["paper_us"] / res["median_us"]))
        lines.append(f"{name:<14}{'ours':<10}" + "".join(v.rjust(width) for v in ours))
        lines.append(f"{'':<14}{'paper':<10}" + "".join(v.rjust(width) for v in paper))
        lines.append(f"{'':<14}{'paper/ours':<10}" + "".join(v.rjust(width) for v in ratio))
    lines += [f"  ({note})" for note in notes]
    lines += ["", "Spread max - min of the chosen ends, seconds (ZipLine is optimal); "
              "others: gap to the optimum (ratio)",
              " " * 24 + "".join(h.rjust(width + 6) for h in heads),
              " " * 24 + "".join(h.rjust(width + 6) for h in heads2)]
    for key, name, _, _ in ALGORITHMS:
        cells = []
        for row in results:
            res = row["algorithms"][key]
            if res["spread"] is None:
                cells.append("skip")
            elif key == "zipline":
                cells.append(f"{res['spread']:.4g}")
            elif res["gap"] == 0:
                cells.append("=opt")
            else:
                ratio = "" if res["ratio"] is None else f" ({res['ratio']:.2f}x)"
                cells.append(f"+{res['gap']:.3g}{ratio}")
        lines.append(f"{name:<24}" + "".join(c.rjust(width + 6) for c in cells))
    lines.append("")
    if goal["status"] == "not measured":
        lines.append(f"Goal ZipLine at n={GOAL_WORKERS}, R={GOAL_R} under "
                     f"{GOAL_SECONDS * 1e3:g} ms: not measured (not in the grid)")
    else:
        lines.append(f"Goal ZipLine at n={GOAL_WORKERS}, R={GOAL_R} under "
                     f"{GOAL_SECONDS * 1e3:g} ms: {goal['zipline_ms']:.3f} ms median "
                     f"(min {goal['zipline_min_ms']:.3f}, max {goal['zipline_max_ms']:.3f} "
                     f"ms): {goal['status']}")
    return "\n".join(lines)


def _goal(results: List[Dict[str, Any]]) -> Dict[str, Any]:
    """The goal on one family's results: ZipLine's median at GOAL_WORKERS x GOAL_R."""
    goal: Dict[str, Any] = {"workers": GOAL_WORKERS, "R": GOAL_R,
                            "limit_ms": GOAL_SECONDS * 1e3, "zipline_ms": None,
                            "zipline_min_ms": None, "zipline_max_ms": None,
                            "status": "not measured"}
    for row in results:
        if (row["workers"], row["R"]) == (GOAL_WORKERS, GOAL_R):
            res = row["algorithms"]["zipline"]
            goal["zipline_ms"] = res["median_us"] / 1e3
            goal["zipline_min_ms"] = res["min_us"] / 1e3
            goal["zipline_max_ms"] = max(res["runs_us"]) / 1e3
            goal["status"] = "PASS" if res["median_us"] * 1e-6 < GOAL_SECONDS else "FAIL"
    return goal


def format_goals(goals: Dict[str, Dict[str, Any]]) -> str:
    """One line per family: ZipLine's median (min-max) at the goal's size, PASS/FAIL."""
    lines = [f"Goal ZipLine at n={GOAL_WORKERS}, R={GOAL_R} under {GOAL_SECONDS * 1e3:g} ms, "
             "per input family: median (min-max over the calls)"]
    width = max(len(kind) for kind in goals)
    for kind, goal in goals.items():
        if goal["status"] == "not measured":
            lines.append(f"  {kind:<{width}}  not measured")
        else:
            lines.append(f"  {kind:<{width}}  {goal['zipline_ms']:6.3f} ms "
                         f"({goal['zipline_min_ms']:.3f}-{goal['zipline_max_ms']:.3f})  "
                         f"{goal['status']}")
    return "\n".join(lines)


def _overall(goals: Dict[str, Dict[str, Any]]) -> str:
    statuses = {goal["status"] for goal in goals.values()}
    if "FAIL" in statuses:
        return "FAIL"
    return "PASS" if statuses == {"PASS"} else "not measured"


def run(args: argparse.Namespace) -> int:
    """Run the grid on every input family, print the tables, write --json; 0 unless the
    goal was missed on a family or an algorithm beat ZipLine."""
    kinds = _check_args(args)
    load_start = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    families: Dict[str, Dict[str, Any]] = {}
    beaten = []
    for kind in kinds:
        results = measure(list(args.workers), list(args.R), int(args.repeats),
                          int(args.seed), float(args.budget), kind)
        goal = _goal(results)
        print(format_report(results, goal, int(args.repeats), kind))
        print()
        # ZipLine is exact: nothing may beat it (a failure here is a bug)
        beaten += [(kind, row["workers"], row["R"], key) for row in results
                   for key, res in row["algorithms"].items()
                   if res["spread"] is not None and res["gap"] < 0]
        families[kind] = {
            "description": describe_input(kind), "results": results, "goal": goal,
            "full_gridscan_suboptimal": sum(
                1 for row in results
                if row["algorithms"]["full_gridscan"]["spread"] is not None
                and row["algorithms"]["full_gridscan"]["gap"] > 0)}
    goals = {kind: family["goal"] for kind, family in families.items()}
    if len(kinds) > 1:
        print(format_goals(goals))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    if load is not None:
        print(f"Load average {load_start:.1f} at the start, {load:.1f} at the end, on "
              f"{os.cpu_count()} cores (other jobs inflate the medians)")
    for kind, n, r, key in beaten:
        print(f"ERROR: {key} found a smaller spread than ZipLine at n={n}, R={r} on "
              f"input {kind}")
    status = _overall(goals)
    if args.json:
        report = {"benchmark": "zipline", "units": "microseconds", "seed": int(args.seed),
                  "inputs": kinds, "repeats": int(args.repeats),
                  "budget_s": float(args.budget), "load_average_start": load_start,
                  "load_average": load, "cpu_count": os.cpu_count(),
                  "paper_us": {key: {f"n={n},R={r}": v for (n, r), v in table.items()}
                               for key, table in PAPER_US.items()},
                  "families": families,
                  "goal": {"workers": GOAL_WORKERS, "R": GOAL_R,
                           "limit_ms": GOAL_SECONDS * 1e3, "status": status,
                           "families": goals},
                  "ok": not beaten and status != "FAIL"}
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 1 if beaten or status == "FAIL" else 0


def main() -> int:
    """`python -m asapmpi.bench.zipline [options]`."""
    parser = argparse.ArgumentParser(prog="asapmpi bench zipline",
                                     description=__doc__.splitlines()[0])
    add_arguments(parser)
    try:
        return run(parser.parse_args())
    except ConfigError as exc:
        parser.error(str(exc))
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
