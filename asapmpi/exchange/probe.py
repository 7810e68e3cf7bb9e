"""transport="auto" by measurement: time a step of each transport that fits.

NOTIFY-ACK waits, every step, for one signal per neighbour and direction: on the
put and shared transports a notify or an ack is an int64 word written into the
neighbour's window (MPI_Fetch_and_op, completed lazily), on the message transport the
update is a message and its posted receive the ack.  Which is faster is a property of
the MPI stack, not of its name: on shared memory a window word costs a store, on
MPICH's active-message network path and on Open MPI's UCX over TCP it is several round
trips that wait for the target's CPU, while a message costs one.

`measure` opens, on the graph given, the window of each channel the resolver gives the
policy (asapmpi.transports.channels: SharedWindow or PutWindow against MessageWindow
for NOTIFY-ACK, PutWindow against MailboxWindow for Hop and BSP, against NewestWindow
for async, backup_ps and elastic), and times ROUNDS steps through the channel verbs on
each after WARMUP steps, alternating, so that both see the same load (ranks
oversubscribing cores, other jobs).  A step is deliver(k), await_(k), release(k), each
writer waiting for its readers' release of k - 1 (waits_for_release): one signal per
neighbour and direction, whatever the policy's own pace, so that the two channels are
compared on the same round trip.  It runs the window's own code, with its waits,
progress and timeouts.  Collective.

Both carry the update's size (up to MESSAGE_PROBE_BYTES, the time scaled above), as
the exchange will: what a signal costs is not what moving a megabyte costs, and the
two can rank the transports differently.  Over TCP to a host whose CPU is starved, a
put's flush waits for the target to copy every put into its window (MPICH's
active-message RMA), while the messages' receives were posted ahead: timed with 8-byte
signals the two were within noise and either was taken, and backup_ps ran at 1.5 or
7.3 it/s by which (docs/BENCHMARKS.md, issue 32).  The shared channel's deliver copies
the update once, into its own slot, which its readers reduce in place; a message moves
it through MPI into the reader's slot.

Gossip (`measure_gossip`) has no NOTIFY-ACK step: its probe times gossip's own steps on
each channel, a pull (publish, MPI_Rget of a random peer's two published slots,
verified, averaged) against a push (push to a random peer, take what arrived, the
verified reduce, release), GOSSIP_STEPS back to back per round, and charges each
round per model mixed: a push that waits for nobody could otherwise look free while
its models arrive late or not at all (flow control replaces a model whose channel is
busy).  A pull mixes one model a step; pushes mix what arrived, so their time per
round is scaled by (steps x ranks) / models mixed by all ranks in the measured rounds.
"""
from __future__ import annotations

import statistics
import time
from typing import Any, Dict

import numpy as np
from mpi4py import MPI

from .._core import Layout
from .._core.segments import SharedSegments
from .._core.slotwin import settle_all
from ..errors import NeighbourTimeoutError
from ..reduce.graphs import graph as make_graph
from ..sync import Await
from .construction import open_window

WARMUP = 3
ROUNDS = 15
#: the largest update the message probe sends (larger updates: its time scaled up)
MESSAGE_PROBE_BYTES = 1 << 20


def _window(comm: MPI.Comm, g, channel, timeout: float, slack_ns: int, nbytes: int):
    """`channel`'s window on `g` with one slot per sender of `nbytes`, its writers
    waiting for their readers' release; (window, its shared-memory segments or None)."""
    rank = comm.Get_rank()
    layouts = [Layout(g.in_degree(r), g.out_degree(r), 1, nbytes, 0, 0,
                      channel.in_place_read) for r in range(g.n)]
    # a mailbox keeps no version past its release (retain 0: one slot)
    options = {"waits_for_release": True, **dict.fromkeys(channel.takes, 0)}
    segments = None
    if channel.in_place_read:
        segments = SharedSegments(comm, layouts[rank].segment_bytes, g.in_neighbours(rank))
        options["outboxes"] = (segments.own, segments.peers)
    try:
        win = open_window(comm, g, layouts, rank, channel.window_class(), "float64",
                          timeout, slack_ns, **options)
    except BaseException:
        if segments is not None:
            segments.close()
        raise
    # the release of version 0: every slot is free for version 1
    win.release(0)
    return win, segments


def measure(comm: MPI.Comm, g, channels: Dict[str, Any], timeout: float,
            slack_ns: int = 0, update_bytes: int = 8) -> Dict[str, float]:
    """Seconds per round of each channel in `channels` (a name: the Channel the
    resolver gave the policy in a family, asapmpi.transports.channels) over graph `g`,
    each step moving an update of `update_bytes`, the time scaled by update_bytes /
    MESSAGE_PROBE_BYTES above it: the median round after the warm-up, the slowest
    rank's; the windows' waits sleep with timer slack `slack_ns` (0: the thread's own),
    as the exchange's will.  Collective."""
    sent = max(8, min(update_bytes, MESSAGE_PROBE_BYTES)) // 8 * 8
    bufs = {name: np.zeros(sent // 8, dtype=np.float64) for name in channels}
    times: Dict[str, list] = {name: [] for name in channels}
    # exact versions where the channel gives them; a mailbox of newest versions may
    # replace k by k + 1 before anyone sees it: at least k there
    modes = {name: Await.EXACT if Await.EXACT in c.awaits else Await.AT_LEAST
             for name, c in channels.items()}
    # on an error (a neighbour's timeout) the windows are left to MPI_Abort or
    # MPI_Finalize: freeing is collective and could wait for the rank that failed
    wins = {name: _window(comm, g, c, timeout, slack_ns, sent)
            for name, c in channels.items()}
    for k in range(1, WARMUP + ROUNDS + 1):
        for name, (win, _) in wins.items():
            # each round from a common start: a slow round of the other channel (large
            # messages) must not leave its skew to this one.  The lazy notifies and acks
            # go first: a neighbour may still wait for them (an MPI may issue them only
            # at a flush: Open MPI's osc over tcp does).  The window's barrier has a
            # deadline: a rank that failed its round leaves the others a timeout error,
            # not a hang
            settle_all(timeout)
            win.barrier(timeout)
            # one step through the channel verbs, as NOTIFY-ACK runs it
            t0 = time.perf_counter()
            win.deliver(bufs[name], k, timeout)
            win.await_(k, timeout, modes[name])
            win.release(k)
            if k > WARMUP:
                times[name].append(time.perf_counter() - t0)
    for win, segments in wins.values():
        win.free()
        if segments is not None:
            segments.close()
    scale = max(1.0, update_bytes / sent)
    return {name: comm.allreduce(statistics.median(ts), op=MPI.MAX) * scale
            for name, ts in times.items()}


#: gossip steps per probe round (measure_gossip)
GOSSIP_STEPS = 4


def _gossip_window(comm: MPI.Comm, g, channel, timeout: float, slack_ns: int,
                   nbytes: int):
    # the gossip exchange's layout: complete graph, no receive slots, two published
    # slots where a pull reads them and the time table's words (what a push carries)
    publish = 2 if channel.reads_published else 0
    layouts = [Layout(g.in_degree(r), g.out_degree(r), 0, nbytes, 1 + g.n, publish,
                      False) for r in range(g.n)]
    win = open_window(comm, g, layouts, comm.Get_rank(), channel.window_class(),
                      "float64", timeout, slack_ns)
    return win, layouts


def _gossip_step(win, layouts, buf, tmp, version: int, rng, timeout: float) -> int:
    """One gossip step on `win`; returns the models it mixed."""
    peers = [r for r in range(win.size) if r != win.rank]
    peer = int(rng.choice(peers))
    if win.pushes:
        win.push(buf, version, peer)
        versions = win.take()
        m = int(np.count_nonzero(versions))
        if m:
            weights = np.where(versions > 0, 1.0 / (1 + m), 0.0)
            m = win.reduce_versions(buf, 1.0 / (1 + m), weights, versions, checksum=True)
        win.release(1 << 62)
        return m
    win.publish(buf, version)
    deadline = time.monotonic() + timeout
    while not win.pull(peer, layouts[peer].off_publish, tmp):
        if time.monotonic() > deadline:     # gossip's own pull raises the same way
            raise NeighbourTimeoutError(win.rank, "a whole published model", [peer], [1],
                                        [0], timeout)
        time.sleep(1e-4)
    buf += tmp
    buf *= 0.5
    return 1


def measure_gossip(comm: MPI.Comm, channels: Dict[str, Any], timeout: float,
                   slack_ns: int = 0, update_bytes: int = 8,
                   oversubscribed: bool = False) -> Dict[str, float]:
    """Seconds per model mixed of gossip on each channel of `channels` (a name: the
    Channel the resolver gave gossip in a family: a window's one-sided pull, or pushes),
    each step moving a model of `update_bytes` (up to
    MESSAGE_PROBE_BYTES, the time scaled above): the median round of GOSSIP_STEPS steps
    after the warm-up, the slowest rank's, per step, times (steps x ranks) / models
    mixed; the pushes yield where the ranks share cores (`oversubscribed`), as the
    exchange's do.  Collective."""
    n, rank = comm.Get_size(), comm.Get_rank()
    g = make_graph("complete", n)
    sent = max(8, min(update_bytes, MESSAGE_PROBE_BYTES)) // 8 * 8
    rng = np.random.default_rng([7, rank])
    names = list(channels)
    wins = {name: _gossip_window(comm, g, c, timeout, slack_ns, sent)
            for name, c in channels.items()}
    for win, _ in wins.values():
        if win.pushes:
            win.yields = oversubscribed
    bufs = {name: np.full(sent // 8, float(rank)) for name in names}
    tmp = np.empty(sent // 8)
    times: Dict[str, list] = {name: [] for name in names}
    mixed = dict.fromkeys(names, 0)
    version = 0
    for k in range(1, WARMUP + ROUNDS + 1):
        for name, (win, layouts) in wins.items():
            settle_all(timeout)
            win.barrier(timeout)
            t0 = time.perf_counter()
            got = 0
            for _ in range(GOSSIP_STEPS):
                version += 1
                got += _gossip_step(win, layouts, bufs[name], tmp, version, rng, timeout)
            if k > WARMUP:
                times[name].append((time.perf_counter() - t0) / GOSSIP_STEPS)
                mixed[name] += got
    for win, _ in wins.values():
        win.free()
    scale = max(1.0, update_bytes / sent)
    out = {}
    for name in names:
        slowest = comm.allreduce(statistics.median(times[name]), op=MPI.MAX)
        total = comm.allreduce(mixed[name], op=MPI.SUM)
        expected = ROUNDS * GOSSIP_STEPS * n
        out[name] = slowest * scale * expected / max(total, 1)
    return out
