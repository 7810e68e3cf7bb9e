"""Slowdown injection: reproducible, the right rate, the right ranks, bad input refused."""
import time

import pytest

from asapmpi.errors import ConfigError
from asapmpi.launch.slowdown import Slowdown, from_options, hold, uniform


def test_random_slowdown_is_reproducible_and_has_the_right_rate():
    s = Slowdown("random", factor=6, probability=0.125, seed=3)
    draws = [s.factor_for(r, k) for r in range(8) for k in range(2000)]
    assert draws == [s.factor_for(r, k) for r in range(8) for k in range(2000)]
    assert set(draws) == {1.0, 6.0}
    rate = draws.count(6.0) / len(draws)
    assert 0.11 < rate < 0.14
    other = Slowdown("random", factor=6, probability=0.125, seed=4)
    assert draws != [other.factor_for(r, k) for r in range(8) for k in range(2000)]
    assert 0.0 <= uniform(1, 2, 3) < 1.0


def test_deterministic_and_none():
    s = Slowdown("deterministic", factor=4, ranks=(2,))
    assert s.factor_for(2, 7) == 4 and s.factor_for(1, 7) == 1
    assert Slowdown().factor_for(0, 0) == 1.0
    assert from_options("random", 6, 0, (), 0, 8).probability == 1 / 8


@pytest.mark.parametrize("kwargs, message", [
    ({"kind": "sometimes"}, "kind must be one of"),
    ({"kind": "random", "factor": 0.5}, "factor must be >= 1"),
    ({"kind": "random", "factor": 2, "probability": 2}, "probability must be in"),
    ({"kind": "deterministic", "factor": 2}, "needs ranks"),
])
def test_bad_slowdowns(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        Slowdown(**kwargs)


def test_a_held_slowdown_keeps_the_core_busy_for_its_time():
    # the trainer's extra compute of a slowed worker: it must take this rank's CPU share
    # (a sleep would lend it to the other ranks of an oversubscribed host) and last as
    # long as asked. CPU time: even with 8 other busy processes on 2 cores, a spin gets
    # ~20% of its wall time; a sleep of 0.3 s costs microseconds
    wall, cpu = time.perf_counter(), time.process_time()
    hold(0.3)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    assert 0.3 <= wall < 3.0
    assert cpu > 0.03, f"{cpu:.4f} s of CPU in {wall:.3f} s"
