"""Serial tests of the iteration-gap bounds and the trace checker."""
import numpy as np
import pytest

import asapmpi
from asapmpi import trace
from asapmpi.errors import ConfigError


def test_path_lengths_and_bounds():
    ring = asapmpi.graph("ring", 4)                  # i -> i+1
    d = trace.path_lengths(ring)
    assert d[0, 1] == 1 and d[1, 0] == 3 and d[2, 2] == 0
    # Theorem 1: Iter(i) - Iter(j) <= len(j -> i); i = 1, j = 0: len(0 -> 1) = 1
    assert trace.gap_bounds(ring, "standard")[1, 0] == 1
    # NOTIFY-ACK: min(len(j->i), 2 len(i->j)) for i = 0, j = 1: min(3, 2) = 2
    assert trace.gap_bounds(ring, "notify_ack")[0, 1] == 2
    # tokens: min(len(j->i), max_gap len(i->j)), i = 0, j = 1, max_gap 2: min(3, 2) = 2
    assert trace.gap_bounds(ring, "tokens", max_gap=2)[0, 1] == 2
    assert trace.gap_bounds(ring, "backup", max_gap=2)[1, 0] == 6
    assert trace.gap_bounds(ring, "staleness", max_gap=9, staleness=1)[1, 0] == 2
    with pytest.raises(ConfigError, match="setting must be one of"):
        trace.gap_bounds(ring, "other")


def steady(n_iters, start, period):
    hi = start + period * np.arange(n_iters)
    return {"lo": hi - period * 0.1, "hi": hi}


def test_checker_accepts_a_run_within_bounds_and_catches_one_outside():
    g = asapmpi.graph("bidirectional-ring", 2)
    bounds = trace.gap_bounds(g, "tokens", max_gap=1)          # |gap| <= 1
    fine = [steady(10, 0.0, 1.0), steady(10, 0.5, 1.0)]
    assert trace.check_gaps(fine, bounds) == []
    assert trace.max_gaps(fine)[0, 1] <= 1
    # rank 0 races three iterations ahead of rank 1 at t = 3
    racing = [steady(10, 0.0, 1.0), steady(10, 2.5, 1.0)]
    found = trace.check_gaps(racing, bounds)
    assert found and found[0]["i"] == 0 and found[0]["j"] == 1
    assert found[0]["iter_i"] - found[0]["iter_j"] > found[0]["bound"]
