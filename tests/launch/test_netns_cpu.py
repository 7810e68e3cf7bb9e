"""CPU budgets of emulated hosts (launch/netns-hosts cpu): each host's cgroup carries the
quota asked for, what starts on a host (netns-hosts exec, netns-ssh, so mpiexec's ranks)
runs inside it and is held to it, bad budgets are refused in one line before anything
changes, and `down` (or the next `up`, after a run that was killed) leaves no cgroup and
no process behind.

Needs root, `ip netns` and a cgroup cpu controller (skipped otherwise)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from test_multihost import NETNS_HOSTS, SKIP, across_hosts
from test_netns_links import ok, run

from asapmpi.bench.hosts import cgroup_cpu_unavailable

NO_CGROUP = cgroup_cpu_unavailable()
pytestmark = [pytest.mark.mpi, pytest.mark.skipif(SKIP is not None, reason=SKIP or ""),
              pytest.mark.skipif(NO_CGROUP is not None, reason=NO_CGROUP or "")]

V1 = Path("/sys/fs/cgroup/cpu/netns-hosts")
V2 = Path("/sys/fs/cgroup/netns-hosts")
ROOT = V1 if Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").exists() else V2
NETNS_SSH = NETNS_HOSTS.parent / "netns-ssh"


def quota(host: str) -> tuple:
    """(quota us or None, period us) of a host's cgroup."""
    if ROOT == V1:
        q = int((ROOT / host / "cpu.cfs_quota_us").read_text())
        return (None if q < 0 else q), int((ROOT / host / "cpu.cfs_period_us").read_text())
    q, p = (ROOT / host / "cpu.max").read_text().split()
    return (None if q == "max" else int(q)), int(p)


@pytest.fixture
def hosts():
    """Two hosts of a prefix of this test's own; gone afterwards, cgroups included."""
    name = f"nc{uuid.uuid4().hex[:8]}"
    ok("up", "2", name)
    try:
        yield name
    finally:
        run("down", name)
        assert not list(ROOT.glob(f"{name}-*")) if ROOT.exists() else True


BURN = ("import time; t = time.process_time(); w = time.perf_counter()\n"
        "while time.process_time() - t < 0.2: pass\n"
        "print(time.perf_counter() - w)")


def test_each_host_gets_its_quota_and_its_processes_are_held_to_it(hosts):
    out = ok("cpu", hosts, "all=0.5", "1=0.125")
    assert out.splitlines() == ["cpu: h0 cores=0.5 period=10000us",
                                "cpu: h1 cores=0.125 period=10000us"]
    assert quota(f"{hosts}-h0") == (5000, 10000)
    assert quota(f"{hosts}-h1") == (1250, 10000)
    # what starts on the host runs in its cgroup: netns-hosts exec and netns-ssh alike
    for launcher in ([str(NETNS_HOSTS), "exec"], [str(NETNS_SSH)]):
        proc = subprocess.run([*launcher, f"{hosts}-h1", "cat", "/proc/self/cgroup"],
                              capture_output=True, text=True, timeout=30, check=True)
        assert f"netns-hosts/{hosts}-h1" in proc.stdout, proc.stdout
    # 0.2 s of CPU at 1/8 of a core cannot take less than 1.6 s (less would mean the
    # quota is not applied); the kernel counts the throttling
    proc = subprocess.run([str(NETNS_HOSTS), "exec", f"{hosts}-h1", sys.executable, "-c",
                           BURN], capture_output=True, text=True, timeout=60, check=True)
    assert float(proc.stdout) > 0.2 / 0.125 * 0.8, proc.stdout
    stat = dict(line.split() for line in (ROOT / f"{hosts}-h1" / "cpu.stat").read_text()
                .splitlines())
    assert int(stat["nr_throttled"]) > 0
    # changed in place, then lifted
    ok("cpu", hosts, "0=1", "1=0.5")
    assert quota(f"{hosts}-h1") == (5000, 10000)
    assert ok("cpu", hosts, "--clear").splitlines() == [
        "cpu: h0 cores=none period=10000us", "cpu: h1 cores=none period=10000us"]
    assert quota(f"{hosts}-h0")[0] is None and quota(f"{hosts}-h1")[0] is None


# cg(): this process's cpu cgroup (v1's cpu line, else v2's); GATHER: the ranks' `seen`,
# printed by rank 0 in one line (ranks' own lines interleave)
CPU_CGROUP = ("import json; from mpi4py import MPI\n"
              "def cg():\n"
              "    text = open('/proc/self/cgroup').read()\n"
              "    cpu = [l for l in text.splitlines() if ':cpu:' in l]\n"
              "    return cpu[0].split(':')[2] if cpu else text.split('::')[-1].strip()\n")
GATHER = ("rows = MPI.COMM_WORLD.gather(seen)\n"
          "if rows: print('RANKS', json.dumps(rows), flush=True)")
# each rank's host and cpu cgroup
CGROUP_OF_RANK = (CPU_CGROUP + "import socket\nseen = (socket.gethostname(), cg())\n"
                  + GATHER)


def test_the_ranks_of_an_mpi_job_run_in_their_hosts_budget(hosts):
    # mpiexec's launcher must see /sys/fs/cgroup when it starts the hosts' proxies: under
    # `ip netns exec` (a sysfs of its own over /sys) the ranks ran unlimited, silently
    ok("cpu", hosts, "all=0.5", "1=0.25")
    proc = across_hosts(hosts, 4, sys.executable, "-c", CGROUP_OF_RANK, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (rows,) = [json.loads(line[6:]) for line in proc.stdout.splitlines()
               if line.startswith("RANKS ")]
    assert len(rows) == 4, rows
    for rank, (host, cgroup) in enumerate(rows):
        assert host == f"{hosts}-h{rank % 2}", rows
        assert cgroup == f"/netns-hosts/{host}", rows


# each rank's cpu cgroup at the start, inside its budget (ClockBudget.enter), after a
# pause of it, and at the end (leave)
DEFERRED_BUDGET = (CPU_CGROUP + "from asapmpi.launch.budget import ClockBudget\n"
                   "local = MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED)\n"
                   "b = ClockBudget.from_environment(); seen = [cg()]\n"
                   "b.split(local.Get_rank(), local.Get_size())\n"
                   "b.enter(); seen.append(cg())\n"
                   "with b.paused(): seen.append(cg())\n"
                   "seen.append(cg()); b.leave(); seen.append(cg())\n" + GATHER)


def test_a_deferred_budget_holds_a_rank_only_between_enter_and_leave(hosts, monkeypatch):
    # NETNS_HOSTS_BUDGET=deferred (bench training's jobs): the ranks start in the set's
    # unlimited cgroup and move themselves in and out of their share of their host's
    # budget
    ok("cpu", hosts, "all=0.5", "1=0.25")
    monkeypatch.setenv("NETNS_HOSTS_BUDGET", "deferred")
    proc = across_hosts(hosts, 4, sys.executable, "-c", DEFERRED_BUDGET, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (rows,) = [json.loads(line[6:]) for line in proc.stdout.splitlines()
               if line.startswith("RANKS ")]
    free = f"/netns-hosts/{hosts}-free"
    shares = set()
    for rank, seen in enumerate(rows):
        # each of a host's two ranks in a cgroup of its own with half the host's quota
        share = seen[1]
        assert share.startswith(f"/netns-hosts/{hosts}-h{rank % 2}-r"), (rank, rows)
        assert seen == [free, share, free, share, free], (rank, rows)
        shares.add(share)
    assert len(shares) == 4, rows
    assert quota(f"{hosts}-h0-r0") == quota(f"{hosts}-h0-r1") == (2500, 10000)
    assert quota(f"{hosts}-h1-r0") == quota(f"{hosts}-h1-r1") == (1250, 10000)
    # the unlimited cgroup has no quota; down removes it and the shares with the hosts'
    # (the fixture)
    assert quota(f"{hosts}-free")[0] is None
    proc = subprocess.run([str(NETNS_SSH), f"{hosts}-h0", "true"], capture_output=True,
                          text=True, timeout=30, check=False,
                          env={**os.environ, "NETNS_HOSTS_BUDGET": "soon"})
    assert proc.returncode != 0 and "set it to 'deferred'" in proc.stderr, proc.stderr


def test_a_deferred_budget_without_its_cgroup_is_one_line(monkeypatch, tmp_path):
    from asapmpi.errors import AsapError
    from asapmpi.launch.budget import ClockBudget

    monkeypatch.setenv("NETNS_HOSTS_BUDGET", "deferred")
    monkeypatch.setattr("socket.gethostname", lambda: "bt1234-h3")
    with pytest.raises(AsapError, match=r"host bt1234-h3 has no cgroup under .*netns-hosts cpu"):
        ClockBudget.from_environment(str(tmp_path))
    monkeypatch.setattr("socket.gethostname", lambda: "login01")
    with pytest.raises(AsapError, match="'login01' is not an emulated host's"):
        ClockBudget.from_environment(str(tmp_path))
    monkeypatch.delenv("NETNS_HOSTS_BUDGET")
    assert ClockBudget.from_environment(str(tmp_path)) is None


def test_a_budget_the_launcher_cannot_see_is_an_error_not_unlimited(hosts):
    ok("cpu", hosts, "all=0.5")
    proc = subprocess.run(["ip", "netns", "exec", f"{hosts}-h0", str(NETNS_SSH),
                           f"{hosts}-h1", "true"], capture_output=True, text=True,
                          timeout=30, check=False)
    assert proc.returncode != 0
    assert "has a CPU budget but its cgroup is not visible" in proc.stderr, proc.stderr


def test_a_small_budget_raises_the_period_to_the_kernels_smallest_quota(hosts):
    out = ok("cpu", hosts, "--period", "5000", "0=0.05")
    assert "period raised from 5000 us to 20000 us" in out
    assert quota(f"{hosts}-h0") == (1000, 20000)
    assert quota(f"{hosts}-h1") == (None, 20000)


@pytest.mark.parametrize("args, fix", [
    (["0=3"], "more than this machine's"),
    (["all=1.5"], "more than this machine's"),
    (["2=0.5"], "there is no host 2"),
    (["0:0.5"], "give I=CORES, all=CORES or I=none"),
    (["0=0"], "give more than 0"),
    (["--period", "50", "0=0.5"], "microseconds from 1000 to 1000000"),
    (["--clear", "0=0.5"], "give it alone"),
    ([], "BUDGET: I=CORES"),
])
def test_bad_budgets_are_one_line_and_change_nothing(hosts, args, fix):
    if args == ["all=1.5"] and (os.cpu_count() or 1) >= 3:
        pytest.skip("two hosts of 1.5 cores fit this machine")
    proc = run("cpu", hosts, *args)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and fix in lines[0], proc.stderr
    assert not (ROOT / f"{hosts}-h0").exists()          # nothing was made


def test_down_kills_what_runs_in_a_budget_and_removes_it(hosts):
    ok("cpu", hosts, "all=0.5")
    sleeper = subprocess.Popen([str(NETNS_HOSTS), "exec", f"{hosts}-h0", "sleep", "600"])
    try:
        for _ in range(50):
            if (ROOT / f"{hosts}-h0" / "cgroup.procs").read_text().strip():
                break
            time.sleep(0.1)
        assert (ROOT / f"{hosts}-h0" / "cgroup.procs").read_text().strip()
        ok("down", hosts)
        assert sleeper.wait(timeout=30) is not None
        assert not (ROOT / f"{hosts}-h0").exists() and not (ROOT / f"{hosts}-h1").exists()
    finally:
        sleeper.kill()


def test_up_removes_the_budgets_of_a_set_whose_namespaces_are_gone(hosts):
    ok("cpu", hosts, "all=0.5")
    # a run killed before its `down`, whose namespaces were removed by hand: its cgroups
    # would stay; the next set's `up` removes them
    for i in range(2):
        subprocess.run(["ip", "netns", "delete", f"{hosts}-h{i}"], check=True, timeout=30)
    other = f"nc{uuid.uuid4().hex[:8]}"
    try:
        ok("up", "1", other)
        assert not (ROOT / f"{hosts}-h0").exists() and not (ROOT / f"{hosts}-h1").exists()
    finally:
        run("down", other)
