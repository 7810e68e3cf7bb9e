"""Several hosts emulated on one machine: launch/netns-hosts makes network namespaces with
their own addresses (10.77.0.10+I on eth0) and hostnames, joined by a bridge in a switch
namespace where mpiexec runs; hydra starts one proxy per host through launch/netns-ssh,
and MPI's traffic between hosts goes over the veths (libfabric tcp on eth0).  The exchange,
MPI's view of the hosts and a short training are checked across 3 such hosts.

Needs root and `ip netns` (skipped otherwise); every test run has its own prefix, so
parallel runs do not clash, and the hosts are removed whatever happens."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Optional

import pytest

from asapmpi.bench.hosts import emulation_unavailable

from mpilaunch import RESULT_TAG, RUNNER, mpiexec, results

ROOT = Path(__file__).resolve().parents[2]
NETNS_HOSTS = ROOT / "launch" / "netns-hosts"
HOSTS = 3


SKIP = emulation_unavailable()
pytestmark = [pytest.mark.mpi, pytest.mark.skipif(SKIP is not None, reason=SKIP or "")]


def netns_hosts(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(NETNS_HOSTS), *args], capture_output=True, text=True,
                          check=False, timeout=timeout)
    assert proc.returncode == 0, f"netns-hosts {' '.join(args)}:\n{proc.stdout}{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def hosts():
    """3 emulated hosts under a prefix of this run's own; their names (hosts file order)."""
    prefix = f"mh{uuid.uuid4().hex[:8]}"
    try:
        netns_hosts("up", str(HOSTS), prefix)
        path = netns_hosts("hostfile", prefix).stdout.strip()
        names = Path(path).read_text().split()
        assert names == [f"{prefix}-h{i}" for i in range(HOSTS)], names
        yield prefix, names
    finally:
        netns_hosts("down", prefix)
        left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                              check=False, timeout=30).stdout
        assert prefix not in left, left


def across_hosts(prefix: str, ranks: int, *argv: str, timeout: float = 60,
                 cwd: Optional[Path] = None) -> subprocess.CompletedProcess:
    """Run `argv` on `ranks` ranks spread over the hosts of `prefix`: mpiexec in the switch
    namespace, proxies through netns-ssh (the command line: launch/netns-hosts header)."""
    env = dict(os.environ)
    env.pop("PYTEST_CURRENT_TEST", None)
    env.pop("MPIR_CVAR_NOLOCAL", None)        # ranks of one host may share memory
    env["MPIEXEC"] = mpiexec()
    env["MPIEXEC_TIMEOUT"] = str(int(timeout))
    cmd = [str(NETNS_HOSTS), "mpiexec", prefix, "-n", str(ranks), *argv]
    try:
        return subprocess.run(cmd, env=env, capture_output=True, text=True, check=False,
                              timeout=timeout + 30, cwd=cwd)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"{argv} on {ranks} ranks across hosts hung past {timeout + 30} s:"
                             f"\n{exc.stdout}\n{exc.stderr}") from None


def link_bytes(host: str, dev: str) -> int:
    """Bytes received so far on `dev` of the emulated host `host`."""
    out = subprocess.run(["ip", "-n", host, "-j", "-s", "link", "show", dev],
                         capture_output=True, text=True, check=True, timeout=30).stdout
    return json.loads(out)[0]["stats64"]["rx"]["bytes"]


def test_exchange_roundtrip_across_hosts_goes_over_their_links(hosts):
    prefix, names = hosts
    iters, n = 200, 257
    before = {h: (link_bytes(h, "eth0"), link_bytes(h, "lo")) for h in names}
    proc = across_hosts(prefix, HOSTS, sys.executable, str(RUNNER), "roundtrip",
                        json.dumps({"graph": "ring", "iters": iters, "n": n}))
    for rank, res in enumerate(results(proc, HOSTS)):
        assert res["in"] == [(rank - 1) % HOSTS]
        # transport="auto" timed the only neighbour class there is: other hosts
        assert list(res["transport_report"]["rounds"]) == ["other host"], res
        assert res["stats"] == {str((rank - 1) % HOSTS): {"consistent": iters, "torn": 0,
                                                           "stale": 0, "ahead": 0}}
    payload = iters * n * 8                   # what each rank reads from its in-neighbour
    for h in names:
        eth0, lo = link_bytes(h, "eth0") - before[h][0], link_bytes(h, "lo") - before[h][1]
        assert eth0 >= payload and lo < payload, (h, eth0, lo)


PROBE = """
import json, socket, sys
from mpi4py import MPI
from asapmpi.reduce import hosts_of
comm = MPI.COMM_WORLD
local = comm.Split_type(MPI.COMM_TYPE_SHARED)
out = dict(name=MPI.Get_processor_name(), hostname=socket.gethostname(), shared=local.size,
           shared_names=local.allgather(MPI.Get_processor_name()), hosts=hosts_of(comm))
local.Free()
# one write, as tests/mpi/run.py: the lines of two ranks of a host do not interleave
sys.stdout.write("%s %d %s\\n" % (sys.argv[1], comm.rank, json.dumps(out)))
sys.stdout.flush()
"""


def test_ranks_are_on_distinct_hosts_that_mpi_sees_as_hosts(hosts):
    prefix, names = hosts
    ranks = 2 * HOSTS                         # two per host: those two share memory
    res = results(across_hosts(prefix, ranks, sys.executable, "-c", PROBE, RESULT_TAG), ranks)
    by_name = {}
    for rank, r in enumerate(res):
        assert r["hostname"] == r["name"]     # each host has its own UTS name
        assert r["shared"] == 2 and r["shared_names"] == [r["name"]] * 2, r
        by_name.setdefault(r["name"], []).append(rank)
    assert sorted(by_name) == names and all(len(v) == 2 for v in by_name.values()), by_name
    # asapmpi finds the same hosts (the hierarchical graph's), identically on every rank
    assert all(r["hosts"] == res[0]["hosts"] for r in res)
    assert sorted(set(res[0]["hosts"])) == sorted(min(v) for v in by_name.values())
    for members in by_name.values():
        assert {res[0]["hosts"][m] for m in members} == {min(members)}


def test_short_training_across_hosts(hosts, tmp_path):
    pytest.importorskip("torch")
    prefix, _ = hosts
    summary = tmp_path / "s.json"
    # hierarchical: the hosts found by MPI (3 hosts of one rank: a ring of their leaders,
    # in-degree 2, so hop may skip one); one torch thread per rank: they share the cores.
    # 300 iterations: before ~150 the SVM's test accuracy still swings between 0.5 and 0.9
    # from one evaluation to the next (loss 0.69 -> 0.68 by 60), after it stays near 0.9
    iters = 300
    proc = across_hosts(prefix, HOSTS, sys.executable, "-m", "asapmpi", "train", "svm",
                        "--graph", "hierarchical", "--threads", "1", "--iters", str(iters),
                        "--no-progress", "--out", str(tmp_path / "out"), "--json",
                        str(summary), "--compare", "notify_ack,hop:backup=1",
                        timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    runs = json.loads(summary.read_text())["runs"]
    assert [r["label"] for r in runs] == ["notify_ack", "hop:backup=1"]
    for r in runs:
        assert r["iterations"] == iters and r["ranks"] == HOSTS and r["graph"] == "hierarchical"
        assert r["final_test_accuracy"] > 0.8, r
