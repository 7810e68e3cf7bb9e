"""What a demo's evaluation measures: the classifiers' test accuracy (higher is better)
or the language model's held-out loss (lower is better).

Everything that compares a run with its target (the summary's time to target, bench
training's smoothed time to target, its gaps to allreduce, --target checks, tables and
plots) asks the run's Metric rather than assuming "accuracy, higher is better".  Names
in summaries and reports are made from the metric's key (``final_test_accuracy``,
``target_accuracy``; ``final_test_loss``, ``target_loss``), so the classifiers' outputs
keep the names they always had.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, Optional

import numpy as np

from ..errors import ConfigError


@dataclass(frozen=True)
class Metric:
    """One evaluation metric and how to compare, check and show it."""

    #: the name in curves and summaries: "accuracy" or "loss"
    key: str
    #: the metrics log's column (MetricsLog, metrics.h5)
    column: str
    higher_is_better: bool
    #: what it is, in words ("test accuracy")
    title: str
    #: the axis label of plots (values times `scale`)
    label: str
    #: plots and tables show value * scale (accuracy in percent)
    scale: float
    #: the gap to a reference run that still counts as "the same": 0.5 accuracy
    #: points (issue 32), 1% of the reference's loss (issue 47)
    tolerance: float
    #: the unit of gap() and tolerance
    gap_unit: str

    def reached(self, values, target: float) -> np.ndarray:
        """Where `values` (an array) reach `target`."""
        values = np.asarray(values, dtype=float)
        return values >= target if self.higher_is_better else values <= target

    def worst(self, values) -> float:
        """The worst of several replicas' values (the lowest accuracy, the highest
        loss)."""
        return float(min(values) if self.higher_is_better else max(values))

    def gap(self, value: float, reference: float) -> float:
        """How much better `value` is than `reference` (negative: worse): accuracy
        points, or percent of the reference's loss."""
        if self.higher_is_better:
            return 100.0 * (value - reference)
        return 100.0 * (reference - value) / reference

    def text(self, value: Optional[float]) -> str:
        """A value in words: "88.50%", or "1.234 nats/char (1.78 bits/char)"."""
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return "-"
        if self.higher_is_better:
            return f"{100 * value:.2f}%"
        return f"{value:.3f} nats/char ({bits_per_char(value):.2f} bits/char)"

    def target_text(self, target: float) -> str:
        """A target in words, as the reports have always written accuracy's."""
        return f"{100 * target:.1f}%" if self.higher_is_better else \
            f"{target:.3g} nats/char"

    def check_target(self, target: Any, flag: str = "--target") -> None:
        """ConfigError unless `target` is one this metric can reach."""
        if self.higher_is_better:
            if not 0 < target <= 1:
                raise ConfigError(f"{flag} is an accuracy in (0, 1], got {target}")
        elif not (isinstance(target, (int, float)) and 0 < target < math.inf):
            raise ConfigError(f"{flag} is a held-out loss in nats per character, a "
                              f"positive number (ln 256 = 5.55 is chance), got {target}")


ACCURACY = Metric("accuracy", "test_accuracy", True, "test accuracy", "test accuracy (%)",
                  100.0, 0.5, "points")
LOSS = Metric("loss", "test_loss", False, "held-out loss", "held-out loss (nats/char)",
              1.0, 1.0, "%")
METRICS: Dict[str, Metric] = {m.key: m for m in (ACCURACY, LOSS)}
#: the demos evaluated by held-out loss; the others by test accuracy
LOSS_MODELS = ("lm",)


def metric_of(model: str) -> Metric:
    """The metric of a demo model (`asapmpi train MODEL`)."""
    return LOSS if model in LOSS_MODELS else ACCURACY


def of_summary(summary: Dict[str, Any]) -> Metric:
    """The metric a run's summary reports (a summary names its target by the key)."""
    return LOSS if "target_loss" in summary else ACCURACY


def bits_per_char(nats: float) -> float:
    """A cross-entropy in nats per character as bits per character."""
    return nats / math.log(2.0)
