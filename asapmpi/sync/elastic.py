"""ElasticBSP (Zhao et al., ICDM'19) on a parameter server: the server picks every
worker's next barrier with ZipLine so that the workers arrive together.

Superstep s on a star around the server:

  worker: runs `assigned` local optimizer steps (no communication), timing each; then
          reports its mean iteration interval (an int64 of nanoseconds) and s, two
          words at the server, and puts its parameters tagged s (ordered write, notify
          s); waits for theta(s), reads it (verified), waits until the server's stamp
          word says s and reads the two words written with it: its next `assigned`
          count and the global iteration count G;
  server: waits for every worker's s (a barrier: this is BSP) and its interval
          stamped s, theta(s) = their mean; predicts each worker's next R iteration
          ends from its interval (all start together when theta(s) arrives: ends[w] =
          interval[w] * (1..R)) and runs ZipLine: worker w gets index[w] + 1 local
          iterations; writes them, G and the stamp s into every worker's words, then
          puts theta(s) (notify s).

The words go by `write_words`: remote atomics in order on the window transports, one
message per write on the mailbox (where a message may be stored after the put that
followed it: the stamps, read last, say when the words of superstep s are there).

G counts iterations as the mean number of local steps per worker (total // workers);
every rank's exchange version is G, so a loop `while version < iters` ends on every
rank after the same superstep.  No slot can be overwritten while read: a worker writes
s + 1 only after reading theta(s), which the server publishes only after reading all
of s; the server writes theta(s + 1) only after every worker sent s + 1.
"""
from __future__ import annotations

import time
from collections import deque
from typing import Dict, Optional

import numpy as np

from ..options import Option, Options
from . import zipline
from .base import Await, Policy, Reads, StepContext, server_star
from .feedback import RoundingFeedback

ALGORITHMS = {"zipline": zipline.zipline, "gridscan": zipline.gridscan,
              "full_gridscan": zipline.full_gridscan}
#: the server's words: per rank its interval and the superstep of it; a worker's:
#: [assigned count, G, superstep of both]
_COUNT, _GLOBAL, _STAMP = 0, 1, 2
_INTERVAL, _INTERVAL_STAMP = 0, 1


class ElasticBSP(Policy):
    """ElasticBSP on a parameter server, barriers chosen by ZipLine (module docstring)."""

    name = "elastic"
    #: each sender's newest whole version (on messages: docs/PROTOCOL.md 2e): every
    #: slot holds exactly superstep s when it is read (nobody sends s + 1 before
    #: theta(s) is read); the control words go by write_words, which every channel
    #: serving it carries (remote atomics, or two messages per worker per superstep)
    reads = Reads.NEWEST
    #: on the channel verbs: deliver (ordered: ordered_writes), await_ of exactly
    #: superstep s (no writer runs ahead: a channel of newest versions gives it too),
    #: the control words by the words' own calls
    awaits = frozenset({Await.EXACT})
    delivers = True
    #: the exchange's version is the global iteration count G, also between supersteps
    global_iterations = True

    OPTIONS = Options(
        Option("R", int, 15, "lookahead: predicted iteration ends per worker", low=1),
        Option("server", int, 0, "the server's rank", low=0),
        Option("algorithm", str, "zipline", "how the barrier is chosen",
               choices=tuple(ALGORITHMS)),
        Option("window", int, 5, "iteration intervals averaged per worker", low=1),
    )

    def __init__(self, **options):
        super().__init__(**options)
        o = self._options
        self.R, self.server, self.algorithm, self.window = \
            o["R"], o["server"], o["algorithm"], o["window"]
        self.layouts = None                 # every rank's window layout (set by Exchange)
        self._rounding = RoundingFeedback()     # the server's publication

    def join_refusal(self) -> Optional[str]:
        """Supersteps count global iterations, not each rank's steps: not yet joined."""
        return ("ElasticBSP's supersteps count global iterations, not each rank's steps; "
                "give every worker the same number of steps")

    def topology(self, n: int):
        """A star around the server."""
        return server_star(self.name, self.server, n)

    def role(self, rank: int) -> str:
        """"server" or "worker"."""
        return "server" if rank == self.server else "worker"

    def user_words(self, rank: int, n: int) -> int:
        """Words of control data in `rank`'s window (see the module docstring)."""
        return 2 * n if rank == self.server else 3

    def ordered_writes(self, rank: int) -> bool:
        """No slot is written while read (module docstring): the ordered sequence."""
        return True

    def start(self) -> None:
        """Superstep 1 is plain BSP: one local step each (no interval is known yet)."""
        self._ends = deque([time.monotonic()], maxlen=self.window + 1)
        self._local, self._assigned, self._superstep = 0, 1, 0
        self._global, self._total, self._pending = 0, 0, False
        self.supersteps = self.table("supersteps")

    # ------------------------------------------------------------------ worker

    def send(self, win, buf, version: int, ctx: StepContext) -> None:
        """A local step ended; at the assigned count, report and put (superstep s)."""
        if win.rank == self.server:
            return
        self._ends.append(time.monotonic())
        self._local += 1
        if self._local < self._assigned:
            return
        # the mean of the intervals between the ends kept: (last - first) / count
        interval = (self._ends[-1] - self._ends[0]) / (len(self._ends) - 1)
        self._superstep += 1
        server = self.layouts[self.server]
        win.write_words(self.server, server.user_disp(2 * win.rank + _INTERVAL),
                        [max(1, int(interval * 1e9)), self._superstep])
        win.deliver(buf, self._superstep, ctx.timeout, ctx.checksum)
        self._pending = True

    def receive(self, win, buf, version: int, ctx: StepContext) -> int:
        """Worker: after a put, theta(s), the next count and G.  Server: a superstep."""
        if win.rank == self.server:
            return self._serve(win, buf, ctx)
        if not self._pending:
            return self._global
        s = self._superstep
        own = self.layouts[win.rank]
        win.await_(s, ctx.timeout, Await.EXACT)
        win.wait_word(own.user_disp(_STAMP), s, ctx.timeout, from_rank=self.server)
        win.reduce(buf, 0.0, np.ones(1), s, s, s, checksum=ctx.checksum, require_all=True)
        self._assigned = int(win.local_word(own.user_disp(_COUNT)))
        self._global = int(win.local_word(own.user_disp(_GLOBAL)))
        self._local, self._pending = 0, False
        self._ends = deque([time.monotonic()], maxlen=self.window + 1)
        self.supersteps.append((s, self._global, self._assigned))
        return self._global

    # ------------------------------------------------------------------ server

    def _serve(self, win, buf, ctx: StepContext) -> int:
        s = self._superstep = self._superstep + 1
        waited = time.monotonic()
        win.await_(s, ctx.timeout, Await.EXACT)
        own = self.layouts[win.rank]
        ranks = win.in_ranks
        win.wait_words([own.user_disp(2 * r + _INTERVAL_STAMP) for r in ranks], s,
                       ctx.timeout, ranks)
        waited = time.monotonic() - waited
        workers = win.n_in
        win.reduce(buf, 0.0, np.full(workers, 1.0 / workers), s, s, s,
                   checksum=ctx.checksum, require_all=True)
        self._rounding.round_into(buf, ctx)
        # the counts of superstep s were assigned at s - 1 (1 each for the first)
        self._total += int(np.sum(self._counts)) if s > 1 else workers
        self._global = self._total // workers
        intervals = np.array([win.local_word(own.user_disp(2 * r + _INTERVAL))
                              for r in ranks], float) / 1e9
        ends = intervals[:, None] * np.arange(1, self.R + 1)[None, :]
        choice = ALGORITHMS[self.algorithm](ends)
        self._counts = np.asarray(choice.index) + 1
        for r, count in zip(ranks, self._counts):
            win.write_words(r, self.layouts[r].user_disp(_COUNT),
                            [int(count), self._global, s])
        win.deliver(buf, s, ctx.timeout, ctx.checksum)
        self.supersteps.append((s, self._global, waited, float(choice.spread),
                                *self._counts.tolist()))
        return self._global

    @property
    def supersteps_done(self) -> int:
        """Supersteps this rank has completed (a worker: theta received; the server:
        theta sent)."""
        return self.supersteps.count

    @property
    def trace(self) -> Dict[str, np.ndarray]:
        """Server: per superstep [s, G, seconds waited for the workers, predicted spread,
        next count per worker]; worker: per superstep [s, G, next count]."""
        return {"supersteps": self.supersteps.array()} if self.supersteps.count else {}
