"""Serial tests of the bounded per-iteration records (asapmpi.sync.records) and of the
trace checker on traces that keep only their newest iterations."""
import h5py
import numpy as np
import pytest

import asapmpi
from asapmpi import trace
from asapmpi.errors import ConfigError
from asapmpi.sync.records import Records, part_path


def test_a_table_keeps_the_newest_rows_in_order_and_no_more():
    t = Records(keep=5).table("reduced", np.int64)
    for k in range(1, 13):
        t.append((k, 10 * k))
    assert t.count == 12 and t.first == 7
    assert t.array()[:, 0].tolist() == [8, 9, 10, 11, 12]
    assert t.last(2).tolist() == [[11, 110], [12, 120]]
    assert t._rows.shape == (5, 2)          # the ring never grows
    with pytest.raises(ConfigError, match="6 rows asked for, 5 kept"):
        t.last(6)


def test_a_table_before_it_wraps_and_empty():
    t = Records(keep=8).table("entries")
    assert t.array().shape == (0, 0) and t.count == 0
    for k in range(3):
        t.append((k, k + 0.5))
    assert t.first == 0 and t.array()[:, 1].tolist() == [0.5, 1.5, 2.5]


def test_streamed_rows_reach_the_part_file_whole(tmp_path):
    path = str(tmp_path / "t.h5")
    rec = Records(keep=3, path=path, rank=2)
    t = rec.table("entries")
    for k in range(10):
        t.append((k, -k))
    assert t.array()[:, 0].tolist() == [7, 8, 9]     # memory: the newest 3
    rec.close()
    with h5py.File(part_path(path, 2), "r") as f:
        assert f["entries"][:, 0].tolist() == list(range(10))   # the file: all of them
    rec.discard()
    assert not (tmp_path / "t.h5.rank00002.part").exists()


def test_rows_filled_in_place_reach_the_ring_and_the_part_file_whole(tmp_path):
    # next_row hands out the row before its cells are written: what is streamed must
    # be the rows already filled, never the one being filled
    path = str(tmp_path / "t.h5")
    rec = Records(keep=3, path=path, rank=0)
    t = rec.table("reduced", np.int64)
    for k in range(1, 11):
        row = t.next_row(3)
        row[0], row[1], row[2] = k, 10 * k, -k
        if k % 3 == 0:
            t.append((100 + k, 0, 0))       # both kinds of append interleave
    assert t.count == 13
    assert t.array().tolist() == [[9, 90, -9], [109, 0, 0], [10, 100, -10]]
    rec.close()
    with h5py.File(part_path(path, 0), "r") as f:
        rows = f["reduced"][:].tolist()
    expected = []
    for k in range(1, 11):
        expected.append([k, 10 * k, -k])
        if k % 3 == 0:
            expected.append([100 + k, 0, 0])
    assert rows == expected


def test_the_ring_size_must_be_positive():
    with pytest.raises(ConfigError, match="trace_iterations >= 1"):
        Records(keep=0)
    with pytest.raises(ConfigError):
        asapmpi.rc.trace_iterations = 0


def _steady(n, start, period, first=1):
    hi = start + period * np.arange(n)
    return {"lo": hi - 0.1 * period, "hi": hi, "first": first}


def _tail(t, keep):
    # what a ring of `keep` rows holds of a whole trace t
    n = len(t["hi"])
    return {"lo": t["lo"][n - keep:], "hi": t["hi"][n - keep:], "first": n - keep + 1}


def test_the_checker_reads_truncated_traces_with_their_iteration_numbers():
    g = asapmpi.graph("bidirectional-ring", 2)
    bounds = trace.gap_bounds(g, "tokens", max_gap=1)
    whole = [_steady(100, 0.0, 1.0), _steady(100, 0.5, 1.0)]
    tails = [_tail(t, 10) for t in whole]
    assert trace.check_gaps(tails, bounds) == []
    assert trace.max_gaps(tails)[0, 1] == trace.max_gaps(whole)[0, 1]
    # rank 0 races ahead late in the run: the tails still show it, at the same iterations
    racing = [_steady(100, 0.0, 1.0), _steady(100, 0.0, 1.0)]
    racing[1]["hi"][95:] += 3.0
    racing[1]["lo"][95:] += 3.0
    whole_found = trace.check_gaps(racing, bounds)
    tail_found = trace.check_gaps([_tail(t, 10) for t in racing], bounds)
    assert tail_found and tail_found[0]["iter_i"] == whole_found[0]["iter_i"]
    assert tail_found[0]["iter_j"] == whole_found[0]["iter_j"]


@pytest.mark.mpi
@pytest.mark.parametrize("sync, options", [("hop", {"backup": 1, "graph": "bidirectional-ring"}),
                                           ("notify_ack", {})])
def test_a_trace_file_holds_the_whole_run_while_memory_holds_the_ring(tmp_path, sync,
                                                                       options):
    from mpilaunch import run

    path = tmp_path / "run.h5"
    results = run("test_records:trace_streams_whole_run", 4, "shm", timeout=120, sync=sync,
                  trace_file=str(path), steps=300, keep=50, **options)
    for r in results:
        # 301 iterations entered (1 at creation), the newest 50 kept
        assert r == {"first": 252, "kept": 50, "reduced": 50}, r
    checked = trace.check_file(str(path))
    assert checked["iterations"] == [301] * 4
    assert checked["gap_violations"] == [] and checked["window_violations"] == []
    data = trace.load(str(path))
    assert all(len(t["reduced"]) == 300 for t in data["traces"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.h5"]    # parts merged


# ---------------------------------------------------------------- scenario bodies (on the ranks)
# tests/mpi/run.py runs each on every rank as "test_records:NAME"

def trace_streams_whole_run(comm, trace_file, sync="hop", steps=300, keep=50,
                            graph="ring", **options):
    """A ring of `keep` iterations in memory, the whole run in trace_file (written by
    free()); returns what the rank kept."""
    asapmpi.rc.trace_iterations = keep
    buf = np.zeros(256)
    with asapmpi.Exchange(buf, graph=graph, sync=sync, comm=comm, trace_file=trace_file,
                          **options) as ex:
        for _ in range(steps):
            ex.step()
        kept = ex.trace
    return {"first": int(kept["first"]), "kept": len(kept["hi"]),
            "reduced": len(kept["reduced"])}
