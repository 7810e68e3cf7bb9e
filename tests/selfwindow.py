"""A window of one rank that is its own in- and out-neighbour (MPI.COMM_SELF): every
channel moves an update into its own slot and writes words into its own window, so a
channel's verbs, its words and the verified reduce run end to end in one process
(tests/channels/test_windows.py, tests/words/test_words.py)."""
import numpy as np

#: float64 elements of a slot
N = 64

#: window class -> the kind of words it carries (asapmpi/_core/words.pxi)
WORDS_KIND = {"PutWindow": "OneSidedWords", "SharedWindow": "OneSidedWords",
              "MessageWindow": "Words", "MailboxWindow": "MessageWords",
              "NewestWindow": "MessageWords", "PushWindow": "Words"}


#: the shared channel's segments made here, kept for the process's life (a window
#: reads and writes its segment until free(), and nothing else may hold it)
_SEGMENTS = []


def window(cls, depth=1, outbox=False, n_user=0, segment=False, **options):
    """(layout, window of class `cls`) on MPI.COMM_SELF, slots of N float64 elements,
    `n_user` user words.  With `segment=True` (a SharedWindow's) an outbox layout and
    its segment, which is its in-neighbour's too."""
    from mpi4py import MPI

    from asapmpi import _core

    layout = _core.Layout(1, 1, depth, N * 8, n_user, 0, outbox or segment)
    if segment:
        memory = bytearray(layout.segment_bytes)
        _SEGMENTS.append(memory)
        options["outboxes"] = (memory, [memory])
    return layout, cls(MPI.COMM_SELF, layout, [0], [0], [layout.slot_disp(0)],
                       [layout.notify_disp(0)], [layout.ack_disp(0)], "float64",
                       flush_timeout=10.0, **options)


def reduce_own(win, version, update):
    """0.5 * ones + 0.5 * (the slot of `version`), checked CONSISTENT."""
    from asapmpi import _core

    out = np.ones(N)
    assert win.reduce(out, 0.5, np.array([0.5]), version, version, version,
                      require_all=True) == 1
    assert win.last_status() == [_core.CONSISTENT]
    np.testing.assert_array_equal(out, 0.5 + 0.5 * update)
