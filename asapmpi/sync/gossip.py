"""Gossip SGD with a communication period and the warm-up of Oguni and Shudo
("Addressing the Heterogeneity of a Wide Area Network for DNNs", Algorithm 2), by pulls
or by pushes, whichever channel the exchange resolved (the window says which it does:
`win.pushes`; docs/PROTOCOL.md 2f and 2h).

Pull (a window: one-sided reads).  Every rank publishes its model in its own window,
into two slots that take turns.
Every T iterations a rank publishes, picks one peer, pulls the peer's newest published
model (one MPI_Rget of both slots, polled with back-off: no code of the peer takes
part, but without RDMA hardware its MPI serves the get in its next MPI call; each slot
verified by header, footer and the checksum of the payload read, so a slot that a
publish was writing is never taken but for a 64-bit collision; retried only if both
were) and averages:
w = (w + w_peer) / 2.

Push (messages: where a one-sided read waits on the peer's progress, MPICH's TCP path
and UCX over TCP, a pull cost 6-10x MPI_Allreduce).  Every T iterations a rank picks
one peer by the same rule and sends it its model (the channel never waits for the
receiver: a model the channel cannot send yet waits, and a newer one replaces it); and
mixes what arrived since its last mix, the newest whole version from each sender (each
verified by header, footer and checksum), never waiting for any:
w = (w + sum_s w_s) / (1 + m) over the m senders whose model arrived.  m = 1 is the
pull's (w + w_peer) / 2; with m > 1 every model counts alike, as each is one peer's
whole model, where mixing them one after the other would weigh the last at 1/2 and
the first at 1/2^m by the order MPI delivered them; m = 0 leaves w as it is (a pull
never waited for a particular version either).  With a uniform choice every rank
receives one model per period on average (the sum over senders of 1/(K-1)), as a
puller mixes one.  Ranks that joined (Exchange.join) neither push nor are mixed: a
model from a rank absent from this step counts as not arrived.

Peer choice: uniformly at random; or, during the first `warmup` iterations, with
probability inversely proportional to the communication time this rank believes each
peer has (its time table c_i).  After every pull (push) c_i[j] = UPDATE_TIME(c_i[j],
measured); during the warm-up the peer's own table, read from its window (one atomic
read of all its words), is merged entry by entry with UPDATE_TIME (UPDATE_TIMES) and
each rank publishes its table in its window.  Pushed, the table travels with the model
(the channel's words) during the warm-up, and the receiver merges each sender's: the
rank that mixes a model merges its sender's table, as a puller does.  After the
warm-up nothing reads the tables (the choice is uniform), so no pull pays their round
trips.

UPDATE_TIME(c, new) (the paper's text is garbled; our reading, tested): a much smaller
time (new < (1 - threshold) c) replaces c; a much larger one (new > (1 + threshold) c)
moves c half way, (c + new) / 2; otherwise c stays.  Unknown entries start at INF, so
the first measurement replaces them.  Peers still unknown get the probability of the
fastest known one, so that they are tried.

At the first communication at least CALIBRATION_STEPS iterations after the first step,
every rank measures E[G] (compute time per iteration since its first step) and E[C]
(one pull from every peer, the emulated link delay included), and the ranks exchange
them (one allgather) to evaluate the paper's congestion condition
eq. (1), (1/(K-1)) sum_{j != i} (T E[G_j] + E[C_j]) < E[C_i], and the smallest T
that avoids it, eq. (2): `policy.report`.

Bandwidth emulation (asapmpi.links.LinkModel, options wide_mbps, narrow_mbps, narrow,
latency_ms): a pull from j takes at least links.seconds(i, j, bytes); the serving
node's link is reserved in a "busy until" word of its window (MPI_Fetch_and_op: MAX
to raise it to now, then SUM to take the transfer's time), so pulls from a narrow node
queue as on a congested link.  Pushed, the serving node is the sender itself, and
only it sends its model: its busy-until is its own clock, no remote word, and the
sender sleeps out the transfer (links.seconds(i, j, bytes)) before it hands the model
to MPI, as a puller sleeps out its pull.  The transfer's time lands on the node whose
model travels; the links are symmetric (seconds(i, j) = seconds(j, i)), so a narrow
node's pushes, and the pushes to it, cost what its pulls and the pulls from it cost.
A push's measured time (the time table, E[C]) is that emulated time plus the last
observed latency of a send to that peer (posting to the pump that saw it complete:
what the real network took, the receiver's progress included).
"""
from __future__ import annotations

import time
from typing import Dict, List, Optional

import numpy as np

from ..errors import ConfigError, NeighbourTimeoutError
from ..links import LinkModel
from ..options import Option, Options
from ..reduce.graphs import graph as make_graph
from .base import Policy, Reads, StepContext

INF_NS = (1 << 62)
_BUSY = 0                      # user word 0: the link's busy-until time (ns)
_TABLE = 1                     # user words 1..K: this rank's time table (ns)


def update_time(c: float, new: float, threshold: float) -> float:
    """UPDATE_TIME of Algorithm 2 (module docstring)."""
    if (1.0 - threshold) * c > new:
        return new
    if (1.0 + threshold) * c < new:
        return (c + new) / 2.0
    return c


class Gossip(Policy):
    """Pull-gossip SGD with a period and a warm-up (module docstring)."""

    name = "gossip"
    #: a peer's published model and words, read one-sidedly while the peer goes on
    reads = Reads.PULL
    depth = 0                  # no receive slots: peers are pulled, not pushed to
    #: two published slots taking turns: a pull reading the newest model is not torn by
    #: the next publish, which writes the other
    publish_slots = 2
    #: no rank waits for a particular peer: survivors of a failure learn of it by a
    #: probe each step (Policy.waits_for_none)
    waits_for_none = True
    OPTIONS = Options(
        Option("every", int, 1, "the period T: communicate every T iterations", low=1),
        Option("warmup", int, 0, "iterations with the warm-up choice of peers", low=0),
        Option("threshold", float, 0.1, "UPDATE_TIME's relative threshold", low=0, high=1,
               open_low=True, open_high=True),
        Option("seed", int, 0, "the peer choice's random seed", low=0),
        Option("wide_mbps", float, 0.0, "emulated bandwidth of the other ranks' links "
               "(0: not limited)", low=0),
        Option("narrow_mbps", float, 0.0, "emulated bandwidth of the narrow ranks' links",
               low=0),
        Option("narrow", list, (), "the ranks on narrow links", low=0),
        Option("latency_ms", float, 0.0, "emulated latency of every pull", low=0),
    )

    def __init__(self, **options):
        super().__init__(**options)
        o = self._options
        self.period, self.warmup, self.threshold, self.seed = \
            o["every"], o["warmup"], o["threshold"], o["seed"]
        self.links = LinkModel(o["wide_mbps"], o["narrow_mbps"], tuple(o["narrow"]),
                               o["latency_ms"])
        self.layouts = None
        self.report: Optional[Dict[str, object]] = None

    def topology(self, n: int):
        """Any rank may pull from any other: the complete graph (no slots: depth 0)."""
        if n < 2:
            raise ConfigError("gossip needs at least 2 ranks")
        bad = [r for r in self.links.narrow if not 0 <= r < n]
        if bad:
            raise ConfigError(f"gossip narrow ranks {bad} are outside 0..{n - 1}")
        return make_graph("complete", n)

    def user_words(self, rank: int, n: int) -> int:
        """The busy-until word and the time table."""
        return 1 + n

    #: iterations timed before the congestion condition is evaluated
    CALIBRATION_STEPS = 5

    def start(self) -> None:
        """Empty time table (INF); E[G] is timed from the first step on."""
        self._started = None
        self._table: Optional[np.ndarray] = None
        self._rng = None
        self._tmp = None
        self._comm_seconds = 0.0
        self._uncounted_seconds = 0.0
        self.pulls = self.table("pulls")       # version, peer, got, seconds
        # version, peer pushed to, models mixed, seconds of the push, of the mix
        self.pushes = self.table("pushes")
        #: models mixed so far (a pull mixes one; pushes what arrived): the trace's
        #: tables are bounded, this count is not
        self.mixed = 0

    # ------------------------------------------------------------------ one iteration

    @property
    def extra_wait_seconds(self) -> float:
        """Seconds spent pulling (emulated link time included) that the window's own
        wait_seconds does not count: time not computing."""
        return self._uncounted_seconds

    def send(self, win, buf, version: int, ctx: StepContext) -> None:
        """On a communication iteration: publish the model, or push it to a peer."""
        if self._started is None:
            self._started = (time.monotonic(), version)
        if version % self.period:
            return
        self._ready(win, buf)
        if win.pushes:
            self._push(win, buf, version, ctx)
        else:
            win.publish(buf, version)

    def _ready(self, win, buf) -> None:
        if self._table is None:
            self._table = np.full(win.size, float(INF_NS))
            self._rng = np.random.default_rng([self.seed, win.rank])
            self._tmp = np.empty_like(np.frombuffer(buf, dtype=np.uint8))
            self._weights = np.zeros(win.n_in)

    def receive(self, win, buf, version: int, ctx: StepContext) -> None:
        """On a communication iteration: pull one peer and average, or mix what was
        pushed to this rank."""
        if version % self.period:
            return
        self._ready(win, buf)
        if self.report is None and version - self._started[1] >= self.CALIBRATION_STEPS:
            # every rank passes the same communication iterations: one allgather
            self._congestion(win, ctx, version)
        if win.pushes:
            self._mix_pushed(win, buf, version, ctx)
            return
        n = win.size
        peer = self._choose(self._peers(win, ctx), version)
        counted, start = win.wait_seconds, time.monotonic()
        got = self._pull(win, peer, ctx)
        took = time.monotonic() - start
        self._comm_seconds += took
        # the window counted its own polls of this pull in win.wait_seconds already
        self._uncounted_seconds += max(0.0, took - (win.wait_seconds - counted))
        self._table[peer] = update_time(self._table[peer], took * 1e9, self.threshold)
        if version <= self.warmup:
            # UPDATE_TIMES: only the warm-up's choice reads the tables (after it the
            # choice is uniform), so only the warm-up pays their round trips
            theirs = self._peer_table(win, peer)
            for k in range(n):
                # 0: the peer has not published that entry (windows start zeroed)
                if k != win.rank and 0 < theirs[k] < INF_NS:
                    self._table[k] = update_time(self._table[k], float(theirs[k]),
                                                 self.threshold)
            self._publish_table(win)
        if win.itemsize == 2:
            # bfloat16 (bit patterns) and float16: averaged in float32 by the reduce kernel
            from .._core.kernels import weighted_sum

            kind = np.uint16 if win.dtype == "bfloat16" else np.float16
            array = np.frombuffer(buf, dtype=kind)
            weighted_sum(array, array, 0.5, [np.frombuffer(self._tmp, dtype=kind)],
                         [0.5], bfloat16=win.dtype == "bfloat16", wide=ctx.wide)
            if ctx.wide is not None:
                ctx.wide_count += 1
        else:
            array = np.frombuffer(buf, dtype=self._dtype(win))
            peer_model = np.frombuffer(self._tmp, dtype=array.dtype)
            np.add(array, peer_model, out=array)
            array *= 0.5
        self.pulls.append((version, peer, got, took))
        self.mixed += 1

    @staticmethod
    def _peers(win, ctx: StepContext) -> List[int]:
        peers = [r for r in range(win.size) if r != win.rank]
        if ctx.absent:
            # ranks that joined (Exchange.join) are no one's peers while another trains
            peers = [r for r in peers if r not in ctx.absent] or peers
        return peers

    def _push(self, win, buf, version: int, ctx: StepContext) -> None:
        """Send the model to the peer the schedule chose (never waits for it)."""
        if win.rank in ctx.absent:
            return              # a joined rank's replica is in nobody's average
        peer = self._choose(self._peers(win, ctx), version)
        start = time.monotonic()
        if self.links.active:
            # the sender's own link carries its model: only it reserves it
            time.sleep(self.links.seconds(win.rank, peer, win.nbytes))
        table = np.minimum(self._table, INF_NS).astype(np.int64) if version <= self.warmup \
            else None
        win.push(buf, version, peer, table)
        # a push never waits, but a peer that has not taken a model for a whole timeout
        # is dead or stalled: named, as a wait on it would name it
        late = win.overdue(ctx.timeout)
        if late:
            raise NeighbourTimeoutError(win.rank, "its receive of a pushed model", late, [],
                                        [], ctx.timeout)
        took = time.monotonic() - start
        self._comm_seconds += took
        self._uncounted_seconds += took
        latency = win.push_seconds(peer)
        self._table[peer] = update_time(self._table[peer],
                                        (took + max(latency, 0.0)) * 1e9, self.threshold)
        self._pushed = (peer, took)

    def _mix_pushed(self, win, buf, version: int, ctx: StepContext) -> None:
        """buf = (buf + the newest model of each of the m senders that arrived) /
        (1 + m), verified; none: buf as it is (module docstring)."""
        start = time.monotonic()
        versions = win.take()
        senders = win.in_ranks
        for i, s in enumerate(senders):
            if s in ctx.absent:
                versions[i] = 0         # a joined rank's model counts as not arrived
        m = int(np.count_nonzero(versions > 0))
        mixed = 0
        if m:
            self._weights[:] = np.where(versions > 0, 1.0 / (1 + m), 0.0)
            mixed = win.reduce_versions(buf, 1.0 / (1 + m), self._weights, versions,
                                        checksum=True)
            if version <= self.warmup:
                for i in np.flatnonzero(versions > 0):
                    theirs = win.taken_words(int(i))[:win.size]
                    for k in range(win.size):
                        if k != win.rank and 0 < theirs[k] < INF_NS:
                            self._table[k] = update_time(self._table[k], float(theirs[k]),
                                                         self.threshold)
        win.release(1 << 62)
        self.mixed += mixed
        took = time.monotonic() - start
        self._uncounted_seconds += took
        peer, pushed = getattr(self, "_pushed", (-1, 0.0))
        self._pushed = (-1, 0.0)
        self.pushes.append((version, peer, mixed, pushed, took))

    def _dtype(self, win):
        return np.float32 if win.dtype == "float32" else np.float64

    def _choose(self, peers: List[int], version: int) -> int:
        if version > self.warmup:
            return int(self._rng.choice(peers))
        times = self._table[peers]
        known = times < INF_NS
        if not known.any():
            return int(self._rng.choice(peers))
        times = np.where(known, times, times[known].min())
        p = (1.0 / times) / np.sum(1.0 / times)
        return int(self._rng.choice(peers, p=p))

    def _pull(self, win, peer: int, ctx: StepContext) -> int:
        """The peer's newest whole model into self._tmp (emulated link time included);
        returns its version."""
        disp = self.layouts[peer].off_publish
        deadline = time.monotonic() + ctx.timeout
        while True:
            self._wait_for_link(win, peer)
            got = win.pull(peer, disp, self._tmp)
            if got:
                return got
            if time.monotonic() > deadline:
                raise NeighbourTimeoutError(win.rank, "a whole published model", [peer],
                                            [1], [got], ctx.timeout)
            time.sleep(1e-4)       # empty (not yet published) or overwritten meanwhile

    def _wait_for_link(self, win, peer: int) -> None:
        """Reserve the serving peer's link for this transfer, then let the time pass."""
        if not self.links.active:
            return
        seconds = self.links.seconds(win.rank, peer, win.nbytes)
        disp = self.layouts[peer].user_disp(_BUSY)
        # The link's busy-until word only grows: raise it to now (MPI_MAX), then take the
        # next `seconds` of it (MPI_SUM returns where this transfer starts).  Two
        # reservations never overlap: each SUM takes its own interval of the word.  No
        # compare-and-swap loop: Open MPI 4.1 crashes in a 64-bit one on shared memory.
        took = int(seconds * 1e9)
        win.accumulate_word(peer, disp, time.monotonic_ns(), op="max")
        until = win.accumulate_word(peer, disp, took, op="sum") + took
        # at most everybody queued on this link: a clock from another host (emulation
        # is for one host) cannot make a pull sleep for hours
        delay = min(until / 1e9 - time.monotonic(), seconds * win.size + 1.0)
        if delay > 0:
            time.sleep(delay)

    def _peer_table(self, win, peer: int) -> np.ndarray:
        # the whole table in one atomic read (one round trip)
        return win.fetch_words(peer, self.layouts[peer].user_disp(_TABLE),
                               win.size).astype(float)

    def _publish_table(self, win) -> None:
        own = self.layouts[win.rank]
        for k, value in enumerate(self._table):
            win.accumulate_word(win.rank, own.user_disp(_TABLE + k), int(min(value, INF_NS)))

    def _congestion(self, win, ctx: StepContext, version: int) -> None:
        """E[G] (compute seconds per iteration since the first step) and E[C] (one pull
        from each peer; pushed: each peer's emulated transfer plus the observed latency
        of a send to it, none sent for the purpose) of every rank, one allgather, and
        the paper's eq. (1)-(2)."""
        since, first = self._started
        g = (time.monotonic() - since - self._comm_seconds) / (version - first)
        times = []
        peers = [p for p in range(win.size) if p != win.rank]
        if win.pushes:
            seen = [win.push_seconds(p) for p in peers]
            known = [t for t in seen if t >= 0]
            typical = float(np.mean(known)) if known else 0.0
            times = [self.links.seconds(win.rank, p, win.nbytes) if self.links.active
                     else 0.0 for p in peers]
            times = [t + (s if s >= 0 else typical) for t, s in zip(times, seen)]
        for peer in ([] if win.pushes else peers):
            start = time.monotonic()
            self._pull_any(win, peer, ctx)
            times.append(time.monotonic() - start)
        c = float(np.mean(times))
        every = win.allgather_doubles([g, c], ctx.timeout)       # (K, 2)
        self.report = congestion_report(every[:, 0], every[:, 1], self.period)

    def _pull_any(self, win, peer: int, ctx: StepContext) -> None:
        # the calibration pull: the peer may not have published yet (its first
        # communication iteration is now too), so an empty slot counts as read
        self._wait_for_link(win, peer)
        win.pull(peer, self.layouts[peer].off_publish, self._tmp)

    @property
    def trace(self) -> Dict[str, np.ndarray]:
        """Per pull: [iteration, peer, version read, seconds]; per push and mix:
        [iteration, peer pushed to (-1: none), models mixed, seconds of the push (the
        emulated link's included), seconds of the mix]."""
        out = {"pulls": self.pulls.array()} if self.pulls.count else {}
        if self.pushes.count:
            out["pushes"] = self.pushes.array()
        return out


def congestion_report(g: np.ndarray, c: np.ndarray, period: int) -> Dict[str, object]:
    """Eq. (1) per node i: congested when mean_{j != i}(T G_j + C_j) < C_i; eq. (2): the
    smallest T with no congested node."""
    k = len(g)
    lhs = np.array([(period * (g.sum() - g[i]) + (c.sum() - c[i])) / (k - 1)
                    for i in range(k)])
    congested = lhs < c
    need = [((k - 1) * c[i] - (c.sum() - c[i])) / max(g.sum() - g[i], 1e-12)
            for i in range(k)]
    return {"period": period, "compute_s": g.tolist(), "comm_s": c.tolist(),
            "interval_s": lhs.tolist(), "congested": congested.tolist(),
            "min_period": max(1, int(np.ceil(max(need))))}
