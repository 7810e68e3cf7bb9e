"""`asapmpi trace check FILE...` and `asapmpi trace plot FILE --png OUT`."""
from __future__ import annotations

import argparse

from .. import trace
from ..outputs import output_file


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `asapmpi trace`."""
    sub = parser.add_subparsers(dest="trace_command", required=True)
    check = sub.add_parser("check", help="check Hop's iteration-gap bounds (Theorem 1, 2, "
                                         "Table 1) and reduce windows of trace files")
    check.add_argument("files", nargs="+")
    draw = sub.add_parser("plot", help="draw iterations over time per rank")
    draw.add_argument("file")
    draw.add_argument("--png", required=True, type=output_file)


def run(args: argparse.Namespace) -> int:
    """Exit 0 when every file keeps every bound, 1 otherwise."""
    import os

    from ..errors import ConfigError

    for path in args.files if args.trace_command == "check" else [args.file]:
        if not os.path.isfile(path):
            raise ConfigError(f"{path}: no such trace file; write one with `asapmpi demo "
                              f"--trace FILE` or asapmpi.trace.save")
    if args.trace_command == "plot":
        trace.plot(args.file, args.png)
        print(f"drawn to {args.png}")
        return 0
    failed = False
    for path in args.files:
        r = trace.check_file(path)
        gap, window = r["gap_violations"], r["window_violations"]
        verdict = "OK" if not gap and not window else "VIOLATED"
        failed |= verdict != "OK"
        print(f"{path}: {verdict}: {r['ranks']} ranks, setting {r['setting']}, "
              f"{min(r['iterations'])}-{max(r['iterations'])} iterations per rank, largest "
              f"gap to an out-neighbour {r['max_gap_to_out_neighbours']}, "
              f"{len(gap)} gap and {len(window)} window violations")
        for v in gap[:5]:
            print(f"  t={v['time']:.6f}: rank {v['i']} at iteration >= {v['iter_i']}, rank "
                  f"{v['j']} at most {v['iter_j']}: gap above the bound {v['bound']:g}")
        for v in window[:5]:
            print(f"  rank {v['rank']} reduced version {v['version']} of rank {v['sender']} "
                  f"in iteration {v['iteration']} (allowed {v['allowed']})")
    return 1 if failed else 0
