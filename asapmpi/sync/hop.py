"""Hop (ASPLOS'19, sections 4 and 6): update queues, token queues and backup workers.

Update queues: every sender has depth = max_gap + 1 slots at each receiver; the update of
iteration k goes into slot k mod depth (Hop 6.1), written with the ordered sequence and
a notify, with no ACK.

Token queues (Hop 4.2) as counters: a worker publishes the number of iterations it has
completed into the ack word it owns at each in-neighbour (MPI_Accumulate REPLACE); to
enter iteration k+1 it waits, reading its own words atomically, until every
out-neighbour has completed at least k - max_gap iterations.  The token count
TokenQ(j -> i).size() = Iter(j) - Iter(i) + max_gap of the paper is exactly
completed(j) + 1 + max_gap - (k + 1) here, so Theorem 2 holds: Iter(i) - Iter(j) <=
max_gap for every out-neighbour j.

That invariant is what makes the rotating slots safe: when i writes version k into slot
k mod depth at j, j has completed iteration k - depth, whose update lived in that slot;
and j reads slot k mod depth in iteration k while no sender can write k + depth there
before j completes k.

Backup workers (Hop 4.3, option backup=b): Rec(k) waits for version k from at least
in-degree - b in-neighbours, reduces those that have arrived (renormalized weights) and
never reads a slot whose notify is not k (its sender may be writing it); a late update is
overwritten later and never reduced into another iteration (its version differs).

Every iteration's entry is traced: `trace_lo[k]` before the token wait, `trace_hi[k]`
after publishing, on the host's monotonic clock, so asapmpi.trace can check the bounds
of Theorem 2 and Table 1 on every run.
"""
from __future__ import annotations

import time
from typing import Dict

import numpy as np

from ..errors import ConfigError
from .base import Policy, StepContext


class Hop(Policy):
    """Hop's queue-based protocol: options max_gap (>= 1, default 2) and backup (>= 0)."""

    name = "hop"

    def __init__(self, max_gap: int = 2, backup: int = 0):
        for label, value, low in (("max_gap", max_gap, 1), ("backup", backup, 0)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
                raise ConfigError(f"hop option {label} must be an integer >= {low}, got "
                                  f"{value!r}")
        self.max_gap = int(max_gap)
        self.backup = int(backup)
        self.depth = self.max_gap + 1
        self._lo = [0.0, 0.0]
        self._hi = [0.0, 0.0]

    def options(self) -> Dict[str, int]:
        """The options, as every rank must have given them."""
        return {"max_gap": self.max_gap, "backup": self.backup}

    def validate(self, graph, rank: int) -> None:
        """Refuse a backup count that leaves a rank nothing to wait for."""
        worst = min(graph.in_degree(r) for r in range(graph.n))
        if graph.n > 1 and self.backup >= worst:
            raise ConfigError(f"hop backup={self.backup} must be smaller than the smallest "
                              f"in-degree of the graph ({worst}): every rank must wait for at "
                              f"least one in-neighbour")

    def start(self) -> None:
        """Iteration 1 is entered when the exchange is created."""
        now = time.monotonic()
        self._lo = [0.0, float("-inf")]
        self._hi = [0.0, now]

    def step(self, win, buf, version: int, ctx: StepContext) -> None:
        k = version
        win.put(buf, k, k, checksum=ctx.checksum)                       # Send(k)
        if self.backup:
            win.wait_notifies_count(k, win.n_in - self.backup, ctx.timeout)
        else:
            win.wait_notifies(k, ctx.timeout)                           # Rec(k)
        win.reduce(buf, ctx.w_self, ctx.weights, k, k, k, checksum=ctx.checksum,
                   renormalize=self.backup > 0, require_all=self.backup == 0,
                   only_notified=self.backup > 0)                        # Reduce
        # enter k+1: a token from every out-neighbour, then one for every in-neighbour
        self._lo.append(time.monotonic())
        win.wait_acks(k - self.max_gap, ctx.timeout, at_least=True)
        win.ack(k)
        self._hi.append(time.monotonic())

    @property
    def trace(self) -> Dict[str, np.ndarray]:
        """Entry times of iterations 1, 2, ...: lo (before the token wait: the iteration
        cannot have been entered earlier) and hi (after publishing: entered by then)."""
        return {"lo": np.array(self._lo[1:]), "hi": np.array(self._hi[1:])}
