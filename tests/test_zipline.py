"""ElasticBSP barrier selection: ZipLine exact against brute force (ties included),
FullGridScan optimal only for n <= 3, GridScan a heuristic with a reported gap, input
validation, the predictor, and the `bench zipline` command on a tiny grid."""
from __future__ import annotations

import argparse
import heapq
import itertools
import json

import numpy as np
import pytest

from asapmpi.bench import zipline as bench
from asapmpi.errors import ConfigError
from asapmpi.sync.zipline import full_gridscan, gridscan, predict_ends, zipline

ALGORITHMS = (zipline, gridscan, full_gridscan)


def brute_force(ends):
    """(spread, barrier, index tuple) of the best set over all R^n choices: smallest
    spread, then earliest barrier, then lexicographically smallest indices."""
    m = np.asarray(ends, dtype=np.float64)
    n, r = m.shape
    idx = np.array(list(itertools.product(range(r), repeat=n)), dtype=np.int64)
    times = m[np.arange(n), idx]
    hi, lo = times.max(axis=1), times.min(axis=1)
    spread = hi - lo
    # np.lexsort: last key is primary; product order is already lexicographic on idx
    best = np.lexsort((np.arange(len(idx)), hi, spread))[0]
    return float(spread[best]), float(hi[best]), tuple(int(i) for i in idx[best])


def heap_sweep(ends):
    """The textbook O(nR log n) smallest range covering n sorted lists: (spread, barrier)
    of the first minimal window in a left-to-right sweep; an independent reference for
    sizes brute force cannot reach."""
    m = np.asarray(ends, dtype=np.float64)
    n, r = m.shape
    heap = [(m[p, 0], p, 0) for p in range(n)]
    heapq.heapify(heap)
    hi = m[:, 0].max()
    best = (np.inf, np.inf)
    while True:
        lo, p, i = heapq.heappop(heap)
        if hi - lo < best[0]:
            best = (hi - lo, hi)
        if i + 1 == r:
            return best
        hi = max(hi, m[p, i + 1])
        heapq.heappush(heap, (m[p, i + 1], p, i + 1))


def random_cases(seed, count, integer=True, high=10):
    rng = np.random.default_rng(seed)
    for _ in range(count):
        n, r = int(rng.integers(1, 6)), int(rng.integers(1, 6))
        if integer:             # few distinct values: many ties, equal timestamps
            yield np.sort(rng.integers(0, high, (n, r)), axis=1).astype(np.float64)
        else:
            steps = rng.exponential(1.0, (n, r)) * (rng.random((n, r)) > 0.2)
            yield np.cumsum(steps, axis=1) + rng.uniform(-5, 5, (n, 1))


def check_consistent(ends, choice):
    m = np.asarray(ends, dtype=np.float64)
    n, r = m.shape
    assert choice.index.shape == (n,) and choice.times.shape == (n,)
    assert np.issubdtype(choice.index.dtype, np.integer)
    assert ((choice.index >= 0) & (choice.index < r)).all()
    assert np.array_equal(choice.times, m[np.arange(n), choice.index])
    assert choice.spread == choice.times.max() - choice.times.min()
    assert choice.barrier == choice.times.max()
    with pytest.raises(ValueError):
        choice.index[0] = 0         # read-only: a choice cannot be edited by accident


@pytest.mark.parametrize("integer", [True, False])
def test_zipline_equals_brute_force_with_its_tie_break(integer):
    for ends in random_cases(1 if integer else 2, 400, integer=integer):
        choice = zipline(ends)
        check_consistent(ends, choice)
        assert (choice.spread, choice.barrier, tuple(choice.index.tolist())) == \
            brute_force(ends), ends.tolist()


def test_zipline_tie_break_prefers_earliest_barrier_then_smallest_indices():
    # spreads 1 at barriers 2 ({1, 2}) and 6 ({5, 6}): the earliest barrier wins
    choice = zipline([[1, 5], [2, 6]])
    assert choice.index.tolist() == [0, 0] and choice.barrier == 2 and choice.spread == 1
    # equal timestamps in a row: the first one
    assert zipline([[3, 3, 3], [1, 3, 3]]).index.tolist() == [0, 1]
    # -0.0 and 0.0 are the same time
    assert zipline([[-0.0, 1.0], [0.0, 2.0]]).spread == 0.0
    # one worker: its next iteration
    assert zipline([[4.0, 5.0, 6.0]]).index.tolist() == [0]
    # every spread overflows to inf: still a choice, the earliest barrier
    huge = zipline([[-1e308, -1e308], [1e308, 1e308]])
    assert huge.index.tolist() == [0, 0] and huge.barrier == 1e308
    assert zipline([[-1e308], [1e308]]).index.tolist() == [0, 0]


def test_zipline_matches_an_independent_sweep_at_larger_sizes():
    rng = np.random.default_rng(3)
    for n, r in [(1000, 150), (50, 30), (200, 20), (7, 300)]:
        uniform = bench.random_sorted_ends(n, r, rng)    # every row over the same range
        choice = zipline(uniform)
        check_consistent(uniform, choice)
        assert (choice.spread, choice.barrier) == heap_sweep(uniform)
        ends = bench.generate_ends(n, r, rng)        # workers of different speeds
        choice = zipline(ends)
        check_consistent(ends, choice)
        assert (choice.spread, choice.barrier) == heap_sweep(ends)
        same = np.cumsum(rng.uniform(0.9, 1.1, (n, r)), axis=1)     # equal speeds
        assert (zipline(same).spread, zipline(same).barrier) == heap_sweep(same)
        ties = np.floor(ends / 2)                    # many ties across and within rows
        assert (ties[:, 1:] == ties[:, :-1]).any()
        assert (zipline(ties).spread, zipline(ties).barrier) == heap_sweep(ties)
        # one row far above the rest: the window's end stays on it for every point of
        # the others (the sweep's plateau jump)
        outlier = uniform.copy()
        outlier[n // 3] += 1000.0
        choice = zipline(outlier)
        check_consistent(outlier, choice)
        assert (choice.spread, choice.barrier) == heap_sweep(outlier)
        # plateaus that end and start again: rows in two groups far apart in time
        steps = uniform.copy()
        steps[::2] += 50.0 * np.arange(r)
        assert (zipline(steps).spread, zipline(steps).barrier) == heap_sweep(steps)


def test_full_gridscan_is_optimal_for_three_workers_or_fewer_and_never_better():
    for ends in itertools.chain(random_cases(4, 300), random_cases(5, 200, integer=False)):
        choice = full_gridscan(ends)
        check_consistent(ends, choice)
        best = brute_force(ends)[0]
        if ends.shape[0] <= 3:
            assert choice.spread == best, ends.tolist()
        else:
            assert choice.spread >= best


def test_full_gridscan_is_not_always_optimal():
    ends = [[0, 1], [0, 3], [1, 4], [3, 4]]         # the docstring's counterexample
    assert brute_force(ends)[:2] == (2.0, 3.0)
    assert zipline(ends).spread == 2.0 and zipline(ends).index.tolist() == [1, 1, 0, 0]
    assert full_gridscan(ends).spread == 3.0
    # and it is not an integer artefact: random real-valued cases miss too
    rng = np.random.default_rng(6)
    misses = 0
    for _ in range(300):
        m = np.cumsum(rng.exponential(1.0, (5, 4)), axis=1)
        misses += full_gridscan(m).spread > zipline(m).spread
    assert misses > 0


def test_gridscan_is_a_heuristic_never_better_sometimes_worse():
    worse = 0
    for ends in random_cases(7, 300):
        choice = gridscan(ends)
        check_consistent(ends, choice)
        best = brute_force(ends)[0]
        assert choice.spread >= best
        worse += choice.spread > best
    assert worse > 0
    ends = [[0, 1], [7, 9], [0, 4]]                  # the docstring's example
    assert gridscan(ends).spread == 7.0 and gridscan(ends).times.tolist() == [0, 7, 0]
    assert zipline(ends).spread == 6.0


def test_gridscan_designated_row_and_closest_point_rules():
    # row 1 holds the earliest first point: around 0 the set is {2, 0}, around 10
    # {11, 10}, around 12 {11, 12}; spread 1 twice: the earlier barrier wins
    choice = gridscan([[2, 2, 11], [0, 10, 12]])
    assert choice.spread == 1.0 and choice.index.tolist() == [2, 1]
    # equal timestamps in a row: the first one, for the designated and the other rows
    assert gridscan([[0, 6, 6], [5, 5, 30]]).index.tolist() == [1, 0]
    # equally near neighbours: the earlier one ({0, 1} would do as well)
    assert gridscan([[-5, 0], [-1, 1]]).times.tolist() == [0, -1]


def test_benchmark_reports_the_gridscan_gap(monkeypatch):
    monkeypatch.setitem(bench.INPUTS, "realistic",
                        lambda n, r, rng: np.array([[0.0, 1.0], [7.0, 9.0], [0.0, 4.0]]))
    (row,) = bench.measure([3], [2], repeats=1, seed=0, budget=20)
    assert row["optimal_spread"] == 6.0
    grid = row["algorithms"]["gridscan"]
    assert grid["spread"] == 7.0 and grid["gap"] == 1.0 and grid["optimal"] is False
    assert grid["ratio"] == pytest.approx(7 / 6)
    assert row["algorithms"]["full_gridscan"]["gap"] == 0.0
    assert "+1 (1.17x)" in bench.format_report([row], {"status": "not measured"}, 1)


@pytest.mark.parametrize("ends, message", [
    ([1.0, 2.0], "must be 2-D"),
    ([[[1.0]]], "must be 2-D"),
    (np.empty((0, 3)), "at least 1 worker"),
    (np.empty((3, 0)), "at least 1 worker"),
    ([[1.0, np.nan]], "must be finite"),
    ([[1.0, 2.0], [0.0, np.inf]], r"finite.*worker 1"),
    ([[1.0, 2.0], [3.0, 2.0]], "non-decreasing; sort worker 1"),
    ([[1.0, 2.0], [3.0]], "n x R array"),
    ([["a", "b"]], "n x R array"),
])
def test_bad_ends_are_refused_with_one_line(ends, message):
    for algorithm in ALGORITHMS:
        with pytest.raises(ConfigError, match=message) as info:
            algorithm(ends)
        assert "\n" not in str(info.value)


def test_predict_ends_from_recent_intervals():
    history = [np.array([0.0, 1.0, 2.0, 3.0]), [0, 2, 4, 6, 8, 10, 20]]
    ends = predict_ends(history, 3)
    # worker 1: mean of its last 5 intervals (20 - 2) / 5 = 3.6
    np.testing.assert_allclose(ends, [[4, 5, 6], [23.6, 27.2, 30.8]])
    np.testing.assert_allclose(predict_ends(history, 2, window=1), [[4, 5], [30, 40]])
    # window longer than the history: all its intervals
    np.testing.assert_allclose(predict_ends([[0, 2]], 2, window=5), [[4, 6]])
    # now: a late worker ends its current iteration now; on-time workers unchanged
    np.testing.assert_allclose(predict_ends(history, 3, now=25),
                               [[25, 26, 27], [25, 28.6, 32.2]])
    np.testing.assert_allclose(predict_ends(history, 3, now=1), ends)
    assert zipline(ends).index.tolist() == [2, 0]


@pytest.mark.parametrize("history, R, kwargs, message", [
    ([[0.0, 1.0], [5.0]], 3, {}, r"history\[1\] needs at least 2"),
    ([[0.0, 1.0], [2.0, 1.0]], 3, {}, "non-decreasing"),
    ([[0.0, np.nan]], 3, {}, "finite"),
    ([], 3, {}, "at least one worker"),
    ([[0.0, 1.0]], 0, {}, "R .* >= 1"),
    ([[0.0, 1.0]], 2, {"window": 0}, "window"),
    ([[0.0, 1.0]], 2, {"now": float("nan")}, "now must be"),
])
def test_predict_ends_refuses_bad_input(history, R, kwargs, message):
    with pytest.raises(ConfigError, match=message):
        predict_ends(history, R, **kwargs)


def tiny_args(tmp_path, *extra):
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    return parser.parse_args(["--workers", "5", "--R", "4", "--repeats", "1",
                              "--json", str(tmp_path / "z.json"), *extra])


def test_benchmark_run_on_a_tiny_grid(tmp_path, capsys):
    args = tiny_args(tmp_path)
    assert args.workers == [5] and args.R == [4]
    assert bench.run(args) == 0
    out = capsys.readouterr().out
    assert "ZipLine" in out and "GridScan" in out and "not measured" in out
    report = json.loads((tmp_path / "z.json").read_text())
    assert {"paper_us", "results", "goal", "seed", "repeats", "ok"} <= set(report)
    assert report["paper_us"]["zipline"]["n=1000,R=150"] == 2.38e6
    (row,) = report["results"]
    assert (row["workers"], row["R"]) == (5, 4)
    assert set(row["algorithms"]) == {"zipline", "gridscan", "full_gridscan"}
    for res in row["algorithms"].values():
        assert res["status"] == "ok" and res["median_us"] > 0 and res["repeats"] == 1
        assert res["gap"] >= 0 and res["spread"] >= row["optimal_spread"]
    assert row["algorithms"]["zipline"]["gap"] == 0
    assert report["goal"]["status"] == "not measured" and report["ok"] is True


def test_benchmark_random_sorted_rows_input(tmp_path, capsys):
    args = tiny_args(tmp_path, "--input", "random")
    assert bench.run(args) == 0
    assert "input: random" in capsys.readouterr().out
    report = json.loads((tmp_path / "z.json").read_text())
    assert report["input"] == "random"
    assert report["results"][0]["algorithms"]["zipline"]["gap"] == 0
    ends = bench.random_sorted_ends(5, 4, np.random.default_rng(0))
    assert ends.shape == (5, 4) and (np.diff(ends, axis=1) >= 0).all()


def test_benchmark_goal_pass_and_fail(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "GOAL_WORKERS", 5)
    monkeypatch.setattr(bench, "GOAL_R", 4)
    monkeypatch.setattr(bench, "GOAL_SECONDS", 10.0)      # passes even on a busy machine
    assert bench.run(tiny_args(tmp_path)) == 0
    assert json.loads((tmp_path / "z.json").read_text())["goal"]["status"] == "PASS"
    monkeypatch.setattr(bench, "GOAL_SECONDS", 0.0)
    assert bench.run(tiny_args(tmp_path)) == 1
    report = json.loads((tmp_path / "z.json").read_text())
    assert report["goal"]["status"] == "FAIL" and report["ok"] is False


def test_benchmark_skips_calls_over_the_budget():
    res = bench._time_calls(zipline, np.ones((2, 2)), repeats=5, budget=1.0, estimate=2.0)
    assert res["status"] == "skipped" and res["estimated_us"] == 2e6
    res = bench._time_calls(zipline, np.ones((2, 2)), repeats=5, budget=1.0, estimate=0.1)
    assert res["status"] == "ok" and res["repeats"] == 5


@pytest.mark.parametrize("argv", [["--workers", "5,x"], ["--R", ""]])
def test_benchmark_bad_lists(argv):
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(argv)


def test_benchmark_bad_numbers(tmp_path):
    with pytest.raises(ConfigError, match="--workers needs integers >= 1"):
        bench.run(tiny_args(tmp_path, "--workers", "0"))
    with pytest.raises(ConfigError, match="--repeats"):
        bench.run(tiny_args(tmp_path, "--repeats", "0"))
