"""Multi-rank tests: each launches ranks under mpiexec (2, 4, 8 on a 2-core machine, so
oversubscribed), on the shared-memory path and on the forced network path."""
import os
import random
import re
import time

import numpy as np
import pytest

import asapmpi
from asapmpi.errors import ConfigError, FreedError, NeighbourTimeoutError, ProtocolError
from asapmpi.testing import NotifyAckIgnoringAcks
from asapmpi.testing.faults import store_word, torn_write

from mpilaunch import PATHS, launch, mpich_only, run, run_cases

pytestmark = pytest.mark.mpi
SIZES = (2, 4, 8)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("graph", ["ring", "complete"])
def test_roundtrip_exact_values_and_versions(graph, n, path):
    results = run("roundtrip", n, path, timeout=300, graph=graph, iters=1000, n=257)
    # every rank here, on the cores this test may use: the waits sleep coarsely only
    # when the ranks oversubscribe them
    from asapmpi.launch.cores import DEFAULT_SLACK_NS, PRECISE_SLACK_NS, cgroup_quota

    quota = cgroup_quota()
    cores = min(len(os.sched_getaffinity(0)), quota["cores"] if quota else float("inf"))
    for rank, res in enumerate(results):
        expected_in = [(rank - 1) % n] if graph == "ring" else [r for r in range(n) if r != rank]
        assert res["in"] == expected_in
        assert res["oversubscribed"] == (n > cores), (res, cores)
        assert res["slack_ns"] == (DEFAULT_SLACK_NS if n > cores else PRECISE_SLACK_NS)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("n", (2, 4, 8))
@pytest.mark.parametrize("graph", ["ring", "complete"])
def test_double_buffered_roundtrip_exact_values(graph, n, path):
    # the shared transport: computed in the slots, reduced from one into the other, no
    # copy; the others (transport="auto" measures: the network path, or messages
    # faster) run the same calls, the buffer never moves
    results = run("roundtrip", n, path, timeout=300, graph=graph, iters=500, n=257,
                  double_buffer=True)
    assert len({res["transport"] for res in results}) == 1
    for res in results:
        assert res["transport"] in ({"shared", "messages"} if path == "shm"
                                    else {"put", "messages"}), res
        assert res["double_buffered"] == (res["transport"] == "shared"), res


def test_double_buffered_float32_with_checksum_across_the_copy_threshold():
    # 3M + 1 float32 (12 MB): past the streaming-copy size, odd length
    run("roundtrip", 4, "shm", timeout=300, graph="bidirectional-ring", iters=6,
        n=3 * (1 << 20) + 1, dtype="float32", checksum=True, double_buffer=True)


def test_double_buffer_keeps_the_shape_and_guards_the_read_slot():
    run("test_multirank:double_buffer_keeps_shape", 3, "shm", timeout=120)


@pytest.mark.parametrize("path", PATHS)
def test_message_writer_stays_within_one_version_of_its_reader(path):
    # Issue 15, point 5: on a directed ring of 4, rank 2 pauses after its step 2.  A
    # writer's step k completes only once its reader posted the receive of k (it
    # reduced k - 1), so while rank 2 sleeps every rank completes at most one step
    # more than its out-neighbour: rank 1 stops at 3, rank 0 at 4, rank 3 at 5.
    # With sends that complete eagerly rank 1 ran on to 5 (n - 1 ahead).
    results = run("test_multirank:ring_run_ahead", 4, path, timeout=120)
    woke = results[2]["woke"]
    before = [sum(t < woke for t in res["done"]) for res in results]
    assert before[2] == 2, before
    for rank in range(4):
        assert before[rank] <= before[(rank + 1) % 4] + 1, before
    assert all(len(res["done"]) == 10 for res in results)


@pytest.mark.parametrize("path", PATHS)
def test_auto_transport_is_measured_agreed_and_reported(path):
    results = run("transport_choice", 4, path, timeout=300)
    auto = [r["auto"] for r in results]
    assert all(a == auto[0] for a in auto), auto          # one choice, one report
    report = auto[0]["report"]
    assert report["chosen"] == auto[0]["transport"] and report["requested"] == "auto"
    rounds = report["rounds"]["same host"]                 # every rank on this host
    window = "shared" if path == "shm" else "put"
    # the channels the resolver gives NOTIFY-ACK in each family are what was timed,
    # each carrying the update (the shared one copies it once, into its own slot)
    assert report["timed"] == {"words": "SharedWindow" if window == "shared"
                               else "PutWindow", "messages": "MessageWindow"}, report
    assert report["message_bytes"] == report["window_bytes"] == 8000, report
    assert auto[0]["transport"] == ("messages" if rounds["messages"] < rounds["words"]
                                    else window), report
    assert results[0]["put"]["report"]["reason"] == "asked for"
    assert results[0]["put"]["transport"] == "put"
    # gossip: pulls against pushes, timed as gossip steps per model mixed
    gossip = results[0]["gossip"]
    steps = gossip["report"]["rounds"]["all peers"]
    assert gossip["report"]["unit"] == "us per model mixed", gossip
    assert gossip["report"]["timed"] == {"words": "PutWindow",
                                         "messages": "PushWindow"}, gossip
    assert gossip["transport"] == ("messages" if steps["messages"] < steps["words"]
                                   else "put"), gossip
    # Hop and async run on window words or on a mailbox of messages: their own
    # channels timed through the verbs, NOTIFY-ACK's way, the update on both sides
    for sync, mailbox in (("hop", "MailboxWindow"), ("async", "NewestWindow")):
        chosen = results[0][sync]
        assert chosen["report"]["timed"] == {"words": "PutWindow",
                                             "messages": mailbox}, chosen["report"]
        rounds = chosen["report"]["rounds"]["same host"]
        assert chosen["transport"] == ("messages" if rounds["messages"] < rounds["words"]
                                       else "put"), chosen["report"]
    # backup_ps's star: every worker's 160 KB update measured on both sides
    star = results[0]["backup_ps"]["report"]
    assert star["message_bytes"] == star["window_bytes"] == 160000, star
    assert results[0]["backup_ps"]["transport"] == star["chosen"], star


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("transport", ["messages", "window"])
def test_free_after_a_send_leaves_nothing_in_flight(path, transport):
    if transport == "window":
        transport = "shared" if path == "shm" else "put"
    results = run("test_multirank:free_after_send", 4, path, timeout=300, transport=transport)
    assert {r["transport"] for r in results} == {transport}


@mpich_only
def test_roundtrip_on_libfabrics_own_tcp_rma():
    # the network path runs RMA as MPICH active messages; libfabric's tcp RMA must work too
    results = run("roundtrip", 4, "net-native", timeout=300, graph="complete", iters=100,
                  n=4099)
    assert [r["in"] for r in results] == [[j for j in range(4) if j != r] for r in range(4)]


@pytest.mark.parametrize("path", PATHS)
def test_roundtrip_large_float32_with_checksum(path):
    # 4M + 3 float32: several puts' worth, not a multiple of the vector width
    run("roundtrip", 4, path, timeout=300, graph="bidirectional-ring", iters=10,
        n=(1 << 22) + 3, dtype="float32", checksum=True)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("n", SIZES)
def test_torn_write_is_detected_and_not_reduced(n, path):
    for res in run("tear_detected", n, path, timeout=120):
        assert res["stats"]["torn"] == 2


@pytest.mark.parametrize("path", PATHS)
def test_notify_ack_raises_on_torn_input(path):
    run("test_multirank:notify_ack_refuses_torn", 4, path, timeout=120)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("n", [2, 4])
def test_concurrent_reads_are_whole_versions_or_counted_torn(n, path):
    results = run("test_multirank:concurrent_seqlock", n, path, timeout=300, iters=1500)
    assert sum(r["untorn"] for r in results) > 0
    print("torn reads caught:", [r["torn"] for r in results])


@pytest.mark.parametrize("path", PATHS)
def test_checksum_catches_silent_corruption(path):
    run("test_multirank:checksum_catches_corruption", 2, path, timeout=120)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("n", [2, 4])
def test_silent_neighbour_times_out_naming_it(n, path):
    timeout = 1.0
    results = run("test_multirank:silent_neighbour", n, path, timeout=120, wait_timeout=timeout)
    assert results[1]["error"] is None
    # rank 2 % n receives from rank 1: waits for a notify that never comes
    victim = results[2 % n]
    # a notify (window words) or an update (messages), whichever auto measured faster
    assert victim["ranks"] == [1] and victim["what"] in ("the notify of version 1",
                                                         "the update of version 1"), victim
    assert "rank 1 (expected 1, last seen 0)" in victim["error"]
    assert timeout <= victim["elapsed"] < timeout + 10
    if n > 2 and "notify" in victim["what"]:
        # rank 0 sends to rank 1: its step 1 completes, step 2 waits for rank 1's ack
        assert results[0]["ranks"] == [1] and "ack of version 1" in results[0]["what"]
    elif n > 2:
        # messages: rank 0's update of version 2 is a synchronous send that rank 1 never
        # posts the receive for: rank 0 names rank 1 (and free() still drains it); rank
        # n-1 waits for version 2 from rank n-2, which timed out on rank 1 in step 1
        assert results[0]["ranks"] == [1], results[0]
        assert "the receive of its update of version 2" in results[0]["what"], results[0]
        assert results[n - 1]["ranks"] == [n - 2], results[n - 1]


def test_payload_view_is_read_only_and_pins_the_window_on_every_rank():
    results = run("test_multirank:payload_view", 3, "shm", timeout=60)
    assert "rank 0 holds 1 view(s)" in results[0]["refused"]
    assert all("the most on one rank: 1" in r["refused"] for r in results)


def test_versions_and_offsets_out_of_range_are_refused():
    (res, _) = run("test_multirank:bounds_are_checked", 2, "shm", timeout=60)
    assert len(res["problems"]) == 8
    assert sum("versions start at 1" in p for p in res["problems"]) == 4
    assert sum("not an int64 word" in p for p in res["problems"]) == 4


def _timed_out_while_stalled(results, wait_timeout):
    """Rank 0 timed out at its deadline while rank 1 was still outside MPI: rank 1 stays
    asleep until rank 0 has timed out (stalled_target with `out`), and was woken by
    that, not by its cap."""
    assert results[1]["told"], results
    assert wait_timeout <= results[0]["elapsed"] < 10 * wait_timeout, results[0]


def test_stalled_target_times_out_on_shared_memory(tmp_path):
    results = run("test_multirank:stalled_target", 2, "shm", timeout=120, wait_timeout=2.0,
                  stall=60.0, out=str(tmp_path))
    assert "rank 1 (expected 2, last seen 1)" in results[0]["error"]
    _timed_out_while_stalled(results, 2.0)


def test_stalled_target_times_out_on_the_network_path_with_messages(tmp_path):
    results = run("test_multirank:stalled_target", 2, "net", timeout=120, wait_timeout=2.0,
                  stall=60.0, out=str(tmp_path))
    assert "update of version 2 from rank 1 (expected 2, last seen 1)" in results[0]["error"]
    _timed_out_while_stalled(results, 2.0)


@mpich_only     # MPICH's active-message RMA needs the target; Open MPI's need not
def test_stalled_target_ends_the_job_on_the_network_path_with_puts():
    proc = launch("test_multirank:stalled_target", 2, "net", timeout=120, wait_timeout=2.0,
                  stall=30.0, transport="put")
    assert proc.returncode != 0, "the job survived a stalled target"
    # Which flush stalls depends on how far rank 1 got into MPI before it stopped: the
    # put of version 2, or (if that completed) the notify of version 2, which rank 0
    # completes lazily as soon as it has to wait for rank 1.  Both name rank 1.
    assert re.search(r"rank 0: MPI_Win_flush_all (after the put of version 2|of its notifies "
                     r"and acks) to rank\(s\) 1 did not complete within 2 s",
                     proc.stderr), proc.stderr[-3000:]


BAD_INPUT = {
    "size": "same buffer size in bytes",
    "dtype": "same buffer dtype",
    "out_of_range": "outside the communicator",
    "asymmetric": "does not list",
    "graph_size": "but the communicator has",
    "weights": "must sum to 1",
    "weights_type": "must map ranks to numbers",
    "weights_kind": "same kind of weights",
    "disconnected": "is not connected: rank 0's updates never reach rank(s) [2]",
    "not_doubly_stochastic": "use weights='metropolis'",
    "graph_name": "same graph name",
    "hop_gap": "max_gap must be an integer >= 1, got 0",
    "hop_backup": "backup=1 must be smaller than the smallest in-degree",
    "hop_options_differ": "same policy options",
    "hop_unknown_option": "has no option(s) named ['max_gapp']",
    "timeout": "timeout must be a number of seconds, got 'soon'",
    "transport": "transport must be one of auto, put, shared, messages, got 'pigeon'",
    "transport_policy": "transport='shared' does not fit sync='hop' (it drives its slots "
                        "and window words itself); use transport='put', 'messages' or "
                        "'auto'",
    "transport_gossip": "transport='shared' does not fit sync='gossip' (it mixes a peer's "
                        "model without waiting for the peer); use transport='put', "
                        "'messages' or 'auto'",
    "transport_differs": "same transport",
}


@pytest.fixture(scope="module")
def bad_input_runs():
    """Every BAD_INPUT case one after another in one job of 3 ranks (each case's error
    comes before any communication of its exchange, on every rank alike)."""
    return run_cases({case: ("test_multirank:bad_input", {"case": case})
                      for case in sorted(BAD_INPUT)}, 3, "shm", timeout=120)


@pytest.mark.parametrize("case", sorted(BAD_INPUT))
def test_bad_input_raises_on_every_rank(case, bad_input_runs):
    for res in bad_input_runs[case]:
        assert BAD_INPUT[case] in res["error"] or "was given bad input" in res["error"], res
        assert "\n" not in res["error"]


def test_use_after_free_and_wrong_size():
    for res in run("test_multirank:use_after_free", 2, "shm", timeout=60):
        assert "was freed" in res["freed"]
        assert "has 248 bytes" in res["wrong_size"] and "hold 256" in res["wrong_size"]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("n", [4, 8])
def test_consensus_converges_at_least_as_fast_as_sigma2(n, path):
    (rank0, *_) = run("test_multirank:consensus", n, path, timeout=600)
    for name, r in rank0.items():
        assert r["worst_ratio"] <= r["sigma2"] + 1e-9, (name, r)
        assert r["final"] <= 1e-8, (name, r)
    print({name: round(r["sigma2"], 4) for name, r in rank0.items()})


@pytest.mark.parametrize("path", PATHS)
def test_complete_graph_step_equals_allreduce(path):
    run("test_multirank:complete_equals_allreduce", 4, path, timeout=120)


def test_hierarchical_finds_hosts_by_shared_memory():
    for res in run("test_multirank:hierarchical_hosts", 4, "shm", timeout=60):
        assert res["hosts"] == [0, 0, 0, 0] and res["complete"]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("n", SIZES)
def test_policies_reduce_exactly_what_they_report(n, path):
    results = run("policies_reduce_exactly_what_they_report", n, path, timeout=600)
    totals = {}
    for res in results:
        for key, tally in res.items():
            for status, count in tally.items():
                if status != "transport":
                    totals.setdefault(key, {}).setdefault(status, 0)
                    totals[key][status] += count
    for key, tally in totals.items():
        if key.startswith("notify_ack"):
            assert tally["torn"] == tally["stale"] == tally["ahead"] == 0, (key, tally)
    print(totals)


@pytest.mark.parametrize("path", PATHS)
def test_bsp_on_messages_reduces_exactly_every_current_version(path):
    # the mailbox: after the barrier every version-k update is waited for, and no
    # writer refills a slot its reader has not released (asserted in the scenario)
    results = run("policies_reduce_exactly_what_they_report", 4, path, timeout=600,
                  policies=["bsp"], transport="messages", iters=100)
    for res in results:
        for key, tally in res.items():
            assert tally["transport"] == "messages"
            assert tally["consistent"] == 100 * (1 if key.endswith("ring") else 3), tally


@pytest.mark.parametrize("path", PATHS)
def test_async_on_messages_reduces_only_whole_versions(path):
    # the mailbox of newest versions: every reduce replays exactly from the versions it
    # reports, and a slot that trades places with its receive buffer is never torn
    results = run("policies_reduce_exactly_what_they_report", 4, path, timeout=600,
                  policies=["async"], transport="messages", iters=150)
    reduced = 0
    for res in results:
        for key, tally in res.items():
            assert tally["transport"] == "messages"
            assert tally["torn"] == 0, (key, tally)
            reduced += tally["consistent"] + tally["stale"] + tally["ahead"]
    assert reduced > 0


def test_broken_protocol_is_caught_on_the_network_path():
    results = run("test_multirank:broken_protocol", 8, "net", timeout=600)
    caught = sum(r["torn"] + r["ahead"] for r in results)
    assert caught > 0, "writers that ignore acks overwrote nothing the checks could see"
    print("caught:", caught, "of", sum(sum(r.values()) for r in results), "inputs")


HOP_SETTINGS = {
    "standard-gap1": {"max_gap": 1},
    "standard-gap2": {"max_gap": 2},
    "backup1": {"max_gap": 3, "backup": 1},
    "staleness2-eq2": {"max_gap": 3, "staleness": 2},
    "staleness2-uniform": {"max_gap": 2, "staleness": 2, "staleness_weights": "uniform"},
    "backup1-skip10": {"max_gap": 3, "backup": 1, "skip_trigger": 2, "max_jump": 10},
    "staleness2-skip2": {"max_gap": 3, "staleness": 2, "skip_trigger": 2, "max_jump": 2},
}


@pytest.mark.parametrize("graph", ["ring-based", "double-ring"])
@pytest.mark.parametrize("n", [4, 8])
def test_hop_keeps_the_gap_bounds_and_reduces_exactly(n, graph):
    # every setting as a run of one job: one start of n ranks, not seven
    results = _hop_runs_of_settings(HOP_SETTINGS, n, "shm", timeout=300, graph=graph)
    for setting, options in HOP_SETTINGS.items():
        _check_hop_runs(results[setting], options, "skip" in setting, setting)


def _hop_runs_of_settings(settings, ranks, path, timeout, **common):
    """hop_runs with each {name: options} of `settings`, one after another in one job
    (one start of the ranks for all); {name: per-rank results}.  A setting that skips
    ("skip" in its name) stalls its slow rank once for 1 s (hop_runs' stall_s), so that
    it must jump whatever the load."""
    return run_cases({name: ("hop_runs", dict(common, options=options,
                                              stall_s=1.0 if "skip" in name else 0.0))
                      for name, options in settings.items()}, ranks, path, timeout)


def _check_hop_runs(results, options, skips, setting=""):
    """Theorem 2's gap bound and Table 1 kept, nothing torn or ahead reduced (every
    reduce was replayed exactly inside the scenario), and the slow rank skipped."""
    rank0 = results[0]
    assert rank0["violations"] == [], (setting, rank0["violations"][:3])
    assert rank0["max_gap_to_out_neighbours"] <= options["max_gap"], (setting, rank0)
    for res in results:
        for counts in res["stats"].values():
            assert counts["torn"] == 0 and counts["ahead"] == 0, (setting, counts)
    if skips:
        assert rank0["jumps"] > 0, f"{setting}: the slower rank 0 never skipped"


# i -> i+1 and i -> i+4 on 6 ranks: out-neighbours can run further ahead than the
# in-neighbours a jump waits for (a jump of 4 once deadlocked here).  On messages the
# slots are released by the reader's tokens while its in-neighbours are not its
# out-neighbours; its tokens and rendezvous sends wait for the slow rank's next MPI
# call, so its out-neighbours rarely reach the 4 ahead that puts trigger on: 3 there
@pytest.mark.parametrize("transport, trigger", [("put", 4), ("messages", 3)])
def test_hop_skipping_on_a_directed_graph_does_not_deadlock(transport, trigger):
    edges = [(i, (i + 1) % 6) for i in range(6)] + [(i, (i + 4) % 6) for i in range(6)]
    options = {"max_gap": 2, "backup": 1, "skip_trigger": trigger, "max_jump": 4,
               "weights": "uniform", "transport": transport}
    results = run("hop_runs", 6, "shm", timeout=300, graph=edges, options=options,
                  iters=120, stall_s=1.0)
    assert results[0]["transport"] == transport
    _check_hop_runs(results, options, True)


# staleness 0 waits in wait_newest for every in-neighbour's notify of k while its own
# notify of k is a lazy word: an MPI may defer issuing it until a flush (Open MPI's
# osc pt2pt, the one-sided component of its network path here, does), so two ranks
# each waited for the other's with their own still queued (issue 15, point 2) until
# wait_newest settled the pending words like every other wait
NETWORK_HOP_SETTINGS = dict(HOP_SETTINGS, staleness0={"max_gap": 1, "staleness": 0})


def test_hop_on_the_network_path():
    # the settings as runs of one job
    settings = {name: dict(NETWORK_HOP_SETTINGS[name], transport="put")
                for name in ("standard-gap2", "backup1", "staleness2-eq2", "backup1-skip10",
                             "staleness0")}
    results = _hop_runs_of_settings(settings, 8, "net", timeout=600, graph="ring-based",
                                    iters=80)
    for setting, options in settings.items():
        rank0 = results[setting][0]
        assert rank0["violations"] == [], (setting, rank0["violations"])
        assert rank0["max_gap_to_out_neighbours"] <= options["max_gap"], setting


def test_hop_on_messages_keeps_the_bounds_and_reduces_exactly():
    # the mailbox: updates and tokens as two-sided messages the waits complete into the
    # slots, on the network path where it is the fast transport; the settings as runs
    # of one job
    settings = {name: dict(options, transport="messages")
                for name, options in HOP_SETTINGS.items()}
    results = _hop_runs_of_settings(settings, 8, "net", timeout=600, graph="double-ring",
                                    iters=80)
    for setting, options in settings.items():
        runs = results[setting]
        assert {r["transport"] for r in runs} == {"messages"}, setting
        _check_hop_runs(runs, options, "skip" in setting, setting)


def test_hop_never_hangs_on_a_stopped_rank(tmp_path):
    # every setting as a run of one job (one start of 6 ranks, not seven)
    _stopped_rank_is_named(HOP_SETTINGS, tmp_path)


def test_hop_on_messages_never_hangs_on_a_stopped_rank(tmp_path):
    settings = {name: dict(HOP_SETTINGS[name], transport="messages")
                for name in ("standard-gap2", "backup1-skip10", "staleness2-eq2")}
    _stopped_rank_is_named(settings, tmp_path)


def _stopped_rank_is_named(settings, tmp_path):
    results = run_cases({name: ("test_multirank:hop_stopped_rank",
                                {"options": options, "out": str(tmp_path), "tag": name})
                         for name, options in settings.items()}, 6, "shm", timeout=180)
    for setting, options in settings.items():
        runs = results[setting]
        transports = {r["transport"] for r in runs}
        expected = {options["transport"]} if "transport" in options else transports
        assert len(transports) == 1 and transports == expected, (setting, runs)
        assert runs[0]["finished"], (setting, runs[0])
        others = runs[1:]
        assert all(r["finished"] or r["waited_for"] for r in others), (setting, others)
        assert any(r["waited_for"] and 0 in r["waited_for"] for r in others), \
            (setting, others)
        # rank 0 stayed silent until every other rank had finished or timed out
        assert runs[0]["told"], (setting, runs[0])


def test_sync_spelled_two_ways_is_one_policy():
    # rank 0 writes the command line's spelling, the others keyword options: the ranks
    # agree on the policy by its name and options, not by how it was written
    for res in run("test_multirank:sync_spelled_two_ways", 3, "shm", timeout=60):
        assert res == {"sync": "hop", "max_gap": 3, "version": 3}, res


# ---------------------------------------------------------------- scenario bodies (on the ranks)
# tests/mpi/run.py runs each on every rank as "test_multirank:NAME"

def sync_spelled_two_ways(comm):
    import numpy as np

    import asapmpi

    spelled = {"sync": "hop:max_gap=3"} if comm.rank == 0 else {"sync": "hop", "max_gap": 3}
    with asapmpi.Exchange(np.zeros(16), graph="ring", comm=comm, timeout=30,
                          **spelled) as ex:
        while ex.version < 3:
            ex.step()
        return {"sync": ex.sync, "max_gap": ex.policy.max_gap, "version": int(ex.version)}


HEADER = 64  # bytes before the payload in a slot


def message_of(error, call, what):
    """Call `call()`, which must raise `error`; return the error's message."""
    try:
        call()
    except error as exc:
        return str(exc)
    raise AssertionError(f"{what} did not raise {error.__name__}")


def notify_ack_refuses_torn(comm, n=1024):
    """Under notify_ack, a torn input makes step() raise ProtocolError naming the sender."""
    from scenarios import settled_barrier, slot_transport  # tests/mpi, on the ranks' path

    rank = comm.rank
    buf = np.full(n, float(rank))
    with asapmpi.Exchange(buf, graph="ring", comm=comm, timeout=30,
                          transport=slot_transport()) as ex:
        ex.step()
        sender = ex.in_neighbours[0]
        # a writer that breaks the protocol: the slot of version 2 is half written
        # (header says 2, footer still 1) and notified; the reader then runs the
        # policy's receive half as usual
        win = ex.window
        win.wait_acks(1, 30)
        torn_write(ex, np.full(n, -1.0), 2)
        win.notify(2)
        settled_barrier(comm)
        before = buf.copy()
        message = message_of(ProtocolError, lambda: ex._policy.receive(win, buf, 2, ex._ctx),
                             "a torn input under notify_ack")
        assert np.array_equal(buf, before), "the buffer changed although nothing was reduced"
        settled_barrier(comm)
    assert f"rank(s) [{sender}]" in message and "'torn'" in message, message
    return {"message": message}


def concurrent_seqlock(comm, iters=2000, n=65536, seed=0):
    """Writers rewrite while readers read: every read reported untorn is exactly one
    version (all elements equal that version); torn reads are counted, never reduced."""
    from asapmpi import _core

    from scenarios import settled_barrier, slot_transport  # tests/mpi, on the ranks' path

    rank = comm.rank
    rng = random.Random(seed + rank)
    src = np.zeros(n, dtype=np.float64)
    out = np.zeros(n, dtype=np.float64)
    with asapmpi.Exchange(src, graph="ring", comm=comm, timeout=60,
                          transport=slot_transport()) as ex:
        win = ex.window
        ones = np.ones(1)
        big = 1 << 62
        untorn = torn = 0
        for k in range(1, iters + 1):
            src[:] = k
            win.put(src, k, seqlock=True, notify=False)
            for _ in range(rng.randrange(3)):
                used = win.reduce(out, 0.0, ones, k, 1, big, seqlock=True)
                status = win.last_status()[0]
                if status == _core.TORN:
                    torn += 1
                    assert used == 0 and not out.any(), "a torn input was reduced"
                else:
                    version = int(win.last_versions[0])
                    if version == 0:
                        assert used == 0
                        continue
                    untorn += 1
                    assert used == 1
                    assert out[0] == version and out[-1] == version and np.all(out == version), (
                        f"read reported version {version} but holds {np.unique(out)[:5]}")
            if rng.random() < 0.3:
                time.sleep(rng.random() * 1e-4)
        counts = ex.stats[ex.in_neighbours[0]]
        settled_barrier(comm)
    assert counts["torn"] == torn, (counts, torn)
    return {"untorn": untorn, "torn": torn, "stats": counts}


def checksum_catches_corruption(comm, n=1000):
    """A payload changed behind the versions' back passes the version check but not the
    checksum."""
    from asapmpi import _core

    from scenarios import settled_barrier  # tests/mpi, on the ranks' path

    rank = comm.rank
    buf = np.full(n, float(rank))
    with asapmpi.Exchange(buf, graph="ring", comm=comm, transport="put", checksum=True,
                          timeout=30) as ex:
        ex.step()
        win = ex.window
        w = np.asarray([ex.weights[ex.in_neighbours[0]]])
        w_self = ex.weights[rank]
        win.wait_acks(1, 30)
        win.put(buf, 2, checksum=True)
        win.wait_notifies(2, 30)
        payload = win.slot_offset(0, 2) + HEADER
        store_word(win, payload + 8 * (n // 2), 12345)      # corrupt one element
        keep = buf.copy()
        assert win.reduce(buf, w_self, w, 2, 2, 2, checksum=False) == 1, "versions agree"
        buf[:] = keep
        assert win.reduce(buf, w_self, w, 2, 2, 2, checksum=True) == 0, "checksum missed it"
        assert win.last_status()[0] == _core.TORN
        settled_barrier(comm)
    return {}


def silent_neighbour(comm, wait_timeout=1.0):
    """Rank 1 never steps: its out-neighbour times out on the notify naming rank 1, and
    rank 1's in-neighbour (which did step once) times out on the ack of version 1."""
    from scenarios import settled_barrier  # tests/mpi, on the ranks' path

    rank = comm.rank
    buf = np.zeros(16)
    result = {"error": None}
    with asapmpi.Exchange(buf, graph="ring", comm=comm, timeout=wait_timeout) as ex:
        if rank != 1:
            t0 = time.monotonic()
            try:
                ex.step()
                ex.step()
            except NeighbourTimeoutError as exc:
                result = {"error": str(exc), "ranks": exc.ranks, "what": exc.what,
                          "elapsed": time.monotonic() - t0, "version": ex.version}
        settled_barrier(comm)
    return result


def bad_input(comm, case):
    """Every rank raises the same kind of ConfigError before any RMA starts."""
    rank, size = comm.rank, comm.size
    buf = np.zeros(8)
    kwargs = {"graph": "ring", "comm": comm}
    if case == "size":
        buf = np.zeros(8 if rank else 9)
    elif case == "dtype":
        buf = np.zeros(8, dtype=np.float32 if rank else np.float64)
    elif case == "out_of_range":
        out = size + 5 if rank == 1 else (rank + 1) % size
        kwargs["graph"] = {"in": [(rank - 1) % size], "out": [out]}
    elif case == "asymmetric":
        ring_in, ring_out = [(rank - 1) % size], [(rank + 1) % size]
        kwargs["graph"] = {"in": [] if rank == 1 else ring_in, "out": ring_out}
    elif case == "graph_size":
        kwargs["graph"] = asapmpi.graph("ring", size + 1)
    elif case == "weights":
        w = 0.9 if rank == 0 else 0.5
        kwargs["weights"] = {rank: w, (rank - 1) % size: w}
    elif case == "weights_type":
        kwargs["weights"] = {rank: "half" if rank == 2 else 0.5, (rank - 1) % size: 0.5}
    elif case == "weights_kind":
        kwargs["weights"] = "uniform" if rank == 1 else {rank: 0.5, (rank - 1) % size: 0.5}
    elif case == "disconnected":
        kwargs["graph"] = asapmpi.graph_from([(0, 1), (1, 0)], n=size)
    elif case == "not_doubly_stochastic":
        kwargs.update(graph="star", weights="uniform")
    elif case == "graph_name":
        kwargs["graph"] = "ring" if rank else "complete"
    elif case == "hop_gap":
        kwargs.update(sync="hop", max_gap=0 if rank == 2 else 1)
    elif case == "hop_backup":
        kwargs.update(sync="hop", backup=1)            # the ring's in-degree is 1
    elif case == "hop_options_differ":
        kwargs.update(sync="hop", max_gap=1 + (rank == 1))
    elif case == "hop_unknown_option":
        kwargs.update(sync="hop", max_gapp=2)
    elif case == "timeout":
        kwargs["timeout"] = "soon" if rank == 1 else 10
    elif case == "transport":
        kwargs["transport"] = "pigeon"
    elif case == "transport_policy":
        kwargs.update(sync="hop", transport="shared")
    elif case == "transport_gossip":
        kwargs.update(sync="gossip", transport="shared", graph=None)
    elif case == "transport_differs":
        kwargs["transport"] = "put" if rank == 1 else "auto"
    else:
        raise ValueError(case)
    return {"error": message_of(ConfigError, lambda: asapmpi.Exchange(buf, **kwargs),
                                f"case {case} on rank {rank}")}


def use_after_free(comm):
    """A freed Exchange refuses to step; free() twice is fine; wrong sizes are refused."""
    buf = np.zeros(32)
    ex = asapmpi.Exchange(buf, graph="ring", comm=comm)
    wrong_size = message_of(ConfigError, lambda: ex.window.put(np.zeros(31), 1),
                            "a wrong-size put")
    ex.step()
    ex.free()
    ex.free()
    freed = message_of(FreedError, ex.step, "step() after free()")
    return {"wrong_size": wrong_size, "freed": freed}


def payload_view(comm, n=100):
    """A read-only zero-copy view shows the neighbour's last payload; the window refuses
    to be freed while a view is alive."""
    rank = comm.rank
    buf = np.full(n, float(rank), dtype=np.float32)
    ex = asapmpi.Exchange(buf, graph="ring", comm=comm, transport="put")
    ex.step()
    sender = ex.in_neighbours[0]
    view = ex.window.payload(0, 1)
    seen = np.asarray(view)
    assert seen.dtype == np.float32 and not seen.flags.writeable
    assert np.all(seen == sender), seen[:4]
    if rank != 0:          # only rank 0 keeps a view: every rank must refuse together
        del seen
        view.release()
    refused = message_of(BufferError, ex.free, "free() with a live view")
    if rank == 0:
        del seen
        view.release()
    ex.free()
    return {"refused": refused}


def bounds_are_checked(comm):
    """Versions below 1 and offsets outside a window are refused, never dereferenced."""
    from scenarios import settled_barrier  # tests/mpi, on the ranks' path

    buf = np.zeros(16)
    problems = []
    with asapmpi.Exchange(buf, graph="ring", comm=comm, transport="put") as ex:
        win = ex.window
        w = np.ones(1) / 2
        for call in (lambda: win.payload(0, -2), lambda: win.reduce(buf, 0.5, w, -1, 1, 1),
                     lambda: win.wait_notifies(0, 1), lambda: win.notify(-3),
                     lambda: win.wait_word(1 << 40, 1, 0.1), lambda: win.local_word(-8),
                     lambda: win.fetch_word((comm.rank + 1) % comm.size, 1 << 40),
                     lambda: win.accumulate_word(comm.rank, win.total_bytes, 1)):
            problems.append(message_of(ConfigError, call, "an out-of-range call"))
        settled_barrier(comm)
    return {"problems": problems}


def stalled_target(comm, wait_timeout=2.0, stall=8.0, transport="auto", out=None):
    """Rank 1 stops calling MPI after step 1.  Shared memory, and messages on the network
    path: rank 0's wait for rank 1 times out with NeighbourTimeoutError.  Puts on the
    network path: rank 0's flush cannot complete, and the watchdog ends the job, naming
    rank 1.  With `out` (a directory) rank 1 stays asleep until rank 0 has timed out
    (a file there, no MPI call), at most `stall` s, and reports whether it was told;
    without, it sleeps `stall` s."""
    from scenarios import raise_flag, settled_barrier, wait_for_flags  # tests/mpi

    rank = comm.rank
    buf = np.zeros(1 << 16)
    result = {}
    with asapmpi.Exchange(buf, graph="ring", comm=comm, timeout=wait_timeout,
                          transport=transport) as ex:
        ex.step()
        t0 = time.monotonic()
        error, elapsed = None, None
        if rank == 1:
            # computing without MPI calls
            if out is None:
                time.sleep(stall)
            else:
                result["told"] = wait_for_flags(out, ["timed-out"], stall)
        else:
            try:
                ex.step()
            except NeighbourTimeoutError as exc:
                error, elapsed = str(exc), time.monotonic() - t0
            if out is not None:
                raise_flag(out, "timed-out")
        settled_barrier(comm)
    return dict(result, error=error, elapsed=elapsed)


CONSENSUS_GRAPHS = ("root-expander", "ring", "bidirectional-ring", "ring-based", "double-ring",
                    "exponential", "star", "chain", "hierarchical", "random-regular",
                    "complete")


def _disagreement(comm, x, mean):
    """sqrt(sum over ranks of ||x_r - mean||^2)."""
    return float(np.sqrt(comm.allreduce(float(np.sum((x - mean) ** 2)))))


def consensus(comm, graphs=CONSENSUS_GRAPHS, n=999, tol=1e-9):
    """From a different vector per rank, step() converges to the global mean; every step
    contracts the disagreement by at least sigma_2 of the mixing matrix (a theorem for a
    doubly stochastic W); the mean is preserved."""
    from asapmpi.reduce import second_singular_value

    rank, size = comm.rank, comm.size
    report = {}
    for name in graphs:
        x = np.random.default_rng(rank).standard_normal(n) * 10 + rank
        mean = np.empty(n)
        comm.Allreduce(x, mean)
        mean /= size
        with asapmpi.Exchange(x, graph=name, comm=comm, timeout=60) as ex:
            sigma2 = second_singular_value(ex.mixing)
            steps = 60 if sigma2 < 1e-12 else min(400, int(np.log(1e-10) / np.log(sigma2)) + 5)
            e0 = e = _disagreement(comm, x, mean)
            worst = 0.0
            for _ in range(steps):
                ex.step()
                e_next = _disagreement(comm, x, mean)
                if e > 1e-7 * e0:       # above rounding noise: the bound must hold
                    worst = max(worst, e_next / e)
                    assert e_next <= (sigma2 + tol) * e, (name, e_next / e, sigma2)
                e = e_next
            assert e <= 1e-8 * e0, (name, e / e0, steps)
            total = np.empty(n)
            comm.Allreduce(x, total)
            assert np.allclose(total / size, mean, rtol=0, atol=1e-9), name
        report[name] = {"sigma2": sigma2, "worst_ratio": worst, "steps": steps,
                        "final": e / e0}
    return report


def complete_equals_allreduce(comm, n=4097):
    """One step on the complete graph equals MPI_Allreduce averaging to rounding."""
    x = np.random.default_rng(comm.rank).standard_normal(n)
    y = x.copy()
    with asapmpi.Exchange(x, graph="complete", comm=comm) as ex:
        ex.step()
    with asapmpi.Exchange(y, sync="allreduce", comm=comm) as ey:
        assert ey.stats == {} and ey.in_neighbours != []
        ey.step()
    np.testing.assert_allclose(x, y, rtol=1e-13, atol=1e-14)
    return {"max_diff": float(np.max(np.abs(x - y)))}


def hierarchical_hosts(comm):
    """On one host the shared-memory split puts every rank on one host, so the
    hierarchical graph by name is the complete graph."""
    from asapmpi.reduce import hosts_of

    hosts = hosts_of(comm)
    with asapmpi.Exchange(np.zeros(8), graph="hierarchical", comm=comm) as ex:
        complete = ex.graph == asapmpi.graph("complete", comm.size)
    return {"hosts": hosts, "complete": complete}


def broken_protocol(comm, iters=300, n=1 << 15):
    """Writers that ignore acks: the checks catch what they overwrite (torn or ahead),
    and nothing torn is ever reduced (constant buffers stay constant)."""
    from scenarios import settled_barrier  # tests/mpi, on the ranks' path

    buf = np.zeros(n)
    with asapmpi.Exchange(buf, graph="complete", sync=NotifyAckIgnoringAcks, comm=comm,
                          timeout=60) as ex:
        tally = dict.fromkeys(("consistent", "torn", "stale", "ahead"), 0)
        for k in range(1, iters + 1):
            buf[:] = comm.rank * 1000.0 + k
            ex.step()
            assert np.all(buf == buf[0]), k
            for s in ex.last_status.values():
                tally[s] += 1
        settled_barrier(comm)
    return tally


def hop_stopped_rank(comm, options, out, tag, iters=200, wait_timeout=1.5):
    """Rank 0 stops after 3 iterations.  Every other rank either finishes or raises
    NeighbourTimeoutError naming the ranks it waited for: nothing hangs.  Rank 0 stays
    silent (asleep, no MPI call, as if computing forever) until every other rank has
    finished or timed out (a file `tag-RANK` each in `out`), at most 60 s, and reports
    whether they all did."""
    from scenarios import raise_flag, settled_barrier, wait_for_flags  # tests/mpi

    rank = comm.rank
    buf = np.zeros(256)
    outcome = {"finished": False, "waited_for": None}
    with asapmpi.Exchange(buf, graph="ring-based", sync="hop", comm=comm,
                          timeout=wait_timeout, **options) as ex:
        outcome["transport"] = ex.transport
        try:
            while ex.version < (3 if rank == 0 else iters):
                ex.step()
            outcome["finished"] = True
        except NeighbourTimeoutError as exc:
            outcome["waited_for"] = exc.ranks
        if rank == 0:
            outcome["told"] = wait_for_flags(
                out, [f"{tag}-{r}" for r in range(1, comm.size)], 60)
        else:
            raise_flag(out, f"{tag}-{rank}")
        settled_barrier(comm)
    return outcome


def free_after_send(comm, n=20000, iters=5, transport="auto"):
    """Free an exchange whose last update is sent but not received (parallel mode's
    Send(k+1) at the end of training), then run a new exchange on the same ranks: every
    step of the new one is exact, so nothing of the old one was left in flight."""
    from scenarios import pattern, roundtrip  # tests/mpi, on the ranks' path

    rank = comm.rank
    buf = np.zeros(n)
    with asapmpi.Exchange(buf, graph="complete", comm=comm, timeout=60,
                          transport=transport) as ex:
        transport = ex.transport
        for k in range(1, 3):
            buf[:] = pattern(rank, 100 + k, n, "float64")
            ex.step()
        buf[:] = pattern(rank, 103, n, "float64")
        ex.send()                       # version 3 sent, never received
    results = roundtrip(comm, "complete", iters, n)
    return {"transport": transport, "stats": results["stats"]}


def double_buffer_keeps_shape(comm):
    """A double-buffered exchange of a 2-D array hands out 2-D arrays, the mean after one
    step on the complete graph, and leaves the result in the array it was given."""
    rank, size = comm.rank, comm.size
    original = np.full((4, 5), float(rank))
    # the shared transport explicitly: "auto" may measure messages faster
    with asapmpi.Exchange(original, graph="complete", comm=comm, timeout=60,
                          double_buffer=True, transport="shared") as ex:
        x = ex.buffer
        assert x.shape == (4, 5) and x is not original and np.all(x == rank)
        x = ex.step()
        assert x.shape == (4, 5)
        np.testing.assert_allclose(x, (size - 1) / 2)
        x += 1.0
        y = ex.step()
        assert not x.flags.writeable and y.flags.writeable
        try:
            x[0, 0] = 5.0
        except ValueError:
            pass
        else:
            raise AssertionError("the slot neighbours may be reading was writable")
        # between send() and receive() the slot being sent is read in place by the
        # neighbours: a write through ex.buffer fails instead of tearing their reduce
        ex.send()
        try:
            y[0, 0] = 5.0
        except ValueError:
            pass
        else:
            raise AssertionError("the slot being sent was writable before receive()")
        y = ex.receive()
        assert y.flags.writeable
        assert np.all(original == rank), "the original changed before free()"
    np.testing.assert_allclose(original, (size - 1) / 2 + 1.0)
    assert np.array_equal(original, y), "free() did not copy the result back"
    return {}


def ring_run_ahead(comm, iters=10, n=64, slow=2, pause=1.0):
    """NOTIFY-ACK by messages on the directed ring (i -> i + 1), updates small enough to
    go eagerly: rank `slow` pauses `pause` seconds after its step 2.  Returns when each
    step completed on this rank and when `slow` woke (CLOCK_MONOTONIC is one clock
    for every process of the host), so the test can count how far each writer got
    ahead of its reader meanwhile."""
    buf = np.full(n, float(comm.rank))
    done, woke = [], None
    with asapmpi.Exchange(buf, graph="ring", sync="notify_ack", comm=comm, timeout=60,
                          transport="messages") as ex:
        for k in range(1, iters + 1):
            ex.step()
            done.append(time.monotonic())
            if comm.rank == slow and k == 2:
                time.sleep(pause)
                woke = time.monotonic()
    return {"done": done, "woke": woke}
