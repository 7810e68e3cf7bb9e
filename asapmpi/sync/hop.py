"""Hop (ASPLOS'19, sections 4 and 6): update queues, token queues and backup workers.

Update queues: every sender has depth = max_gap + 1 (+ staleness s) slots at each
receiver; the update of iteration k goes into slot k mod depth (Hop 6.1), written with
the ordered sequence and a notify, with no ACK.

Token queues (Hop 4.2) as counters: a worker publishes the number of iterations it has
completed with the channel's release(k) (the ack word it owns at each in-neighbour,
MPI_Fetch_and_op REPLACE, issued lazily like every notify and ack; a token message on
a mailbox); to enter iteration k+1 it waits, await_(k - max_gap, RELEASED), reading its
own words atomically, until every out-neighbour has completed at least k - max_gap
iterations.  The token count
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
from typing import Dict, Optional

import numpy as np

from ..errors import ConfigError
from ..options import Option, Options
from .base import Await, Policy, Reads, StepContext
from .records import entry_trace


class Hop(Policy):
    """Hop's queue-based protocol."""

    name = "hop"
    reduces_last = True
    #: rotating update slots and token counters in window words it waits on; the
    #: oldest version it may still reduce is `retain` (its staleness) behind its last
    #: ack (set in __init__)
    reads = Reads.WORDS
    #: on the channel verbs: deliver(k) (ordered: the tokens let a writer into a slot
    #: only once its reader released the version before), await_ of version k
    #: (EXACT; COUNT with backup workers; NEWEST with staleness), the tokens as
    #: await_(k, RELEASED) and release(k)
    awaits = frozenset({Await.EXACT, Await.COUNT, Await.NEWEST, Await.RELEASED})
    delivers = True
    OPTIONS = Options(
        Option("max_gap", int, 2, "the token bound on Iter(i) - Iter(j) for every "
               "out-neighbour j", low=1),
        Option("backup", int, 0, "backup workers", low=0),
        Option("staleness", int, None, "bounded staleness s", low=0, optional=True),
        Option("staleness_weights", str, "hop", "'hop': eq. (2), or 'uniform': the "
               "graph's weights renormalized", choices=("hop", "uniform")),
        Option("skip_trigger", int, None, "jump ahead when at least this many iterations "
               "behind every out-neighbour", low=1, optional=True),
        Option("max_jump", int, 1, "the longest jump", low=1),
        Option("suppress_late", bool, True, "do not send an update its receiver can no "
               "longer use"),
    )

    def __init__(self, **options):
        super().__init__(**options)
        o = self._options
        if o["backup"] and o["staleness"] is not None:
            raise ConfigError("hop: choose backup workers or bounded staleness, not both")
        if o["skip_trigger"] is not None and not (o["backup"] or o["staleness"] is not None):
            raise ConfigError("hop: skipping iterations needs backup workers or staleness "
                              "(the skipped updates are never sent, so standard receivers "
                              "would wait for them)")
        self.max_gap, self.backup = o["max_gap"], o["backup"]
        self.staleness = o["staleness"]
        self.staleness_weights = o["staleness_weights"]
        self.skip_trigger = o["skip_trigger"]
        self.max_jump = o["max_jump"]
        self.suppress_late = o["suppress_late"]
        # a reader may pick any version in [k - s, k] while senders run up to max_gap ahead
        self.depth = self.max_gap + 1 + (self.staleness or 0)
        # a need (Policy.retain): the oldest version iteration k + 1 reduces is
        # k + 1 - staleness
        self.retain = self.staleness or 0
        self.jumps = 0

    def join_refusal(self) -> Optional[str]:
        """Skipping jumps several versions in one step, past the count join agrees on."""
        if self.skip_trigger is not None:
            return ("skipping (skip_trigger) jumps several versions in one step; leave it "
                    "off to join")
        return None

    @property
    def setting(self) -> str:
        """The row of Hop's Table 1 that bounds this run (all with token queues)."""
        if self.backup:
            return "backup"
        if self.staleness is not None:
            return "staleness"
        return "tokens"

    def validate(self, graph, rank: int) -> None:
        """Refuse a backup count that leaves a rank nothing to wait for."""
        worst = min(graph.in_degree(r) for r in range(graph.n))
        if self.backup and self.backup >= worst:
            raise ConfigError(f"hop backup={self.backup} must be smaller than the smallest "
                              f"in-degree of the graph ({worst}): every rank must wait for at "
                              f"least one in-neighbour")

    def start(self) -> None:
        """Iteration 1 is entered when the exchange is created."""
        self.entries = self.table("entries")                # lo, hi per iteration
        self.reduced = self.table("reduced", np.int64)      # k, version per in-neighbour
        self.entries.append((float("-inf"), time.monotonic()))

    # ------------------------------------------------------------------ one iteration

    def send(self, win, buf, version: int, ctx: StepContext) -> None:
        """Send(k): the update of iteration k into slot k mod depth, with its notify,
        to every out-neighbour that can still use it."""
        win.deliver(buf, version, ctx.timeout, ctx.checksum,
                    skip_released=self._useless_after(version) if self.suppress_late else 0)

    def receive(self, win, buf, version: int, ctx: StepContext) -> int:
        """Rec(k) and Reduce, a jump when this worker trails (section 5), then the
        tokens to enter the next iteration.  Returns the last iteration completed."""
        k = version
        self._receive_and_reduce(win, buf, k, ctx)
        target = self._jump_target(win, k, ctx)
        if target > k + 1:
            # Hop section 5: renew the parameters with the updates of iteration target-1
            self.jumps += 1
            self._receive_and_reduce(win, buf, target - 1, ctx)
        self._enter(win, target, ctx)
        return target - 1

    def _useless_after(self, k: int) -> int:
        """An out-neighbour that completed this many iterations cannot use update k."""
        if self.backup:
            return k                        # it is past iteration k
        if self.staleness is not None:
            return k + self.staleness       # even k - s of its next iteration is past k
        return 0                            # standard: it always waits for k

    def _receive_and_reduce(self, win, buf, k: int, ctx: StepContext) -> None:
        if self.staleness is not None:
            versions = win.await_(k, ctx.timeout, Await.NEWEST, max(k - self.staleness, 1))
            w_self, weights = self._staleness_weights(k, versions, ctx)
            # an input that fails its check is dropped and the rest renormalized, which
            # for eq. (2) equals recomputing it over the remaining inputs
            win.reduce_versions(buf, w_self, weights, versions, checksum=ctx.checksum)
        else:
            if self.backup:
                win.await_(k, ctx.timeout, Await.COUNT, win.n_in - self.backup)
            else:
                win.await_(k, ctx.timeout, Await.EXACT)
            win.reduce(buf, ctx.w_self, ctx.weights, k, k, k, checksum=ctx.checksum,
                       renormalize=self.backup > 0, require_all=self.backup == 0,
                       only_notified=self.backup > 0)
        # record what the kernel verified it read: the footer version of every input it
        # reduced (0 for the others); in place, as every step pays for it
        win.record_reduced(self.reduced.next_row(win.n_in + 1), k)

    def _staleness_weights(self, k: int, versions: np.ndarray, ctx: StepContext):
        """Hop eq. (2): weight Iter(u) - (k - s) + 1 for every satisfactory update, the
        worker's own (iteration k) included; or the graph's weights renormalized."""
        if self.staleness_weights == "hop":
            raw_self = float(self.staleness + 1)
            raw = np.where(versions > 0, versions - (k - self.staleness) + 1, 0).astype(float)
        else:
            raw_self = ctx.w_self
            raw = np.where(versions > 0, ctx.weights, 0.0)
        if ctx.present is not None:
            raw = np.where(ctx.present, raw, 0.0)     # joined ranks leave the average
        total = raw_self + raw.sum()
        return raw_self / total, np.ascontiguousarray(raw / total)

    def _jump_target(self, win, k: int, ctx: StepContext) -> int:
        """k + 1, or further when this worker trails all its out-neighbours by at least
        skip_trigger iterations (Hop section 5); never past the slowest of them."""
        if self.skip_trigger is None or win.n_out == 0:
            return k + 1
        # the tokens: the fewest iterations an out-neighbour has completed
        completed = win.await_(0, ctx.timeout, Await.RELEASED)
        behind = completed + 1 - k            # Iter(j) - Iter(i) for the slowest j
        if behind < self.skip_trigger:
            return k + 1
        # Rec(T-1) needs version T-1 from the in-neighbours, which cannot pass iteration
        # k + max_gap before this worker publishes: on directed graphs the out-neighbours
        # may be further ahead than that, so the jump is capped at max_gap + 1
        return k + max(1, min(self.max_jump, behind, self.max_gap + 1))

    def _enter(self, win, t: int, ctx: StepContext) -> None:
        """Enter iteration t: a token from every out-neighbour (each has completed at
        least t - 1 - max_gap iterations), then publish t - 1 completed iterations, which
        gives every in-neighbour t - 1 - k0 tokens after a jump from k0."""
        lo = time.monotonic()
        win.await_(t - 1 - self.max_gap, ctx.timeout, Await.RELEASED)
        win.release(t - 1)
        hi = time.monotonic()
        while self.entries.count < t:         # iterations jumped over are entered with t
            row = self.entries.next_row(2)
            row[0], row[1] = lo, hi

    @property
    def trace(self) -> Dict[str, np.ndarray]:
        """Entry times of the iterations kept (the newest rc.trace_iterations; `first` is
        the iteration of lo[0]): lo (before the token wait: the iteration cannot have
        been entered earlier) and hi (after publishing: entered by then); `reduced`: per
        reduce, the iteration and the version used from each in-neighbour (0 = none)."""
        return entry_trace(self.entries, self.reduced)

