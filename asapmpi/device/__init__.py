"""Device (GPU) buffers for an Exchange.

An Exchange given a CUDA array (a torch tensor or any object with
``__cuda_array_interface__``) runs the staged channel: before each send the device
values go to a pinned host buffer on a side stream, the host channel the policy resolved
moves and verifies them exactly as for a host buffer, and after each receive the reduced
values go back to the device in the device's stream order, or, for the policies whose
reduce ends their receive, each verified slot is copied to the device and reduced there
(reduce.py).  buffers.py recognises device
memory (no framework imported), ops.py is what a framework provides to copy it
(asapmpi.torch.device for torch), staging.py the order of the copies around a step.
"""
from .buffers import DeviceBuffer, device_buffer
from .ops import DeviceOps, ops_for
from .reduce import DeviceReduce
from .staging import Stager

__all__ = ["DeviceBuffer", "DeviceOps", "DeviceReduce", "Stager", "device_buffer", "ops_for"]
