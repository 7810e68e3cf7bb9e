"""A one-line progress bar for rank 0: iterations, iterations/s, loss, test accuracy."""
from __future__ import annotations

import sys
import time
from typing import Optional, TextIO


class ProgressBar:
    """Redraws one line at most every `interval` seconds (and on the last update).

    On a terminal the line is redrawn in place; into a file or a pipe (CI logs) a line
    is written only every `log_interval` seconds, so logs stay short.
    """

    def __init__(self, total: int, label: str = "", stream: Optional[TextIO] = None,
                 interval: float = 0.2, log_interval: float = 5.0, width: int = 24):
        self.total = max(int(total), 1)
        self.label = label
        self.stream = sys.stderr if stream is None else stream
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.interval = interval if self.tty else log_interval
        self.width = width
        self._last = float("-inf")
        self._shown = False

    def render(self, iteration: int, rate: float, loss: float,
               accuracy: Optional[float]) -> str:
        """The text of the bar (no line ending)."""
        done = min(max(iteration, 0), self.total)
        filled = self.width * done // self.total
        acc = "  acc   -  " if accuracy is None else f"  acc {100 * accuracy:5.1f}%"
        shown = "  -   " if loss != loss else f"{loss:.4f}"      # NaN: nothing trained yet
        return (f"{self.label} [{'#' * filled}{'.' * (self.width - filled)}] "
                f"{done}/{self.total}  {rate:7.1f} it/s  loss {shown}{acc}")

    def update(self, iteration: int, rate: float, loss: float,
               accuracy: Optional[float] = None, force: bool = False) -> None:
        """Show the state if the last redraw is old enough (or `force`)."""
        now = time.monotonic()
        if not force and now - self._last < self.interval:
            return
        self._last = now
        text = self.render(iteration, rate, loss, accuracy)
        if self.tty:
            self.stream.write("\r" + text + "\033[K")
        else:
            self.stream.write(text + "\n")
        self._shown = True
        self.stream.flush()

    def close(self) -> None:
        """End the line."""
        if self._shown and self.tty:
            self.stream.write("\n")
            self.stream.flush()
