"""The scenarios: protocol x graph x bounds x variant, each with the verdict it must get.

`quick` scenarios are the test suite's bounded run (tests/channels/test_modelcheck.py, seconds);
`asapmpi check-protocol` runs the full list (minutes).  Expected verdicts:

  ok         every reachable state explored, no property broken
  violation  the named property is broken, with a trace (the broken variants)
  bounded    a directed search that stops at max_states without a violation (a
             configuration too large to explore in full: the runs it covers are real,
             the verdict is no proof)
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Dict, List, Optional, Tuple

from ..errors import ConfigError
from .explorer import SEARCHES, Result, explore
from .gossip_pull import GossipPullModel
from .gossip_push import GossipPushModel
from .graphs import make_graph
from .hop import HopModel
from .join import JoinModel
from .mailbox import MailboxModel
from .model import PROPERTIES
from .newest import NewestModel
from .notify_ack_messages import NotifyAckMessages
from .notify_ack_put import NotifyAckPut
from .notify_ack_shared import NotifyAckShared
from .onesided import ModelError, OneSidedModel

#: the five protocol variants of issue 15, then the mailboxes, gossip's pulls and
#: pushes (issue 48), the drain at free() and join (issue 45)
PROTOCOLS = ("notify-ack-put", "notify-ack-shared", "notify-ack-shared-db",
             "notify-ack-messages", "hop", "hop-messages", "bsp-messages", "newest",
             "gossip-pull", "gossip-push", "drain", "join")
NA = ("overlap", "version", "error", "gap", "deadlock")    # NOTIFY-ACK: gap 1 (lockstep)
MSG = ("overlap", "version", "error", "gap", "ahead", "alias", "deadlock")
MB = ("overlap", "version", "error", "gap", "stage", "deadlock")     # the mailbox
NW = ("overlap", "version", "stage", "monotone", "inflight", "deadlock")   # newest
GP = ("version", "freed", "deadlock")                                # gossip's pulls
GS = ("overlap", "monotone", "inflight", "freed", "deadlock")        # gossip's pushes
DR = ("overlap", "version", "error", "gap", "stage", "freed", "deadlock")  # drain
DN = ("overlap", "version", "stage", "monotone", "inflight", "freed", "deadlock")
JN = ("agree", "rule", "deadlock")                                   # join
JD = ("agree", "rule", "dead", "named", "deadlock")          # join, a rank dies
#: the properties each protocol's scenarios check unless they say otherwise
DEFAULTS = {"notify-ack-messages": MSG, "hop-messages": MB, "bsp-messages": MB,
            "newest": NW, "gossip-pull": GP, "gossip-push": GS, "drain": DR, "join": JN}


@dataclass(frozen=True)
class Scenario:
    """One model-checking run and the verdict it must get."""

    protocol: str
    graph: str                      # a spec of asapmpi.modelcheck.graphs
    iterations: int
    variant: str = "correct"
    options: Tuple[Tuple[str, object], ...] = ()    # the model's keyword options
    properties: Tuple[str, ...] = NA
    expect: str = "ok"
    prop: Optional[str] = None      # the property a "violation" must break
    search: str = "bfs"
    straggler: Optional[int] = None     # a rank slowed without bound (Model.straggler)
    max_states: Optional[int] = None    # the budget of a "bounded" search
    quick: bool = False
    broken: bool = False            # a deliberately broken or defective variant
    note: str = ""

    def label(self) -> str:
        """The variant and its options, as the table shows them."""
        words = [self.variant]
        for key, value in self.options:
            words.append(_SHORT.get((key, value))
                         or _KEYS.get(key, key + "={}").format(value))
        if self.straggler is not None:
            words.append(f"straggler={self.straggler}")
        default = DEFAULTS.get(self.protocol, NA)
        if self.protocol == "drain" and dict(self.options).get("policy") == "newest":
            default = DN
        if self.properties != default:
            words.append("checks " + ",".join(self.properties))
        return " ".join(words)

    def as_dict(self) -> Dict[str, object]:
        """The scenario as plain data (the --json report)."""
        return {"protocol": self.protocol, "graph": self.graph,
                "iterations": self.iterations, "variant": self.variant,
                "options": dict(self.options), "properties": list(self.properties),
                "expect": self.expect, "expect_property": self.prop,
                "search": self.search, "straggler": self.straggler, "note": self.note}


#: how the table names options
_SHORT = {("landings", "spontaneous"): "spontaneous", ("parts", True): "parts",
          ("parts", False): "lumped", ("invalidate", False): "no-mark",
          ("checksum", True): "checksum"}
_KEYS = {"tag_modulus": "tags mod {}", "skip_trigger": "trigger={}", "max_jump": "jump={}",
         "settle_after": "settle after {}", "policy": "{}", "tail": "tail={}",
         "drop": "drop={0[0]}@{0[1]}", "steps": "steps {}", "max_steps": "any <={} steps",
         "die": "dies in round {}"}
_SHORT.update({("tail", "free"): "free()", ("final_wait", False): "no-final-wait",
               ("die_posted", True): "or after posting"})


def _s(protocol, graph, iterations, variant="correct", quick=False, **kw) -> Scenario:
    """Shorthand: model options as keywords, Scenario fields by name."""
    fields = {k: kw.pop(k) for k in list(kw) if k in Scenario.__dataclass_fields__}
    if "properties" not in fields and protocol in DEFAULTS:
        fields["properties"] = DEFAULTS[protocol]
    return Scenario(protocol, graph, iterations, variant, tuple(sorted(kw.items())),
                    quick=quick, **fields)


BROKEN = {"broken": True, "expect": "violation"}

SCENARIOS: List[Scenario] = [
    # ---- NOTIFY-ACK, put transport
    _s("notify-ack-put", "ring:3", 2, quick=True, landings="spontaneous",
       note="every lazy word and put part lands on its own: cross-checks 'demand'"),
    _s("notify-ack-put", "complete:3", 3, quick=True),
    _s("notify-ack-put", "ring:4", 3, quick=True),
    _s("notify-ack-put", "offsets:6:1,4", 2, quick=True),
    _s("notify-ack-put", "ring:3", 3, landings="spontaneous"),
    _s("notify-ack-put", "ring:4", 4),
    _s("notify-ack-put", "complete:4", 4),
    _s("notify-ack-put", "offsets:6:1,4", 3),
    _s("notify-ack-put", "complete:2", 3, "ignore-acks", quick=True,
       properties=("overlap", "version", "deadlock"), prop="overlap",
       note="NotifyAckIgnoringAcks: a writer overwrites a slot being read", **BROKEN),
    _s("notify-ack-put", "complete:2", 3, "ignore-acks", quick=True, broken=True,
       properties=("version", "deadlock"),
       note="its seqlock writes and reads catch every overlap: no torn input is reduced"),
    _s("notify-ack-put", "complete:3", 3, "ignore-acks", broken=True,
       properties=("version", "deadlock")),
    _s("notify-ack-put", "complete:2", 3, "ignore-acks-ordered", quick=True,
       properties=("version", "deadlock"), prop="version",
       note="the harness before b4bb560: with one flush for header, payload and footer "
            "its seqlock reduce takes a torn payload for whole", **BROKEN),
    _s("notify-ack-put", "complete:2", 2, "no-settle", quick=True, prop="deadlock",
       note="a wait that never flushes its own lazy notify", **BROKEN),
    # ---- NOTIFY-ACK, shared-memory transport (single buffer)
    _s("notify-ack-shared", "complete:3", 3, quick=True),
    _s("notify-ack-shared", "ring:4", 3, quick=True),
    _s("notify-ack-shared", "complete:4", 4),
    _s("notify-ack-shared", "offsets:6:1,4", 2),
    _s("notify-ack-shared", "complete:2", 2, "no-settle", quick=True, prop="deadlock",
       **BROKEN),
    # ---- NOTIFY-ACK, shared-memory transport, double buffered
    _s("notify-ack-shared-db", "ring:3", 3, quick=True),
    _s("notify-ack-shared-db", "complete:3", 3, quick=True, parts=False),
    _s("notify-ack-shared-db", "ring:4", 3),
    _s("notify-ack-shared-db", "complete:4", 2),
    # (spontaneous landings: a writer that does not wait may notify k + 2 into the word
    # its reader still polls for k, which landing on demand cannot represent)
    _s("notify-ack-shared-db", "ring:3", 3, "no-ack-wait", quick=True,
       landings="spontaneous", properties=("overlap", "version"), prop="overlap",
       note="the reduce rewrites a slot an out-neighbour still reads", **BROKEN),
    _s("notify-ack-shared-db", "ring:3", 3, "no-ack-wait", quick=True, broken=True,
       landings="spontaneous", properties=("version",),
       note="begin_rewrite's mark: a reader of the slot being rewritten finds it torn"),
    _s("notify-ack-shared-db", "ring:3", 3, "no-ack-wait", quick=True, invalidate=False,
       landings="spontaneous", properties=("version",), prop="version",
       note="without the mark (before 7cfbf52) a late reader takes it for whole",
       **BROKEN),
    # ---- NOTIFY-ACK, message transport
    _s("notify-ack-messages", "ring:4", 4, "sync", quick=True, tag_modulus=2,
       properties=MSG, note="MPI_Issend: one version ahead at most, tags mod 2 suffice"),
    _s("notify-ack-messages", "complete:3", 3, "sync", quick=True, tag_modulus=2,
       properties=MSG),
    _s("notify-ack-messages", "ring:3", 3, "sync", quick=True, tag_modulus=1,
       checksum=True, properties=("overlap", "version", "gap", "ahead", "deadlock"),
       note="payload and checksum messages, every tag equal: posting order matches them"),
    _s("notify-ack-messages", "ring:4", 4, "sync", tag_modulus=2, checksum=True,
       properties=MSG),
    _s("notify-ack-messages", "complete:4", 4, "sync", tag_modulus=2, properties=MSG),
    _s("notify-ack-messages", "offsets:6:1,4", 4, "sync", tag_modulus=2,
       properties=MSG),
    _s("notify-ack-messages", "ring:4", 4, "eager", quick=True,
       properties=("overlap", "version", "ahead", "alias", "deadlock"), prop="ahead",
       note="buffered sends: a sender runs n-1 versions ahead on a directed ring",
       **BROKEN),
    _s("notify-ack-messages", "ring:3", 4, "eager", quick=True, tag_modulus=2,
       properties=("alias",), prop="alias",
       note="three versions in flight on one channel: two share a tag mod 2", **BROKEN),
    _s("notify-ack-messages", "ring:4", 6, "eager", quick=True, tag_modulus=2,
       broken=True, properties=("overlap", "version", "deadlock"),
       note="aliased tags still match the right version: MPI does not overtake"),
    _s("notify-ack-messages", "ring:4", 5, "eager", tag_modulus=1, checksum=True,
       broken=True, properties=("overlap", "version", "deadlock")),
    # ---- Hop
    _s("hop", "ring:3", 3, quick=True, max_gap=1),
    _s("hop", "ring:4", 3, quick=True, max_gap=2),
    _s("hop", "complete:3", 3, quick=True, max_gap=1, parts=True),
    _s("hop", "complete:4", 2, quick=True, max_gap=1),
    _s("hop", "ring:3", 4, max_gap=1, parts=True, landings="spontaneous"),
    _s("hop", "ring:4", 4, max_gap=2),
    _s("hop", "complete:4", 3, max_gap=1),
    _s("hop", "offsets:6:1,4", 2, max_gap=1),
    _s("hop", "complete:3", 2, quick=True, max_gap=1, backup=1),
    _s("hop", "complete:3", 3, max_gap=1, backup=1),
    _s("hop", "complete:3", 2, quick=True, max_gap=2, backup=1, skip_trigger=1,
       max_jump=3, note="jumps of 2 iterations happen"),
    _s("hop", "complete:3", 3, max_gap=2, backup=1, skip_trigger=2, max_jump=3),
    _s("hop", "ring:3", 3, quick=True, max_gap=1, staleness=1),
    _s("hop", "ring:3", 3, quick=True, max_gap=1, staleness=1, skip_trigger=1, max_jump=2,
       note="bounded staleness with jumps of 2"),
    _s("hop", "complete:3", 3, max_gap=1, staleness=1),
    _s("hop", "ring:3", 3, max_gap=1, staleness=1, parts=True),
    _s("hop", "offsets:6:1,4", 4, max_gap=2, backup=1, skip_trigger=1, max_jump=4,
       search="drift", straggler=0, expect="bounded", max_states=100_000,
       note="the search that finds skip-uncapped's deadlock, on the capped jump"),
    _s("hop", "ring:3", 3, "shallow", quick=True, max_gap=1, prop="overlap",
       note="depth max_gap instead of max_gap + 1", **BROKEN),
    _s("hop", "complete:2", 2, "no-settle", quick=True, max_gap=1, prop="deadlock",
       **BROKEN),
    _s("hop", "complete:2", 2, "no-settle", quick=True, max_gap=1, staleness=0,
       prop="deadlock", note="wait_newest without Waits.settle_pending (fixed in 5bde6b8)",
       **BROKEN),
    _s("hop", "ring:3", 3, "shallow", quick=True, max_gap=1, staleness=1, prop="overlap",
       note="depth max_gap + s: the writer reaches the slot of v - s", **BROKEN),
    _s("hop", "offsets:6:1,4", 4, "skip-uncapped", quick=True, max_gap=2, backup=1,
       skip_trigger=1, max_jump=4, search="drift", straggler=0, prop="deadlock",
       note="a jump past max_gap + 1 waits for an update its in-neighbours cannot send",
       **BROKEN),
    # ---- Hop on the mailbox (messages)
    _s("hop-messages", "ring:3", 3, quick=True, max_gap=1),
    _s("hop-messages", "complete:2", 4, quick=True, max_gap=1, staleness=1),
    _s("hop-messages", "ring:3", 3, max_gap=1, staleness=1,
       note="a reader may complete an iteration without its writer's newest update"),
    _s("hop-messages", "ring:4", 3, max_gap=2),
    _s("hop-messages", "complete:3", 2, max_gap=1, backup=1, search="drift",
       expect="bounded", max_states=100_000,
       note="late arrivals: a reduce takes 1 of 2 inputs while the other still comes"),
    _s("hop-messages", "complete:3", 3, max_gap=1, backup=1, search="drift",
       expect="bounded", max_states=100_000),
    _s("hop-messages", "ring:3", 3, "tokens-own-pump", quick=True, max_gap=1, staleness=1,
       search="drift", prop="deadlock",
       note="a token held back leaves only on its own window's pump: the rank waits in "
            "free()'s collective, its in-neighbour for the token (the defect a407441 "
            "fixed)", **BROKEN),
    _s("hop-messages", "ring:3", 3, "tokens-settle-once", max_gap=1, staleness=1,
       search="drift", prop="deadlock",
       note="settle_all once before the collective is not enough: the token before the "
            "one held back may still be in flight", **BROKEN),
    _s("hop-messages", "ring:3", 3, "tokens-settle-waits", max_gap=1, staleness=1,
       search="drift", prop="deadlock",
       note="the code since 29bc8eb: settle waits at most a second for the token before; "
            "if it is still in flight then (a standard send of 8 bytes that completes "
            "only once matched, a reader out of MPI), the held-back token stays", **BROKEN),
    _s("hop-messages", "complete:3", 3, "refill-in-flight", quick=True, max_gap=1,
       backup=1, search="drift", prop="stage",
       note="without _wait_stage: backup lets a reader go on without an update, whose "
            "stage is then refilled", **BROKEN),
    _s("hop-messages", "ring:3", 3, "token-ahead", quick=True, max_gap=1, prop="gap",
       note="a token one iteration early lets a writer run max_gap + 1 ahead", **BROKEN),
    _s("hop-messages", "complete:3", 3, "refill-in-flight", max_gap=1, backup=1,
       search="drift", properties=("version", "error"), broken=True, expect="bounded",
       max_states=100_000,
       note="the refilled stage carries a version its reader is past (token bound): "
            "never reduced"),
    # ---- BSP on the mailbox
    _s("bsp-messages", "ring:3", 3, quick=True),
    _s("bsp-messages", "complete:3", 2, quick=True),
    _s("bsp-messages", "complete:3", 3),
    _s("bsp-messages", "ring:4", 3),
    _s("bsp-messages", "complete:2", 3, "refill-in-flight", quick=True, stages=1,
       properties=("version",), prop="version",
       note="one staging buffer refilled with k + 1 while the reader takes k", **BROKEN),
    _s("bsp-messages", "ring:3", 3, quick=True, stages=1,
       note="one staging buffer is enough for BSP: the barrier orders the refill"),
    _s("bsp-messages", "complete:2", 3, "release-before-reduce", quick=True,
       prop="overlap", note="the slot's receive reposted before the reduce reads it",
       **BROKEN),
    _s("bsp-messages", "complete:2", 3, "release-before-reduce", quick=True,
       properties=("version", "error", "deadlock"), prop="error",
       note="the repost zeroes the slot's words: the reduce finds the input it waited for "
            "gone (never a torn one)", **BROKEN),
    # ---- the mailbox of newest versions
    _s("newest", "complete:2", 3, quick=True),
    _s("newest", "complete:2", 3, quick=True, settle_after=2,
       note="a settle between iterations puts a second message in flight"),
    _s("newest", "complete:2", 4),
    _s("newest", "complete:2", 4, settle_after=2),
    _s("newest", "ring:3", 2),
    _s("newest", "ring:3", 2, settle_after=1),
    _s("newest", "complete:3", 2, search="drift", expect="bounded", max_states=100_000),
    _s("newest", "complete:2", 3, "settle-once", quick=True, settle_after=2,
       prop="deadlock",
       note="the code today: a settle finds both of a channel's requests in flight, the "
            "newest version stays waiting and nothing sends it once the writer waits in "
            "free()'s collective", **BROKEN),
    _s("newest", "complete:2", 3, "settle-once", broken=True,
       note="without a settle before the last one, the second request is free for it"),
    _s("newest", "complete:2", 3, "no-deliver", quick=True, prop="deadlock",
       note="a settle that only pumps: a reader still stepping waits for ever", **BROKEN),
    _s("newest", "complete:2", 3, "refill-in-flight", quick=True, prop="stage", **BROKEN),
    _s("newest", "complete:2", 3, "refill-in-flight", quick=True, properties=("version",),
       prop="version", note="the reader takes a payload of version 3 stamped 1", **BROKEN),
    _s("newest", "complete:2", 3, "repost-slot", quick=True, prop="overlap", **BROKEN),
    _s("newest", "complete:2", 3, "no-version-check", quick=True, prop="monotone",
       **BROKEN),
    _s("newest", "complete:2", 3, "isend", quick=True, prop="inflight", **BROKEN),
    # ---- gossip's pulls
    _s("gossip-pull", "complete:2", 3, quick=True),
    _s("gossip-pull", "complete:3", 3, quick=True, note="two pullers"),
    _s("gossip-pull", "complete:2", 5, pulls=3),
    _s("gossip-pull", "complete:2", 4, "complete-copy-first", quick=True, pulls=3),
    _s("gossip-pull", "complete:2", 3, "abandon", quick=True, prop="version",
       note="before a407441: the late get lands between the check and the copy",
       **BROKEN),
    _s("gossip-pull", "complete:2", 2, "abandon-copy-first", broken=True,
       note="copying first and verifying the copy is enough on its own"),
    _s("gossip-pull", "complete:2", 3, "no-checksum", quick=True, prop="version",
       **BROKEN),
    _s("gossip-pull", "complete:2", 3, "retire-free", quick=True, prop="freed", **BROKEN),
    # ---- gossip's pushes (every sender pushes to rank 0, whose pool has 2 buffers)
    _s("gossip-push", "complete:2", 3, quick=True, mixes=3),
    _s("gossip-push", "complete:3", 2, quick=True, mixes=2, note="two senders"),
    _s("gossip-push", "complete:3", 3, mixes=3),
    _s("gossip-push", "complete:2", 3, "release-at-take", quick=True, mixes=3,
       prop="overlap", **BROKEN),
    _s("gossip-push", "complete:2", 3, "no-guard", quick=True, mixes=3, prop="monotone",
       note="an older version landing late is mixed after a newer one", **BROKEN),
    _s("gossip-push", "complete:2", 3, "cancel-uncounted", quick=True, mixes=3,
       prop="deadlock", **BROKEN),
    _s("gossip-push", "complete:2", 3, "isend", quick=True, mixes=3, prop="inflight",
       **BROKEN),
    # ---- free()'s drain and dropped windows (the mailbox)
    _s("drain", "ring:3", 2, quick=True, policy="hop", tail="free"),
    _s("drain", "ring:3", 3, quick=True, policy="bsp", tail="free"),
    _s("drain", "ring:3", 3, policy="hop", staleness=1, tail="free"),
    _s("drain", "complete:3", 3, policy="hop", backup=1, tail="free", search="drift",
       expect="bounded", max_states=100_000),
    _s("drain", "ring:3", 3, quick=True, policy="hop", drop=(0, 2),
       properties=("overlap", "version", "stage", "freed"),
       note="rank 0 raises; its neighbours go on stepping into its cancelled receives"),
    _s("drain", "complete:3", 3, policy="hop", backup=1, drop=(0, 2), search="drift",
       expect="bounded", max_states=100_000,
       properties=("overlap", "version", "stage", "freed")),
    _s("drain", "complete:2", 3, quick=True, policy="newest", tail="free", properties=DN),
    _s("drain", "complete:2", 3, policy="newest", tail="free", settle_after=2,
       properties=DN),
    _s("drain", "ring:3", 2, policy="newest", tail="free", properties=DN),
    _s("drain", "complete:2", 3, quick=True, policy="newest", drop=(0, 2),
       properties=("overlap", "version", "freed")),
    _s("drain", "ring:3", 2, policy="newest", drop=(0, 2),
       properties=("overlap", "version", "freed")),
    _s("drain", "complete:2", 2, "no-drain", quick=True, policy="hop", tail="free",
       prop="freed", **BROKEN),
    _s("drain", "complete:2", 3, "no-drain", quick=True, policy="newest", tail="free",
       properties=("freed",), prop="freed", **BROKEN),
    _s("drain", "complete:2", 3, "destructor", quick=True, policy="newest", drop=(0, 2),
       properties=("freed",), prop="freed",
       note="before a407441: the destructor freed the stages and spare buffers",
       **BROKEN),
    _s("drain", "ring:3", 3, "destructor", quick=True, policy="hop", drop=(0, 2),
       properties=("freed",), prop="freed",
       note="before a407441: the destructor frees buffers that requests still use",
       **BROKEN),
    # ---- join (uneven inputs): iterations are joins in a row (epochs); steps: each
    # epoch's training steps per rank ("epoch 0 / epoch 1"), or any number up to max
    _s("join", "ring:3", 2, quick=True, steps="1,0,0",
       note="two ranks join at once, then an empty second epoch for every rank"),
    _s("join", "ring:3", 2, quick=True, steps="2,0,1/0,1,0"),
    _s("join", "complete:3", 2, quick=True, max_steps=1,
       note="every plan of 0 or 1 training steps per rank and epoch"),
    _s("join", "ring:3", 3, steps="1,0,0", note="three joins in a row"),
    _s("join", "ring:3", 2, max_steps=1),
    _s("join", "ring:4", 2, steps="1,0,0,0"),
    _s("join", "ring:4", 2, steps="2,0,1,0/0,1,0,0"),
    _s("join", "complete:3", 2, max_steps=2),
    _s("join", "ring:3", 2, quick=True, steps="1,0,0", die=0, properties=JD,
       note="a rank dies in the agreement: nobody completes it, every other rank ends "
            "in a wait with a deadline that names it"),
    _s("join", "complete:3", 2, steps="1,0,0", die=0, die_posted=True, properties=JD),
    # the board by messages (the messages channel, the allreduce policy): ENTERED
    # words arrive eventually, JOINED_AT complete at publish; one join (the views of
    # two in a row pass 3,000,000 states, asapmpi/modelcheck/join.py)
    _s("join", "ring:3", 1, quick=True, steps="1,0,0", board="messages",
       note="the board by messages: each reader's view of the entered counts lags"),
    _s("join", "ring:3", 1, steps="2,0,1", board="messages"),
    _s("join", "complete:3", 1, max_steps=1, board="messages"),
    # a death before posting (with one join, a death after posting may follow a rank
    # that completed the agreement and is done: no wait left to name it)
    _s("join", "ring:3", 1, steps="1,0,0", die=0, properties=JD, board="messages"),
    _s("join", "ring:3", 1, "eventual-joined", quick=True, steps="1,0,0", prop="rule",
       board="messages", note="JOINED_AT sent without waiting for its readers: a reader "
                              "enters a step before the word of a rank it must leave out "
                              "arrived", **BROKEN),
    _s("join", "complete:3", 1, "eventual-joined", max_steps=1, prop="rule",
       board="messages", **BROKEN),
    _s("join", "ring:3", 2, "one-word", quick=True, steps="1,0,0", prop="rule",
       note="one JOINED_AT word (before 8d1baef): a rank that ended round 0 joins round 1 "
            "at once and replaces the count a slower rank reads", **BROKEN),
    _s("join", "ring:4", 2, "one-word", steps="1,0,0,0", prop="rule", **BROKEN),
    _s("join", "complete:3", 2, "one-word", max_steps=1, broken=True,
       note="one word is enough where every in-neighbour is an out-neighbour too: the "
            "writer's step J waits for the reader's version J"),
    _s("join", "ring:3", 2, "j-joined", quick=True, steps="1,0,0", prop="agree",
       note="J = largest joined-at + 1: a rank stepped along further", **BROKEN),
    _s("join", "ring:4", 2, "j-joined", steps="1,0,0,0", prop="agree", **BROKEN),
    _s("join", "complete:3", 2, "j-joined", max_steps=1, broken=True,
       note="on a graph of diameter 1 nobody steps along past the largest joined-at + 1"),
    _s("join", "complete:3", 2, "no-lag", quick=True, steps="1,0,0", prop="rule",
       note="c + 1 <= s: whether a rank that joins at s - 1 is out of step s depends on "
            "when it publishes", **BROKEN),
    _s("join", "ring:3", 2, "late-only", quick=True, steps="1,0,0", die=0,
       properties=("dead", "named", "deadlock"), prop="named",
       note="join() before the model: the agreement's timeout names the ranks below the "
            "largest count; a rank that died at the largest is named by nobody", **BROKEN),
    _s("join", "complete:3", 2, "late-only", steps="1,0,0", die=0, die_posted=True,
       properties=("dead", "named", "deadlock"), prop="named", **BROKEN),
    _s("join", "ring:3", 2, quick=True, steps="1,0,0", die=0, die_posted=True,
       properties=JD, note="join() names the ranks of this round below the largest "
                           "count, else every other rank"),
]


def select(protocols=None, broken: bool = False, quick: bool = False) -> List[Scenario]:
    """The scenarios of `protocols` (None: all), the broken variants too if `broken`,
    only the quick ones if `quick`."""
    chosen = []
    for sc in SCENARIOS:
        if protocols and sc.protocol not in protocols:
            continue
        if (sc.broken and not broken) or (quick and not sc.quick):
            continue
        chosen.append(sc)
    return chosen


def override(sc: Scenario, iterations: Optional[int] = None, graph: Optional[str] = None,
             ranks: Optional[int] = None) -> Scenario:
    """The scenario with other bounds: iterations, graph (a family such as "complete"
    or "offsets:1,4", or a full spec such as "complete:4") and rank count."""
    family, _, rest = sc.graph.partition(":")
    n, _, extra = rest.partition(":")
    if graph:
        family, _, rest = graph.partition(":")
        first, _, tail = rest.partition(":")
        if first.isdigit():         # a full spec: NAME:N[:extra]
            n, extra = first, tail
        else:                       # a family, maybe with its extra field
            extra = rest
    if ranks is not None:
        n = str(ranks)
    spec = ":".join(x for x in (family, n, extra) if x)
    return replace(sc, graph=spec, iterations=iterations or sc.iterations)


def build(sc: Scenario):
    """The model of scenario `sc` (ConfigError for options that do not fit it)."""
    if sc.iterations < 1:
        raise ConfigError(f"iterations must be at least 1, got {sc.iterations}")
    if sc.search not in SEARCHES:
        raise ConfigError(f"search {sc.search!r} not in {SEARCHES}")
    unknown = set(sc.properties) - set(PROPERTIES)
    if unknown:
        raise ConfigError(f"unknown properties {sorted(unknown)}")
    g = make_graph(sc.graph)
    opts = dict(sc.options)
    try:
        if sc.protocol == "notify-ack-put":
            model = NotifyAckPut(g, sc.iterations, sc.variant, properties=sc.properties,
                                 **opts)
        elif sc.protocol in ("notify-ack-shared", "notify-ack-shared-db"):
            model = NotifyAckShared(g, sc.iterations, sc.protocol.endswith("-db"),
                                    sc.variant, properties=sc.properties, **opts)
        elif sc.protocol == "notify-ack-messages":
            # the variant is how a send completes: sync (MPI_Issend) or eager
            model = NotifyAckMessages(g, sc.iterations, sc.variant,
                                      properties=sc.properties, **opts)
        elif sc.protocol == "hop":
            model = HopModel(g, sc.iterations, variant=sc.variant,
                             properties=sc.properties, **opts)
        elif sc.protocol == "drain" and opts.get("policy") == "newest":
            del opts["policy"]
            model = NewestModel(g, sc.iterations, variant=sc.variant,
                                properties=sc.properties, **opts)
        elif sc.protocol in ("hop-messages", "bsp-messages", "drain"):
            opts.setdefault("policy", "bsp" if sc.protocol == "bsp-messages" else "hop")
            model = MailboxModel(g, sc.iterations, variant=sc.variant,
                                 properties=sc.properties, **opts)
        elif sc.protocol == "newest":
            model = NewestModel(g, sc.iterations, variant=sc.variant,
                                properties=sc.properties, **opts)
        elif sc.protocol == "join":
            model = JoinModel(g, sc.iterations, variant=sc.variant,
                              properties=sc.properties, **opts)
        elif sc.protocol == "gossip-pull":
            model = GossipPullModel(g, sc.iterations, variant=sc.variant,
                                    properties=sc.properties, **opts)
        elif sc.protocol == "gossip-push":
            model = GossipPushModel(g, sc.iterations, variant=sc.variant,
                                    properties=sc.properties, **opts)
        else:
            raise ConfigError(f"unknown protocol {sc.protocol!r}; choose from "
                              f"{', '.join(PROTOCOLS)}")
    except (ValueError, TypeError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"{sc.protocol} on {sc.graph}: {exc}") from None
    if sc.straggler is not None:
        if not 0 <= sc.straggler < g.n:
            raise ConfigError(f"straggler rank {sc.straggler} outside 0..{g.n - 1}")
        if not isinstance(model, OneSidedModel):
            raise ConfigError(f"{sc.protocol} has no straggler schedule")
        model.straggler = sc.straggler
    return model


@dataclass
class Outcome:
    """A scenario, what the explorer found and whether that is what was expected."""

    scenario: Scenario
    result: Result
    verdict: str = field(init=False)
    matches: bool = field(init=False)

    def __post_init__(self):
        r, sc = self.result, self.scenario
        self.verdict = "bounded" if r.verdict == "limit" else r.verdict
        self.matches = self.verdict == sc.expect and (
            sc.expect != "violation" or sc.prop is None or r.prop == sc.prop)


def run(sc: Scenario, max_states: Optional[int] = None) -> Outcome:
    """Build and explore scenario `sc` (at most max_states states, or the scenario's
    own budget).  Where landing on demand cannot be exact (ModelError: a writer's word
    may overtake the value its reader waits for), explore again with spontaneous
    landings, which the scenario then names."""
    budget = sc.max_states if sc.max_states is not None else max_states
    try:
        return Outcome(sc, explore(build(sc), budget, sc.search))
    except ModelError:
        sc = replace(sc, options=tuple(sorted({**dict(sc.options),
                                               "landings": "spontaneous"}.items())))
        return Outcome(sc, explore(build(sc), budget, sc.search))
