"""Serial tests: layout, graphs, weights, configuration, errors, one-rank Exchange."""
import time

import numpy as np
import pytest
from mpi4py import MPI

import asapmpi
from asapmpi import _core
from asapmpi._core.layout import Layout
from asapmpi.errors import ConfigError, FreedError, MPIError, NeighbourTimeoutError
from asapmpi.rc import RC
from asapmpi.reduce.weights import resolve_weights


def test_layout_regions_are_aligned_and_disjoint():
    lay = Layout(n_in=3, n_out=2, depth=4, nbytes=1000, n_user=5)
    assert lay.off_notify == 64
    offsets = [lay.off_notify, lay.off_ack, lay.off_user, lay.off_slots]
    assert offsets == sorted(offsets) and all(o % 64 == 0 for o in offsets)
    assert lay.off_ack - lay.off_notify >= 8 * 3 * 4
    assert lay.payload_stride == 1024 and lay.slot_stride == 64 + 1024 + 64
    assert lay.slot_disp(2, 3) == lay.off_slots + (2 * 4 + 3) * lay.slot_stride
    assert lay.total == lay.slot_disp(2, 3) + lay.slot_stride
    assert lay.notify_disp(1, 2) == 64 + 8 * (1 * 4 + 2)


def test_graph_neighbours_and_connectivity():
    g = asapmpi.graph("ring", 5)
    assert g.out_neighbours(4) == [0] and g.in_neighbours(0) == [4]
    assert g.is_strongly_connected()
    c = asapmpi.graph("complete", 4)
    assert c.in_neighbours(2) == [0, 1, 3] and len(c.edges()) == 12
    b = asapmpi.graph("bidirectional-ring", 2)
    assert b.out_neighbours(0) == [1]
    split = asapmpi.Graph(4, [[1], [0], [3], [2]])
    assert not split.is_strongly_connected()


@pytest.mark.parametrize("outs, message", [
    ([[1], [5]], "outside 0..1"),
    ([[0], []], "lists itself"),
    ([[1, 1], []], "twice"),
    ([[1]], "1 neighbour lists for 2 ranks"),
])
def test_graph_rejects_bad_lists(outs, message):
    with pytest.raises(ConfigError, match=message):
        asapmpi.Graph(2, outs)


def test_unknown_graph_name():
    with pytest.raises(ConfigError, match="unknown graph 'rign'"):
        asapmpi.graph("rign", 4)


def test_weights_default_and_user():
    assert resolve_weights(0, [1, 2], None) == (1 / 3, [1 / 3, 1 / 3])
    assert resolve_weights(0, [2], {0: 0.25, 2: 0.75}) == (0.25, [0.75])
    with pytest.raises(ConfigError, match="sum to"):
        resolve_weights(0, [2], {0: 0.5, 2: 0.6})
    with pytest.raises(ConfigError, match="exactly this rank"):
        resolve_weights(0, [2], {0: 0.5, 1: 0.5})
    with pytest.raises(ConfigError, match="finite"):
        resolve_weights(0, [2], {0: float("nan"), 2: 0.5})


def test_rc_rejects_unknown_and_invalid():
    rc = RC()
    rc.timeout = "2.5"
    assert rc.timeout == 2.5
    with pytest.raises(ConfigError, match="no option 'timout'"):
        rc.timout = 3
    with pytest.raises(ConfigError, match="positive"):
        rc.timeout = 0
    # switches take the words every boolean option takes, and nothing else (issue 49:
    # ASAPMPI_ABORT_ON_ERROR=maybe was taken for true)
    for word, value in (("off", False), ("YES", True), ("0", False), (1, True)):
        rc.abort_on_error = word
        assert rc.abort_on_error is value
    with pytest.raises(ConfigError, match=r"sweep_shm must be true or false.*'maybe'"):
        rc.sweep_shm = "maybe"


def test_errors_share_one_base_and_builtin_classes():
    assert issubclass(ConfigError, ValueError) and issubclass(ConfigError, asapmpi.AsapError)
    assert issubclass(NeighbourTimeoutError, TimeoutError)
    e = NeighbourTimeoutError(0, "the notify of version 3", [2, 5], [3, 3], [2, 0], 1.5)
    assert "rank 2 (expected 3, last seen 2)" in str(e) and e.ranks == [2, 5]
    m = MPIError(13, "MPI_Put", "Invalid rank")
    assert m.code == 13 and "MPI_Put" in str(m)


def test_single_rank_exchange_is_identity_and_frees():
    buf = np.arange(10, dtype=np.float32)
    with asapmpi.Exchange(buf, graph="ring", comm=MPI.COMM_SELF) as ex:
        ex.step()
        assert ex.in_neighbours == [] and ex.weights == {0: 1.0}
        np.testing.assert_array_equal(buf, np.arange(10, dtype=np.float32))
    with pytest.raises(FreedError):
        ex.step()
    ex.free()  # twice is fine


@pytest.mark.parametrize("steps", [33, 81])
def test_the_derived_timeout_follows_the_median_and_longest_steps(steps, monkeypatch):
    # the adaptive timeout (timeout=None) is refreshed every STEPS_MEASURED steps from
    # the last 64 step times: factor x their median, at least 3 x their longest, within
    # [timeout_min, timeout].  Checked against NumPy's median of the same times, before
    # and after the 64 kept are full (the refresh sorts them in Python: the hot path;
    # its counts are even, so the odd case is checked on _median itself)
    from asapmpi.exchange.exchange import STEPS_MEASURED
    monkeypatch.setattr(asapmpi.rc, "timeout_min", 1e-9)
    monkeypatch.setattr(asapmpi.rc, "timeout_factor", 7.0)
    with asapmpi.Exchange(np.zeros(8), comm=MPI.COMM_SELF) as ex:
        for i in range(steps):
            time.sleep(0.0005 * (i % 5))    # step times spread over 0-2 ms
            ex.step()
        timed = ex._timed
        assert timed == steps - 1 and timed % STEPS_MEASURED == 0
        times = np.asarray(ex._step_seconds)
        assert len(times) == min(timed, 64)
        expected = min(max(7.0 * np.median(times), 3.0 * times.max()), ex.timeout)
        assert ex.current_timeout == pytest.approx(expected, rel=1e-12)
    odd = [3.0, 1.0, 2.0]
    from asapmpi.exchange.exchange import _median
    assert _median(sorted(odd)) == np.median(odd)
    assert _median(sorted([*odd, 10.0])) == np.median([*odd, 10.0])


@pytest.mark.parametrize("buf, message", [
    (np.zeros(4, dtype=np.int64), "float32, float64 or float16"),
    (np.zeros((4, 4))[:, 0], "C-contiguous"),
    (np.zeros(0), "empty"),
    ([1.0, 2.0], "buffer protocol"),
])
def test_bad_buffers(buf, message):
    with pytest.raises(ConfigError, match=message):
        asapmpi.Exchange(buf, graph="ring", comm=MPI.COMM_SELF)


def test_read_only_buffer_and_bad_options():
    ro = np.zeros(4)
    ro.flags.writeable = False
    with pytest.raises(ConfigError, match="writable"):
        asapmpi.Exchange(ro, graph="ring", comm=MPI.COMM_SELF)
    with pytest.raises(ConfigError, match="unknown sync policy"):
        asapmpi.Exchange(np.zeros(4), graph="ring", sync="nope", comm=MPI.COMM_SELF)
    with pytest.raises(ConfigError, match="timeout must be"):
        asapmpi.Exchange(np.zeros(4), graph="ring", comm=MPI.COMM_SELF, timeout=-1)
    with pytest.raises(ConfigError, match="unknown graph 'nope'"):
        asapmpi.Exchange(np.zeros(4), graph="nope", comm=MPI.COMM_SELF)
    with pytest.raises(ConfigError, match="needs a server and at least one worker"):
        asapmpi.Exchange(np.zeros(4), sync="backup_ps", comm=MPI.COMM_SELF)


def test_sync_takes_the_command_line_spelling_of_a_policy():
    # "hop:backup=1" as on the command line, merged with keyword options
    from asapmpi.sync import policy

    hop = policy("hop:backup=1:max_gap=3")
    assert (hop.name, hop.backup, hop.max_gap) == ("hop", 1, 3)
    assert policy("hop:backup=1", max_gap=2).max_gap == 2
    assert policy("hop:backup=1", backup=1).backup == 1
    with pytest.raises(ConfigError, match="sets backup=1 but the keyword backup=2"):
        policy("hop:backup=1", backup=2)
    with pytest.raises(ConfigError, match="is not OPTION=VALUE"):
        policy("hop:backup")
    with pytest.raises(ConfigError, match="transport is the Exchange's"):
        policy("bsp:transport=messages")
    with asapmpi.Exchange(np.zeros(4), graph="ring", sync="hop:max_gap=3",
                          comm=MPI.COMM_SELF) as ex:
        ex.step()
        assert (ex.policy.name, ex.policy.max_gap) == ("hop", 3)


def test_window_word_access_checks_offsets_and_ranks():
    with asapmpi.Exchange(np.zeros(4), graph="ring", comm=MPI.COMM_SELF) as ex:
        win = ex.window
        with pytest.raises(ConfigError, match="not an int64 word"):
            win.local_word(3)
        with pytest.raises(ConfigError, match="outside the communicator"):
            win.fetch_word(1, 64)
        with pytest.raises(ConfigError, match="not an int64 word of rank 0"):
            win.fetch_word(0, win.total_bytes)
        word = 48  # an unused word of the window's header line
        assert win.accumulate_word(0, word, 5, op="sum") == 0
        assert win.accumulate_word(0, word, 2, op="sum") == 5        # returns the old value
        assert win.fetch_word(0, word) == 7 and win.local_word(word) == 7
        assert win.accumulate_word(0, word, 3, op="max") == 7        # below: unchanged
        assert win.accumulate_word(0, word, 9, op="max") == 7 and win.local_word(word) == 9
        win.accumulate_word(0, word, 7, op="replace")
        win.accumulate_word(0, word + 8, -2, op="replace")
        assert win.fetch_words(0, word, 2).tolist() == [7, -2]    # one atomic read
        with pytest.raises(ConfigError, match="count must be at least 1"):
            win.fetch_words(0, word, 0)
        with pytest.raises(ConfigError, match="not an int64 word of rank 0"):
            win.fetch_words(0, win.total_bytes - 8, 2)
        win.wait_word(word, 7, 1.0)
        with pytest.raises(NeighbourTimeoutError, match="to reach 8"):
            win.wait_word(word, 8, 0.05, from_rank=0)


def test_status_names():
    assert _core.STATUS_NAMES[_core.TORN] == "torn"


def test_a_forgotten_free_is_named_on_stderr_at_exit(tmp_path):
    # one line from asapmpi, whatever Python's warning filters (a ResourceWarning is
    # hidden by default, and the warnings module is gone at interpreter exit)
    import subprocess
    import sys

    script = ("import numpy as np, asapmpi\nfrom mpi4py import MPI\n"
              "ex = asapmpi.Exchange(np.zeros(4), graph='ring', comm=MPI.COMM_SELF)\n"
              "ex.step()\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path, check=False)
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "without free()" in line]
    assert lines == ["asapmpi: rank 0: an Exchange was dropped without free(); call free() "
                     "on every Exchange (or DecentralizedOptimizer) on every rank, or use "
                     "it in a with block"], proc.stderr
    assert "Exception ignored" not in proc.stderr, proc.stderr


def test_an_interrupt_is_reported_in_one_line_saying_where(capfd):
    # issue 49: a rank's Ctrl-C is one line (where it was, what it waited for), not a
    # traceback; written in one piece so that the launcher cannot glue it to another's
    from asapmpi.launch.faults import report_error

    def users_loop():
        raise KeyboardInterrupt

    try:
        users_loop()
    except KeyboardInterrupt as exc:
        exc.__notes__ = ["asapmpi: interrupted waiting for the notify of version 7 from rank(s) 1"]
        report_error(exc)
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"asapmpi: rank {MPI.COMM_WORLD.Get_rank()}: interrupted at "
                          f"test_serial.py:"), err
    assert "(raise KeyboardInterrupt)" in err and err.rstrip().endswith(
        "waiting for the notify of version 7 from rank(s) 1; ending the job"), err
