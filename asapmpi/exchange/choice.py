"""Which transport (channel family) an Exchange runs on: the one asked for, the only one
that fits its policy, or, under transport="auto", the faster of those that fit as
measured at creation (asapmpi.exchange.probe).  The choice is the same on every rank and
reported (ex.transport_report)."""
from __future__ import annotations

from typing import Any, Dict, List, Tuple

from mpi4py import MPI

from ..errors import ConfigError
from ..launchers import network_forced
from ..reduce.graphs import Graph
from ..sync.base import Reads
from ..transports import families, resolve
from . import probe


def on_one_host(comm: MPI.Comm) -> bool:
    """True when every rank of comm can map the others' memory (collective)."""
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return node.Get_size() == comm.Get_size()
    finally:
        node.Free()


def choose_transport(requested: str, policy, comm: MPI.Comm, g: Graph, hosts: List[str],
                     timeout: float, nbytes: int, slack_ns: int = 0,
                     oversubscribed: bool = False) -> Tuple[str, Dict[str, Any]]:
    """The transport (channel family) of this exchange, the same on every rank, and the
    report of how it was chosen (ex.transport_report).  Collective.

    What fits the policy is the resolver's (asapmpi.transports.channels).  An explicit
    choice wins.  Under "auto", a policy that one family fits gets it; where several fit
    (window words or messages) a step of the channel each gives the policy, moving an
    update of `nbytes`, is timed (asapmpi.exchange.probe: through the channel verbs, as
    NOTIFY-ACK steps; gossip's pulls and pushes as gossip steps), per neighbour class,
    and the faster one taken (the report names the window classes timed, "timed"):
    the step waits for its slowest neighbour, so a transport costs its slowest class.
    `oversubscribed`: this rank's host has fewer cores than ranks (pushes then yield,
    as the exchange's will: PushWindow.yields)."""
    report: Dict[str, Any] = {"requested": requested}
    fit = families(policy)
    if requested != "auto" or len(fit) == 1:
        chosen = requested if requested != "auto" else fit[0]
        if resolve(chosen, policy).one_host and not on_one_host(comm):
            others = [f for f in fit if not resolve(f, policy).one_host]
            raise ConfigError(f"transport={chosen!r} needs every rank on one host; use "
                              f"transport={', '.join(map(repr, others))} or 'auto'")
        report.update(chosen=chosen, reason="asked for" if requested != "auto" else
                      f"the only transport sync={policy.name!r} has")
        return chosen, report
    channel = {f: resolve(f, policy) for f in fit}
    one_host = on_one_host(comm)
    # the environment could differ between ranks: agree on the most conservative
    local = comm.allreduce(int(one_host and not network_forced()), op=MPI.MIN)
    # signals in window words (reading in place first: it copies nothing) or messages
    words = sorted((f for f in fit if channel[f].remote_atomics
                    and (local or not channel[f].one_host)),
                   key=lambda f: not channel[f].in_place_read)
    by_messages = [f for f in fit if not channel[f].remote_atomics]
    if not by_messages or not words:
        chosen = (words or by_messages)[0]
        report.update(chosen=chosen, reason=f"{'window words' if words else 'messages'}: "
                                            f"the only signals this policy has here")
        return chosen, report
    window, messages_family = words[0], by_messages[0]
    limit = channel[messages_family].max_update_bytes
    if limit is not None and nbytes > limit:
        report.update(chosen=window, reason=f"an update of {nbytes} bytes is more than "
                                            f"one message carries ({limit})")
        return window, report
    if policy.reads is Reads.PULL:
        return _choose_gossip(comm, timeout, slack_ns, nbytes, window, messages_family,
                              channel, report, oversubscribed)
    # the channels the resolver gives the policy in each family, each moving the
    # update as the exchange will (a signal's cost does not rank them for a megabyte)
    timed = {"words": channel[window], "messages": channel[messages_family]}
    in_place = channel[window].in_place_read
    measured: Dict[str, Dict[str, float]] = {}
    for name in ("same host", "other host"):
        keep = [[j for j in g.out_neighbours(r)
                 if (hosts[j] == hosts[r]) == (name == "same host")] for r in range(g.n)]
        if not any(keep):
            continue
        measured[name] = probe.measure(comm, Graph(g.n, keep, name), timed, timeout,
                                       slack_ns, nbytes)
    if not measured:
        report.update(chosen=window, reason="no neighbours to measure")
        return window, report
    # decide on the figures the report gives (0.1 us, below the noise), so the report
    # always explains the choice; a tie keeps the window, which copies nothing
    rounds = {name: {k: round(v * 1e6, 1) for k, v in m.items()}
              for name, m in measured.items()}
    words_us = max(m["words"] for m in rounds.values())
    messages_us = max(m["messages"] for m in rounds.values())
    chosen = messages_family if messages_us < words_us else window
    report.update(chosen=chosen, reason=f"measured with {nbytes}-byte updates: window "
                                        f"words {words_us:.0f} us"
                                        f"{' (read in place)' if in_place else ''}, "
                                        f"messages {messages_us:.0f} us a round",
                  rounds=rounds, unit="us per round", message_bytes=nbytes,
                  window_bytes=nbytes,
                  timed={name: c.window for name, c in timed.items()})
    return chosen, report


def _choose_gossip(comm: MPI.Comm, timeout: float, slack_ns: int, nbytes: int,
                   window: str, messages_family: str, channel: Dict[str, Any],
                   report: Dict[str, Any], oversubscribed: bool = False
                   ) -> Tuple[str, Dict[str, Any]]:
    """Gossip: pulls (one-sided reads of a peer's published model) against pushes, each
    timed as gossip steps per model mixed (probe.measure_gossip); a tie keeps the
    window."""
    timed = {"words": channel[window], "messages": channel[messages_family]}
    measured = probe.measure_gossip(comm, timed, timeout, slack_ns, nbytes, oversubscribed)
    rounds = {"all peers": {k: round(v * 1e6, 1) for k, v in measured.items()}}
    pull_us, push_us = rounds["all peers"]["words"], rounds["all peers"]["messages"]
    chosen = messages_family if push_us < pull_us else window
    report.update(chosen=chosen, reason=f"measured gossip steps with {nbytes}-byte models: "
                                        f"pulls {pull_us:.0f} us, pushes {push_us:.0f} us "
                                        f"per model mixed",
                  rounds=rounds, unit="us per model mixed", message_bytes=nbytes,
                  window_bytes=nbytes,
                  timed={name: c.window for name, c in timed.items()})
    return chosen, report
