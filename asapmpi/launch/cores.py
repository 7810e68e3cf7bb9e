"""Whether the ranks of a host oversubscribe its cores, and so how precisely waits sleep.

A wait that finds nothing yields, then sleeps (asap_backoff in _core/kernels.h).  Linux
lets a sleep overrun its deadline by the thread's timer slack, 50 us by default, so a
sleep of 1 us ends 50-70 us later.  Where ranks oversubscribe the cores that coarse
sleep is what they need: a sleeping waiter leaves its core to the rank it waits for,
and waking sooner takes it back (8 ranks on 2 cores, MPICH's network path: a
notify_ack step of 64 KB took 1.15 ms with 1 us of slack against 0.51 ms with the
default).  Where every rank has a core of its own, the overrun is only latency that the
wait could have observed (2 ranks on 2 cores, messages: a Hop step of 64 KB took 127 us
with the default slack, 56 us with 1 us; docs/BENCHMARKS.md).

The cores of a host are those its ranks may run on (the union of their affinity
masks), capped by the CPU quota of their cgroups (a container given 2 CPUs of 64).
"""
from __future__ import annotations

import math
import os
from typing import Any, Dict, Mapping, Optional, Sequence

#: the timer slack of a wait's sleeps where every rank has a core of its own
PRECISE_SLACK_NS = 1000
#: Linux's default timer slack, kept where ranks oversubscribe the cores
DEFAULT_SLACK_NS = 50000


def cgroup_quota(root: str = "/sys/fs/cgroup",
                 membership: str = "/proc/self/cgroup") -> Optional[Dict[str, Any]]:
    """This process's cgroup (v2) and its CPU quota in cores (the tightest `cpu.max`
    from the root down to it), or None without a quota."""
    try:
        with open(membership) as f:
            line = next((x for x in f if x.startswith("0::")), None)
    except OSError:
        return None
    if line is None:
        return None
    path = line[3:].strip()
    quota = math.inf
    parts = [p for p in path.split("/") if p]
    for depth in range(len(parts) + 1):
        try:
            with open(os.path.join(root, *parts[:depth], "cpu.max")) as f:
                limit, period = f.read().split()[:2]
        except (OSError, ValueError):
            continue
        if limit != "max" and float(period) > 0:
            quota = min(quota, float(limit) / float(period))
    return None if math.isinf(quota) else {"cgroup": path, "cores": quota}


def local_cpus() -> Dict[str, Any]:
    """What this rank may run on: the CPUs of its affinity mask and its cgroup's quota
    (JSON-able, for the allgather at an Exchange's creation)."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = list(range(os.cpu_count() or 1))
    return {"cpus": cpus, "quota": cgroup_quota()}


def host_cores(meta: Sequence[Mapping[str, Any]], host: str) -> float:
    """The cores the ranks on `host` share: the union of their affinity masks, capped by
    the sum of the quotas of their distinct cgroups when every one has a quota."""
    local = [m for m in meta if m["host"] == host]
    cpus = set()
    for m in local:
        cpus.update(m["cpu"]["cpus"])
    cores = float(len(cpus))
    quotas = [m["cpu"]["quota"] for m in local]
    if local and all(q is not None for q in quotas):
        per_cgroup = {q["cgroup"]: q["cores"] for q in quotas}
        cores = min(cores, sum(per_cgroup.values()))
    return cores


def oversubscribed(meta: Sequence[Mapping[str, Any]], rank: int) -> bool:
    """True when rank's host runs more ranks than it has cores for them."""
    host = meta[rank]["host"]
    ranks = sum(1 for m in meta if m["host"] == host)
    return ranks > host_cores(meta, host)


def sleep_slack_ns(meta: Sequence[Mapping[str, Any]], rank: int,
                   configured: int = 0) -> int:
    """The timer slack of rank's waits: `configured` when given (rc.poll_timer_slack_ns),
    else precise where its host's ranks have a core each, Linux's default where they
    oversubscribe the cores."""
    if configured:
        return int(configured)
    return DEFAULT_SLACK_NS if oversubscribed(meta, rank) else PRECISE_SLACK_NS

