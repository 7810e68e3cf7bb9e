"""The reduce of a device buffer on the device (issue 30, items 2 and 4).

For a policy whose reduce ends its receive (Policy.reduces_last) the Exchange hands the
policy a DeviceReduce in place of its window.  Its reduce() copies each in-neighbour's
slot to the device and sums there, in this order, as a seqlock reader does:

    read_begin   the window's checks before any payload is read (footer, header, the
                 version wanted; require_all refuses here, nothing touched)
    copy         each usable slot's payload -> its device stage (one per in-neighbour,
                 made once), then wait for the copies
    read_end     the barrier, then each copied slot's header again: a slot rewritten
                 during the copy is dropped (counted torn) and its copy never used
    sum          device = w_self * device + sum of w_i * stage_i over the inputs kept
                 (renormalized when the policy asks), in the device's stream order

So the device sees only versions verified around their copy, and a refusal leaves the
device buffer as it was.  With checksum= (a checksum is computed on the host) the reduce
runs on the host buffer and the result is copied to the device.  Every other window
method is the window's own."""
from __future__ import annotations

import numpy as np

from ..errors import ProtocolError


class DeviceReduce:
    """A window as a policy sees it when the Exchange's buffer lives on a device."""

    def __init__(self, window, stager):
        self._win = window
        self._stager = stager
        self._ops = stager.ops
        self._versions = np.zeros(window.n_in, dtype=np.int64)
        self._in = list(window.in_ranks)
        #: reduces made on the device, and on the host (checksum=) then copied over
        self.device_reduces = 0
        self.host_reduces = 0
        #: where a 16-bit buffer's device reduce also leaves its float32 sums (a device
        #: array the ops accepted: Exchange.keep_float32_mix), and how many did
        self.wide = None
        self.wide_count = 0

    def __getattr__(self, name):
        return getattr(self._win, name)

    def reduce(self, buf, w_self, weights, expected, min_version, max_version,
               seqlock=False, checksum=False, renormalize=False, require_all=False,
               only_notified=False, own=None):
        """As SlotWindow.reduce, into the device buffer (`buf` is its host staging)."""
        if checksum or own is not None:
            return self._on_host(self._win.reduce(
                buf, w_self, weights, expected, min_version, max_version, seqlock=seqlock,
                checksum=checksum, renormalize=renormalize, require_all=require_all,
                only_notified=only_notified, own=own))
        self._versions[:] = expected
        return self._on_device(w_self, weights, min_version, max_version, False, seqlock,
                               renormalize, require_all, only_notified, expected)

    def reduce_versions(self, buf, w_self, weights, versions, checksum=False,
                        renormalize=True):
        """As SlotWindow.reduce_versions, into the device buffer."""
        if checksum:
            return self._on_host(self._win.reduce_versions(
                buf, w_self, weights, versions, checksum=checksum, renormalize=renormalize))
        self._versions[:] = versions
        return self._on_device(w_self, weights, 0, 0, True, True, renormalize, False,
                               False, None)

    def _on_host(self, reduced: int) -> int:
        self._ops.to_device()
        self._stager.to_device_copies += 1
        self.host_reduces += 1
        return reduced

    def _on_device(self, w_self, weights, min_version, max_version, exact_each, droppable,
                   renormalize, require_all, only_notified, expected) -> int:
        addresses = self._win.read_begin(self._versions, min_version, max_version,
                                         exact_each, require_all, only_notified)
        used = [i for i in range(len(addresses)) if addresses[i]]
        for i in used:
            self._ops.slot_to_device(i, int(addresses[i]))
        self._ops.wait_slots()
        dropped = self._win.read_end()
        if dropped and (require_all or not droppable):
            ranks = [self._in[i] for i in dropped]
            raise ProtocolError(f"rank {self._win.rank}: the slot(s) of rank(s) {ranks} "
                                f"changed while version {expected} was copied to the "
                                f"device; a writer did not wait for its ack (the device "
                                f"buffer is unchanged)")
        kept = [i for i in used if i not in dropped]
        scale = 1.0
        if renormalize:
            used_weight = w_self + sum(float(weights[i]) for i in kept)
            if used_weight > 0:
                scale = (w_self + float(np.sum(weights))) / used_weight
        self._ops.weighted_sum(w_self * scale, [(i, float(weights[i]) * scale) for i in kept],
                               wide=self.wide)
        self.device_reduces += 1
        if self.wide is not None:
            self.wide_count += 1
        return len(kept)
