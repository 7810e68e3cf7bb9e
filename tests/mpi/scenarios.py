"""Multi-rank scenarios that several test modules run, and the helpers the ranks share,
run on every rank by run.py under mpiexec: test_multirank runs these on the
shared-memory and network paths, test_ucx on UCX, test_multihost across namespaces.  A
scenario that one test module alone runs lives beside its test there (test_multirank,
test_faults, test_seams, test_cli, ...: run as "MODULE:NAME").

Each takes the communicator and keyword arguments, asserts what must hold on its rank,
and returns a JSON-able dict that the pytest side checks across ranks.
"""
import os
import resource
import time

import numpy as np
from mpi4py.MPI import MAX as MPI_MAX
from mpi4py.MPI import MIN as MPI_MIN

import asapmpi
from asapmpi import _core
from asapmpi.launchers import network_forced
from asapmpi.testing.faults import torn_write


def settled_barrier(comm):
    """comm.Barrier() after this rank's own steps: first complete its lazy notifies and
    acks (Exchange.settle), which an MPI may not issue until a flush (Open MPI's osc
    pt2pt): a neighbour still stepping would wait for them (docs/PROTOCOL.md section 2)."""
    _core.slotwin.settle_all()
    comm.Barrier()


def raise_flag(directory, name):
    """Tell the ranks in wait_for_flags(directory, [name, ...]) that this rank passed a
    point: a file, so that a rank can wait for it outside MPI (asleep, as if computing
    or stalled), with no message that MPI's progress would have to move."""
    open(os.path.join(directory, name), "x").close()


def wait_for_flags(directory, names, cap):
    """Sleep until every one of `names` was raised in `directory` (raise_flag()),
    polling every 10 ms without calling MPI, or until `cap` seconds passed; returns
    whether they all came.  A scenario orders its events by these, not by sleeps it
    hopes are long enough: under load a rank may start its part seconds after the
    others."""
    deadline = time.monotonic() + cap
    while not all(os.path.exists(os.path.join(directory, n)) for n in names):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def voluntary_switches():
    """This thread's voluntary context switches so far: one per sleep or blocking wait.
    A thread that spins (a busy loop, a poll in MPI's progress engine) makes none, only
    involuntary ones when it yields or is preempted, however busy the host: a count
    that tells waiting asleep from spinning where CPU time, which depends on the
    host's load, cannot."""
    return resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw


def slot_transport():
    """The transport of scenarios that drive the slot protocol themselves (puts, tears,
    seqlock reads): shared memory where it runs, else puts (the message transport has
    no puts to tear)."""
    return "put" if network_forced() else "shared"


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
             seed=0, stall_s=0.0):
    """Hop with random slowdown (6x with probability 1/n, Hop section 7) and one rank
    deterministically slower: every reduce is replayed exactly from what it reports
    (iteration, versions used, the setting's weights), versions used are within the
    setting's window, and the traces keep Theorem 2 / Table 1.  With `stall_s` the slow
    rank also stops that long once, a quarter into the run: the others then run ahead
    to the gap bound whatever the machine's load, so a setting that skips must jump
    (a 4x slower rank alone fell too little behind on a loaded machine to trigger)."""
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
            if stall_s and rank == slow_rank and ex.version == iters // 4:
                time.sleep(stall_s)
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
    table = ex._policy._table       # the warm-up's times, ns (INF_NS: never measured)
    got = ex.window.bytes_got
    spread = comm.allreduce(float(buf[0]), op=MPI_MAX) - comm.allreduce(float(buf[0]),
                                                                         op=MPI_MIN)
    ex.free()
    return {"torn": torn, "pulls": pulls.tolist(), "report": report, "spread": spread,
            "bytes_got": int(got), "wall_s": wall, "wait_s": waited,
            "table_ns": None if table is None else table.tolist()}


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


