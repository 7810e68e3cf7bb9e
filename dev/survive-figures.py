"""The figures of docs/FAILURES.md on surviving in place (Open MPI 5, ULFM), measured with
the environment of dev/setup-openmpi5.sh and the scenarios of
tests/exchange/test_survive.py:

    .venv/bin/python dev/survive-figures.py [--ranks 8] [--runs 7] [--steps 2000]

1. recovery: one rank SIGKILLed at step 20 of 60 (notify_ack on a ring, put); per run
   the seconds from its death (CLOCK_MONOTONIC, written just before the kill) to the
   end of the first mixed step on the new exchange, the last survivor's (and the
   first's); min, median, max over the runs;
2. step time without failures (notify_ack on a ring, 4096 float64, put) in alternated
   runs of three settings: the plain launch, the ULFM launch (--with-ft ulfm: the MPI's
   own cost) without and with fault_tolerance=True (asapmpi's cost); each run's mean
   step over `steps` steps, the slowest rank's; min, median, max per setting.
Prints one line per run and the summaries, and the load average before and after.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile

# tests/ (ompi5) and tests/exchange/ (test_survive)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
sys.path.insert(0, os.path.join(sys.path[0], "exchange"))

import ompi5
import test_survive as ts


def spread(values):
    return (f"min {min(values):.4g}  median {statistics.median(values):.4g}  "
            f"max {max(values):.4g}  (n={len(values)})")


def recovery(ranks, runs):
    last, first = [], []
    for run in range(runs):
        with tempfile.TemporaryDirectory() as out:
            proc = ts.launch("survive_steps", ranks, out=out, sync="notify_ack",
                             graph="ring", transport="put", options={}, steps=60,
                             kill_at=20, victim=ranks // 2)
            found = ts.results(out)
            with open(os.path.join(out, "died.json")) as f:
                died = json.load(f)["died"]
        if len(found) != ranks - 1:
            print(f"recovery run {run}: {len(found)} survivors reported, exit "
                  f"{proc.returncode}; skipped", flush=True)
            continue
        resumed = []
        for res in found.values():
            m = res["survivals"][0]["resumed_at"]
            resumed.append(next(t for v, t in res["ends"] if v == m + 1) - died)
        last.append(max(resumed))
        first.append(min(resumed))
        print(f"recovery run {run}: first survivor {min(resumed):.3f} s, last "
              f"{max(resumed):.3f} s after the death (exit {proc.returncode})", flush=True)
    return last, first


#: (launched with --with-ft ulfm, Exchange(fault_tolerance=...)): the plain launch, the
#: ULFM launch without asapmpi's fault tolerance (the MPI's own cost), and with it
SETTINGS = ((False, False), (True, False), (True, True))


def step_times(ranks, runs, steps):
    times = {setting: [] for setting in SETTINGS}
    for run in range(runs):
        for launch_ft, ft in SETTINGS:
            with tempfile.TemporaryDirectory() as out:
                ts.launch("steps_timed", ranks, fault_tolerance=launch_ft, out=out, ft=ft,
                          steps=steps)
                found = ts.results(out)
            if len(found) != ranks:
                print(f"step run {run} {label(launch_ft, ft)}: incomplete", flush=True)
                continue
            worst = max(r["seconds"] / r["steps"] for r in found.values())
            times[(launch_ft, ft)].append(worst * 1e6)
            print(f"step run {run} {label(launch_ft, ft)}: {worst * 1e6:.1f} us/step",
                  flush=True)
    return times


def label(launch_ft, ft):
    return (f"{'--with-ft ulfm' if launch_ft else 'plain launch'}, "
            f"fault_tolerance={ft}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--only", choices=("recovery", "steps"))
    args = parser.parse_args()
    if ompi5.WHY_NOT:
        sys.exit(ompi5.WHY_NOT)
    print("load before:", os.getloadavg(), flush=True)
    if args.only != "steps":
        last, first = recovery(args.ranks, args.runs)
        print(f"recovery, {args.ranks} ranks, last survivor (s): {spread(last)}")
        print(f"recovery, {args.ranks} ranks, first survivor (s): {spread(first)}")
    if args.only != "recovery":
        times = step_times(args.ranks, args.runs, args.steps)
        for setting in SETTINGS:
            print(f"step time, {args.ranks} ranks, {label(*setting)} (us): "
                  f"{spread(times[setting])}")
    print("load after:", os.getloadavg(), flush=True)


if __name__ == "__main__":
    main()
