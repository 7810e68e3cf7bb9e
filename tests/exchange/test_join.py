"""Join for uneven inputs: ranks that run out of data after different numbers of steps
call join() and every rank ends at the same version, under every policy that counts its
own steps; the optimizer's `with opt.join():`; refusals in one line.

Each scenario's body is here, beside its test (`test_join:NAME`)."""
from __future__ import annotations

import re

import numpy as np
import pytest

pytestmark = pytest.mark.mpi

#: steps per rank before it runs out of data (4 ranks: 11/11/10/10, and a longer tail)
UNEVEN = {"even-tail": [11, 11, 10, 10], "long-tail": [12, 4, 9, 7]}


@pytest.mark.parametrize("sync", ["notify_ack", "hop:backup=1", "bsp", "gossip",
                                  "allreduce", "async"])
@pytest.mark.parametrize("shape", sorted(UNEVEN))
def test_uneven_steps_join_without_a_timeout(sync, shape):
    from mpilaunch import run

    steps = UNEVEN[shape]
    res = run("test_join:uneven", 4, "shm", timeout=120, sync=sync, steps=steps)
    finals = {r["final"] for r in res}
    assert len(finals) == 1, res                    # every rank ends at one version
    final = finals.pop()
    assert final >= max(steps), res
    for r, own in zip(res, steps):
        assert r["version"] == final and r["trained"] == own, r
        assert np.isfinite(r["mean"]), r
    if sync in ("notify_ack", "bsp", "allreduce"):
        # lockstep: every rank steps once past the last rank's last step; a joined rank
        # that stepped along may have entered more before it saw that rank join (then
        # every rank takes them): one a hop, neighbours being at most a step apart (the
        # 4-ring's diameter is 2)
        assert max(steps) + 1 <= final <= max(steps) + 2, res


@pytest.mark.parametrize("sync", ["notify_ack", "hop:backup=1", "gossip"])
def test_uneven_steps_join_on_the_network_path(sync):
    from mpilaunch import run

    res = run("test_join:uneven", 4, "net", timeout=120, sync=sync,
              steps=UNEVEN["long-tail"])
    assert len({r["final"] for r in res}) == 1 and res[0]["final"] >= 12, res


@pytest.mark.parametrize("sync", ["notify_ack", "gossip"])
def test_joins_of_successive_epochs_do_not_mix(sync):
    # epoch 1's join must not count epoch 0's marks as joined
    from mpilaunch import run

    res = run("test_join:epochs", 4, "shm", timeout=120, sync=sync,
              epochs=[[11, 11, 10, 10], [3, 9, 9, 6], [5, 5, 5, 5]])
    for e in range(3):
        assert len({r["finals"][e] for r in res}) == 1, res


@pytest.mark.parametrize("sync", ["notify_ack", "bsp", "hop"])
def test_a_rank_that_left_without_join_is_told_from_a_dead_one(sync):
    # rank 3 steps 10 times and enters free() without join(); its neighbours wait for
    # its version 11: the timeout says it is alive and finished, and what to change
    import json

    from mpilaunch import RESULT_TAG, launch

    # each rank's error comes back as its result line; the job itself may end killed
    # (ranks that dropped their exchange), and hydra may join two ranks' lines into one
    proc = launch("test_join:without_join", 4, "shm", timeout=90, sync=sync,
                  steps=[11, 11, 11, 10])
    found = {int(r): json.loads(payload)["error"] for r, payload in
             re.findall(RESULT_TAG + r' (\d) (\{"error": ".*?"\})', proc.stdout)}
    assert sorted(found) == [0, 1, 2, 3], proc.stdout + proc.stderr
    errors = {r: e for r, e in found.items() if e}
    # rank 3's neighbours (2 and 0 on the ring) heard it leave; a timeout that names
    # rank 3 (NOTIFY-ACK and Hop wait on it, BSP's barrier names its root) says so
    told = [e for r, e in errors.items() if r in (0, 2)]
    assert told, errors
    for e in told:
        assert re.search(r"rank 3 (is alive but finished: it|\(a neighbour\)) entered "
                         r"free\(\) after 10 steps without join\(\)", e), e
        assert "must all end their loops in join()" in e and "dead or stalled" not in e, e
    for e in errors.values():
        if "from rank 3 (" in e:
            # its last version, also among Hop's rotating slots (not the slot's former)
            assert "from rank 3 (expected 11, last seen 10)" in e, e
            assert "rank 3 is alive but finished" in e, e


def test_join_is_deterministic_under_notify_ack():
    from mpilaunch import run

    first = run("test_join:uneven", 4, "shm", timeout=120, sync="notify_ack",
                steps=UNEVEN["long-tail"])
    again = run("test_join:uneven", 4, "shm", timeout=120, sync="notify_ack",
                steps=UNEVEN["long-tail"])
    assert [r["digest"] for r in first] == [r["digest"] for r in again]


@pytest.mark.parametrize("board", ["window", "messages"])
def test_a_rank_a_round_ahead_does_not_hide_its_join_from_one_behind(board):
    # on a directed graph rank A (an in-neighbour of B, far downstream of it) can end a
    # join at J and join again at once (an epoch with no data) while B has yet to enter
    # step J: A's next round's word must not replace the one B reads for step J (at
    # 34bafb9 it did, and B averaged A's shadow replica into step J)
    from mpilaunch import run

    for r in run("test_join:round_ahead", 2, "shm", timeout=60,
                 messages=board == "messages"):
        assert r["before"] == [0] and r["after"] == [0] and r["next"] == [0], r


@pytest.mark.parametrize("path", ["shm", "net", "ucx"])
def test_join_on_the_messages_channel_makes_no_window(path):
    # the messages channel promises no MPI window (on Open MPI with UCX one makes every
    # MPI call progress a worker of its own), the allreduce policy uses none: their
    # join board goes by messages.  Every policy that joins runs there with mpi4py's
    # window constructors made to raise; notify_ack ends bit-identical to the same run
    # on the put channel, whose board is a window (the lag rule holds by messages as by
    # accumulates; BSP on put leaves out a slot a fast writer already refilled, by
    # design, so its result is the run's own)
    from mpilaunch import HAS_UCX, run

    if path == "ucx" and not HAS_UCX:
        pytest.skip("needs Open MPI with osc ucx")
    res = run("test_join:no_window", 4, path, timeout=240, steps=UNEVEN["long-tail"])
    for r in res:
        for sync, got in r["messages"].items():
            assert got["board"] == "messages", (sync, got)
            assert got["final"] == res[0]["messages"][sync]["final"] >= 12, (sync, res)
            assert got["version"] == got["final"] and np.isfinite(got["mean"]), (sync, got)
        for sync, digest in r["put"].items():
            assert r["messages"][sync]["digest"] == digest, (sync, r)


def no_window(comm, steps=(12, 4, 9, 7)):
    """notify_ack on the put channel, then every policy that joins on the messages
    channel with mpi4py's window constructors raising."""
    from mpi4py import MPI

    put = {"notify_ack": uneven(comm, "notify_ack", steps, transport="put")["digest"]}

    def refused(*args, **kwargs):
        raise AssertionError("an MPI window was made on the messages channel")

    class NoWindows:
        Allocate = Allocate_shared = Create = Create_dynamic = staticmethod(refused)

    MPI.Win = NoWindows             # mpi4py's windows, as asapmpi's Python code makes them
    messages = {}
    for sync in ("notify_ack", "bsp", "hop:backup=1", "gossip", "async", "allreduce"):
        messages[sync] = uneven(comm, sync, steps,
                                transport="auto" if sync == "allreduce" else "messages")
    return {"put": put, "messages": messages}


def round_ahead(comm, messages=False):
    """The join board of 2 ranks: rank 0 joins round 0 at 3, rank 1 at 6; then rank 0
    alone goes on to round 1 and joins it at 7.  Rank 1, still in round 0, reads which
    ranks leave the average of step 7, before and after."""
    from asapmpi import collectives
    from asapmpi.exchange.join import JoinBoard

    board = JoinBoard(comm, 30, messages=messages)
    try:
        board.mark_joined(3 if comm.rank == 0 else 6)
        collectives.barrier(comm, 30, "round 0 joined")
        before = sorted(board.absent(7)) if comm.rank == 1 else None
        collectives.barrier(comm, 30, "round 0 read")
        if comm.rank == 0:
            board._next_round(1)            # its join of round 0 ended
            board.mark_joined(7)
        collectives.barrier(comm, 30, "rank 0 in round 1")
        after = sorted(board.absent(7)) if comm.rank == 1 else None
        nxt = None
        if comm.rank == 1:
            board._next_round(1)
            nxt = sorted(board.absent(9))   # and in round 1, rank 0's word of round 1
        collectives.barrier(comm, 30, "both in round 1")
    finally:
        board.board.free()
        board.comm.Free()
    return {"before": before, "after": after, "next": nxt} if comm.rank == 1 else \
        {"before": [0], "after": [0], "next": [0]}


@pytest.mark.parametrize("sync", ["allreduce", "notify_ack"])
def test_the_training_ranks_average_over_each_other_only(sync):
    # rank r adds r + 1 before each step; rank 3 stops after 2 steps. On a complete graph
    # step 3 still averages rank 3's replica (its first shadow version), steps 4-6 the
    # three training ranks only: 2 x 2.5 + 1.5 + 3 x 2 = 12.5 (with rank 3 kept in every
    # average: 2 x 2.5 + 4 x 1.5 = 11); the same on every training rank
    from mpilaunch import run

    res = run("test_join:left_out", 4, "shm", timeout=120, sync=sync, steps=[6, 6, 6, 2])
    for r in res[:3]:
        assert r["mean"] == pytest.approx(12.5, abs=1e-9), res
        assert r["spread"] < 1e-9, res
    if sync == "allreduce":
        # the joined rank adopts the training ranks' mean
        assert res[3]["mean"] == pytest.approx(12.5, abs=1e-9), res


@pytest.mark.parametrize("sync, words", [
    ("backup_ps:backup=1", "a parameter server's versions follow its workers' updates"),
    ("hop:backup=1:skip_trigger=2", "skipping (skip_trigger) jumps several versions")])
def test_policies_that_cannot_join_say_why(sync, words):
    from mpilaunch import run

    for r in run("test_join:refused", 3, "shm", timeout=60, sync=sync):
        name = sync.partition(":")[0]
        assert r["error"].startswith(f"join() under sync={name!r}: ") and words in r["error"]


def test_shards_cover_the_data_once_and_differ_by_one_example():
    pytest.importorskip("torch")
    from asapmpi.errors import ConfigError
    from asapmpi.torch import ShardSampler

    shards = [ShardSampler(1282, rank=r, size=4, seed=3) for r in range(4)]
    assert [len(s) for s in shards] == [321, 321, 320, 320]
    first = [list(s) for s in shards]
    assert sorted(i for shard in first for i in shard) == list(range(1282))
    assert [len(x) for x in first] == [321, 321, 320, 320]
    for s in shards:
        s.set_epoch(1)
    assert [list(s) for s in shards] != first          # another permutation per epoch
    assert list(ShardSampler(10, rank=1, size=4, shuffle=False)) == [1, 5, 9]
    with pytest.raises(ConfigError, match="a dataset of 3 examples leaves ranks of 4"):
        ShardSampler(3, rank=0, size=4)
    # even: as long as the longest, padded with the permutation's first examples
    even = [list(ShardSampler(1282, rank=r, size=4, seed=3, even=True)) for r in range(4)]
    assert [len(x) for x in even] == [321] * 4
    assert even[:2] == first[:2] and even[2][:320] == first[2] and even[3][:320] == first[3]
    assert [even[2][-1], even[3][-1]] == [first[0][0], first[1][0]]


def test_the_uneven_shards_example_runs_two_epochs():
    from mpilaunch import skip_above_the_core

    skip_above_the_core()
    pytest.importorskip("torch")
    import os
    import subprocess
    import sys

    from mpilaunch import job_command

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    cmd, env = job_command(4, [sys.executable, os.path.join(root, "examples",
                                                            "uneven_shards.py")],
                           timeout=120)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=150,
                          check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # (rank, epoch, batches, final version); hydra may join two ranks' lines
    rows = sorted(tuple(map(int, m)) for m in re.findall(
        r"rank (\d+): epoch (\d+): (\d+) batches, .*? exchange version (\d+)", proc.stdout))
    assert [row[:3] for row in rows] == [(r, e, 11 if r < 2 else 10) for r in range(4)
                                         for e in range(2)], proc.stdout
    for epoch in range(2):
        assert len({row[3] for row in rows if row[1] == epoch}) == 1, rows


def test_the_optimizer_joins_uneven_shards_and_its_replicas_agree():
    from mpilaunch import skip_above_the_core

    skip_above_the_core()
    pytest.importorskip("torch")
    from mpilaunch import run

    res = run("test_join:optimizer_uneven", 4, "shm", timeout=120, batches=[11, 11, 10, 10])
    first = np.array(res[0]["params"])
    for r in res:
        assert r["version"] == res[0]["version"] in (11, 12), r
        assert np.allclose(r["params"], first, atol=1e-6), r
        assert r["loss_last"] < r["loss_first"], r


# ---------------------------------------------------------------- scenario bodies (on the ranks)
# tests/mpi/run.py runs each on every rank as "test_join:NAME"


def uneven(comm, sync="notify_ack", steps=(11, 11, 10, 10), transport="auto"):
    """Rank r adds r + 1 to its buffer and steps steps[r] times, then joins."""
    import hashlib

    from asapmpi import Exchange

    buf = np.full(2048, float(comm.rank), dtype=np.float64)
    opts = {} if sync in ("allreduce", "gossip") else {"graph": "bidirectional-ring"}
    with Exchange(buf, sync=sync, comm=comm, timeout=30, transport=transport,
                  **opts) as ex:
        for _ in range(steps[comm.rank]):
            buf += comm.rank + 1
            ex.step()
        trained = ex.version
        final = ex.join()
        out = {"final": final, "version": ex.version, "trained": trained,
               "mean": float(buf.mean()),
               "board": "messages" if ex._joiner.board.messages else "window",
               "digest": hashlib.sha256(buf.tobytes()).hexdigest()}
    return out


def left_out(comm, sync="notify_ack", steps=(6, 6, 6, 2)):
    """Rank r adds r + 1 and steps steps[r] times on a complete graph, then joins."""
    from asapmpi import Exchange

    buf = np.zeros(1024, dtype=np.float64)
    opts = {} if sync == "allreduce" else {"graph": "complete"}
    with Exchange(buf, sync=sync, comm=comm, timeout=30, **opts) as ex:
        for _ in range(steps[comm.rank]):
            buf += comm.rank + 1
            ex.step()
        ex.join()
    return {"mean": float(buf.mean()), "spread": float(buf.max() - buf.min())}


def without_join(comm, sync="notify_ack", steps=(11, 11, 11, 10)):
    """Rank r steps steps[r] times and frees without join(); each rank returns the
    timeout it got ("" for none)."""
    from asapmpi import Exchange, rc
    from asapmpi.errors import NeighbourTimeoutError

    rc.timeout_startup = 4          # free()'s deadline under Hop (default 300 s)
    buf = np.zeros(256)
    ex = Exchange(buf, "bidirectional-ring", sync, comm=comm, timeout=4)
    try:
        for _ in range(steps[comm.rank]):
            ex.step()
        ex.free()
    except NeighbourTimeoutError as exc:
        return {"error": str(exc)}
    return {"error": ""}


def epochs(comm, sync="notify_ack", epochs=()):
    """Several epochs, rank r stepping epochs[e][r] times in epoch e, each ended by
    join(); returns the final version of each."""
    from asapmpi import Exchange

    buf = np.full(512, float(comm.rank))
    opts = {} if sync in ("allreduce", "gossip") else {"graph": "bidirectional-ring"}
    finals = []
    with Exchange(buf, sync=sync, comm=comm, timeout=30, **opts) as ex:
        for steps in epochs:
            for _ in range(steps[comm.rank]):
                buf += 1.0
                ex.step()
            finals.append(ex.join())
    return {"finals": finals}


def refused(comm, sync):
    """join() under a policy that cannot join: its one-line refusal."""
    from asapmpi import Exchange
    from asapmpi.errors import ConfigError

    buf = np.zeros(64)
    opts = {"graph": "bidirectional-ring"} if sync.startswith("hop") else {}
    ex = Exchange(buf, sync=sync, comm=comm, timeout=30, **opts)
    try:
        ex.join()
        error = ""
    except ConfigError as exc:
        error = str(exc)
    ex.free()
    return {"error": error}


def optimizer_uneven(comm, batches=(11, 11, 10, 10)):
    """SGD on a linear model under `with opt.join():`, rank r with batches[r] batches."""
    import torch

    from asapmpi.torch import DecentralizedOptimizer

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = DecentralizedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), "complete",
                                 "notify_ack", model=model, comm=comm, timeout=30)
    g = torch.Generator().manual_seed(comm.rank)
    truth = torch.arange(8, dtype=torch.float32)
    losses = []
    with opt.join():
        for _ in range(batches[comm.rank]):
            x = torch.randn(32, 8, generator=g)
            loss = torch.nn.functional.mse_loss(model(x).squeeze(-1), x @ truth)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss))
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    out = {"version": opt.exchange.version, "params": params.tolist(),
           "loss_first": losses[0], "loss_last": losses[-1]}
    opt.free()
    return out
