"""The staged channel's order of copies around a step (issue 30, item 2).

    send:     to_host (device -> pinned host, side stream), wait_host, then the policy
              sends the host buffer over whichever host channel it resolved
    receive:  the policy waits and reduces into the host buffer (verified: header,
              footer, checksum, exactly as for a host buffer), then to_device (pinned
              host -> device, in the device's stream order: later device work sees it);
              or, for a policy whose reduce ends its receive, the reduce copies each
              verified slot to the device and sums there (asapmpi.device.reduce), and
              nothing is copied back

The host buffer changes only in the policy's send and receive, and both come after the
next to_host's wait_host, which the ops order after the last to_device: so a copy to the
device never reads a host buffer being rewritten.  Nothing is allocated per step."""
from __future__ import annotations

import time

from .buffers import DeviceBuffer
from .ops import ops_for


class Stager:
    """Stages one device buffer through a pinned host buffer (`host`)."""

    def __init__(self, device: DeviceBuffer):
        self.device = device
        self.ops = ops_for(device)
        #: the pinned host array the Exchange's host channel sends from and reduces into
        self.host = self.ops.host_buffer()
        #: copies made each way, and seconds blocked waiting for the device -> host ones
        self.to_host_copies = 0
        self.to_device_copies = 0
        self.wait_host_seconds = 0.0
        #: the reduce runs on the device (asapmpi.device.reduce) and writes the device
        #: array itself: nothing to copy back after a receive
        self.reduce_on_device = False
        self._closed = False

    def before_send(self) -> None:
        """Bring the device array's values into the host buffer (the version to send)."""
        self.ops.to_host()
        t0 = time.perf_counter()
        self.ops.wait_host()
        self.wait_host_seconds += time.perf_counter() - t0
        self.to_host_copies += 1

    def after_receive(self) -> None:
        """Queue the reduced host buffer back to the device array (nothing when the
        reduce ran on the device)."""
        if not self.reduce_on_device:
            self.ops.to_device()
            self.to_device_copies += 1

    def close(self) -> None:
        """Finish the copy in flight and release the ops.  Safe to call twice."""
        if not self._closed:
            self._closed = True
            self.ops.wait_device()
            self.ops.close()

    def report(self) -> dict:
        """The staging path and its counts, for Exchange.transport_report."""
        return {"device": self.device.device, "ops": self.ops.name,
                "path": "staged through pinned host memory",
                "reduce": "device" if self.reduce_on_device else "host",
                "to_host_copies": self.to_host_copies,
                "to_device_copies": self.to_device_copies,
                "wait_host_seconds": round(self.wait_host_seconds, 6), **self.ops.report()}
