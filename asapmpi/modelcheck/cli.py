"""`asapmpi check-protocol`: model-check the slot protocols and report.

    asapmpi check-protocol                       every correct variant, full bounds
    asapmpi check-protocol --broken              and the broken variants (found?)
    asapmpi check-protocol --protocol hop --quick --broken
    asapmpi check-protocol --protocol notify-ack-put --graph complete --ranks 4 --max-iters 3

Prints one row per scenario (protocol, graph, iterations, variant, states, transitions,
seconds, verdict) as it completes, then the trace of every violation, one action per
line.  Exit code 0 when every verdict is the one expected (ok for the correct variants,
the named violation for the broken ones), 1 otherwise.
"""
from __future__ import annotations

import argparse
import json
import time
from typing import List

from ..errors import ConfigError
from ..outputs import output_file
from .model import DESCRIPTIONS
from .scenarios import PROTOCOLS, Outcome, Scenario, build, override, select
from .scenarios import run as run_scenario

#: the budget of states per scenario unless --max-states says otherwise
DEFAULT_MAX_STATES = 3_000_000
COLUMNS = ("protocol", "graph", "iters", "variant", "states", "transitions", "seconds",
           "verdict")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `asapmpi check-protocol`."""
    parser.add_argument("--protocol", action="append", choices=PROTOCOLS,
                        help="a protocol to check (repeat for several; default all)")
    parser.add_argument("--broken", action="store_true",
                        help="also run the deliberately broken and defective variants, "
                             "which must be found")
    parser.add_argument("--quick", action="store_true",
                        help="only the small bounds of the test suite")
    parser.add_argument("--max-iters", type=int,
                        help="iterations of every scenario (default: each its own)")
    parser.add_argument("--graph",
                        help="graph of every scenario: a family (ring, complete, "
                             "offsets:1,4, any name of `asapmpi graph --list`) or a full "
                             "spec such as complete:4 or offsets:6:1,4")
    parser.add_argument("--ranks", type=int,
                        help="ranks of every scenario's graph (2 to 8)")
    parser.add_argument("--max-states", type=int, default=DEFAULT_MAX_STATES,
                        help=f"give up on a scenario after this many states (verdict "
                             f"'bounded'; default {DEFAULT_MAX_STATES})")
    parser.add_argument("--json", metavar="FILE", type=output_file,
                        help="write every result to FILE")


def scenarios(args: argparse.Namespace) -> List[Scenario]:
    """The scenarios the arguments select (ConfigError for bad bounds)."""
    if args.max_iters is not None and args.max_iters < 1:
        raise ConfigError(f"--max-iters must be at least 1, got {args.max_iters}")
    if args.ranks is not None and not 2 <= args.ranks <= 8:
        raise ConfigError(f"--ranks must be 2 to 8, got {args.ranks}")
    if args.max_states < 1:
        raise ConfigError(f"--max-states must be at least 1, got {args.max_states}")
    chosen = select(args.protocol, broken=args.broken, quick=args.quick)
    chosen = [override(sc, args.max_iters, args.graph, args.ranks) for sc in chosen]
    # one run per distinct scenario: with --graph or --ranks, scenarios that differed
    # only by their graph become the same
    chosen = list(dict.fromkeys(chosen))
    for sc in chosen:
        build(sc)       # every bad option is refused before the first (long) run
    return chosen


def run(args: argparse.Namespace) -> int:
    """Run the selected scenarios, print the table and the traces; 0 if every verdict
    is the one expected."""
    chosen = scenarios(args)
    t0 = time.perf_counter()
    print(_row(COLUMNS), flush=True)
    outcomes: List[Outcome] = []
    for chosen_sc in chosen:
        out = run_scenario(chosen_sc, args.max_states)
        outcomes.append(out)
        r, sc = out.result, out.scenario    # (the scenario as run: see scenarios.run)
        print(_row((sc.protocol, sc.graph, sc.iterations, sc.label(), r.states,
                    r.transitions, f"{r.seconds:.2f}", _verdict(out))), flush=True)
    for out in outcomes:
        if out.result.verdict == "violation":
            _print_trace(out)
    wrong = [o for o in outcomes if not o.matches]
    states = sum(o.result.states for o in outcomes)
    print(f"\n{len(outcomes)} scenarios, {states} states in "
          f"{time.perf_counter() - t0:.1f} s: "
          + (f"{len(wrong)} verdict(s) NOT as expected" if wrong
             else "every verdict as expected"))
    if args.json:
        _write_json(args.json, outcomes)
    return 1 if wrong else 0


def _row(cells) -> str:
    protocol, graph, iters, variant, states, transitions, seconds, verdict = cells
    return (f"{protocol:<21} {graph:<14} {iters!s:>5}  {variant:<56.56} {states!s:>9} "
            f"{transitions!s:>11} {seconds!s:>8}  {verdict}")


def _verdict(out: Outcome) -> str:
    r, sc = out.result, out.scenario
    text = f"violation: {r.prop}" if r.verdict == "violation" else out.verdict
    if out.matches:
        return text
    want = sc.expect + (f": {sc.prop}" if sc.expect == "violation" and sc.prop else "")
    return f"{text}  (UNEXPECTED: expected {want})"


def _print_trace(out: Outcome) -> None:
    r, sc = out.result, out.scenario
    print(f"\n{sc.protocol} on {sc.graph}, {sc.iterations} iterations, {sc.label()}: "
          f"{r.prop} ({DESCRIPTIONS[r.prop]}) broken after {len(r.trace)} actions")
    if sc.note:
        print(f"  ({sc.note})")
    for i, action in enumerate(r.trace, 1):
        print(f"  {i:3d}. {action}")
    print(f"  => {r.detail}")


def _write_json(path: str, outcomes: List[Outcome]) -> None:
    rows = []
    for o in outcomes:
        r = o.result
        rows.append({**o.scenario.as_dict(), "verdict": o.verdict, "property": r.prop,
                     "detail": r.detail, "matches": o.matches, "states": r.states,
                     "transitions": r.transitions, "max_depth": r.max_depth,
                     "seconds": round(r.seconds, 3), "measures": r.measures,
                     "trace": r.trace})
    with open(path, "w") as f:
        json.dump({"scenarios": rows, "all_expected": all(o.matches for o in outcomes)},
                  f, indent=1)
