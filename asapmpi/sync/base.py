"""The policy interface: when to send, what to reduce, when to advance.

A policy drives a SlotWindow through one step; it never touches bytes itself.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Tuple

import numpy as np

from .records import Records, Table


@dataclass
class StepContext:
    """What a policy needs for one step, fixed at Exchange creation."""

    w_self: float
    weights: np.ndarray      # float64, one per in-neighbour, in in-neighbour order
    timeout: float
    checksum: bool
    comm: Optional[Any] = None          # policies that use collectives (allreduce)
    array: Optional[np.ndarray] = None  # the buffer as a NumPy array, for them
    #: double buffering (Exchange(double_buffer=True)): this rank's two own slots;
    #: version k is computed in buffers[k % 2] and reduced into the other
    buffers: Tuple[np.ndarray, ...] = ()
    #: how updates reach the slots (asapmpi.transports), for policies that run on any
    #: transport (Policy.outbox / Policy.messages)
    transport: Optional[Any] = None


def server_star(policy: str, server: int, n: int):
    """The star around `server` that a parameter-server policy runs on (ConfigError
    when the server is outside 0..n-1 or there is no worker)."""
    from ..errors import ConfigError
    from ..reduce.graphs import star

    if not 0 <= server < n:
        raise ConfigError(f"{policy} server={server} is outside the communicator "
                          f"(ranks 0..{n - 1})")
    if n < 2:
        raise ConfigError(f"{policy} needs a server and at least one worker: run on 2 or "
                          f"more ranks")
    return star(n, root=server)


class Policy:
    """Base class of synchronization policies."""

    name = "policy"
    #: receive slots per sender the policy needs
    depth = 1
    #: slots of its own that others pull from (gossip)
    publish_slots = 0
    #: whether the policy exchanges through a slot window (else through ctx.comm)
    uses_window = True
    #: whether its steps are correct when out-neighbours read the sender's own slot in
    #: place (the shared-memory transport): the sender must not rewrite a slot before
    #: every reader acknowledged it
    outbox = False
    #: whether it can run on the message transport: each version one two-sided message
    #: per out-neighbour into the reader's slot, a posted receive acting as the ack
    messages = False
    #: whether it runs on a mailbox window (transport="messages" for policies that wait
    #: on window words): puts, notifies and acks travel as two-sided messages that the
    #: reader's waits complete into its slots and words (asapmpi/_core/mailbox.pxi)
    mailbox = False
    #: mailbox: after ack(c) the slots holding versions <= c - retain are refilled (the
    #: oldest version a later iteration may still reduce is c + 1 - retain)
    retain = 0
    #: mailbox of newest versions: one slot per sender that always holds the newest
    #: whole version that arrived, and a writer that never waits for a reader (a busy
    #: reader gets only the newest version once it takes messages again).  For policies
    #: that read "any version >= k" rather than exactly k from each sender (depth 1)
    newest = False
    #: whether every rank completes the same steps at about the same time (each waits
    #: for its neighbours' current version): ranks then reach free() within one step of
    #: each other.  Policies that let ranks drift apart (backup workers, staleness,
    #: parameter servers, gossip) leave it False.
    lockstep = False

    #: where the policy's per-iteration rows go (set by the Exchange before start())
    records: Optional[Records] = None

    def options(self) -> dict:
        """The policy's options (compared across ranks at creation)."""
        return {}

    def table(self, name: str, dtype=np.float64) -> Table:
        """A bounded table of per-iteration rows for the trace (asapmpi.sync.records)."""
        if self.records is None:
            self.records = Records()
        return self.records.table(name, dtype)

    def user_words(self, rank: int, n: int) -> int:
        """Control words the policy needs in `rank`'s window (default none)."""
        return 0

    def validate(self, graph, rank: int) -> None:
        """Refuse options that do not fit the graph (ConfigError); same on every rank."""

    def start(self) -> None:
        """Called once the window exists, before the first step."""

    def step(self, win, buf, version: int, ctx: StepContext) -> Optional[int]:
        """Run step `version` (1, 2, ...): send `buf`, reduce into it, advance.  Returns
        the last iteration completed when it is not `version` (a jump), else None."""
        self.send(win, buf, version, ctx)
        return self.receive(win, buf, version, ctx)

    def send(self, win, buf, version: int, ctx: StepContext) -> None:
        """The first half of a step: publish `buf` as `version`.  After it returns the
        caller may read `buf` (compute gradients on it) but must not write it before
        receive(): Hop's parallel computation graph (section 3.2)."""
        raise NotImplementedError

    def receive(self, win, buf, version: int, ctx: StepContext) -> Optional[int]:
        """The second half of a step: wait for what `version` needs, reduce into `buf`,
        advance.  Returns what step() returns."""
        raise NotImplementedError
