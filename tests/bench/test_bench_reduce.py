"""`asapmpi bench reduce` runs end to end and its output parses; its verdict logic is
checked on made-up figures (timings themselves stay out of the tests: they are noisy)."""
import json
import os
import statistics
import subprocess
import sys

import numpy as np
import pytest

from asapmpi.bench import reduce as bench

from mpilaunch import above_the_core, job_command
from mpilaunch import run as run_scenario

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def asapmpi(*args, timeout=600, launcher=()):
    env = dict(os.environ)
    env.pop("PYTEST_CURRENT_TEST", None)
    return subprocess.run([*launcher, sys.executable, "-m", "asapmpi", *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=timeout,
                          check=False)


@pytest.mark.mpi
def test_sweep_runs_on_both_paths_and_its_json_parses(tmp_path):
    out, png = tmp_path / "reduce.json", tmp_path / "reduce.png"
    proc = asapmpi("bench", "reduce", "--sizes", "4K,64K", "--ranks", "2,3", "--paths",
                   "shm,net", "--graphs", "ring,complete", "--policies", "notify_ack,async",
                   "--repeats", "1", "--min-time", "0.002", "--json", str(out),
                   "--png", str(png))
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert [(j["path"], j["ranks"]) for j in report["jobs"]] == [
        ("shared-memory", 2), ("shared-memory", 3), ("network", 2), ("network", 3)]
    rows = report["rows"]
    assert len(rows) == 4 * 2 * 2 * 2       # jobs x sizes x graphs x policies
    records = {(rec["path"], rec["ranks"], rec["size"]): rec for rec in report["records"]}
    for r in rows:
        assert r["seconds"] > 0 and r["allreduce"] > 0 and r["memcpy"] > 0
        assert r["gloo"] is None or r["gloo"] > 0
        assert r["x_copy"] == pytest.approx(r["seconds"] / r["copy_bound"])
        step = records[(r["path"], r["ranks"], r["size"])]["steps"][r["graph"]][r["policy"]]
        # every policy is timed in turn with an Allreduce, its ratio the median of the
        # per-repeat ratios and its allreduce column the median of those loops
        paired = step["paired"]
        assert len(paired["step"]) == len(paired["allreduce"])
        assert r["seconds"] == pytest.approx(statistics.median(paired["step"]))
        assert r["allreduce"] == pytest.approx(statistics.median(paired["allreduce"]))
        assert r["x_allreduce"] == pytest.approx(statistics.median(
            s / a for s, a in zip(paired["step"], paired["allreduce"])))
        # the bandwidth copy takes turns only with notify_ack, where the bound applies
        assert ("stream" in paired) == (r["path"] == "shared-memory"
                                        and r["policy"] == "notify_ack")
        if "stream" in paired:
            assert len(paired["stream"]) == len(paired["step"])
        else:
            assert r["x_bound"] == pytest.approx(r["seconds"] / r["bound"])
        # and with the MPI's own exchange of its graph: the step against it and it
        # against the Allreduce, per repeat
        assert len(paired["exchange"]) == len(paired["step"]) and r["exchange"] > 0
        assert r["floor_graph"] == r["graph"] and r["graph_exchange"] > 0
        assert r["x_exchange"] == pytest.approx(statistics.median(
            s / x for s, x in zip(paired["step"], paired["exchange"])))
        assert r["exchange_x_allreduce"] == pytest.approx(statistics.median(
            x / a for x, a in zip(paired["exchange"], paired["allreduce"])))
        # notify_ack measures its transport: on one host it reads neighbours' slots in
        # place (double-buffered: no copy) unless messages are much faster, on the
        # network path it puts or sends messages, whichever is faster; async measures
        # puts against its mailbox of newest versions on both paths
        expected = {"messages", "put"}
        if r["policy"] == "notify_ack" and r["path"] == "shared-memory":
            expected = {"shared double-buffered", "messages"}
        assert r["transport"] in expected, r
    for job in report["jobs"]:     # the bound's unit: copies too large for the caches
        bandwidth = job["memory_bandwidth"]
        assert bandwidth["array_bytes"] >= 8 << 20 and bandwidth["bytes_per_s"] > 0
        assert bandwidth["bytes_per_s"] == pytest.approx(2 * bandwidth["array_bytes"]
                                                         / bandwidth["seconds"])
    degrees = {j["ranks"]: j["degrees"] for j in report["jobs"]}
    assert degrees[3] == {"ring": {"in": 1, "out": 1}, "complete": {"in": 2, "out": 2}}
    # none of the targets' configurations was in this sweep
    assert [t["name"] for t in report["targets"]] == \
        ["T1", "T2", "T3", "T4"] + [t[0] for t in bench.TARGETS[3:]]
    assert {t["verdict"] for t in report["targets"]} == {"not measured"}
    assert "network, 3 ranks: ratios" in proc.stdout and "Targets" in proc.stdout
    assert "network, 3 ranks: the MPI's own exchange of each policy's messages" in proc.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.mpi
def test_inside_an_mpi_job_it_measures_that_job(tmp_path):
    out = tmp_path / "one.json"
    proc = asapmpi("bench", "reduce", "--sizes", "4K", "--graphs", "ring", "--policies",
                   "notify_ack", "--repeats", "1", "--min-time", "0.002", "--no-gloo",
                   "--json", str(out), launcher=job_command(2, [])[0])
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert [(j["path"], j["ranks"], j["gloo"]) for j in report["jobs"]] == [
        ("shared-memory", 2, None)]
    assert proc.stdout.count("Targets") == 1        # rank 0 reports, once


@pytest.mark.mpi
@above_the_core     # the harness's timed loop; elastic's own paths: test_elastic_policy
def test_elastic_is_timed_per_superstep_on_its_star(tmp_path):
    # every rank's timed loop runs the same supersteps (a worker's local steps and its
    # exchange with the server per call), so the loops meet and the job ends
    out = tmp_path / "reduce.json"
    proc = asapmpi("bench", "reduce", "--sizes", "4K", "--ranks", "3", "--paths", "shm,net",
                   "--graphs", "ring", "--policies", "elastic,backup_ps", "--repeats", "2",
                   "--min-time", "0.002", "--json", str(out), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    elastic = [r for r in rows if r["policy"] == "elastic"]
    assert len(elastic) == 2 and all(r["seconds"] > 0 for r in elastic), rows
    assert {r["graph"] for r in elastic} == {r["graph"] for r in rows
                                             if r["policy"] == "backup_ps"}
    # on their star, whatever the graph: their floor is the star's own exchange
    assert all(r["floor_graph"] == "star" and r["x_exchange"] > 0
               and r["exchange_x_allreduce"] > 0 for r in rows), rows


@pytest.mark.mpi
def test_gossip_is_timed_beside_a_sendrecv_with_a_random_peer(tmp_path):
    # gossip pulls one buffer from a random peer per step: its floor is a Sendrecv per
    # rank with a peer drawn alike on every rank (the loops meet, the job ends)
    out = tmp_path / "reduce.json"
    proc = asapmpi("bench", "reduce", "--sizes", "4K", "--ranks", "3", "--paths", "net",
                   "--graphs", "ring", "--policies", "gossip", "--repeats", "3",
                   "--min-time", "0.002", "--no-gloo", "--json", str(out), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (row,) = json.loads(out.read_text())["rows"]
    assert row["floor_graph"] == "random pairs" and row["exchange"] > 0, row
    low, high = row["x_exchange_range"]
    assert 0 < low <= row["x_exchange"] <= high, row
    assert "gossip" in proc.stdout.split("timed beside the step; the spread")[1]


@pytest.mark.parametrize("args, message", [
    (["--ranks", "1"], "rank counts >= 2"),
    (["--graphs", "ring,nope"], "unknown graph nope"),
    (["--policies", "notify_ack,nope"], "unknown policy 'nope'"),
    (["--policies", "hop:max_gap=0"], "hop:max_gap=0: "),
    (["--policies", "hop:backup"], "is not OPTION=VALUE"),
    (["--policies", "hop:transport=pigeon"], "transport must be one of auto, put"),
    (["--policies", "gossip:transport=shared"],
     "transport='shared' does not fit sync='gossip'"),
    (["--policies", "elastic:R=0"], "elastic:R=0: "),
    (["--paths", "ib"], "unknown path ib"),
    (["--sizes", "3"], "multiple of 4"),
    (["--graphs", "double-ring", "--ranks", "3"], "needs an even number of ranks"),
    # before any job: a ring gives each rank one in-neighbour, none to spare
    (["--graphs", "root-expander,ring", "--ranks", "8", "--policies", "hop:backup=1"],
     "hop:backup=1 on ring (8 ranks): hop backup=1 must be smaller"),
])
def test_bad_input_is_one_line(args, message):
    proc = asapmpi("bench", "reduce", *args, timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr


def _job(path, ranks, size, step, allreduce, gloo, memcpy, d_in=2, bandwidth=None,
         library="MPICH", policies=("notify_ack",)):
    """One job's figures; the memory bandwidth defaults to that of the copy of SIZE."""
    steps = {"root-expander": {p: {"seconds": step, "transport": "shared"}
                               for p in policies}}
    bytes_per_s = bandwidth or 2 * size / memcpy
    return {"path": path, "ranks": ranks, "mpi_library": library, "gloo": "ok",
            "degrees": {"root-expander": {"in": d_in, "out": d_in}},
            "memory_bandwidth": {"array_bytes": 64 << 20, "seconds": (128 << 20) / bytes_per_s,
                                 "bytes_per_s": bytes_per_s},
            "records": [{"size": size, "memcpy": memcpy, "allreduce": allreduce,
                         "gloo": gloo, "steps": steps}]}


def test_verdicts_follow_the_targets():
    big, small = 16 << 20, 64 << 10
    # step 9 vs Allreduce 10 and gloo 20: T1, T2 pass; bound = 4 * (2 + 2) / 2 = 8 -> 1.125x
    passing = bench.analyze([_job("shared-memory", 8, big, 9.0, 10.0, 20.0, 4.0),
                             _job("network", 8, small, 1.9, 1.0, None, 0.1)])
    verdicts = {t["name"]: (t["verdict"], t["value"]) for t in passing["targets"]}
    assert verdicts["T1"] == ("PASS", pytest.approx(0.9))
    assert verdicts["T2"] == ("PASS", pytest.approx(0.45))
    assert verdicts["T3"] == ("PASS", pytest.approx(9.0 / 8.0))
    assert verdicts["T4"] == ("PASS", pytest.approx(1.9))
    failing = bench.analyze([_job("shared-memory", 8, big, 12.0, 10.0, 20.0, 4.0),
                             _job("network", 8, small, 2.1, 1.0, None, 0.1)])
    verdicts = {t["name"]: t["verdict"] for t in failing["targets"]}
    assert {k: v for k, v in verdicts.items() if v != "not measured"} == \
        {"T1": "FAIL", "T2": "FAIL", "T3": "FAIL", "T4": "FAIL"}
    # the bound applies from 1 MB on shared memory only, and gloo may be missing
    rows = bench.analyze([_job("shared-memory", 2, small, 5.0, 1.0, None, 0.1)])["rows"]
    assert rows[0]["bound_verdict"] is None and rows[0]["x_gloo"] is None
    # the bound is the job's memory bandwidth, not the copy of SIZE: a copy of 1 MB in
    # 0.1 (cache speed 2 MB / 0.1) but memory at 1 MB / 0.1 -> bound 4 MB / (1 MB / 0.1)
    mb = 1 << 20
    row = bench.analyze([_job("shared-memory", 4, mb, 0.5, 1.0, None, 0.1,
                              bandwidth=mb / 0.1)])["rows"][0]
    assert row["bound"] == pytest.approx(0.4) and row["x_bound"] == pytest.approx(1.25)
    assert row["copy_bound"] == pytest.approx(0.2) and row["x_copy"] == pytest.approx(2.5)
    assert row["bound_verdict"] == "PASS"
    # paired timings: ratios per repeat, then the median (3/1, 10/10, 2/1 -> 2), not the
    # ratio of the medians (3 / 1); the bound of each repeat from its own bandwidth copy
    job = _job("shared-memory", 8, big, 3.0, 1.0, None, 4.0)
    job["records"][0]["steps"]["root-expander"]["notify_ack"]["paired"] = {
        "step": [3.0, 10.0, 2.0], "allreduce": [1.0, 10.0, 1.0], "stream": [1.0, 1.0, 2.0]}
    row = bench.analyze([job])["rows"][0]
    assert row["x_allreduce"] == pytest.approx(2.0)
    per_bound = [s / (4 * big / (2 * (64 << 20) / t)) for s, t in ((3, 1), (10, 1), (2, 2))]
    assert row["x_bound"] == pytest.approx(statistics.median(per_bound))
    # the cluster stacks' targets: per policy, on their MPI family and path only
    ucx = ["notify_ack", "hop:backup=1", "bsp", "async", "gossip", "backup_ps"]
    report = bench.analyze([_job("network (UCX)", 8, small, 1.5, 1.0, None, 0.1,
                                 library="Open MPI v4.1.4", policies=ucx),
                            _job("network", 8, small, 0.9, 1.0, None, 0.1,
                                 policies=["hop:backup=1"])])
    verdicts = {t["name"]: t["verdict"] for t in report["targets"]}
    for policy in ucx:
        limit = 2.0 if policy in ("gossip", "backup_ps") else 1.0
        assert verdicts[f"T5 {policy}"] == ("PASS" if 1.5 <= limit else "FAIL"), policy
    assert verdicts["T6 hop:backup=1"] == "PASS"
    # an Open MPI network job is not MPICH's: T6 stays unmeasured
    report = bench.analyze([_job("network", 8, small, 0.9, 1.0, None, 0.1,
                                 library="Open MPI v4.1.4", policies=["hop:backup=1"])])
    assert {t["name"]: t["verdict"] for t in report["targets"]}["T6 hop:backup=1"] == \
        "not measured"
    text = bench.format_report(failing)
    assert "T1         FAIL" in text and "1.20x" in text


def test_the_exchange_floor_is_paired_per_repeat():
    # steps 3, 10, 2 beside exchanges 1, 5, 2 and Allreduces 2, 10, 1: step / exchange
    # 3, 2, 1 -> 2 and exchange / Allreduce 0.5, 0.5, 2 -> 0.5 (medians of the ratios)
    small = 64 << 10
    job = _job("network (UCX)", 8, small, 3.0, 2.0, None, 0.1, library="Open MPI v4.1.4",
               policies=["notify_ack", "backup_ps", "gossip"])
    job["records"][0]["exchange"] = {"root-expander": 1.5}
    steps = job["records"][0]["steps"]["root-expander"]
    steps["notify_ack"].update(floor_graph="root-expander", paired={
        "step": [3.0, 10.0, 2.0], "allreduce": [2.0, 10.0, 1.0], "exchange": [1.0, 5.0, 2.0]})
    # backup_ps beside its star's exchange: 3 / 4 and 4 / 2 per repeat
    steps["backup_ps"].update(floor_graph="star", paired={
        "step": [3.0, 3.0, 3.0], "allreduce": [2.0, 2.0, 2.0], "exchange": [4.0, 4.0, 4.0]})
    steps["gossip"]["paired"] = {"step": [3.0, 3.0, 3.0], "allreduce": [2.0, 2.0, 2.0]}
    report = bench.analyze([job])
    # every ratio to the floor with its spread: the lowest and highest per repeat
    assert report["rows"][0]["x_exchange_range"] == [1.0, 3.0]
    assert report["rows"][0]["exchange_x_allreduce_range"] == [0.5, 2.0]
    rows = {r["policy"]: r for r in report["rows"]}
    assert rows["notify_ack"]["x_exchange"] == pytest.approx(2.0)
    assert rows["notify_ack"]["exchange_x_allreduce"] == pytest.approx(0.5)
    assert rows["notify_ack"]["exchange"] == pytest.approx(2.0)     # the paired median
    assert rows["backup_ps"]["floor_graph"] == "star"
    assert rows["backup_ps"]["x_exchange"] == pytest.approx(0.75)
    assert rows["backup_ps"]["exchange_x_allreduce"] == pytest.approx(2.0)
    # a gossip step timed without its pair exchange beside it: no floor
    assert rows["gossip"]["x_exchange"] is None and rows["gossip"]["floor_graph"] is None
    assert rows["gossip"]["graph_exchange"] == pytest.approx(1.5)   # timed on its own
    targets = {t["name"]: t for t in report["targets"]}
    assert targets["T5 notify_ack"]["exchange_x_allreduce"] == pytest.approx(0.5)
    text = bench.format_report(report)
    assert "notify_ack: step / MPI_Allreduce; the MPI's own exchange of the " \
        "root-expander: 0.50x" in text
    assert "backup_ps: step / MPI_Allreduce; the MPI's own exchange of the star: 2.00x" \
        in text
    # the floor table: a line per policy with a floor (here gossip had none beside it),
    # each ratio with its spread
    floor = text.split("timed beside the step; the spread")[1]
    floor = floor.split("Targets")[0]
    assert "gossip" not in floor
    assert [line.split()[3:5] for line in floor.splitlines() if "KB" in line] == \
        [["notify_ack", "root-expander"], ["backup_ps", "star"]]
    assert "0.50x (0.50-2.00)" in floor and "2.00x (1.00-3.00)" in floor, floor
    # the time table's exchange column is the root expander's beside notify_ack's loops
    # (median 2), not the one timed on its own (1.5)
    times = text.split("seconds per call")[1].split("ratios")[0]
    assert times.count("2000.00 ms") == 2 and "1500.00 ms" not in times, times


@pytest.mark.mpi
@pytest.mark.parametrize("path", ["shm", "net"])
def test_the_mpi_exchange_delivers_every_in_neighbours_buffer(path):
    results = run_scenario("test_bench_reduce:bench_mpi_exchange", 4, path, timeout=120)
    for rank, res in enumerate(results):
        for label, one in res.items():
            assert one["ins"], (rank, label)
            assert one["got"] == [[1000 * k + src for src in one["ins"]] for k in range(3)], \
                (rank, label, one)
            assert one["serving"] == (label == "star" and rank == 1)
    # the star round: the server hears from every worker, a worker from the server
    assert results[1]["star"]["ins"] == [0, 2, 3] and results[0]["star"]["ins"] == [1]


def test_each_policy_is_measured_against_the_exchange_of_its_own_messages():
    # bsp's every step ends in a barrier of all ranks: its floor has one too
    from asapmpi.bench.reduce_job import MPIPairExchange, floor_of

    assert floor_of("bsp", "ring", 8)[0].name == "ring" and floor_of("bsp", "ring", 8)[2]
    for policy in ("notify_ack", "hop:backup=1", "async"):
        graph, server, barrier = floor_of(policy, "root-expander", 8)
        assert graph.name == "root-expander" and server is None and not barrier
    assert floor_of("backup_ps", "ring", 8)[1] is not None
    assert floor_of("gossip", "ring", 8) == (MPIPairExchange.graph, None, False)


def test_the_memory_bound_arrays_fit_in_the_memory_available(monkeypatch):
    # a VM may report a last-level cache of hundreds of MB (480 MB on this project's
    # machine): 4x that per rank had 8 ranks of the network path OOM-killed
    from mpi4py import MPI

    from asapmpi.bench import timing

    monkeypatch.setattr(timing, "last_level_cache_bytes", lambda: 64 << 30)
    monkeypatch.setattr(timing, "available_memory_bytes", lambda: 1 << 30)
    assert timing.stream_array_bytes(MPI.COMM_SELF) == (1 << 30) // 8
    monkeypatch.setattr(timing, "last_level_cache_bytes", lambda: 1 << 20)
    assert timing.stream_array_bytes(MPI.COMM_SELF) == 8 << 20      # the floor


# ---------------------------------------------------------------- scenario bodies (on the ranks)
# tests/mpi/run.py runs each on every rank as "test_bench_reduce:NAME"

def bench_mpi_exchange(comm, n=1000):
    """asapmpi bench reduce's floor, MPIExchange, on a ring, a root expander and a
    parameter server's star round: every rank receives each in-neighbour's buffer (its
    rank, the round) in the receive of that neighbour, every round."""
    from asapmpi.bench.reduce_job import MPIExchange
    from asapmpi.reduce import graph
    from asapmpi.reduce.graphs import star

    out = {}
    size = comm.Get_size()
    for label, g, server, barrier in (
            ("ring", graph("ring", size), None, False),
            ("root-expander", graph("root-expander", size), None, False),
            ("root-expander + barrier", graph("root-expander", size), None, True),
            ("star", star(size, root=1), 1, False)):
        exchange = MPIExchange(comm, g, 4 * n, server, barrier=barrier)
        assert exchange.graph == label or label == "star"
        got = []
        for round_ in range(3):
            exchange.send[:] = 1000 * round_ + comm.rank
            exchange()
            got.append([int(b[0]) if np.all(b == b[0]) else -1 for b in exchange.recv])
        exchange.close()
        out[label] = {"ins": exchange.ins, "got": got, "serving": exchange.serving}
    return out
