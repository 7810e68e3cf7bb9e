"""The progress bar of rank 0, on tqdm: iterations, iterations/s, loss, test accuracy
(or the language model's held-out loss).

Quiet when stderr is not a terminal (CI logs, files), as tqdm is with ``disable=None``.
"""
from __future__ import annotations

from typing import Optional, TextIO

from ..extras import require
from .metric import ACCURACY, Metric

tqdm = require("tqdm", "train", "the progress bar").tqdm


def postfix(rate: float, loss: float, accuracy: Optional[float],
            metric: Metric = ACCURACY) -> str:
    """What follows the bar: the run's iterations/s, the mean training loss since the
    last evaluation and the test accuracy, or with the loss metric the held-out loss
    ("-" when not known yet)."""
    shown = "-" if loss != loss else f"{loss:.4f}"      # NaN: nothing trained yet
    if not metric.higher_is_better:
        held = "-" if accuracy is None else f"{accuracy:.4f}"
        return f"{rate:.1f} it/s, loss {shown}, held-out {held}"
    acc = "-" if accuracy is None else f"{100 * accuracy:.1f}%"
    return f"{rate:.1f} it/s, loss {shown}, acc {acc}"


class ProgressBar:
    """A tqdm bar over `total` iterations, redrawn at most every `interval` seconds (and
    on a forced update), written to `stream` (default stderr) only if it is a terminal;
    it shows the evaluations as `metric` says (test accuracy, or held-out loss)."""

    def __init__(self, total: int, label: str = "", stream: Optional[TextIO] = None,
                 interval: float = 0.2, metric: Metric = ACCURACY):
        self.metric = metric
        # The rate shown is the trainer's (iterations over the run's clock, which pauses
        # for evaluations and checkpoints), not tqdm's wall-clock estimate.
        self.bar = tqdm(total=max(int(total), 1), desc=label or None, file=stream,
                        disable=None, mininterval=interval, dynamic_ncols=True,
                        bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} "
                                   "[{elapsed}<{remaining}{postfix}]")

    @property
    def enabled(self) -> bool:
        """Whether anything is shown (False off a terminal)."""
        return not self.bar.disable

    def update(self, iteration: int, rate: float, loss: float,
               accuracy: Optional[float] = None, force: bool = False) -> None:
        """Move the bar to `iteration` and show rate, loss and accuracy (redrawn now
        if `force`)."""
        if not self.enabled:
            return
        self.bar.set_postfix_str(postfix(rate, loss, accuracy, self.metric), refresh=False)
        self.bar.update(min(max(int(iteration), 0), self.bar.total) - self.bar.n)
        if force:
            self.bar.refresh()

    def close(self) -> None:
        """End the bar's line."""
        self.bar.close()
