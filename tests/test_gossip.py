"""sync="gossip": pull gossip with a period, the warm-up's peer choice, the congestion
condition, and emulated link bandwidth."""
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
    results = run("gossip_pulls_whole_models", 4, path, timeout=300, every=period)
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
            "narrow": [2, 3]}
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
