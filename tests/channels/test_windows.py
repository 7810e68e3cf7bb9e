"""The slot window's transports, one class each (asapmpi/_core/*.pxi), in one process.

Rank 0 of MPI.COMM_SELF is its own in- and out-neighbour: every transport moves an
update into its own slot and the shared verified reduce reads it, so each class's
send, wait and slot hooks run end to end.  The multi-rank scenarios (tests/mpi) run
the same classes under mpiexec on every path; the words of each are
tests/words/test_words.py's.
"""
import numpy as np
import pytest
from selfwindow import N
from selfwindow import reduce_own as _reduce_own
from selfwindow import window as _window


@pytest.mark.parametrize("name", ["PutWindow", "MailboxWindow", "NewestWindow"])
def test_put_wait_reduce_on_each_window_transport(name):
    from asapmpi import _core

    _, win = _window(getattr(_core, name))
    with win:
        for version in (1, 2, 3):
            update = np.arange(N, dtype=np.float64) * version
            win.put(update, version, version)
            win.wait_notifies(version, 10.0)
            _reduce_own(win, version, update)
            win.ack(version)
            win.release(version)
        assert win.bytes_put == 3 * N * 8


#: the channels whose verbs step NOTIFY-ACK's way (waits_for_release) and the await
#: mode a reader uses on each (a mailbox of newest versions has no exact one)
VERB_CHANNELS = {"PutWindow": 0, "SharedWindow": 0, "MessageWindow": 0,
                 "MailboxWindow": 0, "NewestWindow": 1}


@pytest.mark.parametrize("name", sorted(VERB_CHANNELS))
def test_each_channel_steps_through_the_verbs(name):
    # release(0), then per version deliver, await_, the verified reduce, release: the
    # same calls on every channel, each writer waiting for its reader's release
    from asapmpi import _core

    options = {"waits_for_release": True}
    outbox = name == "SharedWindow"
    if outbox:
        segment = bytearray(_core.Layout(1, 1, 1, N * 8, 0, 0, True).segment_bytes)
        options["outboxes"] = (segment, [segment])
    _, win = _window(getattr(_core, name), outbox=outbox, **options)
    with win:
        assert win.waits_for_release
        win.release(0)
        for version in (1, 2, 3):
            update = np.arange(N, dtype=np.float64) * version
            win.deliver(update, version, 10.0)
            win.await_(version, 10.0, VERB_CHANNELS[name])
            _reduce_own(win, version, update)
            win.progress()
            win.release(version)
        win.drain()


@pytest.mark.parametrize("name", ["PutWindow", "MailboxWindow"])
def test_tokens_step_through_the_verbs(name):
    # Hop's way (releases=True, its writers wait for no release in deliver): depth 3,
    # await_(k, RELEASED) is the token wait and returns the smallest release, release(k)
    # the token; deliver leaves out an out-neighbour that released skip_released
    from asapmpi import _core
    from asapmpi.errors import NeighbourTimeoutError
    from asapmpi.sync import Await

    _, win = _window(getattr(_core, name), depth=3, releases=True)
    with win:
        assert win.releases and not win.waits_for_release
        assert win.await_(0, 10.0, Await.RELEASED) == 0
        for version in (1, 2, 3, 4):
            update = np.arange(N, dtype=np.float64) * version
            win.deliver(update, version, 10.0)
            win.await_(version, 10.0, Await.EXACT)
            _reduce_own(win, version, update)
            # the token wait of the next iteration (max_gap 2): released >= version - 2
            assert win.await_(version - 2, 10.0, Await.RELEASED) == version - 1
            win.release(version)
            assert win.await_(version, 10.0, Await.RELEASED) == version
        # the only out-neighbour released 4: update 5 is of no use to it
        win.deliver(np.zeros(N), 5, 10.0, skip_released=4)
        assert win.suppressed == 1
        assert win.await_(5, 10.0, Await.COUNT, 0) == 0      # nothing delivered
        with pytest.raises(NeighbourTimeoutError, match="the ack of version 6"):
            win.await_(6, 0.05, Await.RELEASED)


def test_without_releases_nobody_is_told():
    # a window whose writers never wait (async, BSP): release(k) hands the slot back
    # and tells no writer, so a token wait would wait for ever
    from asapmpi import _core
    from asapmpi.sync import Await

    _, win = _window(_core.PutWindow)
    with win:
        assert not win.releases
        win.deliver(np.ones(N), 1, 10.0)
        win.release(1)
        assert win.await_(0, 10.0, Await.RELEASED) == 0


def test_the_push_channel_refuses_the_verbs_it_cannot_give():
    from asapmpi import _core
    from asapmpi.errors import ConfigError

    _, win = _window(_core.PushWindow, depth=0)
    with win:
        with pytest.raises(ConfigError, match="one peer at a time"):
            win.deliver(np.zeros(N), 1, 1.0)
        with pytest.raises(ConfigError, match="nobody waits"):
            win.await_(1, 1.0)


def test_the_message_channel_awaits_exact_versions_only():
    from asapmpi import _core
    from asapmpi.errors import ConfigError

    _, win = _window(_core.MessageWindow)
    with win:
        win.release(0)
        with pytest.raises(ConfigError, match="exact versions only"):
            win.await_(1, 1.0, 1)
        # every reader's receive waits for its version: none may be left out
        with pytest.raises(ConfigError, match="skip_released must be 0"):
            win.deliver(np.zeros(N), 1, 1.0, skip_released=1)


def test_shared_window_reads_the_writers_own_slot_in_place():
    from asapmpi import _core
    from asapmpi._core.layout import HEADER_BYTES

    layout = _core.Layout(1, 1, 1, N * 8, 0, 0, True)
    segment = bytearray(layout.segment_bytes)
    _, win = _window(_core.SharedWindow, outbox=True, outboxes=(segment, [segment]))
    with win:
        update = np.linspace(0, 1, N)
        win.put(update, 1, 1)
        # the update sits in this rank's own segment: no copy into a reader's slot
        payload = np.frombuffer(segment, np.float64, N, layout.segment_payload(0))
        assert layout.segment_payload(0) == HEADER_BYTES
        np.testing.assert_array_equal(payload, update)
        win.wait_notifies(1, 10.0)
        _reduce_own(win, 1, update)


def test_message_window_sends_through_the_verbs_and_refuses_put():
    from asapmpi import _core
    from asapmpi.errors import ConfigError

    _, win = _window(_core.MessageWindow)
    with win:
        update = np.full(N, 3.0)
        win.release(0)                  # posts the receives of version 1
        win.deliver(update, 1, 10.0)
        win.await_(1, 10.0)
        _reduce_own(win, 1, update)
        with pytest.raises(ConfigError, match="does not put"):
            win.put(update, 2)


def test_a_message_window_sends_a_whole_step_from_the_buffer_and_holds_it_meanwhile():
    # copy=False (NOTIFY-ACK's step()): no copy of the update, so the caller's buffer
    # is held (exported) until the sends complete: a bytearray cannot be resized, nor
    # its memory freed, while MPI may still read it
    from asapmpi import _core

    _, win = _window(_core.MessageWindow)
    with win:
        raw = bytearray(np.full(N, 5.0).tobytes())
        win.release(0)
        win.deliver(raw, 1, 10.0, copy=False)
        with pytest.raises(BufferError):
            raw.extend(b"x")
        win.await_(1, 10.0)
        raw.extend(b"x")                        # released once the sends completed
        del raw[-1:]
        _reduce_own(win, 1, np.frombuffer(raw, np.float64))
        # sent and not waited for: free()'s drain completes the send, then lets go
        win.release(1)
        win.deliver(raw, 2, 10.0, copy=False)
    raw.extend(b"x")


def test_each_window_names_its_transport():
    from asapmpi import _core

    segment = bytearray(_core.Layout(1, 1, 1, N * 8, 0, 0, True).segment_bytes)
    for cls, name, options in [(_core.PutWindow, "put", {}),
                               (_core.SharedWindow, "shared",
                                {"outbox": True, "outboxes": (segment, [segment])}),
                               (_core.MessageWindow, "messages", {}),
                               (_core.MailboxWindow, "mailbox", {}),
                               (_core.NewestWindow, "newest", {})]:
        _, win = _window(cls, **options)
        with win:
            assert win.transport == name
            assert isinstance(win, _core.SlotWindow)


@pytest.mark.parametrize("make, message", [
    (lambda c: _window(c.SlotWindow), "PutWindow, SharedWindow"),
    (lambda c: _window(c.PutWindow, outbox=True), "create a SharedWindow"),
    (lambda c: _window(c.SharedWindow), "needs an outbox layout"),
    (lambda c: _window(c.SharedWindow, outbox=True), r"outboxes=\(own"),
    (lambda c: _window(c.MailboxWindow, depth=2, retain=2), "retain < depth"),
    (lambda c: _window(c.NewestWindow, depth=2), "needs depth 1"),
])
def test_a_window_refuses_options_of_another_transport_before_communicating(make, message):
    from asapmpi import _core
    from asapmpi.errors import ConfigError

    with pytest.raises((ConfigError, TypeError), match=message):
        make(_core)


def test_mailbox_windows_refuse_torn_writes_and_a_separate_notify():
    from types import SimpleNamespace

    from asapmpi import _core
    from asapmpi.errors import ConfigError
    from asapmpi.testing.faults import torn_write

    for cls in (_core.MailboxWindow, _core.NewestWindow):
        _, win = _window(cls)
        with win:
            with pytest.raises(ValueError, match="no torn writes"):
                torn_write(SimpleNamespace(window=win), np.zeros(N), 1)
            with pytest.raises(ConfigError, match="notifies with each put"):
                win.notify(1)


def test_windows_whose_slots_move_refuse_a_fixed_slot_view():
    from asapmpi import _core
    from asapmpi.errors import ConfigError

    segment = bytearray(_core.Layout(1, 1, 1, N * 8, 0, 0, True).segment_bytes)
    for cls, options, message in [
            (_core.NewestWindow, {}, "read it with reduce"),
            (_core.SharedWindow, {"outbox": True, "outboxes": (segment, [segment])},
             "own shared-memory segment")]:
        _, win = _window(cls, **options)
        with win:
            with pytest.raises(ConfigError, match=message):
                win.payload(0, 1)


def test_updates_larger_than_one_message_refuse_messages_and_auto_takes_words():
    from mpi4py import MPI

    import asapmpi
    from asapmpi.errors import ConfigError
    from asapmpi.exchange.choice import choose_transport
    from asapmpi.sync import policy
    from asapmpi.transports.channels import MESSAGE_LIMIT

    # never touched: the check comes before anything reads the buffer
    huge = np.zeros(MESSAGE_LIMIT // 8 + 1)
    with pytest.raises(ConfigError, match="transport='messages' sends each update as one "
                                          "message"):
        asapmpi.Exchange(huge, graph="ring", transport="messages", comm=MPI.COMM_SELF)
    chosen, report = choose_transport("auto", policy("notify_ack"), MPI.COMM_SELF, None,
                                      ["h"], 10.0, MESSAGE_LIMIT + 1)
    assert chosen in ("put", "shared") and "more than one message carries" in report["reason"]


def test_a_wait_backs_off_with_the_windows_timer_slack_and_leaves_the_threads():
    import ctypes
    import os

    from asapmpi import _core
    from asapmpi.errors import ConfigError, NeighbourTimeoutError

    with pytest.raises(ConfigError, match="poll_slack_ns must be >= 0"):
        _window(_core.PutWindow, poll_slack_ns=-1)
    libc = ctypes.CDLL(None)
    before = libc.prctl(30, 0, 0, 0, 0)         # PR_GET_TIMERSLACK
    _, win = _window(_core.PutWindow, poll_slack_ns=1000)
    with win:
        assert win.poll_slack_ns == 1000
        # nothing is ever notified: the wait yields, sleeps, and times out
        with pytest.raises(NeighbourTimeoutError):
            win.wait_notifies(1, 0.05)
    if os.path.exists("/proc/self/timerslack_ns"):
        assert libc.prctl(30, 0, 0, 0, 0) == before


def test_the_trace_row_of_a_reduce_names_the_versions_it_used():
    from asapmpi import _core
    from asapmpi.errors import ConfigError

    _, win = _window(_core.PutWindow)
    with win:
        win.put(np.full(N, 3.0), 4, 4)
        win.wait_notifies(4, 10.0)
        _reduce_own(win, 4, np.full(N, 3.0))
        row = np.full(2, -1, dtype=np.int64)
        win.record_reduced(row, 9)
        assert row.tolist() == [9, 4]
        # an input that was not used (stale for version 5) is recorded as 0
        out = np.ones(N)
        assert win.reduce(out, 1.0, np.array([0.0]), 5, 5, 5, renormalize=True) == 0
        win.record_reduced(row, 10)
        assert row.tolist() == [10, 0]
        with pytest.raises(ConfigError, match="has 2 cells"):
            win.record_reduced(np.zeros(3, dtype=np.int64), 1)


def test_double_buffered_slot_stops_verifying_before_the_reduce_rewrites_it():
    # Issue 15, point 4: a double-buffered Exchange reduces into the own slot that
    # still holds version k - 1 (acknowledged by every reader).  A reader that ignores
    # acks, or reads late, must find it TORN from then on, not header == footer == k-1
    # over bytes that change under it.
    from asapmpi import _core

    layout = _core.Layout(1, 1, 2, N * 8, 0, 0, True)
    segment = bytearray(layout.segment_bytes)
    _, win = _window(_core.SharedWindow, depth=2, outbox=True,
                     outboxes=(segment, [segment]), double_buffered=True,
                     waits_for_release=True)
    slots = [np.frombuffer(segment, np.float64, N, layout.segment_payload(s))
             for s in (0, 1)]

    def send_and_wait(k):
        # version k was computed in slot k % 2; the reduce of step k writes the other
        win.deliver(slots[k % 2], k, 10.0)
        win.await_(k, 10.0)

    def reduce_and_release(k):
        win.reduce(slots[(k + 1) % 2], 0.5, np.array([0.5]), k, k, k, require_all=True,
                   own=slots[k % 2])
        win.release(k)

    with win:
        slots[1][:] = 1.0
        send_and_wait(1)
        reduce_and_release(1)
        send_and_wait(2)
        # slot 1 still holds version 1, and the reduce of step 2 rewrites it next
        late = np.zeros(N)
        assert win.reduce(late, 0.5, np.array([0.5]), 1, 1, 1, seqlock=True) == 0
        assert win.last_status() == [_core.TORN]
        reduce_and_release(2)
        # once version 3 is sent from it, the slot verifies again
        send_and_wait(3)
        out = np.zeros(N)
        win.reduce(out, 0.0, np.array([1.0]), 3, 3, 3, require_all=True)
        np.testing.assert_array_equal(out, slots[1])


def test_a_promised_input_that_fails_its_checksum_raises_and_leaves_the_buffer():
    # require_all (NOTIFY-ACK, Hop's standard mode): an input whose payload fails its
    # checksum after the pass must raise ProtocolError with the buffer as it was, not
    # be left out of a sum whose weights then add up to 0.5
    from asapmpi import _core
    from asapmpi._core.layout import HEADER_BYTES
    from asapmpi.errors import ProtocolError
    from asapmpi.testing.faults import store_word

    layout, win = _window(_core.PutWindow)
    with win:
        win.put(np.full(N, 2.0), 1, 1, checksum=True)
        win.wait_notifies(1, 10.0)
        # a payload torn under an unchanged header and footer (only the checksum sees it)
        store_word(win, layout.slot_disp(0) + HEADER_BYTES + 8 * 5, 12345)
        out = np.ones(N)
        with pytest.raises(ProtocolError, match="not usable"):
            win.reduce(out, 0.5, np.array([0.5]), 1, 1, 1, checksum=True, require_all=True)
        np.testing.assert_array_equal(out, np.ones(N))
        assert win.last_status() == [_core.TORN]
