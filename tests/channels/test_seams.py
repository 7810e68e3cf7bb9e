"""The seams between the windows' lifetimes and MPI's requests: what a window leaves in
flight when it dies without a finished free(), a pull that timed out, tokens held back
while their rank waits on another window, a free() that one rank never reaches, and
the one-sided words still in flight when a window is dropped.

Each scenario's body is here, beside its test; tests/mpi/run.py runs it on every rank
(`test_seams:NAME`).
"""
from __future__ import annotations

import ctypes
import gc
import os
import time

import numpy as np
import pytest

from mpilaunch import PATHS, launch, run

pytestmark = pytest.mark.mpi

_PATTERN = 0x5A


# ---------------------------------------------------------------- helpers (on the ranks)

def _pair_window(comm, cls, depth=1, n=64, timeout=10.0, **options):
    """A window of `cls` between rank 0 and rank 1 (each the other's in- and
    out-neighbour), float64 updates of n values."""
    from asapmpi import _core

    other = 1 - comm.rank
    layout = _core.Layout(1, 1, depth, n * 8, 0, 0, False)
    return cls(comm, layout, [other], [other], [layout.slot_disp(0)],
               [layout.notify_disp(0)], [layout.ack_disp(0)], "float64",
               flush_timeout=timeout, **options)


class _Blocks:
    """Heap blocks from the C allocator, filled with a pattern: freed memory that MPI
    still writes into is handed out again by malloc, so a late write shows up here."""

    # every chunk size glibc's bins hand out up to 4 KB (16-byte steps), 8 deep: the
    # chunks a destructor just freed are taken whatever their size
    SIZES = tuple(range(8, 4097, 16))

    def __init__(self, per_size=8):
        self.libc = ctypes.CDLL(None)
        self.libc.malloc.restype = ctypes.c_void_p
        self.libc.malloc.argtypes = [ctypes.c_size_t]
        self.libc.free.argtypes = [ctypes.c_void_p]
        self.blocks = []
        for size in self.SIZES:
            for _ in range(per_size):
                p = self.libc.malloc(size)
                ctypes.memset(p, _PATTERN, size)
                self.blocks.append((p, size))

    def overwritten(self):
        """The blocks (size, first changed bytes) that no longer hold the pattern."""
        bad = []
        for p, size in self.blocks:
            data = ctypes.string_at(p, size)
            if data != bytes([_PATTERN]) * size:
                bad.append((size, data[:16].hex()))
        return bad

    def free(self):
        for p, _ in self.blocks:
            self.libc.free(p)
        self.blocks = []


def _progress(comm, seconds):
    """Drive this rank's MPI progress for `seconds` (a late message lands meanwhile)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        comm.Iprobe()
        time.sleep(1e-3)


# ---------------------------------------------------------------- 1: a dropped window

def dropped_window(comm, sync="hop", n=64):
    """Rank 1 leaves its Exchange by an exception and drops it without free(); rank 0
    keeps sending into the receives rank 1 had posted (an update, a token).  Rank 1
    then fills the freed heap with a pattern: nothing may write into it."""
    from asapmpi import Exchange
    from asapmpi._core import slotwin

    options = {"max_gap": 1} if sync == "hop" else {}
    buf = np.full(n, float(comm.rank))
    ex = Exchange(buf, graph="complete", sync=sync, transport="messages",
                  checksum=True, timeout=10.0, **options)
    for _ in range(3):
        ex.step()
    comm.Barrier()
    result = {}
    if comm.rank == 1:
        try:
            with ex:
                raise RuntimeError("the training step failed")
        except RuntimeError:
            pass
        del ex
        gc.collect()
        blocks = _Blocks()
        comm.send("filled", dest=0)
        comm.recv(source=0)             # rank 0 sent into the old receives
        _progress(comm, 0.5)
        result["overwritten"] = blocks.overwritten()
        blocks.free()
        _progress(comm, 0.2)
        result["leftovers"] = slotwin.leftovers()
    else:
        comm.recv(source=1)
        win = ex.window
        # an update and a token into rank 1's posted receives (rank 1's slot and
        # token buffer), each sent eagerly: rank 0 waits for nothing of rank 1's
        win.put(buf, 4, 4)
        if sync == "hop":
            win.ack(4)
        comm.send("sent", dest=1)
        del win, ex
        gc.collect()
    comm.Barrier()
    return result


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("sync", ["hop", "async"])
def test_a_dropped_window_leaves_no_receive_into_freed_memory(sync, path):
    res = run("test_seams:dropped_window", 2, path, timeout=90, sync=sync)
    assert res[1]["overwritten"] == [], (
        f"freed heap written after the window was dropped: {res[1]['overwritten'][:4]}")
    # its cancelled receives and completed sends were reaped and their memory freed;
    # async's synchronous sends to rank 0, which dropped its window too, may stay in
    # flight (at most two per channel), with the stage they read kept
    pending = sum(n for _, n in res[1]["leftovers"])
    assert pending == 0 if sync == "hop" else pending <= 2, res[1]["leftovers"]


# ---------------------------------------------------------------- 2: a timed-out pull

def timed_out_pull(comm, n=4096, stall=1.5):
    """Rank 0 pulls rank 1's published model while rank 1 computes outside MPI, so the
    get times out and stays in flight; once rank 1 is back, rank 0's next pull reads
    its newer model whole, and the buffer the late get wrote is freed."""
    from asapmpi import _core
    from asapmpi._core import slotwin
    from asapmpi.errors import NeighbourTimeoutError

    layout = _core.Layout(0, 0, 0, n * 8, 0, 2, False)
    win = _core.PutWindow(comm, layout, [], [], [], [], [], "float64", flush_timeout=0.3)
    result = {}
    model = np.arange(n, dtype=np.float64) + 1000.0 * comm.rank
    if comm.rank == 1:
        win.publish(model, 1)
    comm.Barrier()
    if comm.rank == 1:
        time.sleep(stall)               # no MPI call: the get cannot be served
        win.publish(model + 1.0, 2)     # the newer model, while the late get completes
        comm.send("published", dest=0)
    else:
        out = np.zeros(n)
        try:
            win.pull(1, layout.off_publish, out)
            result["first"] = "whole"
        except NeighbourTimeoutError:
            result["first"] = "timed out"
        comm.recv(source=1)
        got = win.pull(1, layout.off_publish, out)
        result["version"] = got
        result["exact"] = bool(np.array_equal(out, np.arange(n) + 1001.0))
        _progress(comm, 0.2)
        result["leftovers"] = slotwin.leftovers()
    comm.Barrier()
    win.free()
    return result


@pytest.mark.parametrize("path", [p for p in PATHS if p != "shm"])
def test_a_pull_that_timed_out_leaves_its_get_out_of_the_next_pull(path):
    # on shared memory the origin reads the target's memory itself: no get waits
    res = run("test_seams:timed_out_pull", 2, path, timeout=90)
    assert res[0]["first"] == "timed out"
    assert res[0]["version"] == 2 and res[0]["exact"]
    assert res[0]["leftovers"] == []


# ---------------------------------------------------------------- 3: tokens held back

def _flood_and_hold(comm, a, flood, flood_bytes):
    """Rank 0: flood rank 1, which computes outside MPI meanwhile, with messages of its
    own, so that token sends queue behind them; then ack twice on mailbox `a` (the
    second token is held back: the first is still in flight).  Returns the flood's
    requests with their buffer (wait for them once rank 1 took the flood) and the
    in-neighbours whose token is held."""
    chunk = np.ones(flood_bytes, dtype=np.uint8)
    sends = [comm.Isend(chunk, dest=1, tag=77) for _ in range(flood)]
    a.ack(1)
    a.ack(2)
    return (sends, chunk), a.tokens_held


def _take_flood(comm, flood, flood_bytes):
    """Rank 1: receive rank 0's flood (_flood_and_hold)."""
    chunk = np.empty(flood_bytes, dtype=np.uint8)
    for _ in range(flood):
        comm.Recv(chunk, source=0, tag=77)


def tokens_across_windows(comm, flood=2000, flood_bytes=4096, stall=1.0, timeout=8.0):
    """Two mailboxes A and B between ranks 0 and 1.  Rank 0 floods rank 1, which
    computes outside MPI meanwhile, with messages of its own, so that its token sends
    queue behind them; it acks twice on A (the second token is held back: the first is
    still in flight), then waits on B for rank 1's token.  Rank 1 waits on A for that
    held-back token before it acks on B.  Only a wait on B that sends A's held-back
    token ends this without a timeout."""
    from asapmpi import _core

    a = _pair_window(comm, _core.MailboxWindow, timeout=timeout)
    b = _pair_window(comm, _core.MailboxWindow, timeout=timeout)
    result = {}
    comm.Barrier()
    if comm.rank == 0:
        (sends, _sent_buf), result["held"] = _flood_and_hold(comm, a, flood, flood_bytes)
        t0 = time.monotonic()
        b.wait_acks(1, timeout)           # raises at its deadline
        result["waited"] = time.monotonic() - t0
        result["acked"] = True
        comm.send("done", dest=1, tag=78)
        for req in sends:             # _sent_buf stays alive until they complete
            req.Wait()
    else:
        time.sleep(stall)               # outside MPI: rank 0's sends queue up
        a.wait_acks(2, timeout)
        b.ack(1)
        comm.recv(source=0, tag=78)
        _take_flood(comm, flood, flood_bytes)
    comm.Barrier()
    a.free()
    b.free()
    return result


def test_a_token_held_back_leaves_while_its_rank_waits_on_another_window():
    # Shared memory only: there a flood fills the receiver's queue and the token sends
    # wait behind it.  On the network paths the flood cannot hold a token back: the
    # MPI buffers it whole (Open MPI), or libfabric's tcp provider stops the whole
    # connection behind the unexpected messages until they are received (MPICH), so
    # the tokens cannot arrive whatever the sender does.
    res = run("test_seams:tokens_across_windows", 2, "shm", timeout=90)
    # held: the second token waited for the first one's send (else the MPI buffered
    # rank 0's flood whole, and this run did not test the hold)
    assert res[0]["held"] == [1], res[0]
    # and the wait on B ended with rank 1's token, not at its deadline: a wait that
    # times out raises (NeighbourTimeoutError), and the job fails
    assert res[0]["acked"], res[0]


def tokens_held_in_a_collective(comm, flood=2000, flood_bytes=4096, stall=2.5,
                                timeout=10.0):
    """As tokens_across_windows, but rank 0 then waits in asapmpi's collective, not on
    another window, and rank 1 stays outside MPI longer than settle's second: the
    held-back token is still held when the collective's polls begin.  Rank 1 waits for
    it before it comes to the collective.  Only polls that release held-back tokens end
    this without a timeout (docs/MODELCHECK.md, "Tokens held back")."""
    from asapmpi import _core, collectives

    a = _pair_window(comm, _core.MailboxWindow, timeout=timeout)
    result = {}
    comm.Barrier()
    if comm.rank == 0:
        (sends, _sent_buf), result["held"] = _flood_and_hold(comm, a, flood, flood_bytes)
        t0 = time.monotonic()
        collectives.arrive(comm, 3 * timeout, "the scenario's collective")
        result["waited"] = time.monotonic() - t0
        for req in sends:             # _sent_buf stays alive until they complete
            req.Wait()
    else:
        time.sleep(stall)               # outside MPI: rank 0's sends queue up
        a.wait_acks(2, timeout)           # raises at its deadline
        result["token"] = "arrived"
        collectives.arrive(comm, 3 * timeout, "the scenario's collective")
        _take_flood(comm, flood, flood_bytes)
    comm.Barrier()
    a.free()
    return result


def test_a_token_held_back_leaves_while_its_rank_waits_in_a_collective():
    # shared memory only, as above
    res = run("test_seams:tokens_held_in_a_collective", 2, "shm", timeout=90)
    assert res[0]["held"] == [1], res[0]
    # rank 0 waited for rank 1's stall and its wait for the token, not for a timeout:
    # rank 1's wait for the held-back token ended with the token (at its deadline it
    # raises, and the job fails); before, rank 0's wait was bounded by 8 s, 3x the
    # stall it waits out, a timing a loaded host could break
    assert res[1]["token"] == "arrived", res


def newest_stranded(comm, stall=1.5, timeout=8.0, n=64):
    """async on the mailbox of newest versions, two ranks: rank 0 steps three times
    while rank 1 computes outside MPI, with Exchange.settle() between its second and
    third step (version 1 in flight, version 2 sent beside it by the settle, version 3
    waiting behind both), then frees.  Rank 1 then waits for version 3, as a backup_ps
    worker waits for the server's last theta.  Only a free() whose collective's polls
    deliver what waits ends this without a timeout (docs/MODELCHECK.md, "The newest
    version stranded")."""
    from asapmpi import Exchange

    buf = np.full(n, float(comm.rank))
    ex = Exchange(buf, graph="complete", sync="async", transport="messages",
                  timeout=timeout)
    result = {}
    if comm.rank == 0:
        ex.step()
        ex.step()
        ex.settle()
        ex.step()
    else:
        time.sleep(stall)               # outside MPI: rank 0's sends stay unmatched
        result["newest"] = ex.window.wait_newest(3, 3, timeout).tolist()
    ex.free()
    return result


@pytest.mark.parametrize("path", PATHS)
def test_the_newest_version_reaches_a_reader_after_its_writer_settled_and_left(path):
    res = run("test_seams:newest_stranded", 2, path, timeout=90)
    assert res[1]["newest"] == [3], res[1]


# ---------------------------------------------------------------- 4: writes after send()

def written_after_send(comm, transport, n=1 << 17, stall=0.5):
    """Rank 0 sends, then writes its buffer before receive() (rendezvous-sized: the
    message moves only once rank 1, outside MPI for `stall` seconds, takes it).  Rank
    1 must reduce what rank 0 held at send()."""
    from asapmpi import Exchange

    buf = np.full(n, 10.0 if comm.rank == 0 else 1.0)
    ex = Exchange(buf, graph="complete", sync="notify_ack", transport=transport,
                  timeout=20.0)
    ex.send()
    if comm.rank == 0:
        ex.buffer[...] = -999.0
    else:
        time.sleep(stall)
    out = ex.receive()
    result = {"min": float(out.min()), "max": float(out.max()), "transport": ex.transport}
    ex.free()
    return result


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("transport", ["put", "messages"])
def test_a_write_after_send_does_not_reach_the_neighbours(transport, path):
    res = run("test_seams:written_after_send", 2, path, timeout=90, transport=transport)
    assert res[1]["transport"] == transport
    # rank 1: half its own 1.0, half what rank 0 sent (10.0), never the -999 written after
    assert res[1]["min"] == res[1]["max"] == 5.5, res[1]


# ---------------------------------------------------------------- 5: free() never reached

def free_without_one_rank(comm, timeout=1.0):
    """Rank 1 never calls free(); the others must not wait in free() for ever."""
    from asapmpi import _core

    win = _pair_window(comm, _core.PutWindow, timeout=timeout)
    comm.Barrier()
    if comm.rank == 0:
        win.free()
    else:
        time.sleep(60)
    return {}


def test_a_free_that_one_rank_never_reaches_ends_the_job_naming_the_call():
    proc = launch("test_seams:free_without_one_rank", 2, "shm", timeout=45)
    assert proc.returncode != 0
    assert "free()'s MPI_Allreduce" in proc.stderr + proc.stdout, proc.stderr[-2000:]


# ---------------------------------------------------------------- 6: dropped lazy words

def dropped_words(comm, flag, words=12):
    """Rank 0 issues lazy notifies and acks to rank 1 on a put window while rank 1
    computes outside MPI, drops the window without free() (as an exception leaving its
    Exchange would) and fills the freed heap with a pattern; only then does rank 1 come
    back and serve the words.  On MPICH's network path RMA runs as active messages: each
    MPI_Fetch_and_op completes only once its target entered MPI, and its result is then
    written back into the origin's result word.  Nothing may write into the pattern."""
    from asapmpi import _core
    from asapmpi._core import slotwin

    win = _pair_window(comm, _core.PutWindow)
    comm.Barrier()
    result = {}
    if comm.rank == 0:
        for version in range(1, words + 1):
            if version % 2:
                win.notify(version)
            else:
                win.ack(version)
        del win
        gc.collect()
        blocks = _Blocks()
        result["kept"] = slotwin.kept_words()
        with open(flag, "w"):
            pass                        # rank 1 may come back
        comm.recv(source=1)
        _progress(comm, 0.5)            # the words' results come back meanwhile
        result["overwritten"] = blocks.overwritten()
        blocks.free()
    else:
        from scenarios import wait_for_flags  # tests/mpi, on the ranks' path

        # outside MPI (no MPI call: this rank serves no one meanwhile)
        if not wait_for_flags(os.path.dirname(flag), [os.path.basename(flag)], 60):
            raise TimeoutError(f"{flag} never appeared")
        comm.send("back", dest=0)       # in MPI again: rank 0's words are served
        _progress(comm, 0.5)
        del win
        gc.collect()
    comm.Barrier()
    return result


@pytest.mark.parametrize("path", PATHS)
def test_a_dropped_window_keeps_the_memory_of_its_lazy_words(path, tmp_path):
    res = run("test_seams:dropped_words", 2, path, timeout=90,
              flag=str(tmp_path / "dropped"))
    assert res[0]["overwritten"] == [], (
        f"freed heap written after a window with lazy words was dropped: "
        f"{res[0]['overwritten'][:4]}")
    # the window's block of origin and result words (16 of each) was kept
    assert res[0]["kept"] == [["put", 12, 256]], res[0]


def kept_words(comm):
    """kept_words() after three windows on ranks 0 and 1: one freed after an ack, one
    dropped after its acks were flushed (settle_all), one dropped while rank 0's
    notify and acks were in flight (rank 0 only: rank 1 issues none)."""
    from asapmpi import _core
    from asapmpi._core import slotwin

    result = {}
    win = _pair_window(comm, _core.PutWindow)
    win.ack(1)
    win.free()
    result["freed"] = slotwin.kept_words()
    win = _pair_window(comm, _core.PutWindow)
    win.ack(1)
    slotwin.settle_all()
    del win
    gc.collect()
    result["settled"] = slotwin.kept_words()
    win = _pair_window(comm, _core.PutWindow)
    if comm.rank == 0:
        win.notify(1)
        win.ack(1)
        win.ack(2)
    del win
    gc.collect()
    result["dropped"] = slotwin.kept_words()
    comm.Barrier()
    return result


@pytest.mark.parametrize("path", PATHS)
def test_kept_words_lists_what_a_window_dropped_with_words_in_flight_keeps(path):
    res = run("test_seams:kept_words", 2, path, timeout=90)
    for rank in (0, 1):
        assert res[rank]["freed"] == res[rank]["settled"] == [], res[rank]
    assert res[0]["dropped"] == [["put", 3, 256]], res[0]
    assert res[1]["dropped"] == [], res[1]
