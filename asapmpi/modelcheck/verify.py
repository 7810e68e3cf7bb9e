"""The verified reduce as the models see it (SlotWindow._reduce in slotwin.pyx).

A reduce begins by loading each input's footer and header (F, then H): the input is
usable when H == F == the expected version.  It then reads the payload in one pass and
finally loads the header again; a header that moved is a torn read (ordered mode:
ProtocolError; seqlock mode: the input is dropped and the reduce redone without it).
The models make the beginning and the end two actions, so that anything may happen in
between, and record per input what the beginning saw in a "use" cell: (expected, F,
half a, half b).  The payload as loaded at the beginning, compared with the payload at
the end, stands for the whole pass: exact while nobody writes the slot during it (the
overlap property); otherwise a payload that changed while the header did not is taken as
read torn, which some timing of the pass does read.
"""
from __future__ import annotations

from typing import Optional, Tuple

from .rma import Slot


def begin(state: tuple, s: list, slot: Slot, use: int, expected: int) -> Tuple[bool, str]:
    """Load the input's footer and header.  If usable, record the read in cell `use`
    of the next state `s`; returns (usable, why not)."""
    f, h, a, b = state[slot.footer], state[slot.header], state[slot.half_a], state[slot.half_b]
    if h != f:
        return False, f"torn (header {h}, footer {f})"
    if f != expected:
        return False, f"{'stale' if f < expected else 'ahead'} (version {f})"
    s[use] = (expected, f, a, b)
    return True, ""


def end(state: tuple, s: list, slot: Slot, use: int, src: str, reader: int
        ) -> Optional[Tuple[bool, str]]:
    """Load the header again and clear cell `use`.  None if the input was read whole;
    else (detected, what): detected when the header moved (the reduce notices: a
    ProtocolError in ordered mode, a dropped input in seqlock mode), not detected when
    header and footer agreed but the payload read was not that version (silently
    reduced)."""
    expected, f, a, b = state[use]
    s[use] = ()
    if state[slot.header] != f:
        return True, (f"rank {reader}: the header of {src}'s slot moved from {f} to "
                      f"{state[slot.header]} while version {expected} was read")
    now = (state[slot.half_a], state[slot.half_b])
    if (a, b) != (expected, expected) or now != (a, b):
        return False, (f"rank {reader} reduced {src}'s input as version {expected} "
                       f"(header == footer == {expected}) but its payload held versions "
                       f"{a}/{b} when the pass began and {now[0]}/{now[1]} when it ended: "
                       f"a torn payload, silently reduced")
    return None
