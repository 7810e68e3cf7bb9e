"""A parameter server's 16-bit publication, rounded with error feedback.

Workers of a parameter server replace their values by the server's (their reduce has
w_self = 0): what the server loses when it rounds the float32 average of the workers'
16-bit values to 16 bits is lost to every worker.  When workers keep float32 master
weights, each worker's progress below one unit in the last place (ulp) is in that
rounding: rounded to nearest, the average lands back on the value it started from and
the progress is dropped, step after step (bfloat16 SGD at a small learning rate ends
with a much higher loss).  With error feedback (sigma-delta rounding) the server
publishes round(average + e) and carries e = (average + e) - published to its next
publication: each publication stays within one ulp of the average, and their sum
follows the averages' sum to within one ulp, so no progress is lost on the way.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from ..dtypes import f32_to_half, half_to_f32
from .base import StepContext


class RoundingFeedback:
    """Round a server's float32 average into its 16-bit buffer with error feedback;
    active only when the exchange keeps the float32 sums (ctx.wide, float32 master
    weights), else the reduce's own rounding stands."""

    def __init__(self):
        self._error: Optional[np.ndarray] = None

    def round_into(self, buf, ctx: StepContext) -> None:
        """After a reduce wrote its float32 average to ctx.wide: buf = round(average +
        error), error = what that rounding left out."""
        if ctx.wide is None:
            return
        if self._error is None:
            self._error = np.zeros_like(ctx.wide)
        target = ctx.wide + self._error
        bits = np.frombuffer(buf, dtype=np.uint16 if ctx.dtype == "bfloat16" else np.float16)
        f32_to_half(target, ctx.dtype, out=bits)
        np.subtract(target, half_to_f32(bits, ctx.dtype), out=self._error)
