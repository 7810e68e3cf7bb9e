"""One short multi-rank run per policy, on every channel that fits it: the quick tier's
check that each policy still steps end to end (`bash dev/test.sh --quick` runs these
and the serial tests; the full suite holds the exact checks).

Each run: 4 ranks, every rank's buffer starts at its rank number, 25 steps, then free().
What must hold for every policy: no error or timeout, every value finite and inside the
range of the starting values (every reduce is a convex combination of versions that
were sent); for the lockstep averaging policies on a doubly stochastic graph, the mean
over the ranks is kept exactly (up to rounding).
"""
from __future__ import annotations

import numpy as np
import pytest

from mpilaunch import run

pytestmark = [pytest.mark.mpi, pytest.mark.smoke]

#: (policy spec, transports that fit it, whether the rank mean is kept)
POLICIES = [
    ("notify_ack", ("put", "shared", "messages"), True),
    ("hop:max_gap=2", ("put", "messages"), False),
    ("hop:backup=1", ("put", "messages"), False),
    ("bsp", ("put", "messages"), False),
    ("async", ("put", "messages"), False),
    ("backup_ps:backup=1", ("put", "messages"), False),
    ("elastic", ("put", "messages"), False),
    ("gossip", ("put", "messages"), False),
    ("allreduce", ("auto",), True),
]


def policy_smoke(comm, spec, transport, steps=25, n=1000):
    """Run policy `spec` for `steps` steps on `transport`; every rank reports its
    buffer's range and mean, and the transport the Exchange took."""
    from asapmpi import Exchange

    name, *opts = spec.split(":")
    options = {}
    for opt in opts:
        key, value = opt.split("=")
        options[key] = int(value)
    buf = np.full(n, float(comm.rank))
    graph = None if name in ("backup_ps", "elastic", "gossip", "allreduce") else "complete"
    with Exchange(buf, graph=graph, sync=name, transport=transport, timeout=30.0,
                  **options) as ex:
        out = buf
        # by version, not by calls: a parameter server's worker (backup_ps, elastic) may
        # jump ahead to the newest model in one step
        while ex.version < steps:
            out = ex.step()
        taken = ex.transport
    return {"min": float(out.min()), "max": float(out.max()), "mean": float(out.mean()),
            "finite": bool(np.isfinite(out).all()), "transport": taken}


@pytest.mark.parametrize(
    ("spec", "transport", "keeps_mean"),
    [(spec, t, keeps) for spec, fits, keeps in POLICIES for t in fits])
def test_each_policy_steps_on_each_channel_that_fits_it(spec, transport, keeps_mean):
    res = run("test_smoke:policy_smoke", 4, "shm", timeout=120, spec=spec,
              transport=transport)
    for r in res:
        assert r["finite"] and -1e-12 <= r["min"] <= r["max"] <= 3 + 1e-12, (spec, r)
        if transport != "auto":
            assert r["transport"] == transport, r
    if keeps_mean:
        assert abs(np.mean([r["mean"] for r in res]) - 1.5) < 1e-9, res
