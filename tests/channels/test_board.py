"""A board (asapmpi.board: a channel with user words only), on a window and by messages:
a published synchronous word is seen by every reader at once (docs/PROTOCOL.md A13 by
messages, checked here on each MPI and path), eventual words arrive in order, a reader
that stops taking them is named, and free() leaves no message unmatched.

Each scenario's body is here, beside its test (`test_board:NAME`)."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.mpi

#: the paths, and Open MPI's UCX over TCP where it has it (skipped elsewhere; the ranks
#: import this module, so mpilaunch, which runs ompi_info, is imported in the tests)
ALL_PATHS = ["shm", "net", "ucx"]


def _run(scenario, path, **kwargs):
    from mpilaunch import HAS_UCX, run

    if path == "ucx" and not HAS_UCX:
        pytest.skip("needs Open MPI with osc ucx")
    return run(scenario, 3, path, **kwargs)

#: synchronous words published one after another, each looked for at once by the readers
ROUNDS = 1500
KINDS = ["window", "messages"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("path", ALL_PATHS)
def test_a_synchronous_word_is_seen_by_every_reader_once_published(path, kind):
    # rank 0 publishes word k, then tells the others by a message on another
    # communicator; each looks at its board at once (a peek and a peeker): the join
    # board's lag rule rests on this (a reader that completed the writer's next
    # version sees its joined-at word)
    for r in _run("test_board:seen_once_published", path, timeout=180, rounds=ROUNDS,
                  messages=kind == "messages"):
        assert r["missed"] == [] and r["unseen"] == [], r
        assert r["last"] == ROUNDS and r["after_free"] is False, r


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("path", ALL_PATHS)
def test_eventual_words_arrive_in_order_and_free_leaves_none_unmatched(path, kind):
    # 200 a batch from each writer to each reader: past 64 unreceived from one sender
    # MPICH's network path stops delivering anything from it, so a row by message waits
    # for the reader to take the one before (asapmpi.board)
    for r in _run("test_board:eventual", path, timeout=120, words=200,
                  messages=kind == "messages"):
        assert r["read"] == [200, 200], r
        assert r["ordered"], r


def seen_once_published(comm, rounds=ROUNDS, messages=True):
    """Rank 0 publishes word 1 (synchronous) as 1..rounds; after each, a go message on
    COMM_WORLD; the readers peek at once and list the rounds where they saw less (by
    peek(), and by a peeker of word 1 whose threshold is k)."""
    import numpy as np
    from mpi4py import MPI

    from asapmpi.board import Board

    board = Board(comm, 2, 30, "test board", messages=messages, synchronous=(1,))
    peeker = board.peeker(1)
    go = np.zeros(1, dtype=np.int64)
    missed, unseen = [], []
    for k in range(1, rounds + 1):
        if comm.rank == 0:
            board.publish(1, k)
            go[0] = k
            for r in range(1, comm.size):
                comm.Send([go, MPI.INT64_T], dest=r, tag=5)
        else:
            comm.Recv([go, MPI.INT64_T], source=0, tag=5)
            peeker.threshold = k
            if not peeker.seen():
                unseen.append(k)
            if board.peek()[0, 1] < k:      # (k + 1 may be there already)
                missed.append(k)
    last = int(board.read()[0, 1]) if comm.rank else rounds
    board.free()
    return {"missed": missed[:10], "unseen": unseen[:10], "last": last,
            "after_free": peeker.seen()}


def eventual(comm, words=200, messages=True):
    """Ranks 1 and 2 each publish word 0 as 1..words (eventual) to every rank; rank 0
    reads until it has both last words, checking that each rank's word only grows,
    while they serve their boards (the rows that waited leave); then they publish as
    many more, which nobody reads before free()."""
    import time

    from asapmpi import collectives
    from asapmpi.board import Board

    board = Board(comm, 1, 30, "test board", messages=messages)
    out = {"read": [words, words], "ordered": True}
    if comm.rank:
        for k in range(1, words + 1):
            board.publish(0, k)
        _serve_until(board, comm)
    else:
        deadline, seen = time.monotonic() + 60, [0, 0]
        while seen != [words, words] and time.monotonic() < deadline:
            table = board.read()
            now = [int(table[1, 0]), int(table[2, 0])]
            out["ordered"] &= all(n >= s for n, s in zip(now, seen))
            seen = now
        out["read"] = seen
        for r in (1, 2):
            comm.send(True, dest=r, tag=6)
    collectives.barrier(comm, 30, "the first words read")
    if comm.rank:
        for k in range(words + 1, 2 * words + 1):
            board.publish(0, k)
    board.free()        # receives every row sent to this rank: none left on the comm
    return out


def _serve_until(board, comm) -> None:
    # look at the board (its rows that waited leave) until rank 0 has read the last ones
    import time

    while not comm.iprobe(source=0, tag=6):
        board.progress()
        time.sleep(1e-4)
    comm.recv(source=0, tag=6)


def test_a_reader_that_stops_taking_a_synchronous_word_is_named():
    # rank 2 computes outside MPI for 3 s while rank 0, half a second later, publishes
    # a synchronous word with a 1 s deadline: the error names rank 2 alone (rank 1,
    # waiting in a barrier meanwhile, took it: every wait of the process pumps the
    # board); then rank 2 takes it, and free() completes the send
    for r in _run("test_board:stopped_reader", "shm", timeout=60):
        assert r["error"] == ([2] if r["rank"] == 0 else None), r
        assert r["word"] == 5, r


def stopped_reader(comm):
    """Rank 0 publishes word 0 (synchronous) while rank 2 sleeps outside MPI."""
    import time

    from asapmpi import collectives
    from asapmpi.board import Board
    from asapmpi.errors import NeighbourTimeoutError

    board = Board(comm, 1, 1.0, "test board", messages=True, synchronous=(0,))
    out = {"rank": comm.rank, "error": None}
    collectives.barrier(comm, 30, "made")
    if comm.rank == 0:
        time.sleep(0.5)                 # rank 2 is asleep by now
        try:
            board.publish(0, 5)
        except NeighbourTimeoutError as exc:
            out["error"] = exc.ranks
    elif comm.rank == 2:
        time.sleep(3)
    collectives.barrier(comm, 30, "published")
    out["word"] = int(board.read()[0, 0])
    board.free()
    return out


def test_a_board_dropped_without_free_leaves_its_messages_with_their_memory():
    # Exchanges never freed drop their boards by messages with a receive posted and
    # rows in flight: each goes to the leftovers with its buffer (the receive
    # cancelled), and those MPI completes are let go: what stays is at most one row in
    # flight to each other rank, and the job still ends
    for r in _run("test_board:dropped", "shm", timeout=60):
        assert r["left"] <= (2 if r["rank"] else 0), r


def dropped(comm):
    """Ranks 1 and 2 publish eventual words, and every rank drops its board at once:
    its posted receive and its rows in flight go to the leftovers."""
    import gc

    from asapmpi import collectives
    from asapmpi._core import slotwin
    from asapmpi.board import Board

    board = Board(comm, 2, 30, "test board", messages=True)
    if comm.rank:
        for k in range(1, 6):
            board.publish(0, k)
    del board
    gc.collect()
    collectives.barrier(comm, 30, "dropped")
    return {"rank": comm.rank,
            "left": sum(n for t, n in slotwin.leftovers() if t == "mailbox")}
