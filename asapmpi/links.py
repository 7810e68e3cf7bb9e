"""Emulated link bandwidth and latency for experiments on one host (the gossip/WAN
paper's wide and narrow nodes).

    links = LinkModel(wide_mbps=1000, narrow_mbps=100, narrow=(4, 5, 6, 7), latency_ms=1)
    links.seconds(i, j, nbytes)      # latency + bits / min(bandwidth(i), bandwidth(j))

A transfer between i and j takes `seconds(i, j, nbytes)`.  Each node's link is a FIFO
resource: Gossip reserves the serving node's link in a word of its window (an atomic
compare-and-swap on a "busy until" time of the host's monotonic clock), so that pulls
from a narrow node queue behind each other as they would on a congested link.  The
clock is shared by the processes of one host only: emulate on one host.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Tuple

from .errors import ConfigError


@dataclass(frozen=True)
class LinkModel:
    """Per-rank bandwidth (narrow ranks get narrow_mbps, the others wide_mbps) and a
    fixed latency per transfer."""

    wide_mbps: float = 0.0          # 0: no emulation
    narrow_mbps: float = 0.0
    narrow: Tuple[int, ...] = field(default_factory=tuple)
    latency_ms: float = 0.0

    def __post_init__(self):
        for name in ("wide_mbps", "narrow_mbps", "latency_ms"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"link option {name} must be a number >= 0, got {value!r}")
        if self.narrow and not self.narrow_mbps:
            raise ConfigError("narrow ranks need narrow_mbps > 0")
        object.__setattr__(self, "narrow", tuple(int(r) for r in self.narrow))

    @property
    def active(self) -> bool:
        """Whether any delay is emulated."""
        return bool(self.wide_mbps or self.narrow or self.latency_ms)

    def bandwidth(self, rank: int) -> float:
        """Bits per second of `rank`'s link (inf: not limited)."""
        mbps = self.narrow_mbps if rank in self.narrow else self.wide_mbps
        return mbps * 1e6 if mbps else float("inf")

    def seconds(self, i: int, j: int, nbytes: int) -> float:
        """Time to move `nbytes` between ranks i and j."""
        bw = min(self.bandwidth(i), self.bandwidth(j))
        return self.latency_ms / 1e3 + (8.0 * nbytes / bw if bw != float("inf") else 0.0)
