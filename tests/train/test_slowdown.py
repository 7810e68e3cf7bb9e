"""Slowdown injection: reproducible, the right rate, the right ranks, bad input refused."""
import json
import subprocess
import sys

import pytest

from asapmpi.errors import ConfigError
from asapmpi.launch.slowdown import Slowdown, from_options, uniform


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


#: hold(0.3) and a sleep of 0.01 s in a fresh process (no thread of the test session
#: competes for its GIL, whose hand-overs would be voluntary switches too): seconds
#: held and the voluntary context switches of each
HOLD = """
import json, resource, time
from asapmpi.launch.slowdown import hold

def switches():
    return resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw

wall, held = time.perf_counter(), switches()
hold(0.3)
wall, held = time.perf_counter() - wall, switches() - held
slept = switches()
time.sleep(0.01)
print(json.dumps({"wall": wall, "held": held, "slept": switches() - slept}))
"""


def test_a_held_slowdown_keeps_the_core_busy_for_its_time():
    # the trainer's extra compute of a slowed worker: it must take this rank's CPU share
    # (a sleep would lend it to the other ranks of an oversubscribed host) and last as
    # long as asked.  Its CPU time cannot tell: a spin gets the share of the cores that
    # the host's load leaves it (~20% with 8 other busy processes on 2 cores, less
    # with more).  Its voluntary context switches can: every sleep or blocking wait is
    # one; a spin makes none, however often it is preempted (those are involuntary)
    proc = subprocess.run([sys.executable, "-c", HOLD], capture_output=True, text=True,
                          timeout=120, check=True)
    got = json.loads(proc.stdout)
    # at least its deadline; at most 10x it (only a preemption past the deadline adds)
    assert 0.3 <= got["wall"] < 3.0, got
    assert got["held"] == 0, got
    # and the count does tell a sleep apart
    assert got["slept"] >= 1, got
