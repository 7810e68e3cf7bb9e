"""Multi-rank scenarios, run on every rank by run.py under mpiexec: the ones several
test modules share (test_multirank and test_ucx run them on every path), and
test_multirank's own.  A scenario only one other test module runs lives beside its
test there (test_faults, test_seams, test_cli, ...: run as "MODULE:NAME").

Each takes the communicator and keyword arguments, asserts what must hold on its rank,
and returns a JSON-able dict that the pytest side checks across ranks.
"""
import random
import time

import numpy as np
from mpi4py.MPI import MAX as MPI_MAX
from mpi4py.MPI import MIN as MPI_MIN

import asapmpi
from asapmpi import _core
from asapmpi.errors import ConfigError, FreedError, NeighbourTimeoutError, ProtocolError
from asapmpi.launchers import network_forced
from asapmpi.testing import NotifyAckIgnoringAcks
from asapmpi.testing.faults import store_word, torn_write

HEADER = 64  # bytes before the payload in a slot


def settled_barrier(comm):
    """comm.Barrier() after this rank's own steps: first complete its lazy notifies and
    acks (Exchange.settle), which an MPI may not issue until a flush (Open MPI's osc
    pt2pt): a neighbour still stepping would wait for them (docs/PROTOCOL.md section 2)."""
    _core.slotwin.settle_all()
    comm.Barrier()


def slot_transport():
    """The transport of scenarios that drive the slot protocol themselves (puts, tears,
    seqlock reads): shared memory where it runs, else puts (the message transport has
    no puts to tear)."""
    return "put" if network_forced() else "shared"


def message_of(error, call, what):
    """Call `call()`, which must raise `error`; return the error's message."""
    try:
        call()
    except error as exc:
        return str(exc)
    raise AssertionError(f"{what} did not raise {error.__name__}")


def pattern(rank, k, n, dtype):
    """The buffer rank `rank` sends at iteration k: distinct per rank, iteration, element."""
    return (rank * 1000.0 + k + np.arange(n) * 0.25).astype(dtype)


def roundtrip(comm, graph, iters, n, dtype="float64", checksum=False, double_buffer=False,
              transport="auto"):
    """Every step reduces exactly w_self*own + sum w_i*pattern(i, k), from version k.
    double_buffer: compute in ex.buffer, take the result from what step() returns, and
    find the last one in the original buffer after free()."""
    rank = comm.rank
    original = np.zeros(n, dtype=dtype)
    g = asapmpi.graph(graph, comm.size)
    with asapmpi.Exchange(original, graph=g, comm=comm, checksum=checksum, timeout=60,
                          double_buffer=double_buffer, transport=transport) as ex:
        w = ex.weights
        buf = ex.buffer
        assert (buf is not original) == ex.double_buffered
        for k in range(1, iters + 1):
            buf[:] = pattern(rank, k, n, dtype)
            previous = buf
            buf = ex.step()
            assert buf is ex.buffer
            if ex.double_buffered:
                assert buf is not previous and not previous.flags.writeable
            # the NumPy reference, in the kernel's order: self first, then in-neighbours
            expected = dtype_cast(w[rank], dtype) * pattern(rank, k, n, dtype)
            for i in ex.in_neighbours:
                expected = expected + dtype_cast(w[i], dtype) * pattern(i, k, n, dtype)
            if not np.array_equal(buf, expected):
                bad = int(np.argmax(buf != expected))
                raise AssertionError(f"iteration {k}: element {bad} is {buf[bad]!r}, "
                                     f"expected {expected[bad]!r}")
        stats = ex.stats
        last = ex.window.last_versions.tolist()
        assert ex.version == iters
        transport = ex.transport
        report = ex.transport_report
        cpu = {"oversubscribed": ex.oversubscribed, "slack_ns": ex.window.poll_slack_ns}
    # after free(): the result is in the original buffer, and the slot still readable
    assert np.array_equal(original, buf)
    for sender, counts in stats.items():
        assert counts == {"consistent": iters, "torn": 0, "stale": 0, "ahead": 0}, (sender, counts)
    assert last == [iters] * len(ex.in_neighbours), last
    return {"in": ex.in_neighbours, "stats": {str(k): v for k, v in stats.items()},
            "transport": transport, "double_buffered": ex.double_buffered,
            "transport_report": report, **cpu}


def dtype_cast(w, dtype):
    return np.dtype(dtype).type(w)


def tear_detected(comm, n=4096):
    """A writer that stops half way is caught, counted and never reduced.

    On a directed ring: version 1 is written properly; version 2 is written torn (header
    and half the payload, no footer) and notified anyway (a lying writer); version 3
    properly; then version 4 starts (header and half the payload) while the reader reads
    version 3 with the seqlock check: an overwrite during a read.
    """
    rank, size = comm.rank, comm.size
    buf = np.full(n, float(rank), dtype=np.float32)
    with asapmpi.Exchange(buf, graph="ring", comm=comm, timeout=30,
                          transport=slot_transport()) as ex:
        win = ex.window
        w = np.asarray([ex.weights[ex.in_neighbours[0]]])
        w_self = ex.weights[rank]
        ex.step()                                    # version 1, consistent
        assert ex.stats[ex.in_neighbours[0]]["consistent"] == 1

        src = np.full(n, 100.0 + rank, dtype=np.float32)
        win.wait_acks(1, 30)                         # the reader is done with version 1
        torn_write(ex, src, 2)                       # stops half way ...
        win.notify(2)                                # ... and lies that it finished
        win.wait_notifies(2, 30)
        before = buf.copy()
        used = win.reduce(buf, w_self, w, 2, 2, 2)
        status_2 = win.last_status()[0]
        assert used == 0 and status_2 == _core.TORN, (used, status_2)
        assert np.array_equal(buf, (np.float32(w_self) * before)), "a torn input was reduced"

        settled_barrier(comm)
        src[:] = 200.0 + rank
        win.put(src, 3, seqlock=True, notify=False)  # version 3, complete
        settled_barrier(comm)
        src[:] = 300.0 + rank
        torn_write(ex, src, 4)                       # version 4 begins and stalls
        settled_barrier(comm)
        used = win.reduce(buf, w_self, w, 3, 3, 3, seqlock=True)
        status_3 = win.last_status()[0]
        assert used == 0 and status_3 == _core.TORN, (used, status_3)
        stats = ex.stats[ex.in_neighbours[0]]
        settled_barrier(comm)
    assert stats == {"consistent": 1, "torn": 2, "stale": 0, "ahead": 0}, stats
    return {"stats": stats, "size": size}


def notify_ack_refuses_torn(comm, n=1024):
    """Under notify_ack, a torn input makes step() raise ProtocolError naming the sender."""
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
    elif case == "transport_messages":
        kwargs.update(sync="gossip", transport="messages", graph=None)
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


def stalled_target(comm, wait_timeout=2.0, stall=8.0, transport="auto"):
    """Rank 1 stops calling MPI after step 1.  Shared memory, and messages on the network
    path: rank 0's wait for rank 1 times out with NeighbourTimeoutError.  Puts on the
    network path: rank 0's flush cannot complete, and the watchdog ends the job, naming
    rank 1."""
    rank = comm.rank
    buf = np.zeros(1 << 16)
    with asapmpi.Exchange(buf, graph="ring", comm=comm, timeout=wait_timeout,
                          transport=transport) as ex:
        ex.step()
        t0 = time.monotonic()
        error, elapsed = None, None
        if rank == 1:
            time.sleep(stall)       # computing without MPI calls
        else:
            try:
                ex.step()
            except NeighbourTimeoutError as exc:
                error, elapsed = str(exc), time.monotonic() - t0
        settled_barrier(comm)
    return {"error": error, "elapsed": elapsed}


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


def policies_reduce_exactly_what_they_report(comm, iters=150, n=4096,
                                             policies=("bsp", "async", "notify_ack"),
                                             graphs=("ring", "complete"),
                                             transport="auto"):
    """For every policy and graph: the buffer after each step is exactly the renormalized
    weighted mean of the versions the reduce reports it read (recomputed here in the
    kernel's order), so no torn input was ever mixed in; statuses are counted; no policy
    deadlocks on cyclic graphs."""
    from asapmpi._core import CONSISTENT, TORN

    rank = comm.rank
    counts = {}
    for sync in policies:
        for name in graphs:
            buf = np.zeros(n)
            with asapmpi.Exchange(buf, graph=name, sync=sync, comm=comm, timeout=60,
                                  transport=transport) as ex:
                win = ex.window
                tally = dict.fromkeys(("consistent", "torn", "stale", "ahead"), 0)
                tally["transport"] = ex.transport
                for k in range(1, iters + 1):
                    own = rank * 1000.0 + k
                    buf[:] = own
                    ex.step()
                    status, versions = win.last_status(), win.last_versions
                    if sync == "notify_ack":
                        assert all(s == CONSISTENT for s in status)
                    expected = _exact_reduce(
                        ex, own, status, versions,
                        lambda s, v, sync=sync: s != TORN and v > 0 and (
                            sync == "async" or s == CONSISTENT))
                    assert np.all(buf == expected), (sync, name, k, buf[0], expected)
                    if sync == "bsp" and ex.transport == "messages":
                        # nothing overwrites a slot before its reader released it
                        assert all(s == CONSISTENT for s in status), status
                    for s in status:
                        tally[asapmpi._core.STATUS_NAMES[s]] += 1
                # what this rank sent: its update to every out-neighbour each step, and
                # nothing it received (async's mailbox of newest versions skips the
                # versions a busy channel never took)
                sent, each = ex.bytes_sent, len(ex.out_neighbours) * buf.nbytes
                assert (0 < sent <= iters * each if sync == "async"
                        else sent == iters * each), (sync, ex.transport, sent, iters * each)
                settled_barrier(comm)
            counts[f"{sync}/{name}"] = tally
    return counts


def broken_protocol(comm, iters=300, n=1 << 15):
    """Writers that ignore acks: the checks catch what they overwrite (torn or ahead),
    and nothing torn is ever reduced (constant buffers stay constant)."""
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


def _exact_reduce(ex, own, status, versions, accept):
    """What the reduce must have produced: the renormalized weighted mean, in the
    kernel's order, of the inputs `accept(status, version)` admits (constant buffers:
    rank r's buffer of version v holds r*1000 + v)."""
    w_self = ex.weights[ex.rank]
    w_in = [ex.weights[r] for r in ex.in_neighbours]
    used = [i for i, (s, v) in enumerate(zip(status, versions)) if accept(s, v)]
    total_all = w_self
    for w in w_in:
        total_all += w
    total_used = w_self
    for i in used:
        total_used += w_in[i]
    scale = total_all / total_used
    expected = (w_self * scale) * own
    for i in used:
        expected = expected + (w_in[i] * scale) * (ex.in_neighbours[i] * 1000.0 + versions[i])
    return expected


def _replay_reduce(ex, own, k, versions):
    """What a Hop reduce of iteration k that used `versions` (0 = none) must produce."""
    policy = ex._policy
    if policy.staleness is not None:
        w_self, w_in = policy._staleness_weights(k, versions, ex._ctx)
        scale = 1.0
    else:
        w_self = ex.weights[ex.rank]
        w_in = [ex.weights[r] for r in ex.in_neighbours]
        total_all = w_self
        for w in w_in:
            total_all += w
        total_used = w_self
        for w, v in zip(w_in, versions):
            if v > 0:
                total_used += w
        scale = total_all / total_used
    expected = (w_self * scale) * own
    for r, w, v in zip(ex.in_neighbours, w_in, versions):
        if v > 0:
            expected = expected + (w * scale) * (r * 1000.0 + v)
    return expected


def hop_runs(comm, graph, options, iters=150, slow_rank=0, slow_factor=4.0, base_s=0.0004,
             seed=0):
    """Hop with random slowdown (6x with probability 1/n, Hop section 7) and one rank
    deterministically slower: every reduce is replayed exactly from what it reports
    (iteration, versions used, the setting's weights), versions used are within the
    setting's window, and the traces keep Theorem 2 / Table 1."""
    from asapmpi import trace

    rank, size = comm.rank, comm.size
    rng = np.random.default_rng([seed, rank])
    buf = np.zeros(2048)
    if not isinstance(graph, str):          # an edge list
        graph = asapmpi.graph_from([tuple(e) for e in graph], n=size)
    with asapmpi.Exchange(buf, graph=graph, sync="hop", comm=comm, timeout=60,
                          **options) as ex:
        transport = ex.transport
        policy = ex._policy
        g = ex.graph
        while ex.version < iters:
            factor = (6.0 if rng.random() < 1.0 / size else 1.0) * (
                slow_factor if rank == slow_rank else 1.0)
            time.sleep(base_s * factor)
            k = ex.version + 1
            expected = rank * 1000.0 + k
            buf[:] = expected
            before = policy.reduced.count
            ex.step()
            for row in policy.reduced.last(policy.reduced.count - before):
                kk, versions = int(row[0]), row[1:]
                low = kk - (policy.staleness or 0)
                assert all(v == 0 or low <= v <= kk for v in versions), (kk, versions)
                if policy.staleness is None:
                    assert all(v in (0, kk) for v in versions), (kk, versions)
                if not policy.backup and policy.staleness is None:
                    assert all(v == kk for v in versions), (kk, versions)
                expected = _replay_reduce(ex, expected, kk, versions)
            assert np.all(buf == expected), (k, buf[0], expected)
        stats = ex.stats
        tr = ex.trace
        jumps = policy.jumps
        settled_barrier(comm)
    traces = comm.gather(tr, root=0)
    result = {"stats": {str(r): c for r, c in stats.items()}, "jumps": jumps,
              "transport": transport}
    if rank == 0:
        bounds = trace.gap_bounds(g, policy.setting, max_gap=policy.max_gap,
                                  staleness=policy.staleness or 0)
        gaps = trace.max_gaps(traces)
        result["violations"] = trace.check_gaps(traces, bounds)
        result["max_gap_to_out_neighbours"] = int(max(
            gaps[i, j] for i in range(size) for j in g.out_neighbours(i)))
    return result


def hop_stopped_rank(comm, options, iters=200, wait_timeout=1.5):
    """Rank 0 stops after 3 iterations.  Every other rank either finishes or raises
    NeighbourTimeoutError naming the ranks it waited for: nothing hangs."""
    rank = comm.rank
    buf = np.zeros(256)
    outcome = {"finished": False, "waited_for": None}
    with asapmpi.Exchange(buf, graph="ring-based", sync="hop", comm=comm,
                          timeout=wait_timeout, **options) as ex:
        try:
            while ex.version < (3 if rank == 0 else iters):
                ex.step()
            outcome["finished"] = True
        except NeighbourTimeoutError as exc:
            outcome["waited_for"] = exc.ranks
        if rank == 0:
            time.sleep(wait_timeout * 3)      # silent, as if computing forever
        settled_barrier(comm)
    return outcome


def _ps_delta(rank, k, n):
    # a worker's local update at iteration k: exact in binary floating point
    return np.full(n, (rank * 7 + k % 5) / 64.0)


def backup_ps_never_applies_late(comm, iters=60, backup=1, slow_rank=None, n=1000,
                                 base_s=0.0005, slow_s=0.02, transport="auto"):
    """Server 0 and workers 1..; every worker adds a known update per iteration, one is
    slow.  The server's every reduce is replayed from its trace: theta(k) must be
    theta(k-1) plus the mean of the updates of iteration k of the workers it chose, and
    no version other than k may appear: a late contribution is never applied."""
    rank, size = comm.Get_rank(), comm.Get_size()
    slow_rank = size - 1 if slow_rank is None else slow_rank
    buf = np.zeros(n)
    ex = asapmpi.Exchange(buf, sync="backup_ps", comm=comm, backup=backup, timeout=30,
                          transport=transport)
    mismatch = 0.0
    while ex.version < iters:
        k = ex.version + 1
        if ex.role == "server":
            before = buf.copy()
            ex.step()
            row = ex.trace["reduced"][-1]
            chosen = [ex.in_neighbours[i] for i in np.flatnonzero(row[1:])]
            assert row[0] == k and set(row[1:]) <= {0, k}, row
            assert len(chosen) == size - 1 - backup
            expected = before + np.mean([_ps_delta(r, k, n) for r in chosen], axis=0)
            mismatch = max(mismatch, float(np.max(np.abs(buf - expected))))
        else:
            time.sleep(slow_s if rank == slow_rank else base_s)
            buf += _ps_delta(rank, k, n)
            ex.step()
            assert ex.version >= k
    trace = ex.trace["reduced"]
    used = ex.transport
    ex.free()
    if rank == 0:
        slow_index = [r for r in range(size) if r != 0].index(slow_rank)
        return {"mismatch": mismatch, "iterations": len(trace), "transport": used,
                "slow_chosen": int(np.count_nonzero(trace[:, 1 + slow_index]))}
    return {"jumps": int(np.count_nonzero(trace[:, 1] > trace[:, 0])),
            "iterations": len(trace), "transport": used}


def elastic_assigns_by_speed(comm, iters=40, n=64, base_s=0.002, slow=4.0,
                             transport="auto"):
    """ElasticBSP: workers step at different speeds (rank 1 `slow` times slower); the
    server's every superstep is replayed (theta(s) = theta(s-1) + mean of count_w *
    delta_w over the workers) and the counts it assigns follow the speeds."""
    rank, size = comm.Get_rank(), comm.Get_size()
    buf = np.zeros(n)
    ex = asapmpi.Exchange(buf, sync="elastic", comm=comm, R=8, timeout=30,
                          transport=transport)
    delta = (rank + 1) / 32.0
    counts = np.ones(size - 1, dtype=int)
    mismatch = 0.0
    versions = []
    while ex.version < iters:
        if ex.role == "server":
            before = buf.copy()
            ex.step()
            row = ex.trace["supersteps"][-1]
            workers = [r for r in range(size) if r != rank]
            step = np.mean([c * (r + 1) / 32.0 for c, r in zip(counts, workers)])
            mismatch = max(mismatch, float(np.max(np.abs(buf - (before + step)))))
            counts = row[4:].astype(int)
        else:
            time.sleep(base_s * (slow if rank == 1 else 1.0))
            buf += delta
            ex.step()
        versions.append(ex.version)
    rows = ex.trace["supersteps"]
    ex.free()
    out = {"version": ex.version, "supersteps": len(rows), "transport": ex.transport,
           "monotonic": bool(np.all(np.diff(versions) >= 0))}
    if rank == 0:
        out.update(mismatch=mismatch, last_counts=rows[-1][4:].astype(int).tolist(),
                   mean_counts=rows[2:, 4:].mean(axis=0).tolist())
    return out


def gossip_pulls_whole_models(comm, iters=60, n=20000, **options):
    """Every rank starts from a constant vector (its rank) and only gossips: every model
    pulled must be one a peer published whole (a constant vector), pulls happen on
    multiples of the period, disagreement shrinks; returns the pull trace."""
    rank = comm.Get_rank()
    buf = np.full(n, float(rank), dtype=np.float32)
    ex = asapmpi.Exchange(buf, sync="gossip", comm=comm, timeout=60, **options)
    torn = 0
    started = time.perf_counter()
    for _ in range(iters):
        ex.step()
        torn += int(buf.max() != buf.min())
    wall, waited = time.perf_counter() - started, ex.wait_seconds
    pulls = ex.trace.get("pulls", np.zeros((0, 4)))
    report = ex._policy.report
    got = ex.window.bytes_got
    spread = comm.allreduce(float(buf[0]), op=MPI_MAX) - comm.allreduce(float(buf[0]),
                                                                         op=MPI_MIN)
    ex.free()
    return {"torn": torn, "pulls": pulls.tolist(), "report": report, "spread": spread,
            "bytes_got": int(got), "wall_s": wall, "wait_s": waited}


def free_after_send(comm, n=20000, iters=5, transport="auto"):
    """Free an exchange whose last update is sent but not received (parallel mode's
    Send(k+1) at the end of training), then run a new exchange on the same ranks: every
    step of the new one is exact, so nothing of the old one was left in flight."""
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


def transport_choice(comm):
    """transport="auto" measures and reports; an explicit transport and a policy with
    one transport are reported as such.  backup_ps's server takes puts from every
    worker at once, each larger than one MPICH active-message put may be: the probe
    cuts them into the exchange's pieces as the exchange does.  Each exchange runs to
    version 3 rather than three steps: a backup_ps worker that finds a newer theta
    skips ahead, and three steps took it to version 4, which a server that had done
    its three steps (version 3) never published."""
    buf = np.zeros(1000)
    out = {}
    for label, options in (("auto", {}), ("put", {"transport": "put"}),
                           ("hop", {"sync": "hop"}), ("async", {"sync": "async"}),
                           ("gossip", {"sync": "gossip", "graph": None}),
                           ("backup_ps", {"sync": "backup_ps", "backup": 1, "graph": None,
                                          "buffer": np.zeros(20000)})):
        kwargs = {"graph": "ring", **options}
        with asapmpi.Exchange(kwargs.pop("buffer", buf), comm=comm, timeout=60,
                              **kwargs) as ex:
            while ex.version < 3:
                ex.step()
            out[label] = {"transport": ex.transport, "report": ex.transport_report}
            ex.free()
    return out


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


