"""Serial tests: the explicit-state model checker of the slot protocols (no MPI).

The suite runs the quick scenarios of asapmpi.modelcheck.scenarios: every correct
variant must verify over more states than a vacuous model would have, every broken
variant must be found with a trace whose last state breaks the named property.
"""
import json
import subprocess
import sys

import pytest

from asapmpi.errors import ConfigError
from asapmpi.modelcheck.explorer import explore
from asapmpi.modelcheck.gossip_pull import GossipPullModel
from asapmpi.modelcheck.graphs import make_graph
from asapmpi.modelcheck.hop import HopModel
from asapmpi.modelcheck.join import JoinModel
from asapmpi.modelcheck.mailbox import MailboxModel
from asapmpi.modelcheck.model import Model
from asapmpi.modelcheck.newest import NewestModel
from asapmpi.modelcheck.notify_ack_messages import NotifyAckMessages
from asapmpi.modelcheck.notify_ack_put import NotifyAckPut
from asapmpi.modelcheck.notify_ack_shared import NotifyAckShared
from asapmpi.modelcheck.scenarios import PROTOCOLS, build, override, run, select

QUICK = select(broken=True, quick=True)
CORRECT = [sc for sc in QUICK if sc.expect == "ok"]
BROKEN = [sc for sc in QUICK if sc.expect == "violation"]


def name(sc):
    return f"{sc.protocol}-{sc.graph}-{sc.iterations}-{sc.label()}".replace(" ", "_")


def deadlocked(model, state):
    """No transition the code guarantees is enabled, and the run is not over."""
    return not model.finished(state) and not any(
        forced for _, _, forced in model.successors(state))


def test_every_protocol_has_correct_and_broken_quick_scenarios():
    assert {sc.protocol for sc in CORRECT} == set(PROTOCOLS)
    assert {sc.protocol for sc in BROKEN} == set(PROTOCOLS)
    assert all(sc.broken for sc in BROKEN) and set(QUICK) == set(CORRECT + BROKEN)


@pytest.mark.parametrize("sc", CORRECT, ids=name)
def test_correct_variant_verifies(sc):
    out = run(sc)
    r = out.result
    assert r.verdict == "ok", (r.prop, r.detail, r.trace)
    # a model that did nothing (or blocked at once) would have a handful of states; a
    # verified run also reached the end: every rank did every iteration
    n = make_graph(sc.graph).n
    assert r.states >= 100 and r.max_depth >= 2 * n * sc.iterations, (r.states,
                                                                     r.max_depth)
    assert out.matches


@pytest.mark.parametrize("sc", BROKEN, ids=name)
def test_broken_variant_is_found_with_a_trace(sc):
    out = run(sc)
    r = out.result
    assert r.verdict == "violation" and r.prop == sc.prop, (r.verdict, r.prop, r.detail)
    assert r.trace and all(isinstance(a, str) and a for a in r.trace)
    model = build(sc)
    if sc.prop == "deadlock":
        assert deadlocked(model, r.last_state)
    else:
        assert model.violation(r.last_state)[0] == sc.prop
    assert out.matches


def test_ignoring_acks_overwrites_a_slot_being_read():
    model = NotifyAckPut(make_graph("complete:2"), 3, "ignore-acks",
                         properties=("overlap", "version", "deadlock"))
    r = explore(model)
    assert r.prop == "overlap"
    assert "version 2" in r.trace[-1] and "put of version 2" in r.detail
    # the same protocol with acks never does
    assert explore(NotifyAckPut(make_graph("complete:2"), 3)).verdict == "ok"


def test_the_ack_ignoring_harness_detects_every_tear_since_its_writes_are_seqlock():
    # header, payload and footer flushed one after the other: a read that overlaps a
    # write always sees the header move
    seqlock = explore(NotifyAckPut(make_graph("complete:3"), 3, "ignore-acks",
                                   properties=("version", "deadlock")))
    assert seqlock.verdict == "ok" and seqlock.states > 1000
    # one flush for all three (the harness before b4bb560): header == footer == 1 over
    # a payload half of version 2, reduced as version 1
    ordered = explore(NotifyAckPut(make_graph("complete:2"), 3, "ignore-acks-ordered",
                                   properties=("version", "deadlock")))
    assert ordered.prop == "version" and "silently reduced" in ordered.detail
    assert "MPI lands the payload half" in ordered.trace[-1]


def test_eager_sends_run_ahead_on_a_directed_ring_and_issend_does_not():
    ring = make_graph("ring:4")
    props = ("overlap", "version", "deadlock")
    eager = explore(NotifyAckMessages(ring, 6, "eager", 2, props))
    sync = explore(NotifyAckMessages(ring, 6, "sync", 2, (*props, "ahead", "alias")))
    # buffered sends: a sender n-1 = 3 versions ahead, 4 messages on one channel, yet
    # every receive takes the version it expects (MPI does not overtake)
    assert eager.verdict == "ok" and eager.measures == {"ahead": 3, "in flight": 4}
    assert sync.verdict == "ok" and sync.measures == {"ahead": 1, "in flight": 1}
    found = explore(NotifyAckMessages(ring, 4, "eager", 2, ("ahead",)))
    assert found.prop == "ahead" and "iteration 3" in found.detail
    # with the checksum's second message and a single tag for every version, the
    # receives still take their own message (posting order, non-overtaking)
    one_tag = explore(NotifyAckMessages(ring, 5, "sync", 1, (*props, "ahead"),
                                        checksum=True))
    assert one_tag.verdict == "ok" and one_tag.measures["in flight"] == 2


@pytest.mark.parametrize("model", [
    NotifyAckPut(make_graph("complete:2"), 2, "no-settle"),
    NotifyAckShared(make_graph("complete:2"), 2, variant="no-settle"),
    HopModel(make_graph("complete:2"), 2, variant="no-settle"),
], ids=["put", "shared", "hop"])
def test_lazy_words_never_flushed_deadlock(model):
    r = explore(model)
    assert r.prop == "deadlock" and deadlocked(model, r.last_state)
    # every rank waits for a notify the other one holds, issued and never completed
    assert r.detail.count("waits for the notifies") == 2
    assert r.detail.count("its own words still in flight") == 2


@pytest.mark.parametrize("make", [
    lambda landings: NotifyAckPut(make_graph("ring:3"), 2, landings=landings),
    lambda landings: NotifyAckPut(make_graph("complete:2"), 3, "ignore-acks-ordered",
                                  properties=("version", "deadlock"), landings=landings),
    lambda landings: NotifyAckPut(make_graph("ring:3"), 3, "ignore-acks",
                                  properties=("version", "deadlock"), landings=landings),
    lambda landings: NotifyAckShared(make_graph("ring:3"), 2, True, landings=landings),
    lambda landings: HopModel(make_graph("ring:3"), 3, 1, parts=True, landings=landings),
    lambda landings: HopModel(make_graph("ring:3"), 3, 1, variant="shallow",
                              landings=landings),
], ids=["put", "put-silent-tear", "put-seqlock", "shared-db", "hop", "hop-shallow"])
def test_landing_on_demand_gives_the_verdicts_of_spontaneous_landings(make):
    demand, spont = explore(make("demand")), explore(make("spontaneous"))
    assert (demand.verdict, demand.prop) == (spont.verdict, spont.prop)
    assert demand.states <= spont.states


@pytest.mark.parametrize("make", [
    lambda sym: NotifyAckPut(make_graph("complete:3"), 2, symmetry=sym),
    lambda sym: NotifyAckMessages(make_graph("ring:3"), 3, "sync", 2, symmetry=sym),
    lambda sym: HopModel(make_graph("complete:3"), 2, 1, symmetry=sym),
    lambda sym: NotifyAckPut(make_graph("ring:3"), 3, "ignore-acks", symmetry=sym,
                             properties=("overlap",)),
], ids=["put", "messages", "hop", "put-broken"])
def test_symmetry_reduction_keeps_verdicts_and_trace_lengths(make):
    reduced, full = explore(make(True)), explore(make(False))
    assert (reduced.verdict, reduced.prop) == (full.verdict, full.prop)
    assert len(reduced.trace) == len(full.trace)
    assert reduced.states < full.states


def test_skipping_jumps_and_the_uncapped_jump_deadlocks():
    jumps = run(next(sc for sc in CORRECT if dict(sc.options).get("skip_trigger")))
    assert jumps.result.verdict == "ok" and jumps.result.measures["jump"] == 2
    broken = run(next(sc for sc in BROKEN if sc.variant == "skip-uncapped"))
    assert broken.result.prop == "deadlock"
    assert "jump to iteration 5, Rec(4) first" in "\n".join(broken.result.trace)


# ---------------------------------------------------------------- the message paths

DRAIN = ("overlap", "version", "error", "gap", "stage", "freed", "deadlock")


def test_mailbox_tokens_held_back_leave_from_any_wait_not_only_their_window():
    ring = make_graph("ring:3")
    # the token before the one held back is still in flight when the rank enters
    # free()'s collective; its in-neighbour still needs the newer one
    own = explore(MailboxModel(ring, 3, staleness=1, variant="tokens-own-pump"),
                  search="drift")
    assert own.prop == "deadlock" and "tokens held back" in own.detail
    assert "waits for the tokens after iteration 3" in own.detail
    # settling once, or for a second, at the collective's start is not enough in the
    # worst case (a token send that completes only once matched)
    for variant in ("tokens-settle-once", "tokens-settle-waits"):
        r = explore(MailboxModel(ring, 3, staleness=1, variant=variant), search="drift")
        assert r.prop == "deadlock", variant
    # held-back tokens that leave from any wait, the collective's polls too: no deadlock
    # on the same bounds (the full scenario "hop-messages ring:3 3 correct staleness=1":
    # 31,508 states); here a smaller run that holds tokens back too
    fixed = explore(MailboxModel(make_graph("complete:2"), 4, staleness=1))
    assert fixed.verdict == "ok" and fixed.measures["held back"] >= 1


def test_mailbox_matching_on_demand_gives_the_verdicts_of_spontaneous_matching():
    ring = make_graph("ring:3")
    for make in (lambda m: MailboxModel(ring, 3, matching=m),
                 lambda m: MailboxModel(ring, 3, policy="bsp",
                                        variant="release-before-reduce", matching=m),
                 lambda m: MailboxModel(ring, 2, tail="free", properties=DRAIN,
                                        matching=m),
                 lambda m: MailboxModel(ring, 3, drop=(0, 2), variant="destructor",
                                        properties=("freed",), matching=m),
                 lambda m: NewestModel(make_graph("complete:2"), 3, variant="isend",
                                       matching=m),
                 lambda m: NewestModel(make_graph("complete:2"), 3,
                                       variant="refill-in-flight",
                                       properties=("version",), matching=m)):
        demand, spont = explore(make("demand")), explore(make("spontaneous"))
        assert (demand.verdict, demand.prop) == (spont.verdict, spont.prop)
        if demand.verdict == "ok":      # (a violation stops the search anywhere)
            assert demand.states < spont.states


@pytest.mark.parametrize("make", [
    lambda sym: MailboxModel(make_graph("ring:3"), 3, symmetry=sym),
    lambda sym: MailboxModel(make_graph("complete:3"), 2, policy="bsp", symmetry=sym),
    lambda sym: NewestModel(make_graph("complete:2"), 3, variant="no-version-check",
                            symmetry=sym),
    lambda sym: GossipPullModel(make_graph("complete:3"), 2, symmetry=sym),
], ids=["hop-messages", "bsp-messages", "newest-broken", "gossip-pull"])
def test_symmetry_reduction_of_the_message_models(make):
    reduced, full = explore(make(True)), explore(make(False))
    assert (reduced.verdict, reduced.prop) == (full.verdict, full.prop)
    assert len(reduced.trace) == len(full.trace)
    assert reduced.states < full.states


def test_newest_buffer_renaming_keeps_verdicts():
    for variant, props in (("correct", None), ("repost-slot", None),
                           ("refill-in-flight", ("version",))):
        kw = {"properties": props} if props else {}
        a = explore(NewestModel(make_graph("complete:2"), 3, variant, **kw))
        b = explore(NewestModel(make_graph("complete:2"), 3, variant, rename=False, **kw))
        assert (a.verdict, a.prop, len(a.trace)) == (b.verdict, b.prop, len(b.trace))
        assert a.states <= b.states


def test_newest_last_version_stranded_behind_two_requests():
    k2 = make_graph("complete:2")
    # a settle between iterations sent the newest on the second request; the last put
    # finds both requests in flight; the last settle leaves it waiting
    r = explore(NewestModel(k2, 3, "settle-once", settle_after=2))
    assert r.prop == "deadlock" and "newest version waiting: 3" in r.detail
    assert "Exchange.settle() (pump: the newest to rank" in "\n".join(r.trace)
    # (with every wait delivering, the quick scenario "correct settle after 2": ok)
    assert explore(NewestModel(k2, 3, "settle-once")).verdict == "ok"


def test_gossip_late_get_lands_between_the_check_and_the_copy():
    r = explore(GossipPullModel(make_graph("complete:2"), 3, variant="abandon"))
    assert r.prop == "version"
    verify, land, copy = r.trace[-3:]
    assert "verifies the pull buffer" in verify and "copies the verified slot" in copy
    assert "MPI lands the timed-out get's payload" in land
    assert "its MPI_Rget abandoned" in "\n".join(r.trace)
    # the get completed before the buffer is reused, or its buffer retired (the quick
    # scenarios); or the copy verified (abandon-copy-first, a full scenario: 220,000
    # states)
    assert explore(GossipPullModel(make_graph("complete:2"), 3,
                                   variant="correct")).verdict == "ok"


def test_drain_and_dropped_windows():
    ring = make_graph("ring:3")
    ok = explore(MailboxModel(ring, 2, tail="free", properties=DRAIN))
    assert ok.verdict == "ok" and ok.states > 100
    # free() without its drain: requests outlive the memory
    r = explore(MailboxModel(make_graph("complete:2"), 2, tail="free", variant="no-drain",
                             properties=("freed",)))
    assert r.prop == "freed" and "still in flight" in r.detail
    # a window dropped by an exception: the destructor of before a407441 freed buffers
    # under requests; the leftovers keep them until MPI completes them
    r = explore(MailboxModel(ring, 3, drop=(0, 2), variant="destructor",
                             properties=("freed",)))
    assert r.prop == "freed" and "after rank 0 released it" in r.detail
    assert "raises before iteration 2" in "\n".join(r.trace)
    assert explore(MailboxModel(ring, 3, drop=(0, 2),
                                properties=("freed",))).verdict == "ok"


def test_message_models_refuse_bad_options():
    ring = make_graph("ring:3")
    with pytest.raises(ValueError, match="release-before-reduce"):
        MailboxModel(ring, 2, variant="release-before-reduce")
    with pytest.raises(ValueError, match="drop"):
        MailboxModel(ring, 2, variant="destructor")
    with pytest.raises(ValueError, match="no-drain"):
        MailboxModel(ring, 2, variant="no-drain")
    with pytest.raises(ValueError, match="variant"):
        NewestModel(ring, 2, variant="nope")
    with pytest.raises(ValueError, match="variant"):
        GossipPullModel(ring, 2, variant="nope")


# ---------------------------------------------------------------- join

DIES = ("agree", "rule", "dead", "named", "deadlock")


def replay(model, *prefixes):
    """Run `model` from its initial state along the actions whose labels start with
    `prefixes`, one each, in order; returns the labels taken and the last state."""
    state, labels = model.initial(), []
    for prefix in prefixes:
        label, state, _ = next(m for m in model.successors(state)
                               if m[0].startswith(prefix))
        labels.append(label)
    return labels, state


def test_join_one_word_is_replaced_by_a_second_join_on_a_directed_ring():
    ring = make_graph("ring:3")
    r = explore(JoinModel(ring, 2, "one-word", steps="1,0,0"))
    assert r.prop == "rule"
    # rank 1 ended round 0 and joined round 1 at once (no training step in between):
    # its word now holds round 1's count, which rank 2 reads for its step of round 0
    trace = "\n".join(r.trace)
    assert "rank 1: join() of round 1" in trace and "reads round 1 count" in r.detail
    assert r.trace[-1].startswith("rank 2:") and "keeps rank 1" in r.detail
    # the pair of words: the same bounds and three joins in a row verify; a rank was a
    # round ahead of another, and J lay up to the ring's diameter past the last
    # training step
    for epochs in (2, 3):
        ok = explore(JoinModel(ring, epochs, steps="1,0,0"))
        assert ok.verdict == "ok" and ok.measures == {"round ahead": 1, "J past joined": 2}
    # one word is enough where the writer's step J waits for the reader's version J
    undirected = explore(JoinModel(make_graph("complete:3"), 2, "one-word", max_steps=1))
    assert undirected.verdict == "ok" and undirected.measures["round ahead"] == 1


def test_join_j_must_cover_the_counts_entered():
    r = explore(JoinModel(make_graph("ring:3"), 2, "j-joined", steps="1,0,0"))
    assert r.prop == "agree" and "above J = 2" in r.detail
    # a rank two hops from the last training rank stepped along to 3 before it saw it
    # join (at 1): only the counts entered say so
    assert "rank 2: joined, steps along: ENTERED := 3" in "\n".join(r.trace)
    # diameter 1: nobody steps along past the largest joined-at + 1
    assert explore(JoinModel(make_graph("complete:3"), 2, "j-joined",
                             max_steps=1)).verdict == "ok"


def test_join_without_the_lag_two_ranks_disagree_about_one_rank():
    k3 = make_graph("complete:3")
    r = explore(JoinModel(k3, 2, "no-lag", steps="1,0,0"))
    assert r.prop == "rule" and "depends on timing" in r.detail
    # rank 0 enters step 1 before rank 1 joins at 0, rank 2 after: with c + 1 <= s one
    # keeps rank 1 in step 1, the other leaves it out; with c + 1 < s both keep it
    run = ("rank 0: trains, enters step 1", "rank 1: join()", "rank 2: join()",
           "rank 2: joined, steps along")
    labels, _ = replay(JoinModel(k3, 2, "no-lag", steps="1,0,0",
                                 properties=("deadlock",)), *run)
    assert "leaves out" not in labels[0] and labels[3].endswith(
        "enters step 1 (leaves out ranks 1)")
    labels, state = replay(JoinModel(k3, 2, steps="1,0,0"), *run)
    assert not any("leaves out" in label for label in labels) and not state[0]


def test_join_a_rank_dead_in_the_agreement_ends_in_timeouts():
    ring = make_graph("ring:3")
    # nobody completes the agreement; every other rank ends in a wait with a deadline
    ok = explore(JoinModel(ring, 2, steps="1,0,0", die=0, properties=DIES[:3] + DIES[4:]))
    assert ok.verdict == "ok" and ok.states > 1000
    # before the fix: the agreement's timeout named the ranks below the largest count;
    # a rank that died at the largest (every rank caught up) was named by nobody
    model = JoinModel(ring, 2, "late-only", steps="1,0,0", die=0, properties=DIES)
    r = explore(model)
    assert r.prop == "named"
    assert "dies in the agreement of round 0 (before posting)" in "\n".join(r.trace)
    assert r.detail.count("its timeout names nobody") == 2
    # there, the only actions are the live ranks' timeouts (not forced)
    moves = model.successors(r.last_state)
    assert len(moves) == 2 and not any(forced for _, _, forced in moves)
    assert all("times out, NeighbourTimeoutError naming nobody" in label
               for label, _, _ in moves)
    assert model.finished(r.last_state)
    # join() now names every other rank when no count is below the largest: it names it
    fixed = explore(JoinModel(ring, 2, steps="1,0,0", die=0, die_posted=True,
                              properties=DIES))
    assert fixed.verdict == "ok"
    fixed_model = JoinModel(ring, 2, steps="1,0,0", die=0)
    dead = model.dead(r.last_state)
    assert all(dead in fixed_model.timeout_names(r.last_state, x)
               for x in range(3) if x != dead)


def test_join_agreement_timeout_names_a_rank_already_in_the_next_round():
    # a rank that died after posting, once another rank completed the agreement and
    # went on: join()'s idle timeout took that rank's hidden count (-1) for late
    class Ahead(JoinModel):
        def violation(self, state):
            if self.dead(state) is None or self._forced(state):
                return None
            for r in range(self.n):
                ahead = [a for a in self.timeout_names(state, r) or ()
                         if state[self.round[a]] > state[self.round[r]]]
                if ahead and state[self.stage[r]] == 0:
                    return ("named", f"rank {r} names {ahead}, a round ahead")
            return None

    ring = make_graph("ring:3")
    kw = {"steps": "1,0,0", "die": 0, "die_posted": True, "properties": ("named",)}
    model = Ahead(ring, 2, "late-only", **kw)
    r = explore(model)
    trace = "\n".join(r.trace)
    assert r.prop == "named" and "after posting" in trace and "join() of round 1" in trace
    # there the idle rank names only the rank ahead, not the dead one; naming the ranks
    # of this round below the largest count, else every other rank, names it
    waiting = int(r.detail.split()[1])
    dead = model.dead(r.last_state)
    assert dead not in model.timeout_names(r.last_state, waiting)
    assert dead in JoinModel(ring, 2, **kw).timeout_names(r.last_state, waiting)


def test_join_symmetry_and_refusals():
    for make in (lambda sym: JoinModel(make_graph("complete:3"), 2, max_steps=1,
                                       symmetry=sym),
                 lambda sym: JoinModel(make_graph("complete:3"), 2, "no-lag", steps="1,0,0",
                                       symmetry=sym)):
        reduced, full = explore(make(True)), explore(make(False))
        assert (reduced.verdict, reduced.prop) == (full.verdict, full.prop)
        assert len(reduced.trace) == len(full.trace)
        assert reduced.verdict == "violation" or reduced.states < full.states
    ring = make_graph("ring:3")
    for bad in ({"variant": "nope"}, {"steps": "1,0,0,0"}, {"steps": "1,-1"},
                {"die": 2}, {"max_steps": -1}):
        with pytest.raises(ValueError):
            JoinModel(ring, 2, **bad)


class Counter(Model):
    """Two ranks that each count to `n`; rank 1 passes 1 only once rank 0 did."""

    name = "counter"

    def __init__(self, n, bad_at=None):
        from asapmpi.reduce.graphs import complete
        super().__init__(complete(2), n, ("version", "deadlock"))
        self.k = [self.cells.add("k", (r,)) for r in range(2)]
        self.bad_at = bad_at
        self.symmetry = False

    def finished(self, state):
        return all(state[p] == self.iterations for p in self.k)

    def successors(self, state):
        out = []
        for r in range(2):
            k = state[self.k[r]]
            if k < self.iterations and (r == 0 or k < 1 or state[self.k[0]] > 1):
                s = list(state)
                s[self.k[r]] = k + 1
                if (k + 1, r) == self.bad_at:
                    self.flag(s, self.BAD, "version", "bad")
                out.append((f"rank {r}: {k + 1}", tuple(s), True))
        return out


def test_explorer_counts_finds_shortest_traces_and_deadlocks():
    r = explore(Counter(3))
    # (a, b) with b <= 1 until a >= 2: 2 + 2 + 4 + 4 states, 6 steps to the end
    assert r.verdict == "ok" and r.states == 12 and r.max_depth == 6
    r = explore(Counter(3, bad_at=(2, 1)))
    assert r.prop == "version" and len(r.trace) == 4 and r.trace[-1] == "rank 1: 2"
    assert explore(Counter(3), max_states=5).verdict == "limit"
    stuck = Counter(3)
    stuck.finished = lambda state: False
    r = explore(stuck)
    assert r.prop == "deadlock" and len(r.trace) == 6


def test_graph_specs_and_overrides():
    assert make_graph("offsets:6:1,4").out_neighbours(0) == [1, 4]
    assert make_graph("ring:3").out_neighbours(2) == [0]
    sc = next(sc for sc in CORRECT if sc.graph == "complete:3")
    assert override(sc, 5, "offsets:1,4", 6).graph == "offsets:6:1,4"
    assert override(sc, None, "complete:4").graph == "complete:4"
    assert override(sc, 2, None, 4).iterations == 2
    for bad in ("ring", "ring:x", "ring:1", "ring:9", "nope:3", "offsets:4",
                "chain:3:1"):
        with pytest.raises(ConfigError):
            make_graph(bad)
    with pytest.raises(ConfigError, match="backup"):
        build(override(next(sc for sc in CORRECT if dict(sc.options).get("backup")),
                       graph="ring"))


CLI = [sys.executable, "-m", "asapmpi", "check-protocol"]


def test_cli_runs_the_gossip_pull_scenarios():
    proc = subprocess.run([*CLI, "--protocol", "gossip-pull", "--quick", "--broken"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "violation: freed" in proc.stdout and "violation: version" in proc.stdout
    assert "every verdict as expected" in proc.stdout.splitlines()[-1]


def test_cli_runs_quick_scenarios_and_reports(tmp_path):
    out = tmp_path / "mc.json"
    proc = subprocess.run([*CLI, "--protocol", "notify-ack-messages", "--quick", "--broken",
                           "--json", str(out)], capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split()[:3] == ["protocol", "graph", "iters"]
    assert "violation: ahead" in proc.stdout and "violation: alias" in proc.stdout
    assert "every verdict as expected" in lines[-1]
    assert "   1. rank 0: MPI_Isend (eager) version 1" in proc.stdout
    data = json.loads(out.read_text())
    assert data["all_expected"] and all(row["matches"] for row in data["scenarios"])
    assert {row["verdict"] for row in data["scenarios"]} == {"ok", "violation"}


def test_cli_exit_code_1_when_a_verdict_is_unexpected():
    # ignoring acks cannot go wrong with a single iteration: "violation" not found
    proc = subprocess.run([*CLI, "--protocol", "notify-ack-put", "--quick", "--broken",
                           "--max-iters", "1"], capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 1
    assert "UNEXPECTED: expected violation: overlap" in proc.stdout


@pytest.mark.parametrize("args, message", [
    (["--max-iters", "0"], "--max-iters must be at least 1"),
    (["--graph", "nope"], "graph 'nope"),
    (["--ranks", "12"], "--ranks must be 2 to 8"),
    (["--protocol", "hop", "--graph", "ring"], "backup must be smaller"),
])
def test_cli_bad_input_is_one_line(args, message):
    proc = subprocess.run([*CLI, "--quick", *args], capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr


def test_join_by_messages_needs_the_joined_at_word_delivered_before_the_next_step():
    # the board by messages: ENTERED counts arrive late, JOINED_AT must not (mark_joined
    # waits for every reader's match); sent like the counts, a reader enters step 2
    # before the word of a rank it must leave out arrived
    r = explore(JoinModel(make_graph("ring:3"), 1, "eventual-joined", steps="1,0,0",
                          board="messages"))
    assert r.verdict == "violation" and r.prop == "rule", r
    assert "keeps rank 1" in r.detail and "reads empty" in r.detail, r.detail
    with pytest.raises(ValueError, match="board='messages'"):
        JoinModel(make_graph("ring:3"), 1, "eventual-joined", steps="1,0,0")
