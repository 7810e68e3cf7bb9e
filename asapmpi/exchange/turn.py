"""One thread at a time in an Exchange's calls.

An Exchange belongs to one thread: its steps call MPI, which asapmpi initializes for
one thread at a time, and two steps at once would send versions out of order (the
neighbours then find torn or unexpected versions and blame the protocol).  Its step(),
send(), receive() and join() note the thread inside (Exchange._inside, its
threading.get_ident()) and put back what was there on the way out: a second thread that
calls in while another is inside is refused in one line before it touches anything, and
the same thread may call in again (join's shadow steps are steps).  No lock: an RLock
taken without waiting and released cost about 3% of a step at 8 ranks on 2 cores
(hop:backup=1, 64 KB: 134.9 against 130.6 us, medians of 5 alternated runs).  Two threads
calling in at the same instant can both pass the check between its read and its write
(the GIL switches between bytecodes); the check is a diagnosis of a misuse, not a lock.
"""
from __future__ import annotations

import threading

from ..errors import ConfigError


def other_thread(what: str) -> ConfigError:
    """The refusal of Exchange.`what`() called while another thread is inside."""
    me = threading.current_thread().name
    return ConfigError(f"Exchange.{what}() called from thread {me!r} while another thread "
                       f"is inside the same Exchange (its step, send, receive or join): an "
                       f"Exchange belongs to one thread; call it from one thread at a "
                       f"time (or give each thread its own Exchange)")
