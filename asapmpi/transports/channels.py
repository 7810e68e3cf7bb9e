"""Channels advertise what they can do; one resolver matches a policy's needs to them.

A channel is one window class of asapmpi._core: how bytes and words reach a slot.  Each
says which of the policies' needs it serves (asapmpi.sync.Reads: how a reader takes its
in-neighbours' updates) and what it can do, the way UCX's transports advertise
capability flags and c10d's backends answer what they support; a policy only declares
what it needs (Policy.reads, Policy.writer_runs_ahead, Policy.retain) and never names a
transport.  Several channels make up a family, the name Exchange(transport=...) takes:
"messages" gives NOTIFY-ACK its versions, Hop and BSP a mailbox of window words, async,
backup_ps and elastic a mailbox of newest versions, gossip pushes (each rank sends its
model to the peer its schedule chose; the receiver mixes the newest whole versions that
arrived: a "pull" need served without a one-sided read, docs/PROTOCOL.md 2h).

=============  ========  ===================  ========  =======  =====  ====  =======  ===========
window class   family    serves (Reads)       in-place  remote   runs   one   deliver  await_
                                              read      atomics  ahead  host           (Await)
=============  ========  ===================  ========  =======  =====  ====  =======  ===========
PutWindow      put       exact, words,        -         yes      yes    -     yes      exact,
                         newest, pull                                                  at_least,
                                                                                       count,
                                                                                       newest,
                                                                                       released,
                                                                                       barrier
SharedWindow   shared    exact                yes       yes      -      yes   yes      exact,
                                                                                       at_least,
                                                                                       count,
                                                                                       newest,
                                                                                       released,
                                                                                       barrier
MessageWindow  messages  exact                -         -        -      -     yes      exact
MailboxWindow  messages  words                -         -        -      -     yes      exact,
                                                                                       at_least,
                                                                                       count,
                                                                                       newest,
                                                                                       released,
                                                                                       barrier
NewestWindow   messages  newest               -         -        yes    -     yes      at_least,
                                                                                       count,
                                                                                       newest,
                                                                                       (exact)
PushWindow     messages  pull                 -         -        yes    -     -        -
=============  ========  ===================  ========  =======  =====  ====  =======  ===========

Every channel implements the same verbs (asapmpi._core.SlotWindow: deliver(k),
await_(k, mode), release(k), progress(), drain()); the last two columns say which of
them mean something on it: whether deliver(k) reaches every out-neighbour (a push goes
to one peer its policy chose: push()) and which await modes (asapmpi.sync.Await) it
gives (a message channel's receive is posted for one version: exact only; a mailbox of
newest versions may replace version k by k + 1 before anyone sees it: no exact; a count
of version k counts the senders whose newest is k, for a policy whose writers cannot
pass k before it reads, backup_ps's workers; (exact): only to a policy whose writers
do not run ahead, ElasticBSP's; released waits the other way, for the out-neighbours'
releases, which only channels whose words carry them give; barrier is BSP's, a barrier
of all ranks and the wait for what it proved sent).  A policy on the verbs
declares the modes it uses (Policy.awaits, Policy.delivers), and a channel fits it only
when it has them.

The message channels carry an update of at most MESSAGE_LIMIT bytes (one message), and
the mailboxes take the reader's `retain` (Policy.retain: how many versions behind its
last ack it still reduces) so that they refill no slot it may still read.

A channel fits a policy when it serves the policy's Reads and, for a policy whose
writers never wait for a reader, lets a writer run ahead.  `families(policy)` are the
families with a channel that fits, `resolve(family, policy)` the channel a family gives
it (a one-line ConfigError naming what fits otherwise).  Exchange(transport="auto")
measures among the families that fit (asapmpi.exchange.choice, asapmpi.exchange.probe).  A
new channel (GPU memory, say) is one more window class and one more row here.

Importing this module loads no MPI: a channel names its window class, which
`Channel.window_class()` imports from asapmpi._core when an exchange makes one.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import FrozenSet, Optional, Tuple

from ..errors import ConfigError
from ..sync.base import Await, Reads

#: the await modes of a channel whose waits read window words (its own, written by
#: one-sided atomics or by its message pump)
_WORD_AWAITS = frozenset(Await)

#: the await modes that read the in-neighbours' notify words (a policy that uses none
#: of them has its versions delivered without a notify)
_NOTIFIED = frozenset({Await.EXACT, Await.AT_LEAST, Await.COUNT, Await.NEWEST})

#: the largest update the message channels send (one message, MPI's int count of bytes,
#: and the mailbox's 32-byte trailer)
MESSAGE_LIMIT = 0x7fffffff - 32


@dataclass(frozen=True)
class Channel:
    """One window class of asapmpi._core and what it advertises."""

    #: its class in asapmpi._core
    window: str
    #: the family it belongs to: what Exchange(transport=...) names
    family: str
    #: the needs (Reads) it serves
    serves: FrozenSet[Reads]
    #: a reader reduces straight out of the writer's own slot (no copy into its own)
    in_place_read: bool
    #: notify, ack, token and user words are MPI atomics in the target's window (else
    #: messages that the target's waits complete into its words)
    remote_atomics: bool
    #: a writer's update never waits for its reader
    writer_may_run_ahead: bool
    #: every rank must be on one host (it maps the others' memory)
    one_host: bool
    #: the await modes (asapmpi.sync.Await) its await_() gives
    awaits: FrozenSet[Await] = frozenset()
    #: more modes it gives a policy whose writers do not run ahead of their readers (a
    #: mailbox of newest versions replaces version k by k + 1 only if a writer sends
    #: k + 1 before k was read: where the policy's protocol forbids that, its words
    #: say exactly k)
    awaits_paced: FrozenSet[Await] = frozenset()
    #: its deliver(k) reaches every out-neighbour
    delivers: bool = True
    #: the largest update it carries in bytes (None: any)
    max_update_bytes: Optional[int] = None
    #: the policy needs (Policy attributes) the window class takes as keywords
    takes: Tuple[str, ...] = ()
    #: a pull reads a copy the peer published in its own window, so the layout keeps
    #: Policy.publish_slots of them (a push channel carries the model in its messages:
    #: none)
    reads_published: bool = False

    def window_class(self) -> type:
        """The window class, from asapmpi._core (which loads MPI)."""
        from .. import _core
        return getattr(_core, self.window)

    def fits(self, policy) -> bool:
        """Whether this channel serves what `policy` needs."""
        return (policy.reads in self.serves
                and (self.writer_may_run_ahead or not policy.writer_runs_ahead)
                and policy.awaits <= self.awaits_for(policy)
                and (self.delivers or not policy.delivers))

    def awaits_for(self, policy) -> FrozenSet[Await]:
        """The await modes this channel gives `policy`."""
        if policy.writer_runs_ahead:
            return self.awaits
        return self.awaits | self.awaits_paced

    def window_options(self, policy, rank: int) -> dict:
        """The keywords the window class takes from `policy`'s needs on `rank`: retain
        where the channel takes it, whether deliver() waits for the readers' release
        of the version before (waits_for_release: a policy that reads exact
        versions), whether release() is what writers wait for (releases: those, and a
        policy that awaits RELEASED itself, Hop's tokens), whether deliver() writes in
        the ordered sequence (ordered: Policy.ordered_writes) and whether it notifies
        (not for a policy on the verbs that never awaits: its readers take what the
        slots hold)."""
        options = {name: getattr(policy, name) for name in self.takes}
        options["waits_for_release"] = policy.reads is Reads.EXACT
        options["releases"] = (policy.reads is Reads.EXACT
                               or Await.RELEASED in policy.awaits)
        options["ordered"] = policy.ordered_writes(rank)
        options["notifies"] = bool(policy.awaits & _NOTIFIED) or not policy.delivers
        return options


#: every channel, one per window class of asapmpi._core; a family's channels in the
#: order the resolver tries them
CHANNELS: Tuple[Channel, ...] = (
    Channel("PutWindow", "put", frozenset({Reads.EXACT, Reads.WORDS, Reads.NEWEST,
                                           Reads.PULL}),
            in_place_read=False, remote_atomics=True, writer_may_run_ahead=True,
            one_host=False, awaits=_WORD_AWAITS, reads_published=True),
    Channel("SharedWindow", "shared", frozenset({Reads.EXACT}),
            in_place_read=True, remote_atomics=True, writer_may_run_ahead=False,
            one_host=True, awaits=_WORD_AWAITS),
    Channel("MessageWindow", "messages", frozenset({Reads.EXACT}),
            in_place_read=False, remote_atomics=False, writer_may_run_ahead=False,
            one_host=False, awaits=frozenset({Await.EXACT}),
            max_update_bytes=MESSAGE_LIMIT),
    Channel("MailboxWindow", "messages", frozenset({Reads.WORDS}),
            in_place_read=False, remote_atomics=False, writer_may_run_ahead=False,
            one_host=False, awaits=_WORD_AWAITS, max_update_bytes=MESSAGE_LIMIT,
            takes=("retain",)),
    Channel("NewestWindow", "messages", frozenset({Reads.NEWEST}),
            in_place_read=False, remote_atomics=False, writer_may_run_ahead=True,
            one_host=False, awaits=frozenset({Await.AT_LEAST, Await.COUNT, Await.NEWEST}),
            awaits_paced=frozenset({Await.EXACT}),
            max_update_bytes=MESSAGE_LIMIT, takes=("retain",)),
    # gossip's need met by pushes: nobody reads one-sidedly, so nobody waits for the
    # peer's MPI progress (a pull on MPICH's TCP path cost 6-10x MPI_Allreduce)
    Channel("PushWindow", "messages", frozenset({Reads.PULL}),
            in_place_read=False, remote_atomics=False, writer_may_run_ahead=True,
            one_host=False, delivers=False, max_update_bytes=MESSAGE_LIMIT),
)

#: the families, in the order they are offered (what Exchange(transport=...) takes,
#: besides "auto")
FAMILIES: Tuple[str, ...] = tuple(dict.fromkeys(c.family for c in CHANNELS))


#: what a policy with each need does, for the refusal
_DOES = {Reads.EXACT: "it reads exactly version k from each in-neighbour",
         Reads.WORDS: "it drives its slots and window words itself",
         Reads.NEWEST: "it reads each sender's newest version",
         Reads.PULL: "it mixes a peer's model without waiting for the peer",
         Reads.NOTHING: "it uses no window: MPI collectives"}


def _need(policy) -> Reads:
    """The policy's Reads, or ConfigError when it declares none."""
    reads = getattr(policy, "reads", None)
    if not isinstance(reads, Reads):
        raise ConfigError(f"sync={policy.name!r} declares no Policy.reads (one of "
                          f"{', '.join(r.value for r in Reads)}), so no channel can be "
                          f"matched to it")
    return reads


def channel_for(family: str, policy) -> Optional[Channel]:
    """The first channel of `family` that fits `policy` (None when none does)."""
    _need(policy)
    return next((c for c in CHANNELS if c.family == family and c.fits(policy)), None)


def families(policy) -> Tuple[str, ...]:
    """The families with a channel that fits `policy`, in FAMILIES order (none for a
    policy that uses no window)."""
    return tuple(f for f in FAMILIES if channel_for(f, policy) is not None)


def resolve(family: str, policy) -> Channel:
    """The channel `family` gives `policy`, or a one-line ConfigError naming the
    families that fit it."""
    if family not in FAMILIES:
        raise ConfigError(f"transport must be one of auto, {', '.join(FAMILIES)}, got "
                          f"{family!r}")
    channel = channel_for(family, policy)
    if channel is not None:
        return channel
    fit = families(policy)
    why = _DOES[_need(policy)] + (", and its writers never wait for a reader"
                                  if policy.writer_runs_ahead else "")
    use = (f"use transport={', '.join(map(repr, fit))} or 'auto'" if fit
           else "leave transport out or pass 'auto'")
    raise ConfigError(f"transport={family!r} does not fit sync={policy.name!r} ({why}); "
                      f"{use}")


__all__ = ["CHANNELS", "FAMILIES", "MESSAGE_LIMIT", "Channel", "channel_for",
           "families", "resolve"]
