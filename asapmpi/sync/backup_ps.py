"""Synchronous SGD with backup workers (Chen et al., "Revisiting Distributed Synchronous
SGD", Algorithms 3 and 4) on slot windows.

One server rank holds the parameters; the other N + b ranks are workers.  Iteration k:

  worker: start from the server's theta(k-1) (in its buffer), take a local optimizer
          step, put the resulting parameters into its slot at the server tagged k
          (ordered write, then notify k); wait until the server publishes a version
          >= k, read the newest whole one into its buffer (seqlock-verified), and
          continue from it;
  server: wait until at least N workers notified k, pick N of them (the arrivals at
          that poll, ties drawn at random), theta(k) = mean of their parameters, read
          with version checks (a slot whose version is not k is never read: late
          contributions are dropped, Algorithm 4); publish theta(k) to every worker
          (seqlock write + notify k).

Averaging the workers' parameters is Algorithm 4's update: every chosen worker started
iteration k from the same theta(k-1) (it tags its contribution with the version it
read, plus one), so mean_i theta_i = theta(k-1) + mean_i delta_i, which for SGD is
theta(k-1) - lr * mean_i g_i.  With momentum or Adam each worker's optimizer keeps its
own state (the update it sends includes it).

Slot safety: a worker writes its slot at the server only after reading theta(k-1),
which the server publishes only after its reduce of k-1 finished reading; the server
never waits for slow workers, so it writes their parameter slots with the seqlock
sequence and a worker that reads during a write retries (and may get a newer version:
it then skips ahead, as a late worker in Algorithm 3 fetches the current parameters).
"""
from __future__ import annotations

import time
from typing import Dict, Optional

import numpy as np

from ..errors import ConfigError, NeighbourTimeoutError, ProtocolError
from ..options import Option, Options
from .base import Await, Policy, Reads, StepContext, server_star
from .baselines import NEWEST
from .feedback import RoundingFeedback


class BackupPS(Policy):
    """Parameter server with b backup workers."""

    name = "backup_ps"
    #: each sender's newest whole version: the server's slot per worker holds its
    #: newest contribution (k or a late one, never read as k), a worker's slot the
    #: newest theta; the server never waits for a slow worker, who gets the newest
    #: theta once it takes updates again (on messages: docs/PROTOCOL.md 2e)
    reads = Reads.NEWEST
    writer_runs_ahead = True
    #: the server awaits a count of workers' version k, a worker the server's k or
    #: newer (the channel verbs); both deliver (ordered_writes: the server in the
    #: seqlock sequence)
    awaits = frozenset({Await.COUNT, Await.AT_LEAST})
    delivers = True

    OPTIONS = Options(
        Option("backup", int, 0, "backup workers b: the server averages workers - b", low=0),
        Option("server", int, 0, "the server's rank", low=0),
        Option("seed", int, 0, "tie-breaking among simultaneous arrivals", low=0),
    )

    def __init__(self, **options):
        super().__init__(**options)
        o = self._options
        self.backup, self.server, self.seed = o["backup"], o["server"], o["seed"]
        self._rounding = RoundingFeedback()     # the server's publication
        self._rng = np.random.default_rng(self.seed)
        self.dropped = 0            # contributions of iterations reduced without them

    def join_refusal(self) -> Optional[str]:
        """A server publishes versions as its workers' updates arrive, not step by step:
        not yet joined."""
        return ("a parameter server's versions follow its workers' updates, not each "
                "rank's steps; give every worker the same number of steps")

    def topology(self, n: int):
        """The graph this policy runs on: a star around the server."""
        graph = server_star(self.name, self.server, n)
        if self.backup >= n - 1:
            raise ConfigError(f"backup_ps backup={self.backup} must be smaller than the "
                              f"number of workers ({n - 1}): the server averages "
                              f"N = workers - backup >= 1 of them")
        return graph

    def ordered_writes(self, rank: int) -> bool:
        """A worker writes its slot at the server only after reading theta(k - 1),
        which the server publishes once its reduce of k - 1 read every slot: ordered.
        The server waits for no slow worker, who may be reading theta as it is
        rewritten: the seqlock sequence."""
        return rank != self.server

    def start(self) -> None:
        """Per iteration: the server's [k, version from each worker], a worker's [k,
        version of theta it continued from] (bounded: asapmpi.sync.records)."""
        self.reduced = self.table("reduced", np.int64)

    def role(self, rank: int) -> str:
        """"server" or "worker"."""
        return "server" if rank == self.server else "worker"

    # ------------------------------------------------------------------ one iteration

    def send(self, win, buf, version: int, ctx: StepContext) -> None:
        """Worker: the parameters after its local step, tagged `version`.  Server:
        nothing (it publishes after its reduce)."""
        if win.rank != self.server:
            win.deliver(buf, version, ctx.timeout, ctx.checksum)

    def receive(self, win, buf, version: int, ctx: StepContext) -> int:
        """Worker: the newest theta >= version; server: reduce and publish version."""
        if win.rank == self.server:
            self._serve(win, buf, version, ctx)
            return version
        return self._fetch(win, buf, version, ctx)

    def _serve(self, win, buf, k: int, ctx: StepContext) -> None:
        need = win.n_in - self.backup
        win.await_(k, ctx.timeout, Await.COUNT, need)
        arrived = np.flatnonzero(win.newest_versions(k) == k)
        chosen = self._rng.permutation(arrived)[:need]
        versions = np.zeros(win.n_in, dtype=np.int64)
        versions[chosen] = k
        weights = np.where(versions > 0, 1.0 / need, 0.0)
        got = win.reduce_versions(buf, 0.0, weights, versions, checksum=ctx.checksum,
                                  renormalize=False)
        if got != need:
            raise ProtocolError(f"rank {win.rank}: {need - got} of the {need} notified "
                                f"contributions to iteration {k} failed their version "
                                f"check; a worker broke the protocol")
        self.dropped += win.n_in - need
        self.reduced.append((k, *versions))
        self._rounding.round_into(buf, ctx)
        # workers may be reading the previous version: seqlock write
        win.deliver(buf, k, ctx.timeout, ctx.checksum)

    def _fetch(self, win, buf, k: int, ctx: StepContext) -> int:
        start = time.monotonic()
        while True:
            win.await_(k, max(ctx.timeout - (time.monotonic() - start), 1e-3),
                       Await.AT_LEAST)
            if win.reduce(buf, 0.0, np.ones(1), k, k, NEWEST, seqlock=True,
                          checksum=ctx.checksum, renormalize=False) == 1:
                got = int(win.last_versions[0])
                self.reduced.append((k, got))
                return got
            # the server was writing a newer version as we read: read again
            if time.monotonic() - start > ctx.timeout:
                raise NeighbourTimeoutError(win.rank, f"a whole copy of parameters >= {k}",
                                            [self.server], [k], [0], ctx.timeout)

    @property
    def trace(self) -> Dict[str, np.ndarray]:
        """Per iteration: the server's row [k, version read from each worker (0: not
        reduced)]; a worker's row [k, version of theta it continued from]."""
        if not self.reduced.count:
            return {}
        return {"reduced": self.reduced.array()}
