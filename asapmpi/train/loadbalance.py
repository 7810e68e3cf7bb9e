"""Load balancing of minibatch sizes (LB-BSP: Chen, Weng, Wang, Li and Li, "Semi-Dynamic
Load Balancing", SoCC 2020), for every sync policy: a trainer option, not a policy's.

Rank i computes a minibatch of b_i examples, b_i in proportion to its measured speed
(1 / seconds per sample), so that the ranks finish a step together, while the global batch
of a step stays B = n * batch_size (n: the ranks that compute; a parameter server is left
out).  `split` turns the measured paces into sizes: integers >= 1, at most a shard, summing
exactly to B (largest remainder), the same on every rank that sees the same paces.

The paces are shared without a collective inside the training loop: with Hop's skipping
or backup workers the ranks take different numbers of their own steps, and a collective
would couple (or deadlock) them.  `SpeedBoard` is a board (asapmpi.board: an MPI window
of 2 * n words on every rank, written by passive-target accumulates, read atomically word
by word); a word packs a round number and the pace (float32 bits) into one int64, so a
reader never sees a round with another round's pace.

Rounds (`Balancer`): a rank publishes the pace it measured at its own step
P_r = warmup + r * every as round r (two words per writer, by parity of r), and at its
step P_r + 1 takes the split of round r.  Where the ranks run in lockstep (allreduce, bsp)
a rank that reached step P_r + 1 finished the exchange of step P_r, which every other rank
entered after publishing round r: every rank reads the same round and uses the same split,
and the sizes sum to B at every step.  Where they do not (hop with backup workers or
skipping, elastic, decentralized graphs), a rank that has not yet published round r
counts with its newest round, and ranks may hold splits of different rounds for a few
steps.  A rank that has published nothing counts with the default batch_size.

Samples-weighted averaging: rank i scales its loss (hence its gradient) by
n * b_i / B = b_i / batch_size, so the mean over the n replicas of their gradients is the
gradient of the global batch: for SGD, and SGD with momentum (linear in the gradient),
averaging the replicas' updates equals one step on the global batch.  For Adam (not
linear) it is an approximation.

mpi4py and numpy only: no torch; mpi4py.MPI is imported by SpeedBoard only, so the
checks and the split serve the launcher's configuration checks without MPI.
"""
from __future__ import annotations

import collections
import math
import statistics
from typing import List, Optional, Sequence

import numpy as np

from ..board import Board
from ..errors import ConfigError

#: own steps before the first published pace (the first steps pay for lazy setup)
WARMUP_STEPS = 5
#: own steps between two re-balances unless told (balance_every)
DEFAULT_EVERY = 20
_ROUND_SHIFT = 32
_PACE_MASK = (1 << 32) - 1


def check_every(every, where: str = "") -> None:
    """ConfigError (one line) unless `every` is an integer >= 1."""
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ConfigError(f"balance_every={every!r}{' ' + where if where else ''}: it "
                          f"must be an integer >= 1 (own steps between re-balances)")


def check(batch_size, every) -> None:
    """ConfigError (one line) for values balancing cannot use."""
    check_every(every)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 2:
        raise ConfigError(f"balance needs --batch-size >= 2 to move examples between "
                          f"ranks (each computes at least one), got {batch_size!r}")


def split(batch_size: int, paces: Sequence[Optional[float]], active: Sequence[bool],
          cap: Optional[int] = None) -> List[int]:
    """Per rank, the minibatch size: 0 for an inactive rank (a parameter server),
    `batch_size` for an active rank without a pace (None, 0 or not finite), and for the
    others sizes proportional to 1 / pace, each in [1, cap], summing with the defaults to
    exactly (active ranks) * batch_size.  Deterministic: ties go to the lower rank."""
    if len(paces) != len(active):
        raise ConfigError(f"{len(paces)} paces for {len(active)} ranks")
    sizes = [0] * len(active)
    measured = []
    for r, (pace, on) in enumerate(zip(paces, active)):
        if not on:
            continue
        if pace is None or not math.isfinite(pace) or pace <= 0:
            sizes[r] = batch_size
        else:
            measured.append(r)
    total = batch_size * len(measured)
    cap = total if cap is None else int(cap)
    if measured and not len(measured) <= total <= cap * len(measured):
        raise ConfigError(f"a global batch of {total} examples cannot be split among "
                          f"{len(measured)} ranks of 1..{cap} examples each")
    if not measured:
        return sizes
    weight = [1.0 / paces[r] for r in measured]
    quota = _bounded_quotas(weight, total, cap)
    floors = [min(cap, max(1, math.floor(q))) for q in quota]
    left = total - sum(floors)
    # largest remainder; ties to the lower rank; never past cap
    order = sorted(range(len(measured)), key=lambda i: (-(quota[i] - floors[i]), i))
    while left > 0:
        for i in order:
            if left and floors[i] < cap:
                floors[i] += 1
                left -= 1
    for r, f in zip(measured, floors):
        sizes[r] = f
    return sizes


def _bounded_quotas(weight: List[float], total: int, cap: int) -> List[float]:
    """clip(lam * w_i, 1, cap) with lam such that they sum to `total` (feasible:
    n <= total <= n * cap).  The sum is piecewise linear in lam, with breakpoints at
    1/w_i and cap/w_i: find the segment by bisection, then solve it.  Sums are
    math.fsum (exactly rounded), so every rank computes the same quotas bit for bit."""
    def quotas(lam):
        return [min(cap, max(1.0, lam * w)) for w in weight]

    points = sorted({1.0 / w for w in weight} | {cap / w for w in weight})
    lo, hi = 0, len(points) - 1
    if math.fsum(quotas(points[lo])) >= total:
        return quotas(points[lo])
    if math.fsum(quotas(points[hi])) <= total:
        return quotas(points[hi])
    while hi - lo > 1:                       # sum(points[lo]) < total < sum(points[hi])
        mid = (lo + hi) // 2
        if math.fsum(quotas(points[mid])) < total:
            lo = mid
        else:
            hi = mid
    a, mid = points[lo], (points[lo] + points[hi]) / 2
    # the quotas that grow with lam on this segment (classified at its middle, away from
    # the rounding of its ends)
    inside = math.fsum(w for w in weight if 1.0 < mid * w < cap)
    lam = a + (total - math.fsum(quotas(a))) / inside if inside else a
    return quotas(lam)


def _pack(round_: int, pace: float) -> int:
    bits = int(np.array([pace], dtype=np.float32).view(np.uint32)[0])
    return ((round_ + 1) << _ROUND_SHIFT) | bits


def _unpack(word: int):
    """(round, pace) of a board word, or None where nothing was written."""
    word = int(word)
    if word == 0:
        return None
    pace = float(np.array([word & _PACE_MASK], dtype=np.uint32).view(np.float32)[0])
    return (word >> _ROUND_SHIFT) - 1, pace


class SpeedBoard(Board):
    """Every rank's latest paces (seconds per sample), on a board (asapmpi.board) of two
    words per rank, by parity of the round (see the module docstring).  Collective to
    create and to free."""

    def __init__(self, comm, active: bool, timeout: float):
        from .. import collectives

        self.active = [bool(a) for a in collectives.allgather(
            comm, bool(active), timeout, "the ranks that balance their batches")]
        super().__init__(comm, 2, timeout, "speed board", readers=self.active)

    def publish(self, round_: int, pace: float) -> None:
        """Write this rank's pace of `round_` into every active rank's board."""
        super().publish(round_ % 2, _pack(round_, pace))

    def paces(self, round_: int) -> List[Optional[float]]:
        """Per rank, its pace of `round_`, else its newest, else None."""
        out: List[Optional[float]] = []
        for row in self.read():
            seen = [e for e in (_unpack(row[0]), _unpack(row[1])) if e]
            exact = [p for k, p in seen if k == round_]
            out.append(exact[0] if exact else max(seen)[1] if seen else None)
        return out

    def __enter__(self) -> "SpeedBoard":
        return self


class Balancer:
    """One rank's minibatch size over its own steps: measures its pace (seconds of
    compute per sample, the median since its size last changed), publishes it every
    `every` own steps after WARMUP_STEPS and takes the split of the round it published
    one step later (module docstring)."""

    def __init__(self, board: SpeedBoard, batch_size: int, every: int = DEFAULT_EVERY,
                 cap: Optional[int] = None, warmup: int = WARMUP_STEPS):
        check(batch_size, every)
        self.board, self.default, self.every = board, batch_size, every
        self.cap, self.warmup = cap, warmup
        me = board.rank
        self.size = batch_size if board.active[me] else 0
        self.paces = collections.deque(maxlen=max(every, 5))
        self.rebalances, self.samples, self.steps = 0, 0, 0
        self.published: Optional[float] = None

    @property
    def global_batch(self) -> int:
        """B: the examples of one step over every rank."""
        return self.default * sum(self.board.active)

    @property
    def loss_scale(self) -> float:
        """n * b_i / B: this rank's share of the global batch over its default share."""
        return self.size / self.default

    def record(self, seconds: float, samples: int) -> None:
        """One step's compute (including any injected slowdown) over `samples`."""
        if samples > 0 and seconds > 0:
            self.paces.append(seconds / samples)
        self.samples += samples
        self.steps += 1

    def before_step(self, step: int) -> int:
        """The size of own step `step` (publishes and re-balances on schedule)."""
        if not self.board.active[self.board.rank] or step < self.warmup:
            return self.size
        since = step - self.warmup
        if since % self.every == 0 and self.paces:
            self.published = statistics.median(self.paces)
            self.board.publish(since // self.every, self.published)
        if since >= 1 and (since - 1) % self.every == 0:
            round_ = (since - 1) // self.every
            size = split(self.default, self.board.paces(round_), self.board.active,
                         self.cap)[self.board.rank]
            self.rebalances += 1
            if size != self.size:
                self.size = size
                self.paces.clear()
        return self.size

    def report(self) -> dict:
        """This rank's final and mean size, its re-balances and last published pace."""
        return {"batch_size": self.size,
                "mean_batch_size": self.samples / self.steps if self.steps else 0.0,
                "rebalances": self.rebalances,
                "pace_s": self.published}
