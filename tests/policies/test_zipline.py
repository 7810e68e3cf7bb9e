"""ElasticBSP barrier selection: ZipLine exact against brute force (ties included) and
against an independent heap sweep on every input family of the benchmark and on inputs
that take the C code's rarer paths, FullGridScan optimal only for n <= 3, GridScan a
heuristic with a reported gap, input validation, the predictor, the benchmark's input
families, and the `bench zipline` command on a tiny grid."""
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
    with np.errstate(over="ignore"):        # spreads of +-1e308 overflow to inf, as in C
        spread = hi - lo
    # np.lexsort: last key is primary; product order is already lexicographic on idx
    best = np.lexsort((np.arange(len(idx)), hi, spread))[0]
    return float(spread[best]), float(hi[best]), tuple(int(i) for i in idx[best])


def heap_sweep(ends, with_lo=False):
    """The textbook O(nR log n) smallest range covering n sorted lists: (spread, barrier)
    of the first minimal window in a left-to-right sweep (and its start lo if
    ``with_lo``); an independent reference for sizes brute force cannot reach."""
    m = np.asarray(ends, dtype=np.float64)
    n, r = m.shape
    heap = [(m[p, 0], p, 0) for p in range(n)]
    heapq.heapify(heap)
    hi = m[:, 0].max()
    best = None
    while True:
        lo, p, i = heapq.heappop(heap)
        with np.errstate(over="ignore"):
            if best is None or hi - lo < best[0]:
                best = (hi - lo, hi, lo)
        if i + 1 == r:
            return best if with_lo else best[:2]
        hi = max(hi, m[p, i + 1])
        heapq.heappush(heap, (m[p, i + 1], p, i + 1))


def check_against_heap_sweep(ends):
    """ZipLine's choice is consistent, has the reference's spread, barrier and first
    arrival, and takes every worker's first end at or after that arrival."""
    m = np.asarray(ends, dtype=np.float64)
    choice = zipline(m)
    check_consistent(m, choice)
    spread, barrier, lo = heap_sweep(m, with_lo=True)
    assert (choice.spread, choice.barrier) == (spread, barrier)
    assert choice.times.min() == lo
    assert choice.index.tolist() == (m < lo).sum(axis=1).tolist()


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


def test_zipline_plateau_ties_keep_the_smallest_indices():
    # 1.0 - 0.0 and 1.0 - 5e-324 round to the same spread: the windows starting at 0.0
    # and at 5e-324 tie on spread and barrier, and the first has the smaller indices.
    # The heap sweep's plateau jump (18ab137) went to a plateau's last window, assuming
    # spreads fall strictly along it, and took the second: index 3 for worker 1.
    ends = [[-1e308, -1e308, 1.0, 1.0], [-1e308, -1.0, 0.0, 5e-324],
            [-1.0, 0.0, 1.0, 1e308], [-1e308, -1.0, 5e-324, 1.0]]
    choice = zipline(ends)
    assert brute_force(ends) == (1.0, 1.0, (2, 2, 1, 2))
    assert (choice.spread, choice.barrier, tuple(choice.index.tolist())) == \
        brute_force(ends)


@pytest.mark.parametrize("kind", list(bench.INPUTS))
def test_zipline_matches_an_independent_sweep_on_every_input_family(kind):
    rng = np.random.default_rng(3)
    for n, r in [(1000, 150), (50, 30), (200, 20), (7, 300), (1, 5), (4, 1)]:
        check_against_heap_sweep(bench.INPUTS[kind](n, r, rng))


def test_zipline_matches_an_independent_sweep_on_other_shapes():
    rng = np.random.default_rng(4)
    for n, r in [(1000, 150), (50, 30), (200, 20), (7, 300)]:
        uniform = bench.uniform_ends(n, r, rng)
        ties = np.floor(bench.cumulative_ends(n, r, rng) / 2)    # ties across and within rows
        assert (ties[:, 1:] == ties[:, :-1]).any()
        check_against_heap_sweep(ties)
        low = uniform.copy()                # one worker far ahead: L1 is its last end
        low[n // 3] -= 1000.0
        check_against_heap_sweep(low)
        steps = uniform.copy()              # rows in two groups far apart in time
        steps[::2] += 50.0 * np.arange(r)
        check_against_heap_sweep(steps)


@pytest.mark.parametrize("case", ["scale-free", "tiny powers", "one point far below",
                                  "lockstep and one point far below", "a dense cluster",
                                  "huge range", "tiny range", "few values"])
def test_zipline_matches_an_independent_sweep_off_the_common_paths(case):
    # inputs that take the C code's rarer paths (checked once with counters in a copy
    # of asapmpi/sync/_sweep.pyx): most gaps in a few equal-width buckets (it buckets
    # again on the keys), gathered buckets of many gaps (a level below; two levels for
    # the dense cluster), widths that overflow or underflow (keys from the start),
    # buckets of one start value
    rng = np.random.default_rng(5)
    n, r = 300, 60
    if case == "scale-free":
        ends = np.sort(np.exp(rng.uniform(0.0, 700.0, (n, r))), axis=1)
    elif case == "tiny powers":
        ends = np.sort(rng.uniform(0.0, 1.0, (n, r)) ** 50, axis=1)
    elif case == "one point far below":
        ends = bench.uniform_ends(n, r, rng)
        ends[5, 0] = -1e6
    elif case == "lockstep and one point far below":
        ends = bench.lockstep_ends(n, r, rng)
        ends[0, 0] = -1e9
    elif case == "a dense cluster":     # rows in lockstep 1e-9 s apart, among others
        cluster = 50.0 + (np.arange(20)[None, :] * n + np.arange(n)[:, None]) * 1e-9
        ends = np.sort(np.hstack([cluster, rng.uniform(0.0, 100.0, (n, r - 20))]), axis=1)
    elif case == "huge range":
        ends = np.sort(rng.uniform(-1.0, 1.0, (n, r)), axis=1) * 1e308
        ends[:, 0], ends[:, -1] = -1.7e308, 1.7e308         # L1 - low overflows
    elif case == "tiny range":
        ends = np.sort(rng.integers(0, 50, (n, r)), axis=1) * 5e-324    # denormals
    else:
        ends = np.sort(rng.choice([-3.0, -0.0, 0.0, 2.0, 2.5, 7.0], (n, r)), axis=1)
    check_against_heap_sweep(ends)


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
    monkeypatch.setitem(bench.INPUTS, "cumulative",
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
    assert {"paper_us", "families", "goal", "seed", "repeats", "inputs", "ok"} <= set(report)
    assert report["paper_us"]["zipline"]["n=1000,R=150"] == 2.38e6
    assert report["inputs"] == ["cumulative"] and list(report["families"]) == ["cumulative"]
    (row,) = report["families"]["cumulative"]["results"]
    assert (row["workers"], row["R"]) == (5, 4)
    assert set(row["algorithms"]) == {"zipline", "gridscan", "full_gridscan"}
    for res in row["algorithms"].values():
        assert res["status"] == "ok" and res["median_us"] > 0 and res["repeats"] == 1
        assert res["gap"] >= 0 and res["spread"] >= row["optimal_spread"]
    assert row["algorithms"]["zipline"]["gap"] == 0
    assert report["goal"]["status"] == "not measured" and report["ok"] is True
    assert report["goal"]["families"]["cumulative"]["status"] == "not measured"


def test_benchmark_runs_every_input_family_in_one_report(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(bench, "GOAL_WORKERS", 5)
    monkeypatch.setattr(bench, "GOAL_R", 4)
    monkeypatch.setattr(bench, "GOAL_SECONDS", 10.0)      # passes even on a busy machine
    assert bench.run(tiny_args(tmp_path, "--input", "all")) == 0
    out = capsys.readouterr().out
    report = json.loads((tmp_path / "z.json").read_text())
    assert report["inputs"] == list(bench.INPUTS) == list(report["families"])
    assert set(report["goal"]["families"]) == set(bench.INPUTS)
    for kind, family in report["families"].items():
        assert f"input: {kind} ({bench.describe_input(kind)})" in out
        assert family["description"] == bench.describe_input(kind)
        (row,) = family["results"]
        assert row["algorithms"]["zipline"]["gap"] == 0
        goal = family["goal"]
        assert goal["status"] == "PASS"
        assert goal["zipline_min_ms"] <= goal["zipline_ms"] <= goal["zipline_max_ms"]
        assert "PASS" in [line.split()[-1] for line in out.splitlines()
                          if line.strip().startswith(kind + " ")]
    assert report["goal"]["status"] == "PASS" and report["ok"] is True
    assert "per input family" in out


def test_benchmark_one_failing_family_fails_the_goal(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "GOAL_WORKERS", 5)
    monkeypatch.setattr(bench, "GOAL_R", 4)
    monkeypatch.setattr(bench, "GOAL_SECONDS", 10.0)
    slow = np.arange(20.0).reshape(5, 4)            # the family that misses the goal
    monkeypatch.setitem(bench.INPUTS, "sorted", lambda n, r, rng: slow)
    time_calls = bench._time_calls

    def twenty_seconds_on_slow(fn, ends, *args):
        res = time_calls(fn, ends, *args)
        if ends is slow:
            res.update(median_us=20e6, min_us=20e6, runs_us=[20e6])
        return res

    monkeypatch.setattr(bench, "_time_calls", twenty_seconds_on_slow)
    assert bench.run(tiny_args(tmp_path, "--input", "uniform,sorted")) == 1
    report = json.loads((tmp_path / "z.json").read_text())
    assert report["goal"]["families"]["uniform"]["status"] == "PASS"
    assert report["goal"]["families"]["sorted"]["status"] == "FAIL"
    assert report["goal"]["status"] == "FAIL" and report["ok"] is False


@pytest.mark.parametrize("text, names", [
    ("random", ["uniform"]), ("realistic", ["cumulative"]),
    ("uniform,uniform, random", ["uniform"]), ("all", list(bench.INPUTS)),
    ("lockstep,all", ["lockstep"] + [k for k in bench.INPUTS if k != "lockstep"]),
    ("all-ties,one-outlier", ["all-ties", "one-outlier"])])
def test_benchmark_input_names_and_old_aliases(text, names):
    assert bench.parse_inputs(text) == names


@pytest.mark.parametrize("text, message", [
    ("bogus", "--input 'bogus' is not an input family; choose from cumulative, uniform"),
    ("uniform,x", "--input 'x' is not an input family"),
    ("", "--input needs at least one input family"),
    (" , ", "--input needs at least one input family")])
def test_benchmark_bad_input_is_one_line(tmp_path, text, message):
    with pytest.raises(ConfigError, match=message) as info:
        bench.run(tiny_args(tmp_path, "--input", text))
    assert "\n" not in str(info.value)
    assert not (tmp_path / "z.json").exists()       # refused before any work


@pytest.mark.parametrize("kind", list(bench.INPUTS))
def test_input_families_shapes_and_properties(kind):
    gen = bench.INPUTS[kind]
    for n, r in [(1, 1), (1, 6), (5, 1), (40, 25)]:
        ends = gen(n, r, np.random.default_rng(7))
        assert ends.shape == (n, r) and ends.dtype == np.float64
        assert np.isfinite(ends).all() and (np.diff(ends, axis=1) >= 0).all()
        # one seed, one matrix
        assert np.array_equal(ends, gen(n, r, np.random.default_rng(7)))
        assert gen.__doc__ and bench.describe_input(kind)
    ends = gen(40, 25, np.random.default_rng(8))
    if kind == "uniform":
        assert (ends >= 0).all() and (ends < 100).all()
    elif kind == "cumulative":
        steps = np.diff(ends, axis=1, prepend=0.0)
        assert (steps > 0.8 * 0.9 - 1e-12).all() and (steps < 1.2 * 3.0 * 1.1 + 1e-12).all()
        assert steps.max(axis=1).min() < steps.min(axis=1).max()    # different speeds
    elif kind == "homogeneous":
        steps = np.diff(ends, axis=1, prepend=0.0)
        assert (steps > 0.9 - 1e-12).all() and (steps < 1.1 + 1e-12).all()
    elif kind == "sorted":                  # row by row, globally sorted
        assert (np.diff(ends.ravel()) >= 0).all()
        assert (ends[1:, 0] > ends[:-1, -1]).all()
    elif kind == "lockstep":                # column by column, globally sorted
        assert (np.diff(ends.ravel(order="F")) >= 0).all()
        assert (ends[:, 1:].min(axis=0) > ends[:, :-1].max(axis=0)).all()
    elif kind == "all-ties":
        assert (ends == ends[0]).all() and len(np.unique(ends)) == 25
        assert zipline(ends).spread == 0.0
    elif kind == "one-outlier":
        others = np.delete(ends, 20, axis=0)
        assert ends[20].min() > others.max() + 900


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
