"""Mixing weights of the reduce: the self weight and one weight per in-neighbour."""
from __future__ import annotations

import math
from typing import Mapping, Optional, Sequence, Tuple

from ..errors import ConfigError


def uniform_weights(n_in: int) -> Tuple[float, list]:
    """ASAP's weights: 1/(in-degree + 1) for self and for each in-neighbour."""
    w = 1.0 / (n_in + 1)
    return w, [w] * n_in


def resolve_weights(rank: int, in_neighbours: Sequence[int],
                    weights: Optional[Mapping[int, float]]) -> Tuple[float, list]:
    """Return (self weight, in-neighbour weights in in-neighbour order).

    `weights` maps rank -> weight and must name this rank and every in-neighbour, with
    finite non-negative values that sum to 1 (the reduce then averages).
    """
    if weights is None:
        return uniform_weights(len(in_neighbours))
    wanted = {rank, *in_neighbours}
    try:
        given = {int(k) for k in weights}
    except (TypeError, ValueError):
        raise ConfigError(f"rank {rank}: weights must be keyed by rank numbers, got "
                          f"{list(weights)!r}") from None
    if given != wanted:
        raise ConfigError(f"rank {rank}: weights must name exactly this rank and its "
                          f"in-neighbours {sorted(wanted)}, got {sorted(given)}")
    try:
        values = {int(k): float(v) for k, v in weights.items()}
    except (TypeError, ValueError):
        raise ConfigError(f"rank {rank}: weights must map ranks to numbers, got "
                          f"{dict(weights)!r}") from None
    if any(not math.isfinite(v) or v < 0 for v in values.values()):
        raise ConfigError(f"rank {rank}: weights must be finite and >= 0, got {values}")
    total = sum(values.values())
    if abs(total - 1.0) > 1e-9:
        raise ConfigError(f"rank {rank}: weights sum to {total!r}; they must sum to 1")
    return values[rank], [values[r] for r in in_neighbours]
