"""Writers that break the slot protocol on purpose, for the tests that show a reader
catches them.  Built on the windows' public calls: the core has no fault hooks.

A torn write is what a writer that stalls or dies mid-write leaves: the header of the
new version and part of its payload, no footer, no notify.  A stored word is a payload
corrupted, or a version faked, behind the protocol's back.
"""
from __future__ import annotations

import numpy as np

from .._core.layout import HEADER_BYTES

#: write_words' most words per call
_WORDS_PER_CALL = 6


def store_word(win, disp: int, value: int) -> None:
    """Store `value` into the int64 word at `disp` of this rank's own window, bypassing
    the protocol (one atomic MPI_Fetch_and_op REPLACE on its own window: windows with
    RMA only)."""
    win.write_words(win.rank, disp, [value])


def torn_write(ex, buf, version: int, payload_words: int = _WORDS_PER_CALL,
               iteration: int = 0) -> None:
    """Begin writing `buf` as `version` to every out-neighbour of `ex` (an Exchange on
    transport 'put' or 'shared') and stop part-way: the header and the first
    `payload_words` 8-byte words of the payload, no footer, no notify.  (A few words:
    each is one atomic write and flush, which on UCX over TCP costs a round trip.)"""
    win = ex.window
    payload = np.ascontiguousarray(buf).view(np.uint8)
    if payload.nbytes != win.nbytes or win.nbytes % 8:
        raise ValueError(f"buf must have the window's {win.nbytes} bytes, in whole words")
    words = payload.view(np.int64)[:payload_words]
    header = [version, iteration, win.rank, win.nbytes]
    slot = (version % win.depth) * win.slot_stride
    if win.transport == "shared":
        # the writer's own slot in its segment, which its readers map
        own = np.frombuffer(ex._segments.own, dtype=np.int64)
        first = slot // 8
        own[first + 1:first + 4] = header[1:]
        own[first] = version
        own[first + HEADER_BYTES // 8:first + HEADER_BYTES // 8 + len(words)] = words
        return
    if win.transport != "put":
        raise ValueError(f"a {win.transport!r} window sends whole versions: no torn "
                         f"writes; use transport 'put' or 'shared'")
    for target, first in zip(win.out_ranks, win.out_slot_offsets):
        win.write_words(target, first + slot + 8, header[1:])
        win.write_words(target, first + slot, [version])
        body = first + slot + HEADER_BYTES
        for k in range(0, len(words), _WORDS_PER_CALL):
            win.write_words(target, body + 8 * k, words[k:k + _WORDS_PER_CALL])


def corrupt_taken(win, versions, in_index: int, offset: int, value: int) -> None:
    """Overwrite the int64 at `offset` bytes from the payload of in-neighbour
    `in_index`'s model that push gossip's take() handed out (`versions`, what take()
    returned; a negative offset reaches the header), as a torn or corrupted delivery
    would leave it.  Through the address the window's read_begin() gives for a copy
    made elsewhere: the core has no fault hook."""
    import ctypes

    addresses = win.read_begin(np.asarray(versions, dtype=np.int64), 0, 0, exact_each=True)
    win.read_end()
    address = int(addresses[in_index])
    if not address:
        raise ValueError(f"in-neighbour {in_index} has no taken model")
    ctypes.c_int64.from_address(address + offset).value = value
