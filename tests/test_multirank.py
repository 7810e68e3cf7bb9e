"""Multi-rank tests: each launches ranks under mpiexec (2, 4, 8 on a 2-core machine, so
oversubscribed), on the shared-memory path and on the forced network path."""
import os
import re

import pytest

from mpilaunch import PATHS, launch, mpich_only, run

pytestmark = pytest.mark.mpi
SIZES = (2, 4, 8)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("graph", ["ring", "complete"])
def test_roundtrip_exact_values_and_versions(graph, n, path):
    results = run("roundtrip", n, path, timeout=300, graph=graph, iters=1000, n=257)
    # every rank here, on the cores this test may use: the waits sleep coarsely only
    # when the ranks oversubscribe them
    from asapmpi.cores import DEFAULT_SLACK_NS, PRECISE_SLACK_NS, cgroup_quota

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
    run("double_buffer_keeps_shape", 3, "shm", timeout=120)


@pytest.mark.parametrize("path", PATHS)
def test_message_writer_stays_within_one_version_of_its_reader(path):
    # Issue 15, point 5: on a directed ring of 4, rank 2 pauses after its step 2.  A
    # writer's step k completes only once its reader posted the receive of k (it
    # reduced k - 1), so while rank 2 sleeps every rank completes at most one step
    # more than its out-neighbour: rank 1 stops at 3, rank 0 at 4, rank 3 at 5.
    # With sends that complete eagerly rank 1 ran on to 5 (n - 1 ahead).
    results = run("ring_run_ahead", 4, path, timeout=120)
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
    # the messages carry the update; so do the window words, except on the shared
    # transport, whose reduce reads each update in place
    assert report["message_bytes"] == 8000, report
    assert report["window_bytes"] == (8 if window == "shared" else 8000), report
    assert auto[0]["transport"] == ("messages" if rounds["messages"] < rounds["words"]
                                    else window), report
    assert results[0]["put"]["report"]["reason"] == "asked for"
    assert results[0]["put"]["transport"] == "put"
    assert results[0]["gossip"]["report"]["reason"] == \
        "the only transport sync='gossip' has"
    assert results[0]["gossip"]["transport"] == "put"
    # Hop and async run on window words or on a mailbox of messages: measured like
    # NOTIFY-ACK, with the update on both sides (their slots are always put)
    for sync in ("hop", "async"):
        chosen = results[0][sync]
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
    results = run("free_after_send", 4, path, timeout=300, transport=transport)
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
    run("notify_ack_refuses_torn", 4, path, timeout=120)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("n", [2, 4])
def test_concurrent_reads_are_whole_versions_or_counted_torn(n, path):
    results = run("concurrent_seqlock", n, path, timeout=300, iters=1500)
    assert sum(r["untorn"] for r in results) > 0
    print("torn reads caught:", [r["torn"] for r in results])


@pytest.mark.parametrize("path", PATHS)
def test_checksum_catches_silent_corruption(path):
    run("checksum_catches_corruption", 2, path, timeout=120)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("n", [2, 4])
def test_silent_neighbour_times_out_naming_it(n, path):
    timeout = 1.0
    results = run("silent_neighbour", n, path, timeout=120, wait_timeout=timeout)
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
    results = run("payload_view", 3, "shm", timeout=60)
    assert "rank 0 holds 1 view(s)" in results[0]["refused"]
    assert all("the most on one rank: 1" in r["refused"] for r in results)


def test_versions_and_offsets_out_of_range_are_refused():
    (res, _) = run("bounds_are_checked", 2, "shm", timeout=60)
    assert len(res["problems"]) == 8
    assert sum("versions start at 1" in p for p in res["problems"]) == 4
    assert sum("not an int64 word" in p for p in res["problems"]) == 4


def test_stalled_target_times_out_on_shared_memory():
    results = run("stalled_target", 2, "shm", timeout=120, wait_timeout=2.0, stall=6.0)
    assert "rank 1 (expected 2, last seen 1)" in results[0]["error"]
    assert results[0]["elapsed"] < 2.0 + 4


def test_stalled_target_times_out_on_the_network_path_with_messages():
    results = run("stalled_target", 2, "net", timeout=120, wait_timeout=2.0, stall=6.0)
    assert "update of version 2 from rank 1 (expected 2, last seen 1)" in results[0]["error"]
    assert results[0]["elapsed"] < 2.0 + 4


@mpich_only     # MPICH's active-message RMA needs the target; Open MPI's need not
def test_stalled_target_ends_the_job_on_the_network_path_with_puts():
    proc = launch("stalled_target", 2, "net", timeout=120, wait_timeout=2.0, stall=30.0,
                  transport="put")
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
    "transport_messages": "transport='messages' does not fit sync='gossip' (it pulls a "
                          "peer's model one-sidedly); use transport='put' or 'auto'",
    "transport_differs": "same transport",
}


@pytest.mark.parametrize("case", sorted(BAD_INPUT))
def test_bad_input_raises_on_every_rank(case):
    results = run("bad_input", 3, "shm", timeout=60, case=case)
    for res in results:
        assert BAD_INPUT[case] in res["error"] or "was given bad input" in res["error"], res
        assert "\n" not in res["error"]


def test_use_after_free_and_wrong_size():
    for res in run("use_after_free", 2, "shm", timeout=60):
        assert "was freed" in res["freed"]
        assert "has 248 bytes" in res["wrong_size"] and "hold 256" in res["wrong_size"]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("n", [4, 8])
def test_consensus_converges_at_least_as_fast_as_sigma2(n, path):
    (rank0, *_) = run("consensus", n, path, timeout=600)
    for name, r in rank0.items():
        assert r["worst_ratio"] <= r["sigma2"] + 1e-9, (name, r)
        assert r["final"] <= 1e-8, (name, r)
    print({name: round(r["sigma2"], 4) for name, r in rank0.items()})


@pytest.mark.parametrize("path", PATHS)
def test_complete_graph_step_equals_allreduce(path):
    run("complete_equals_allreduce", 4, path, timeout=120)


def test_hierarchical_finds_hosts_by_shared_memory():
    for res in run("hierarchical_hosts", 4, "shm", timeout=60):
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
    results = run("broken_protocol", 8, "net", timeout=600)
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


@pytest.mark.parametrize("setting", sorted(HOP_SETTINGS))
@pytest.mark.parametrize("graph", ["ring-based", "double-ring"])
@pytest.mark.parametrize("n", [4, 8])
def test_hop_keeps_the_gap_bounds_and_reduces_exactly(n, graph, setting):
    options = HOP_SETTINGS[setting]
    results = run("hop_runs", n, "shm", timeout=300, graph=graph, options=options)
    _check_hop_runs(results, options, "skip" in setting)


def _check_hop_runs(results, options, skips):
    """Theorem 2's gap bound and Table 1 kept, nothing torn or ahead reduced (every
    reduce was replayed exactly inside the scenario), and the slow rank skipped."""
    rank0 = results[0]
    assert rank0["violations"] == [], rank0["violations"][:3]
    assert rank0["max_gap_to_out_neighbours"] <= options["max_gap"]
    for res in results:
        for counts in res["stats"].values():
            assert counts["torn"] == 0 and counts["ahead"] == 0, counts
    if skips:
        assert rank0["jumps"] > 0, "the slower rank 0 never skipped"


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
                  iters=120)
    assert results[0]["transport"] == transport
    _check_hop_runs(results, options, True)


# staleness 0 waits in wait_newest for every in-neighbour's notify of k while its own
# notify of k is a lazy word: an MPI may defer issuing it until a flush (Open MPI's
# osc pt2pt, the one-sided component of its network path here, does), so two ranks
# each waited for the other's with their own still queued (issue 15, point 2) until
# wait_newest settled the pending words like every other wait
NETWORK_HOP_SETTINGS = dict(HOP_SETTINGS, staleness0={"max_gap": 1, "staleness": 0})


@pytest.mark.parametrize("setting", ["standard-gap2", "backup1", "staleness2-eq2",
                                     "backup1-skip10", "staleness0"])
def test_hop_on_the_network_path(setting):
    options = dict(NETWORK_HOP_SETTINGS[setting], transport="put")
    rank0 = run("hop_runs", 8, "net", timeout=600, graph="ring-based", options=options,
                iters=80)[0]
    assert rank0["violations"] == []
    assert rank0["max_gap_to_out_neighbours"] <= options["max_gap"]


@pytest.mark.parametrize("setting", sorted(HOP_SETTINGS))
def test_hop_on_messages_keeps_the_bounds_and_reduces_exactly(setting):
    # the mailbox: updates and tokens as two-sided messages the waits complete into the
    # slots, on the network path where it is the fast transport
    options = dict(HOP_SETTINGS[setting], transport="messages")
    results = run("hop_runs", 8, "net", timeout=600, graph="double-ring",
                  options=options, iters=80)
    assert {r["transport"] for r in results} == {"messages"}
    _check_hop_runs(results, options, "skip" in setting)


@pytest.mark.parametrize("setting", sorted(HOP_SETTINGS))
def test_hop_never_hangs_on_a_stopped_rank(setting):
    _stopped_rank_is_named(HOP_SETTINGS[setting])


@pytest.mark.parametrize("setting", ["standard-gap2", "backup1-skip10", "staleness2-eq2"])
def test_hop_on_messages_never_hangs_on_a_stopped_rank(setting):
    _stopped_rank_is_named(dict(HOP_SETTINGS[setting], transport="messages"))


def _stopped_rank_is_named(options):
    results = run("hop_stopped_rank", 6, "shm", timeout=120, options=options)
    assert results[0]["finished"]
    others = results[1:]
    assert all(r["finished"] or r["waited_for"] for r in others), others
    assert any(r["waited_for"] and 0 in r["waited_for"] for r in others), others


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
