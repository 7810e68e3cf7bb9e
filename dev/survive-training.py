"""Issue 31's first target, measured: `asapmpi train mlp --survive` on 8 ranks over 4
emulated hosts (launch/netns-hosts: network namespaces, a CPU budget per host) on Open
MPI 5 (ULFM), one rank killed at 40% of the run, against the same run without a failure;
per policy and seed: the final accuracy of both, the survivors' ranks, and the recovery
(from the victim's death to the last survivor's first step on the survivors' exchange,
both on CLOCK_MONOTONIC: one clock, the hosts are namespaces of one machine).

    .venv-openmpi5/bin/python dev/survive-training.py --seeds 0,1,2 --out /tmp/survive

Run it with the Open MPI 5 environment's python (dev/setup-openmpi5.sh), as root (the
emulated hosts), from anywhere but the checkout (its python must import the environment's
build of asapmpi, not the checkout's).  --one-host runs every rank on this host instead.
Prints a table and writes OUT/survive-training.json; each job's output is kept in OUT.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time

from asapmpi.bench.hosts import NETNS_HOSTS, EmulatedHosts, default_cores

#: the mlp workload of `asapmpi bench training` (asapmpi/bench/training.py WORKLOADS)
MLP = ["mlp", "--data", "synthetic-svm", "--batch-size", "256", "--lr", "0.05"]
DIED = re.compile(r"fault injection: SIGKILL .*\(CLOCK_MONOTONIC ([\d.]+)\)")
LOST = re.compile(r"survived the failure of .*; ([\d.]+) s lost")


def run_job(args, hosts, policy: str, seed: int, kill: bool, folder: str) -> dict:
    """One `asapmpi train` job; its summary, the death time and the job's exit code."""
    sync, *options = policy.split(":")
    name = f"{policy.replace(':', '_').replace('=', '')}-s{seed}-{'kill' if kill else 'none'}"
    out = os.path.join(folder, name)
    os.makedirs(out, exist_ok=True)
    program = [sys.executable, "-m", "asapmpi", "train", *MLP, "--iters", str(args.iters),
               "--eval-every", str(args.eval_every), "--sync", sync, "--seed", str(seed),
               "--survive", "--lost-shards", args.lost_shards, "--timeout",
               str(args.timeout), "--out", out, "--json", os.path.join(out, "s.json"),
               "--no-progress"]
    for option in options:
        program += ["--hop", option]
    kill_at = round(args.kill_fraction * args.iters)
    if kill:
        program += ["--kill-rank", str(args.kill_rank), "--kill-at", str(kill_at)]
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               ASAPMPI_EXPECTED_SIZE=str(args.ranks))
    env["MPIEXEC"] = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if hosts is not None:
        env["MPIEXEC_TIMEOUT"] = str(args.job_timeout)
        if hosts.budgeted:
            env["NETNS_HOSTS_BUDGET"] = "deferred"
        cmd = [str(NETNS_HOSTS), "mpiexec", hosts.prefix, "--with-ft", "ulfm", "-n",
               str(args.ranks), *program]
    else:
        cmd = [env["MPIEXEC"], "--with-ft", "ulfm", "--oversubscribe", "--bind-to", "none",
               "--mca", "mpi_yield_when_idle", "1", "--timeout", str(args.job_timeout),
               "-n", str(args.ranks), *program]
        env["OMPI_MCA_osc"] = "^ucx"
    start = time.monotonic()
    with open(os.path.join(out, "log"), "w") as log:
        code = subprocess.call(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=out)
    with open(os.path.join(out, "log"), errors="replace") as f:
        text = f.read()
    found = DIED.search(text)
    row = {"policy": policy, "seed": seed, "kill": kill, "exit": code, "job": out,
           "job_seconds": time.monotonic() - start,
           "died": float(found[1]) if found else None,
           # every survivor's "seconds lost" (its line): from the start of the step
           # that failed to its new exchange ready, the reload of its shard included
           "lost": [float(x) for x in LOST.findall(text)]}
    try:
        with open(os.path.join(out, "s.json")) as f:
            row["summary"] = json.load(f)
    except (OSError, ValueError):
        row["summary"] = None
    return row


def recovery(row: dict):
    """(seconds from the death to the last survivor's first step on the survivors'
    exchange, whether every survivor made one), or (None, False)."""
    s = row["summary"]
    if not s or row["died"] is None or not s.get("resumed_monotonic"):
        return None, False
    firsts = [times[0] for times in s["resumed_monotonic"] if times]
    if not firsts:
        return None, False
    return max(firsts) - row["died"], len(firsts) == len(s["resumed_monotonic"])


def _lost_of(row: dict):
    # rows of an older version of this script: the survivors' lines in the job's log
    try:
        with open(os.path.join(row["job"], "log"), errors="replace") as f:
            return [float(x) for x in LOST.findall(f.read())]
    except OSError:
        return []


def table(rows) -> str:
    out = [("policy", "seed", "acc no failure %", "acc with failure %", "diff (pts)",
            "ranks at end", "recovery s", "seconds lost (max)", "exits", "load")]
    keys = sorted({(r["policy"], r["seed"]) for r in rows},
                  key=lambda k: (k[0], k[1]))
    for policy, seed in keys:
        pair = {r["kill"]: r for r in rows if r["policy"] == policy and r["seed"] == seed}
        none, kill = pair.get(False), pair.get(True)
        acc = [r["summary"]["final_test_accuracy"] * 100 if r and r["summary"] else None
               for r in (none, kill)]
        rec, whole = recovery(kill) if kill else (None, False)
        lost = max(kill.get("lost") or _lost_of(kill), default=None) if kill else None
        out.append((policy, str(seed), f"{acc[0]:.2f}" if acc[0] is not None else "-",
                    f"{acc[1]:.2f}" if acc[1] is not None else "-",
                    f"{acc[1] - acc[0]:+.2f}" if None not in acc else "-",
                    str(kill["summary"]["ranks"]) if kill and kill["summary"] else "-",
                    (f"{rec:.2f}" + ("" if whole else "*")) if rec is not None else "-",
                    f"{lost:.2f}" if lost is not None else "-",
                    f"{none['exit'] if none else '-'}/{kill['exit'] if kill else '-'}",
                    "-".join(f"{x:.0f}" for x in (
                        min(r[k] for r in (none, kill) if r for k in ("load_before",
                                                                     "load_after")),
                        max(r[k] for r in (none, kill) if r for k in ("load_before",
                                                                     "load_after"))))))
    widths = [max(len(r[i]) for r in out) for i in range(len(out[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in out]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--policies", default="notify_ack,hop:backup=1,gossip")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("-n", "--ranks", type=int, default=8)
    p.add_argument("--hosts", type=int, default=4)
    p.add_argument("--host-cores", type=float, default=None,
                   help="each host's CPU budget (default: 0.9 of the cores shared)")
    p.add_argument("--bandwidth", default="10gbit")
    p.add_argument("--one-host", action="store_true")
    p.add_argument("--iters", type=int, default=300)
    p.add_argument("--eval-every", type=int, default=60)
    p.add_argument("--kill-fraction", type=float, default=0.4)
    p.add_argument("--kill-rank", type=int, default=5)
    p.add_argument("--lost-shards", default="reassign")
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--job-timeout", type=int, default=1200)
    p.add_argument("--only", choices=("kill", "none"), help="only these runs")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    result_path = os.path.join(args.out, "survive-training.json")
    rows = []
    if os.path.exists(result_path):
        with open(result_path) as f:
            rows = json.load(f)["rows"]         # resumed: the jobs done are kept
    done = {(r["policy"], r["seed"], r["kill"]) for r in rows}
    cores = args.host_cores or default_cores(args.hosts)
    hosts = None if args.one_host else EmulatedHosts(args.hosts, bandwidth=args.bandwidth,
                                                     cores=cores)
    kills = {"kill": [True], "none": [False]}.get(args.only, [False, True])
    try:
        if hosts is not None:
            hosts.__enter__()
            hosts.budget({})
            print(hosts.describe(), flush=True)
        for seed in [int(s) for s in args.seeds.split(",")]:
            for policy in args.policies.split(","):
                for kill in kills:
                    if (policy, seed, kill) in done:
                        continue
                    load = os.getloadavg()[0]
                    row = run_job(args, hosts, policy, seed, kill, args.out)
                    row["load_before"] = load
                    row["load_after"] = os.getloadavg()[0]
                    rows.append(row)
                    acc = row["summary"]["final_test_accuracy"] if row["summary"] else None
                    print(f"{policy} seed {seed} {'killed' if kill else 'no failure'}: "
                          f"exit {row['exit']}, accuracy {acc}, recovery "
                          f"{recovery(row)[0] if kill else '-'}, "
                          f"{row['job_seconds']:.0f} s, load {load:.1f}-"
                          f"{row['load_after']:.1f}", flush=True)
                    with open(result_path, "w") as f:
                        json.dump({"rows": rows, "hosts": hosts.describe() if hosts
                                   else "one host", "args": vars(args)}, f, indent=1)
    finally:
        if hosts is not None:
            hosts.__exit__(None, None, None)
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
