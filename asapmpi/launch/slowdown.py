"""Slowdown injection for straggler experiments (Hop section 7), reproducible by seed.

    slow = asapmpi.Slowdown("random", factor=6, probability=1/8, seed=1)
    for k in ...:
        slow.compute(rank, k, seconds=0.005)     # sleeps 5 ms, or 30 ms when slowed

- random: each iteration, with probability p, a worker's compute is slowed by `factor`
  (Hop: factor 6, p = 1/n);
- deterministic: the chosen `ranks` are always slowed by `factor` (Hop: one worker 4x).
The draw for (seed, rank, iteration) is a counter-based hash, not a stream, so a run is
the same whatever order or subset of iterations a rank executes (skipping included).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence, Tuple

from ..errors import ConfigError

KINDS = ("none", "random", "deterministic")
_MASK = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def uniform(seed: int, rank: int, iteration: int) -> float:
    """A uniform number in [0, 1) that depends only on (seed, rank, iteration)."""
    h = _splitmix64(_splitmix64(_splitmix64(seed) ^ rank) ^ iteration)
    return (h >> 11) / float(1 << 53)


@dataclass(frozen=True)
class Slowdown:
    """How much slower a rank computes in an iteration (see the module docstring)."""

    kind: str = "none"
    factor: float = 1.0
    probability: float = 0.0
    ranks: Tuple[int, ...] = field(default_factory=tuple)
    seed: int = 0

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ConfigError(f"slowdown kind must be one of {KINDS}, got {self.kind!r}")
        if not self.factor >= 1.0:
            raise ConfigError(f"slowdown factor must be >= 1, got {self.factor}")
        if self.kind == "random" and not 0.0 <= self.probability <= 1.0:
            raise ConfigError(f"slowdown probability must be in [0, 1], got {self.probability}")
        if self.kind == "deterministic" and not self.ranks:
            raise ConfigError("a deterministic slowdown needs ranks=(r, ...)")
        object.__setattr__(self, "ranks", tuple(int(r) for r in self.ranks))

    def factor_for(self, rank: int, iteration: int) -> float:
        """The compute slowdown of `rank` in `iteration` (1.0 = not slowed)."""
        if self.kind == "random":
            return self.factor if uniform(self.seed, rank, iteration) < self.probability else 1.0
        if self.kind == "deterministic" and rank in self.ranks:
            return self.factor
        return 1.0

    def compute(self, rank: int, iteration: int, seconds: float) -> float:
        """Stand in for a compute phase of `seconds`, slowed as configured; return the
        time slept."""
        delay = seconds * self.factor_for(rank, iteration)
        if delay > 0:
            time.sleep(delay)
        return delay


def hold(seconds: float) -> None:
    """Keep this core busy for `seconds` (a slowed worker's extra compute).  A sleep
    would hand the core to the other ranks of an oversubscribed host, which then run
    faster than they do beside a real slow host (its own CPU, busy); spinning takes only
    this rank's share of the cores, as computing would."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def from_options(kind: str, factor: float, probability: float, ranks: Sequence[int],
                 seed: int, n: int) -> Slowdown:
    """A Slowdown from command-line style options; probability 0 means Hop's 1/n."""
    if kind == "random" and not probability:
        probability = 1.0 / n
    return Slowdown(kind, factor, probability, tuple(ranks), seed)


#: set by asapmpi-run --slowdown: kind:factor:probability:ranks(/-separated):seed
ENVIRONMENT = "ASAPMPI_SLOWDOWN"


def from_environment(n: int) -> Slowdown:
    """The slowdown asapmpi-run asked for (ASAPMPI_SLOWDOWN), or none."""
    import os

    text = os.environ.get(ENVIRONMENT, "")
    if not text:
        return Slowdown()
    try:
        kind, factor, probability, ranks, seed = text.split(":")
        return from_options(kind, float(factor), float(probability),
                            [int(r) for r in ranks.split("/") if r], int(seed), n)
    except ValueError:
        raise ConfigError(f"{ENVIRONMENT}={text!r} is not kind:factor:probability:ranks:"
                          f"seed (e.g. random:6:0:0:1); set it with asapmpi-run "
                          f"--slowdown") from None


def add_arguments(parser):
    """The slowdown-injection options (--slowdown, --slow-factor, --slow-probability,
    --slow-ranks) of the commands that run iterations; returns the argument group."""
    slow = parser.add_argument_group("slowdown injection (Hop section 7)")
    slow.add_argument("--slowdown", default="none", choices=KINDS)
    slow.add_argument("--slow-factor", type=float, default=6.0)
    slow.add_argument("--slow-probability", type=float, default=0.0,
                      help="random: probability per iteration (default 1/n)")
    slow.add_argument("--slow-ranks", type=int, nargs="*", default=[0],
                      help="deterministic: the slowed ranks (default 0)")
    return slow
