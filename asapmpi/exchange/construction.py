"""The slot window of a chosen channel: every rank's layout, where this rank writes in
its neighbours' windows, the polling settings and the put pieces of asapmpi.rc, and an
MPI failure explained (asapmpi.windowhint).  The exchange's windows and the transport
probe's are made here alike."""
from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Tuple

from mpi4py import MPI

from .. import _core
from .._core.layout import window_offsets
from .._core.segments import SharedSegments
from ..errors import MPIError
from ..rc import max_transfer, rc
from ..reduce.graphs import Graph
from ..windowhint import explained


def open_window(comm: MPI.Comm, g: Graph, layouts: Sequence[Any], rank: int, window_class,
                dtype: str, timeout: float, slack_ns: int = 0, **options):
    """A `window_class` slot window of `rank` over graph `g`, every rank's layout given
    (collective): its slots and words where its neighbours expect them, its waits
    polling as asapmpi.rc says with timer slack `slack_ns`, its flushes bounded by
    `timeout`, its puts in the pieces asapmpi.rc.max_transfer() gives (MPICH's
    active-message RMA crashes on larger ones).  An MPIError carries Open MPI's usual
    reason when the allocation failed."""
    out_slot, out_notify, in_ack = window_offsets(g, layouts, rank)
    try:
        win = window_class(comm, layouts[rank], g.in_neighbours(rank), g.out_neighbours(rank),
                           out_slot, out_notify, in_ack, dtype,
                           poll_yields=rc.poll_yields, poll_max_sleep_us=rc.poll_max_sleep_us,
                           poll_slack_ns=slack_ns, flush_timeout=timeout, **options)
    except MPIError as exc:
        raise explained(exc) from None
    win.max_transfer = max_transfer()
    return win


def exchange_window(comm: MPI.Comm, g: Graph, rank: int, policy, channel, nbytes: int,
                    dtype: str, double_buffered: bool, timeout: float,
                    slack_ns: int) -> Tuple[Any, Optional[SharedSegments]]:
    """The window of an exchange whose `policy` runs on `channel` (collective): (window,
    the shared-memory segments of its outboxes or None).  Sets policy.layouts: a policy
    that writes control words into other ranks' windows needs their offsets."""
    # double buffered: version k is computed in slot k % 2 and reduced into the other
    depth = 2 if double_buffered else policy.depth
    # where readers reduce in place, every rank's slots are its own (an outbox)
    outbox = channel.in_place_read
    # the model copies a one-sided pull reads (gossip): only where a pull reads them
    publish = policy.publish_slots if channel.reads_published else 0
    layouts = [_core.Layout(g.in_degree(r), g.out_degree(r), depth, nbytes,
                            policy.user_words(r, g.n), publish, outbox)
               for r in range(g.n)]
    policy.layouts = layouts
    # the policy's needs the window takes (a mailbox's retain, whether writers wait
    # for their readers' release)
    options: Dict[str, Any] = channel.window_options(policy, rank)
    segments = None
    if outbox:
        segments = SharedSegments(comm, layouts[rank].segment_bytes, g.in_neighbours(rank))
        options["outboxes"] = (segments.own, segments.peers)
        options["double_buffered"] = double_buffered
    try:
        win = open_window(comm, g, layouts, rank, channel.window_class(), dtype, timeout,
                          slack_ns, **options)
    except BaseException:
        if segments is not None:
            segments.close()
        raise
    return win, segments
