"""The words of each channel (asapmpi/_core/words.pxi): the notify, ack and user
counters that every wait reads, written by MPI atomics (OneSidedWords: put, shared), by
messages (MessageWords: the mailboxes) or not remotely at all (Words: the message engine,
whose messages are its notifies and acks).  Each test runs a window of one rank that is
its own neighbour (tests/selfwindow.py), for every channel that carries the kind of
word it tests (selfwindow.WORDS_KIND, which tests/channels/test_channels.py checks
against every channel's row).
"""
import numpy as np
import pytest
from selfwindow import WORDS_KIND, N, reduce_own, window

#: the channels whose words are MPI atomics into the target's window
ONE_SIDED = sorted(k for k, v in WORDS_KIND.items() if v == "OneSidedWords")


def _window(name, **options):
    from asapmpi import _core

    return window(getattr(_core, name), segment=name == "SharedWindow", **options)


@pytest.mark.parametrize("name", ONE_SIDED)
def test_one_sided_words_are_atomic_read_modify_writes_of_the_target_s_word(name):
    from asapmpi.errors import ConfigError

    layout, win = _window(name, n_user=3)
    a, b, c = (layout.user_disp(k) for k in range(3))
    with win:
        # each call returns the word's old value and leaves the new one complete
        assert win.accumulate_word(0, a, 5) == 0                    # replace
        assert win.accumulate_word(0, a, 3, op="sum") == 5
        assert win.accumulate_word(0, a, 2, op="max") == 8          # max(8, 2) stays 8
        assert win.accumulate_word(0, a, 11, op="max") == 8
        assert win.fetch_word(0, a) == 11 and win.local_word(a) == 11
        # (a serial test: MPICH's; not on Open MPI 4.1's shared memory, where
        # compare_and_swap_word's docstring says why)
        assert win.compare_and_swap_word(0, b, 1, 7) == 0           # 0 != 1: unchanged
        assert win.compare_and_swap_word(0, b, 0, 7) == 0           # swapped
        assert win.local_word(b) == 7
        win.write_words(0, b, [21, 22])
        np.testing.assert_array_equal(win.fetch_words(0, a, 3), [11, 21, 22])
        with pytest.raises(ConfigError, match="op must be"):
            win.accumulate_word(0, c, 1, op="min")
        with pytest.raises(ConfigError, match="count must be at least 1"):
            win.fetch_words(0, a, 0)


@pytest.mark.parametrize("name", ["PutWindow", "MailboxWindow", "NewestWindow"])
def test_written_words_arrive_in_order_and_only_in_the_user_words(name):
    from asapmpi import _core
    from asapmpi.errors import ConfigError, ProtocolError

    layout, win = window(getattr(_core, name), n_user=3)
    with win:
        for s in (1, 2):
            win.write_words(0, layout.user_disp(0), [10 * s, 20 * s, s])
            win.wait_word(layout.user_disp(2), s, 5.0)      # the last word: the stamp
            assert [win.local_word(layout.user_disp(k)) for k in range(3)] == [10 * s, 20 * s, s]
        with pytest.raises(ConfigError, match="1 to 6 words"):
            win.write_words(0, layout.user_disp(0), list(range(7)))
        if name != "PutWindow":
            # a message past the user words is refused where it lands
            win.write_words(0, layout.user_disp(2), [1, 2])
            with pytest.raises(ProtocolError, match="outside this window's 3 user words"):
                win.wait_word(layout.user_disp(0), 99, 5.0)


def test_a_mailbox_without_user_words_leaves_word_messages_to_the_drain():
    from asapmpi import _core

    # Hop's and BSP's mailboxes have no user words: they post no word receive and
    # test none in their pumps; a word sent to them anyway is received at free()
    layout, win = window(_core.MailboxWindow, depth=2)
    disp = layout.ack_disp(0)
    before = win.local_word(disp)
    win.write_words(0, disp, [41])
    win.wait_word(disp, before, 1.0)                # pumps once
    assert win.local_word(disp) == before
    win.free()                                      # returns: the drain took it


def test_message_transports_have_no_mpi_window_and_refuse_one_sided_words():
    from mpi4py import MPI

    from asapmpi import _core
    from asapmpi.errors import ConfigError

    # the message transports' memory is this process's own (no MPI window, so no
    # window progress in every MPI call); one-sided word operations say what to use
    for cls in (_core.MessageWindow, _core.MailboxWindow, _core.NewestWindow):
        layout, win = window(cls)
        with win:
            assert not win.rma
            assert "no MPI window" in win.memory_model
            # words of its own are read locally
            assert win.fetch_word(0, layout.ack_disp(0)) == 0
            assert win.fetch_words(0, layout.ack_disp(0), 1).tolist() == [0]
            disp = layout.ack_disp(0)
            for call, args in ((win.accumulate_word, (0, disp, 1)),
                               (win.compare_and_swap_word, (0, disp, 0, 1))):
                with pytest.raises(ConfigError, match=r"needs an MPI window.*transport='put'"):
                    call(*args)
    layout, win = window(_core.PutWindow)
    with win:
        assert win.rma and win.memory_model == "MPI_WIN_UNIFIED"
    assert MPI.Is_initialized()


def test_one_pump_takes_every_message_that_arrived_not_one_per_call():
    from asapmpi import _core

    # four word messages and an update are all there before one pump (fetch_word of
    # an own word pumps exactly once): it takes every one, not the first only (an MPI
    # may complete one message per progress call)
    layout, win = window(_core.NewestWindow, n_user=4)
    with win:
        for k in range(4):
            win.write_words(0, layout.user_disp(k), [k + 1])
        win.put(np.full(N, 7.0), 1, 1)
        assert win.fetch_word(0, layout.user_disp(3)) == 4
        assert [win.local_word(layout.user_disp(k)) for k in range(4)] == [1, 2, 3, 4]
        assert win.local_word(layout.notify_disp(0)) == 1
        reduce_own(win, 1, np.full(N, 7.0))


@pytest.mark.parametrize("name", ["PutWindow", "MailboxWindow", "NewestWindow"])
def test_wait_words_waits_for_every_word_and_names_the_writers_that_lag(name):
    from asapmpi import _core
    from asapmpi.errors import ConfigError, NeighbourTimeoutError

    layout, win = window(getattr(_core, name), n_user=2)
    disps = [layout.user_disp(0), layout.user_disp(1)]
    with win:
        win.write_words(0, disps[0], [3])
        win.write_words(0, disps[1], [5])
        win.wait_words(disps, 3, 5.0, [0, 0])
        with pytest.raises(NeighbourTimeoutError) as caught:
            win.wait_words(disps, 4, 0.05, [0, 7])      # only word 0 lags
        assert caught.value.ranks == [0]
        with pytest.raises(ConfigError, match="1 to 2 words"):
            win.wait_words(disps + disps, 1, 1.0, [0, 0, 0, 0])


@pytest.mark.parametrize("name", ["PutWindow", "MailboxWindow", "MessageWindow"])
def test_a_board_row_is_published_into_the_own_copy_and_checked_before_any_write(name):
    # a window of one rank is its own only reader: publish_word writes its own copy
    # (one-sided: an accumulate to itself; by messages: a store), local_words and the
    # peek read it; every misuse is refused before anything is written
    from asapmpi import _core
    from asapmpi.errors import ConfigError

    layout, win = window(getattr(_core, name), n_user=4)
    row = layout.user_disp(1)
    with win:
        with pytest.raises(ConfigError, match="needs a row: call set_row"):
            win.publish_word(0, 1)
        with pytest.raises(ConfigError, match="1 to 6 words"):
            win.set_row(row, 7, [0], "test board")
        with pytest.raises(ConfigError, match="in the user words"):
            win.set_row(layout.user_disp(2), 3, [0], "test board")
        with pytest.raises(ConfigError, match="reader 1 is outside"):
            win.set_row(row, 2, [0, 1], "test board")
        win.set_row(row, 2, [0], "test board")
        with pytest.raises(ConfigError, match="once"):
            win.set_row(row, 2, [0], "test board")
        with pytest.raises(ConfigError, match="word 2 is outside the row's 2 words"):
            win.publish_word(2, 1)
        peek = win.word_peek(row + 8, 1, 1)
        peek.threshold = 9
        if name == "MessageWindow":
            # NOTIFY-ACK's message engine has no words that reach another rank
            with pytest.raises(ConfigError, match="put window's or a mailbox's"):
                win.publish_word(1, 9)
            return
        assert not peek.seen()
        win.publish_word(1, 9)
        win.publish_word(0, 4, wait=False)
        assert win.local_words(row, 2).tolist() == [4, 9]
        assert win.fetch_words(0, row, 2).tolist() == [4, 9]
        assert peek.seen()
    assert not peek.seen()          # freed: nothing to read
