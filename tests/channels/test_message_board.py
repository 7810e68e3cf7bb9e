"""The board by messages (asapmpi.message_board): a synchronous word is seen by every
reader once published (docs/PROTOCOL.md A13, checked here on each MPI and path), the
eventual words arrive in order, and free() leaves no message unmatched.

Each scenario's body is here, beside its test (`test_message_board:NAME`)."""
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


@pytest.mark.parametrize("path", ALL_PATHS)
def test_a_synchronous_word_is_seen_by_every_reader_once_published(path):
    # rank 0 publishes word k, then tells the others by a message on another
    # communicator; each looks at its board at once: the join board's lag rule rests on
    # this (a reader that completed the writer's next version sees its joined-at word)
    for r in _run("test_message_board:seen_once_published", path, timeout=180,
                  rounds=ROUNDS):
        assert r["missed"] == [], r
        assert r["last"] == ROUNDS, r


@pytest.mark.parametrize("path", ALL_PATHS)
def test_eventual_words_arrive_in_order_and_free_leaves_none_unmatched(path):
    # 200 a batch from each writer to each reader: past 64 unreceived from one sender
    # MPICH's network path stops delivering anything from it, so the writer holds
    # words back past MAX_UNTAKEN (asapmpi.message_board)
    for r in _run("test_message_board:eventual", path, timeout=120, words=200):
        assert r["read"] == [200, 200], r
        assert r["ordered"], r


def seen_once_published(comm, rounds=ROUNDS):
    """Rank 0 publishes word 1 (synchronous) as 1..rounds; after each, a go message on
    COMM_WORLD; the readers peek at once and list the rounds where they saw less."""
    import numpy as np
    from mpi4py import MPI

    from asapmpi.message_board import MessageBoard

    board = MessageBoard(comm.Dup(), 2, 30, "test board", synchronous=(1,))
    go = np.zeros(1, dtype=np.int64)
    missed = []
    for k in range(1, rounds + 1):
        if comm.rank == 0:
            board.publish(1, k)
            go[0] = k
            for r in range(1, comm.size):
                comm.Send([go, MPI.INT64_T], dest=r, tag=5)
        else:
            comm.Recv([go, MPI.INT64_T], source=0, tag=5)
            if board.peek()[0, 1] != k:
                missed.append(k)
    last = int(board.peek()[0, 1]) if comm.rank else rounds
    board.free()
    board.comm.Free()
    return {"missed": missed[:10], "last": last}


def eventual(comm, words=200):
    """Ranks 1 and 2 each publish word 0 as 1..words (eventual) to every rank; rank 0
    reads until it has both last words, checking that each rank's word only grows,
    while they serve their boards (the held-back words leave); then they publish as
    many more, which nobody reads before free()."""
    import time

    from asapmpi import collectives
    from asapmpi.message_board import MessageBoard

    board = MessageBoard(comm.Dup(), 1, 30, "test board")
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
    board.free()        # receives every word sent to this rank: none left on the comm
    board.comm.Free()
    return out


def _serve_until(board, comm) -> None:
    # look at the board (its held-back words leave) until rank 0 has read the last ones
    import time

    while not comm.iprobe(source=0, tag=6):
        board.progress()
        time.sleep(1e-4)
    comm.recv(source=0, tag=6)


def test_a_board_dropped_without_free_leaves_its_receives_with_their_memory():
    # an Exchange never freed drops its board with receives still posted: they go to
    # the leftovers with their buffer, and a word sent afterwards lands there, not in
    # freed memory (the leftovers complete once it has)
    for r in _run("test_message_board:dropped", "shm", timeout=60):
        assert r["left_at_drop"] == 2 and r["left_after_word"] == 1, r


def dropped(comm):
    """Rank 0 drops its board (3 ranks: two receives posted); rank 1 then publishes a
    synchronous word, which rank 0's left receive from it takes."""
    import gc

    from asapmpi import collectives
    from asapmpi.message_board import MessageBoard

    board = MessageBoard(comm.Dup(), 2, 30, "test board", synchronous=(1,))
    out = {"left_at_drop": 2, "left_after_word": 1}
    if comm.rank == 0:
        before = collectives.leftovers()
        del board
        gc.collect()
        out["left_at_drop"] = collectives.leftovers() - before
    collectives.barrier(comm, 30, "dropped")
    if comm.rank == 1:
        board.publish(1, 7)     # returns once rank 0's left receive (and rank 2's) took it
    collectives.barrier(comm, 30, "published")
    if comm.rank == 0:
        out["left_after_word"] = collectives.leftovers() - before
    # the others' boards are dropped too (free() is collective, and rank 0 has none)
    return out
