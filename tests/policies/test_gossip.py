"""sync="gossip": pull and push gossip with a period, the warm-up's peer choice, the
congestion condition, and emulated link bandwidth."""
import os
import time

import numpy as np
import pytest

from asapmpi.errors import ConfigError
from asapmpi.links import LinkModel
from asapmpi.sync import Gossip
from asapmpi.sync.gossip import INF_NS, congestion_report, update_time

from mpilaunch import PATHS, run


def test_update_time_follows_algorithm_2():
    assert update_time(float("inf"), 5.0, 0.1) == 5.0          # first measurement
    assert update_time(10.0, 8.0, 0.1) == 8.0                  # much faster: replace
    assert update_time(10.0, 20.0, 0.1) == 15.0                # much slower: half way
    assert update_time(10.0, 10.5, 0.1) == 10.0                # within threshold: keep


def test_congestion_condition_and_smallest_period():
    # 4 nodes, compute 1 s each; node 3 communicates in 5 s, the others in 1 s
    report = congestion_report(np.ones(4), np.array([1.0, 1.0, 1.0, 5.0]), period=1)
    assert report["congested"] == [False, False, False, True]
    # eq. (2) for node 3: ((K-1) C_3 - sum_j C_j) / sum_j G_j = (15 - 3) / 3 = 4
    assert report["min_period"] == 4
    assert not any(congestion_report(np.ones(4), np.array([1.0, 1, 1, 5]), 4)["congested"])


def test_link_model_and_options():
    links = LinkModel(wide_mbps=1000, narrow_mbps=100, narrow=(2,), latency_ms=1)
    assert links.seconds(0, 1, 125_000) == pytest.approx(0.001 + 0.001)
    assert links.seconds(0, 2, 125_000) == pytest.approx(0.001 + 0.01)
    with pytest.raises(ConfigError, match="narrow ranks need narrow_mbps"):
        LinkModel(narrow=(1,))
    with pytest.raises(ConfigError, match="every must be an integer >= 1"):
        Gossip(every=0)
    with pytest.raises(ConfigError, match=r"outside 0\.\.3"):
        Gossip(narrow_mbps=10, narrow=(7,)).topology(4)


@pytest.mark.mpi
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("period", [1, 4])
def test_pulled_models_are_whole_and_disagreement_shrinks(period, path):
    results = run("gossip_pulls_whole_models", 4, path, timeout=300, every=period,
                  transport="put")
    for res in results:
        assert res["torn"] == 0
        pulls = np.array(res["pulls"])
        assert len(pulls) == 60 // period
        assert np.all(pulls[:, 0] % period == 0) and np.all(pulls[:, 2] > 0)
        assert res["report"]["period"] == period and len(res["report"]["congested"]) == 4
        # time waiting is part of the run's time, counted once: the window's polls
        # during a pull were counted twice (145% of the time in bench training)
        assert 0 < res["wait_s"] <= res["wall_s"], (res["wait_s"], res["wall_s"])
    # from 3 (ranks 0..3) to well under it; not tighter: under load a descheduled rank
    # mixes late with peers that already finished (0.27 was seen in a loaded CI run)
    assert results[0]["spread"] < 0.25 * 3


@pytest.mark.mpi
def test_warm_up_measures_narrow_peers_slow_and_narrow_links_are_slow():
    opts = {"every": 1, "warmup": 1000, "wide_mbps": 2000.0, "narrow_mbps": 40.0,
            "narrow": [2, 3], "transport": "put"}
    results = run("gossip_pulls_whole_models", 4, "shm", timeout=300, iters=40, **opts)
    narrow_seconds = 20000 * 4 * 8 / 40e6               # 16 ms per pull from a narrow rank
    for rank, res in enumerate(results):
        pulls = np.array(res["pulls"])
        to_narrow = np.isin(pulls[:, 1], [2, 3])
        # every pull involving a narrow rank took at least its emulated transfer time
        involves = to_narrow | (rank in (2, 3))
        assert np.all(pulls[involves, 3] >= 0.95 * narrow_seconds)
        if rank in (0, 1):
            # the warm-up's table (what its choice reads: the rule is tested alone
            # below) measured both narrow peers at their emulated transfer time or more,
            # and the wide peer.  Not asserted: that the wide peer measured faster.  A
            # narrow rank pulling from it reserves its link for the whole 16 ms transfer
            # (the serving node's busy-until word), so a wide peer measures 12-17 ms when
            # the narrow ranks pull from it first: the pulls from narrow peers were 21
            # of 40 in one full run (the old bound: < 0.5) and the table gave them 0.60
            # and 0.67 of the choice in two of five runs here
            table = np.array(res["table_ns"])
            assert min(table[2], table[3]) >= 0.95 * narrow_seconds * 1e9, table
            assert all(0 < table[p] < INF_NS for p in range(4) if p != rank), table
        # time waiting is part of the run's time
        assert 0 < res["wait_s"] <= res["wall_s"], (res["wait_s"], res["wall_s"])
    # the congestion report has every node's measured times: a narrow node's pulls all
    # cross its own narrow link
    comm = results[0]["report"]["comm_s"]
    assert min(comm[2], comm[3]) >= 0.95 * narrow_seconds and min(comm) > 0


def test_the_warm_up_chooses_peers_in_inverse_proportion_to_their_times():
    # the rule the warm-up's choice follows, with a seeded generator: peers
    # measured at 1, 4 and 16 ms are chosen 16/21, 4/21 and 1/21 of the time; a peer
    # never measured gets the fastest known time (it is tried); after the warm-up, uniform
    policy = Gossip(every=1, warmup=100)
    policy._rng = np.random.default_rng(5)
    policy._table = np.array([0.0, 1e6, 4e6, 16e6])
    draws = np.array([policy._choose([1, 2, 3], 1) for _ in range(21000)])
    shares = [(draws == p).mean() for p in (1, 2, 3)]
    np.testing.assert_allclose(shares, [16 / 21, 4 / 21, 1 / 21], atol=0.01)
    policy._table = np.array([0.0, 1e6, float(INF_NS), 16e6])
    draws = np.array([policy._choose([1, 2, 3], 1) for _ in range(21000)])
    np.testing.assert_allclose([(draws == p).mean() for p in (1, 2, 3)],
                               [16 / 33, 16 / 33, 1 / 33], atol=0.01)
    draws = np.array([policy._choose([1, 2, 3], 101) for _ in range(21000)])
    np.testing.assert_allclose([(draws == p).mean() for p in (1, 2, 3)], [1 / 3] * 3,
                               atol=0.01)


def test_a_pull_takes_the_newest_slot_that_verifies():
    # one rank pulls from itself: its two published slots are corrupted the way a
    # publish in progress leaves them, and a pull takes only a slot that verifies
    from mpi4py import MPI

    from asapmpi import _core
    from asapmpi._core.layout import HEADER_BYTES
    from asapmpi.testing.faults import store_word

    buf = np.arange(10, dtype=np.float64)
    out = np.zeros(10)
    layout = _core.Layout(0, 0, 0, buf.nbytes, 0, 2)
    with _core.PutWindow(MPI.COMM_SELF, layout, [], [], [], [], [], "float64") as win:
        first = layout.off_publish
        second = first + layout.slot_stride

        def foot(head):
            return head + HEADER_BYTES + layout.payload_stride

        assert win.pull(0, first, out) == 0                     # nothing published yet
        assert not out.any()
        win.publish(buf, 7)                                     # into the first slot
        assert win.pull(0, first, out) == 7 and np.array_equal(out, buf)
        win.publish(buf * 2, 9)                                 # the second
        assert win.pull(0, first, out) == 9 and np.array_equal(out, buf * 2)
        store_word(win, second, 11)                             # a newer publish began
        assert win.pull(0, first, out) == 7 and np.array_equal(out, buf)
        store_word(win, foot(first), 6)                         # footer of an older one
        assert win.pull(0, first, out) == 0                     # neither slot whole
        store_word(win, foot(first), 7)
        assert win.pull(0, first, out) == 7
        # header and footer agree but a payload word changed: the read overlapped a
        # publish of that slot, and only the checksum can tell
        store_word(win, first + HEADER_BYTES + 8, 12345)
        assert win.pull(0, first, out) == 0
        win.publish(buf * 3, 13)                                # the first slot again
        assert win.pull(0, first, out) == 13 and np.array_equal(out, buf * 3)


# ---------------------------------------------------------------- push gossip (messages)

def _self_push_window(nbytes, words=2):
    # a push window on one rank, whose only peer is itself (the policy never pushes to
    # itself; the window allows it, which lets one process test the protocol)
    from mpi4py import MPI

    from asapmpi import _core

    layout = _core.Layout(1, 1, 0, nbytes, words, 0)
    return _core.PushWindow(MPI.COMM_SELF, layout, [0], [0], [0], [0], [0], "float64",
                            flush_timeout=10.0)


def _take(win, at_least=1, seconds=10.0):
    # pump until `at_least` models are held (a self-send completes at a progress call)
    deadline = time.monotonic() + seconds
    while True:
        versions = win.take()
        if np.count_nonzero(versions) >= at_least or time.monotonic() > deadline:
            return versions
        win.release(0)
        time.sleep(1e-4)


def test_a_push_mixes_only_whole_verified_models():
    from asapmpi.testing.faults import corrupt_taken

    model = np.full(10, 2.0)
    mine = np.zeros(10)
    with _self_push_window(model.nbytes) as win:
        assert win.pushes and list(win.take()) == [0]           # nothing arrived
        win.push(model, 5, 0, words=[7, 8])
        versions = _take(win)
        assert list(versions) == [5] and list(win.taken_words(0)) == [7, 8]
        assert win.buffers.count("taken from 0") == 1
        # (w + w_peer) / 2, verified: header == footer == 5 and the checksum
        assert win.reduce_versions(mine, 0.5, np.array([0.5]), versions, checksum=True) == 1
        assert np.all(mine == 1.0)
        win.release(1 << 62)
        assert win.buffers.count("posted") == 4
        # two versions before a mix: only the newest is mixed (never a particular one)
        win.push(model * 2, 6, 0)
        win.push(model * 3, 7, 0)
        while win.sends_in_flight or win.waiting_peer >= 0:
            win.take()
            win.release(0)
        versions = _take(win)
        assert list(versions) == [7]
        win.reduce_versions(mine, 0.5, np.array([0.5]), versions, checksum=True)
        assert np.all(mine == 3.5)
        win.release(1 << 62)
        # a delivery torn under a whole header and footer: the checksum drops it, and
        # the buffer is left as it was
        win.push(model, 8, 0)
        versions = _take(win)
        corrupt_taken(win, versions, 0, 8, 12345)
        before = mine.copy()
        assert win.reduce_versions(mine, 0.5, np.array([0.5]), versions, checksum=True) == 0
        assert np.array_equal(mine, before) and win.stats[0, 1] == 1      # torn
        win.release(1 << 62)
        # a header that disagrees with its footer: not whole, never read
        win.push(model, 9, 0)
        versions = _take(win)
        corrupt_taken(win, versions, 0, -64, 10)
        assert win.reduce_versions(mine, 0.5, np.array([0.5]), versions, checksum=True) == 0
        assert np.array_equal(mine, before)
        win.release(1 << 62)
        assert win.pushed == 5 and win.arrived == 5


def test_push_refuses_bad_input_in_one_line():
    from mpi4py import MPI

    from asapmpi import _core
    from asapmpi.errors import ConfigError

    with _self_push_window(80) as win:
        for call, message in [
                (lambda: win.push(np.zeros(9), 1, 0), "buffer has 72 bytes but the model "
                                                      "has 80"),
                (lambda: win.push(np.zeros(10), 1, 3), "push gossip sends to a rank of "
                                                       "0..0, not 3"),
                (lambda: win.push(np.zeros(10), 0, 0), "versions start at 1, got 0"),
                (lambda: win.push(np.zeros(10), 1, 0, words=[1, 2, 3]),
                 "a model carries at most 2 words, got 3"),
                (lambda: win.wait_notifies(1, 1.0), "push gossip never waits for a model"),
                (lambda: win.slot_offset(0, 1), "pool of receive buffers"),
                (lambda: win.put(np.zeros(10), 1), "does not put()")]:
            with pytest.raises(ConfigError) as caught:
                call()
            assert message in str(caught.value) and "\n" not in str(caught.value)
    layout = _core.Layout(1, 1, 1, 80, 0, 0)
    with pytest.raises(ConfigError, match="needs depth 0, got depth=1"):
        _core.PushWindow(MPI.COMM_SELF, layout, [0], [0], [0], [0], [0], "float64")


def test_a_dropped_push_window_leaves_its_requests_with_their_memory():
    # dropped without free(): its receives are cancelled and its send in flight goes
    # with its stage to the leftovers, which free them once MPI completed them
    from asapmpi._core import slotwin

    win = _self_push_window(8000)
    win.push(np.ones(1000), 1, 0)
    win.push(np.ones(1000), 2, 0)                       # waits: one in flight per peer
    assert win.sends_in_flight == [0] or win.waiting_peer in (-1, 0)
    del win
    deadline = time.monotonic() + 10
    while any(t == "push" and n for t, n in slotwin.leftovers()):
        assert time.monotonic() < deadline, slotwin.leftovers()
        time.sleep(1e-3)


def gossip_pushes(comm, iters=60, n=20000, stop_early=-1, **options):
    """Every rank starts from a constant vector (its rank) and only gossips by pushes:
    every mix averages whole models (the buffer stays a constant vector), the replicas
    converge; rank `stop_early` stops after 10 steps (past the calibration's
    collective) and waits in free() while the others still push to it; returns the
    push trace and the channel's counts."""
    import asapmpi
    from asapmpi._core import slotwin

    rank = comm.Get_rank()
    buf = np.full(n, float(rank), dtype=np.float32)
    ex = asapmpi.Exchange(buf, sync="gossip", comm=comm, timeout=60, **options)
    torn = 0
    started = time.perf_counter()
    for _ in range(10 if rank == stop_early else iters):
        ex.step()
        torn += int(buf.max() != buf.min())
    wall, waited = time.perf_counter() - started, ex.wait_seconds
    win = ex.window
    counts = {"pushed": win.pushed, "arrived": win.arrived, "replaced": win.replaced,
              "yields": win.yields, "oversubscribed": ex.oversubscribed} \
        if win.pushes else {}
    pushes = ex.trace.get("pushes", np.zeros((0, 5)))
    values = comm.allgather(float(buf[0]))
    table = ex.policy._table        # the warm-up's times, ns (INF_NS: never measured)
    transport, report = ex.transport, ex.transport_report
    published = ex.policy.layouts[rank].n_publish
    ex.free()
    return {"torn": torn, "pushes": pushes.tolist(), "values": values, "wall_s": wall,
            "published_slots": published,
            "wait_s": waited, "transport": transport, "report": report,
            "leftovers": slotwin.leftovers(), "comm_s": ex.policy.report["comm_s"],
            "table_ns": None if table is None else table.tolist(), **counts}


@pytest.mark.mpi
@pytest.mark.parametrize("path", PATHS)
def test_pushed_models_are_whole_and_replicas_converge(path):
    results = run("test_gossip:gossip_pushes", 4, path, timeout=120, transport="messages")
    for rank, res in enumerate(results):
        assert res["transport"] == "messages" and res["torn"] == 0
        # nobody pulls one-sidedly: no model copies kept for pulls in the window
        assert res["published_slots"] == 0
        # where ranks share cores (4 ranks here on 2) a push in flight yields
        assert res["yields"] == res["oversubscribed"]
        pushes = np.array(res["pushes"])
        assert len(pushes) == 60 and np.all(pushes[:, 1] != rank)  # a peer each step
        assert res["pushed"] and res["arrived"] > 0 and res["leftovers"] == []
        assert 0 <= res["wait_s"] <= res["wall_s"], res
    # every model mixed was whole: values stay averages of the ranks' starting values
    # (0..3) and disagreement shrinks (not tighter: under load a descheduled rank mixes
    # late, as the pull test says)
    values = results[0]["values"]
    assert 0 <= min(values) and max(values) <= 3
    assert max(values) - min(values) < 0.25 * 3
    # a model arrives once (the rest of what was in flight, free() drained)
    assert sum(r["arrived"] for r in results) <= sum(r["pushed"] for r in results)


@pytest.mark.mpi
def test_pushes_warm_up_measures_narrow_peers_slow_and_narrow_links_are_slow():
    # the pull test's links, pushed: the sender sleeps out its own link's transfer
    narrow_seconds = 20000 * 4 * 8 / 40e6               # 16 ms to or from a narrow rank
    results = run("test_gossip:gossip_pushes", 4, "shm", timeout=120, iters=30, every=1,
                  warmup=1000, wide_mbps=2000.0, narrow_mbps=40.0, narrow=[2, 3],
                  transport="messages")
    for rank, res in enumerate(results):
        pushes = np.array(res["pushes"])
        involves = np.isin(pushes[:, 1], [2, 3]) | (rank in (2, 3))
        assert np.all(pushes[involves, 3] >= 0.95 * narrow_seconds)
        if rank in (0, 1):
            # what the warm-up's choice reads: narrow peers at their emulated time or
            # more (measured, or merged from the tables the senders pushed along)
            table = np.array(res["table_ns"])
            known = [p for p in (2, 3) if table[p] < INF_NS]
            assert known and all(table[p] >= 0.95 * narrow_seconds * 1e9 for p in known)
    comm = results[0]["comm_s"]
    assert min(comm[2], comm[3]) >= 0.95 * narrow_seconds


@pytest.mark.mpi
@pytest.mark.parametrize("path", PATHS)
def test_free_takes_the_pushes_still_in_flight(path):
    # rank 1 stops after 10 steps and waits in free() while the others push to it (and
    # their models queue behind its full receive pool): free() drains them all
    results = run("test_gossip:gossip_pushes", 4, path, timeout=120, transport="messages",
                  iters=30, stop_early=1)
    for res in results:
        assert res["torn"] == 0 and res["leftovers"] == []


def push_stall(comm, out, stall_at=10, iters=400, timeout=1.0, cap_s=60.0):
    """Rank 1 stops calling MPI before step stall_at + 1, until every other rank timed
    out (flags in `out`); the others step every 50 ms.  Each rank writes what it saw to
    `out` and the job ends there (os._exit): a rank that gave up on a peer holds sends
    that MPI_Finalize would wait for (a program ends such a job, as the abort hook
    does)."""
    import asapmpi
    from asapmpi.errors import NeighbourTimeoutError

    from scenarios import raise_flag, wait_for_flags  # tests/mpi, on the ranks' path

    rank, size = comm.Get_rank(), comm.Get_size()
    buf = np.zeros(1000)
    ex = asapmpi.Exchange(buf, sync="gossip", comm=comm, timeout=timeout,
                          transport="messages")
    seen = "no error"
    try:
        while ex.version < iters:
            if rank == 1 and ex.version == stall_at:
                seen = "told" if wait_for_flags(
                    out, [f"timed-out-{r}" for r in range(size) if r != 1], cap_s) \
                    else "never told"
                break
            time.sleep(0.05)
            ex.step()
    except NeighbourTimeoutError as exc:
        seen = str(exc)
    with open(os.path.join(out, f"seen-{rank}"), "w") as f:
        f.write(seen)
    if rank != 1:
        raise_flag(out, f"timed-out-{rank}")
        wait_for_flags(out, ["seen-1"], cap_s)
    os._exit(0)


@pytest.mark.mpi
@pytest.mark.parametrize("path", PATHS)
def test_a_push_to_a_stalled_rank_times_out_naming_it(tmp_path, path):
    # a push is never taken by a rank that stopped calling MPI: the pusher names it
    # after its timeout (1 s)
    from mpilaunch import launch

    launch("test_gossip:push_stall", 4, path, timeout=120, out=str(tmp_path))
    seen = {r: (tmp_path / f"seen-{r}").read_text() for r in range(4)}
    assert seen[1] == "told", seen
    for rank in (0, 2, 3):
        assert "its receive of a pushed model from rank 1;" in seen[rank], seen


@pytest.mark.mpi
@pytest.mark.parametrize("path", PATHS)
def test_auto_measures_pulls_against_pushes_and_reports_it(path):
    results = run("test_gossip:gossip_pushes", 4, path, timeout=120, iters=10)
    report = results[0]["report"]
    assert all(r["transport"] == results[0]["transport"] for r in results)
    steps = report["rounds"]["all peers"]
    assert report["unit"] == "us per model mixed" and report["requested"] == "auto"
    assert results[0]["transport"] == ("messages" if steps["messages"] < steps["words"]
                                       else "put"), report
    assert "pulls" in report["reason"] and "pushes" in report["reason"]
    # two published copies where pulls read them, none where models are pushed
    assert {r["published_slots"] for r in results} == \
        {2 if results[0]["transport"] == "put" else 0}
