"""The policy interface: when to send, what to reduce, when to advance.

A policy drives a SlotWindow through one step; it never touches bytes itself.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, FrozenSet, Optional, Tuple

import numpy as np

from ..options import Options
from .records import Records, Table


class Reads(str, enum.Enum):
    """How a policy's reader takes its in-neighbours' updates (Policy.reads): the need
    that decides which channels can serve it (asapmpi.transports.channels matches it to
    what each channel advertises)."""

    #: exactly version k from every in-neighbour, and a writer at most one step ahead:
    #: it rewrites a slot only once its reader released the version there (NOTIFY-ACK)
    EXACT = "exact"
    #: words in its own window that it waits on (notifies over rotating slots, token and
    #: user counters), then the slots they name: the policy drives the window's put,
    #: waits and acks itself (Hop, BSP)
    WORDS = "words"
    #: each sender's newest whole version, from writers that never wait for a reader
    #: (async, backup_ps, elastic)
    NEWEST = "newest"
    #: a peer's newest whole model, mixed without waiting for the peer's step (gossip):
    #: pulled one-sidedly from what the peer published (a window), or pushed by the
    #: peer to the rank its schedule chose (messages)
    PULL = "pull"
    #: nothing through a window: MPI collectives (allreduce)
    NOTHING = "nothing"


class Await(enum.IntEnum):
    """What a channel's await_(k) waits for (the channel verbs, asapmpi.transports):
    a policy on the verbs declares the modes it uses (Policy.awaits), a channel the
    modes it gives (Channel.awaits).  The numbers are the core's (asapmpi._core's
    AWAIT_MODES, in this order)."""

    #: every in-neighbour's version k
    EXACT = 0
    #: every in-neighbour's version k or a newer one (writers that run ahead)
    AT_LEAST = 1
    #: version k from at least `count` in-neighbours (backup workers)
    COUNT = 2
    #: from every in-neighbour a whole version in [count, k], the newest per
    #: in-neighbour (bounded staleness)
    NEWEST = 3
    #: the other way: every out-neighbour released version k or a later one (Hop's
    #: tokens); a policy that awaits it writes only slots its readers released, so its
    #: deliver writes in the ordered sequence and its release(k) is what its writers
    #: wait for
    RELEASED = 4
    #: a barrier of all ranks, each entering it once it delivered version k, then
    #: every in-neighbour's version k in the slots (BSP)
    BARRIER = 5


@dataclass
class StepContext:
    """What a policy needs for one step, fixed at Exchange creation."""

    w_self: float
    weights: np.ndarray      # float64, one per in-neighbour, in in-neighbour order
    timeout: float
    checksum: bool
    comm: Optional[Any] = None          # policies that use collectives (allreduce)
    array: Optional[np.ndarray] = None  # the buffer as a NumPy array, for them
    dtype: str = "float32"              # its element type (bfloat16: bit patterns)
    #: double buffering (Exchange(double_buffer=True)): this rank's two own slots;
    #: version k is computed in buffers[k % 2] and reduced into the other
    buffers: Tuple[np.ndarray, ...] = ()
    #: a 16-bit buffer's float32 mix (the sums before rounding) also goes here when set
    #: (Exchange.keep_float32_mix), counted in wide_count (policies without a window)
    wide: Optional[np.ndarray] = None
    wide_count: int = 0
    #: ranks whose replicas are out of this step's average (they joined: Exchange.join);
    #: w_self and weights already leave out the in-neighbours among them, and present
    #: marks, per in-neighbour, those still in (None: all)
    absent: FrozenSet[int] = frozenset()
    present: Optional[np.ndarray] = None


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
    # What the policy needs from a channel; never a transport (one resolver,
    # asapmpi.transports.channels, matches these to what the channels advertise).
    #: how its reader takes its in-neighbours' updates (Reads); every policy declares it
    reads: Optional[Reads] = None
    #: whether its writers never wait for a reader (a reader may find a slot being
    #: rewritten, or only the newest of several versions): a channel must let a writer
    #: run ahead
    writer_runs_ahead = False
    #: the await modes (Await) it uses through the channel verbs (deliver, await_,
    #: release, progress, drain: asapmpi.transports); the resolver gives it only a
    #: channel that has them.  Empty: it drives its window by the window's own calls
    #: (the policies not yet on the verbs: tests/channels/test_channels.py lists them)
    awaits: FrozenSet[Await] = frozenset()
    #: whether it delivers each version to every out-neighbour (deliver(k)); a channel
    #: that sends to one chosen peer (a push) does not
    delivers = False
    def ordered_writes(self, rank: int) -> bool:
        """Whether `rank`'s deliveries only ever write slots that no reader is reading
        (the policy's protocol proves it: the readers' releases it waits for, Hop's
        tokens, a server's publication), so the channel may write header, payload and
        footer in one order with one flush; else it writes in the seqlock order and a
        reader that overlaps the write finds it torn."""
        return self.reads is Reads.EXACT or Await.RELEASED in self.awaits

    #: how many versions behind its last ack the reader may still reduce: after ack(c)
    #: the oldest version a later iteration reads is c + 1 - retain, so a channel that
    #: refills slots by itself (a mailbox) must keep versions > c - retain (Hop's
    #: staleness s; 0 for every other policy)
    retain = 0
    #: the reduce is the last use of the buffer in a receive (nothing after it reads or
    #: sends the buffer in that step): a device buffer may then be reduced on the
    #: device from copies of the verified slots (asapmpi.device.reduce)
    reduces_last = False
    #: whether every rank completes the same steps at about the same time (each waits
    #: for its neighbours' current version): ranks then reach free() within one step of
    #: each other.  Policies that let ranks drift apart (backup workers, staleness,
    #: parameter servers, gossip) leave it False.
    lockstep = False
    #: whether every step ends in a barrier of all ranks (BSP): the floor of its
    #: messages is then the exchange and a barrier (asapmpi bench reduce)
    barrier_per_step = False
    #: whether a rank may go on stepping without ever waiting for one particular rank
    #: (gossip: its peers are drawn at random, a pull or push waits for none): with
    #: fault_tolerance=True such a rank would never fail out of a wait after another
    #: died, so its exchange probes the fault communicator once per step
    #: (asapmpi.exchange.survive) instead
    waits_for_none = False

    #: where the policy's per-iteration rows go (set by the Exchange before start())
    records: Optional[Records] = None

    #: whether the policy exchanges through a slot window (else through ctx.comm):
    #: follows from `reads`, on the class as on its objects
    uses_window = True

    #: the policy's options, each declared once (asapmpi.options.Option): the one
    #: parser checks what a user gives, as text ("hop:max_gap=3") or as keywords
    OPTIONS = Options()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.uses_window = cls.reads is not Reads.NOTHING
        if "OPTIONS" in cls.__dict__ and cls.OPTIONS and cls.__doc__:
            # the options' help, written once in the declaration
            cls.__doc__ = (cls.__doc__.rstrip() + "\n\n    Options:\n"
                           + "\n".join("    " + line
                                       for line in cls.OPTIONS.describe().splitlines()))

    def __init__(self, **options):
        """Take `options` as OPTIONS declares them (ConfigError in one line for an
        unknown name or a value of the wrong type or range)."""
        self._options = type(self).OPTIONS.parse(self.name, options)

    def options(self) -> dict:
        """The policy's options as parsed (compared across ranks at creation)."""
        return dict(getattr(self, "_options", {}))

    def table(self, name: str, dtype=np.float64) -> Table:
        """A bounded table of per-iteration rows for the trace (asapmpi.sync.records)."""
        if self.records is None:
            self.records = Records()
        return self.records.table(name, dtype)

    def join_refusal(self) -> Optional[str]:
        """Why Exchange.join() cannot run under this policy, or None (it can): join
        counts the exchange steps each rank entered, one by one."""
        return None

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
