"""Device buffers (asapmpi.device): how an Exchange recognises them, and the staged channel
run end to end under mpiexec with host memory standing in for the device
(asapmpi.testing.device), so that CI tests the code path a GPU takes: the copies each way,
their order around the host channel's verified reduce, and results equal to a host
buffer's.  The same scenarios run on a GPU in dev/gpu-check.sh.

Each scenario's body is here, beside its test (`test_device:NAME`)."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from asapmpi.device import device_buffer, ops_for
from asapmpi.errors import ConfigError
from asapmpi.testing.device import StandIn


class CudaArrayLike:
    """An object that says it is CUDA memory through __cuda_array_interface__ only."""

    __module__ = "someframework.arrays"

    def __init__(self, typestr="<f4", shape=(4, 3), strides=None, readonly=False):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr,
                                         "data": (1 << 20, readonly), "strides": strides,
                                         "version": 3}


def test_host_buffers_are_not_device_buffers():
    assert device_buffer(np.zeros(3)) is None
    assert device_buffer(bytearray(16)) is None


def test_a_cuda_array_interface_is_a_device_buffer_with_its_dtype_and_size():
    dev = device_buffer(CudaArrayLike())
    assert (dev.framework, dev.dtype, dev.count, dev.nbytes) == ("someframework", "float32",
                                                                 12, 48)
    assert device_buffer(CudaArrayLike(strides=(12, 4))).count == 12   # C strides given


@pytest.mark.parametrize("kwargs, match", [
    ({"typestr": "<i2"}, "must be float32, float64, bfloat16 or float16, got <i2"),
    ({"strides": (4, 16)}, "must be contiguous"),
    ({"readonly": True}, "read-only"),
    ({"shape": (0,)}, "empty"),
])
def test_device_memory_the_exchange_cannot_take_is_one_line(kwargs, match):
    with pytest.raises(ConfigError, match=match) as err:
        device_buffer(CudaArrayLike(**kwargs))
    assert "\n" not in str(err.value)


def test_a_framework_without_ops_is_named():
    dev = device_buffer(CudaArrayLike())
    with pytest.raises(ConfigError, match="not of someframework"):
        ops_for(dev)


def test_torch_cpu_tensors_are_host_memory_and_cuda_ones_need_a_gpu():
    torch = pytest.importorskip("torch")
    assert device_buffer(torch.zeros(3)) is None
    if not torch.cuda.is_available():
        with pytest.raises((RuntimeError, AssertionError)):
            torch.zeros(3, device="cuda")       # torch's own refusal: nothing to stage


def test_the_stand_in_defers_copies_as_a_stream_does():
    # what makes the end-to-end tests meaningful: without wait_host the host buffer
    # is stale, and a host buffer changed under a queued copy reaches the device
    arr = StandIn(np.arange(4.0))
    ops = ops_for(device_buffer(arr))
    host = ops.host_buffer()
    ops.to_host()
    assert host.tolist() == [0, 0, 0, 0]
    ops.wait_host()
    assert host.tolist() == [0, 1, 2, 3]
    host[...] = 7
    ops.to_device()
    host[...] = 9                       # changed before the copy ran
    assert arr.values().tolist() == [9, 9, 9, 9]


# ---------------------------------------------------------------- multi-rank


@pytest.mark.mpi
@pytest.mark.parametrize("sync", ["notify_ack", "bsp", "allreduce"])
@pytest.mark.parametrize("on_device", [True, False], ids=["device-reduce", "host-reduce"])
def test_a_staged_buffer_ends_equal_to_a_host_buffer(sync, on_device):
    from mpilaunch import run

    res = run("test_device:staged_against_host", 3, "shm", timeout=120, sync=sync, steps=12,
              device_reduce=on_device)
    for r in res:
        assert r["close"], r
        if on_device and sync != "allreduce":
            # every in-neighbour's slot copied to the device, nothing copied back
            assert r["staging"]["reduce"] == "device", r
            assert r["copies"] == [12, 0] and r["slot_copies"] == 12 * r["n_in"], r
        else:
            assert r["equal"], r            # the same host reduce, bit for bit
            assert r["staging"]["reduce"] == "host", r
            assert r["copies"] == [12, 12] and r["slot_copies"] == 0, r
        assert r["staging"]["to_host_copies"] == 12


@pytest.mark.mpi
def test_a_float16_device_reduce_keeps_its_float32_sums_as_the_host_reduce_does():
    # float32 master weights take each mix as the reduce's float32 sum: a reduce on the
    # device leaves it on the device, counted as the host reduce's is (at 34bafb9 it
    # computed the sum and dropped it, and float32_mixes never moved)
    from mpilaunch import run

    for r in run("test_device:float16_sums", 3, "shm", timeout=120, steps=8):
        assert r["on_device"] and r["mixes"] == [8, 8], r
        assert r["sums_close"] and r["values_close"], r
        assert r["slot_copies"] == 8 * r["n_in"], r         # reduced on the device
        assert "float32 NumPy array of 1000 values" in r["refused"], r


@pytest.mark.mpi
def test_with_checksums_the_reduce_runs_on_the_host_and_is_copied_back():
    from mpilaunch import run

    res = run("test_device:staged_against_host", 3, "shm", timeout=120, sync="notify_ack",
              steps=12, checksum=True)
    for r in res:
        # the checksum is computed on the host: the host reduce, bit for bit, copied back
        assert r["equal"] and r["copies"] == [12, 12] and r["slot_copies"] == 0, r
        assert r["staging"]["to_device_copies"] == 12, r


@pytest.mark.mpi
@pytest.mark.parametrize("sync", ["notify_ack", "bsp"])
def test_a_slot_rewritten_during_its_copy_to_the_device_is_never_reduced(sync):
    from mpilaunch import run

    res = run("test_device:slot_rewritten_during_copy", 3, "shm", timeout=120, sync=sync)
    for r in res:
        if sync == "notify_ack":
            # every input was promised: refused, the device buffer as it was
            assert "changed while version 3 was copied to the device" in r["error"], r
            assert r["unchanged"], r
        else:
            # bsp drops what changed and renormalizes over the rest (here: itself)
            assert r["error"] == "" and r["torn"] >= 1, r
            assert r["own_only"], r


@pytest.mark.mpi
@pytest.mark.parametrize("path", ["shm", "net"])
def test_the_parallel_graph_sends_before_compute_and_reduces_after(path):
    from mpilaunch import run

    res = run("test_device:staged_split", 4, path, timeout=120, steps=10)
    for r in res:
        assert r["equal"], r


@pytest.mark.mpi
def test_hop_with_a_backup_worker_mixes_a_staged_buffer_to_consensus():
    from mpilaunch import run

    res = run("test_device:staged_consensus", 4, "shm", timeout=120, sync="hop:backup=1",
              steps=60)
    means = {round(r["mean"], 9) for r in res}
    for r in res:
        assert r["spread"] < 1e-3, r
        # one copy to the host per step; the reduce on the device copies the slots it
        # verified, and nothing comes back from the host
        assert r["copies"] == [r["version"], 0] and r["slot_copies"] > 0, r
    assert len(means) <= 2, means


@pytest.mark.mpi
def test_a_device_buffer_with_double_buffering_is_refused_on_every_rank():
    from mpilaunch import run

    res = run("test_device:double_buffer_refused", 2, "shm", timeout=60)
    for r in res:
        assert "leave double_buffer out" in r["error"] and "\n" not in r["error"], r


# ---------------------------------------------------------------- scenario bodies (on the ranks)
# tests/mpi/run.py runs each on every rank as "test_device:NAME"


def _device_work(x, rank, k):
    """What a training step does to the buffer between exchanges (deterministic)."""
    return x * 0.75 + (rank + 1) * 0.01 * k


def staged_against_host(comm, sync="notify_ack", steps=12, graph="ring",
                        device_reduce=True, checksum=False):
    """The same steps on a host buffer and on a StandIn: the results must agree (bit
    for bit when both reduce on the host)."""
    import asapmpi
    from asapmpi import Exchange

    asapmpi.rc.device_reduce = device_reduce
    start = np.linspace(0, 1, 1000) * (comm.rank + 1)
    host, dev = start.copy(), StandIn(start)
    opts = {} if sync == "allreduce" else {"graph": graph, "checksum": checksum}
    with Exchange(host, sync=sync, comm=comm, timeout=30, **opts) as a, \
            Exchange(dev, sync=sync, comm=comm, timeout=30, **opts) as b:
        for k in range(steps):
            host[...] = _device_work(host, comm.rank, k)
            dev.write(_device_work(dev.values(), comm.rank, k))
            a.step()
            b.step()
        staging = b.staging
        n_in = len(b.in_neighbours)
        slot_copies = b._stager.ops.slot_copies
    return {"equal": bool(np.array_equal(host, dev.values())),
            "close": bool(np.allclose(host, dev.values(), rtol=1e-12, atol=0)),
            "copies": [dev.to_host_copies, dev.to_device_copies], "staging": staging,
            "n_in": n_in, "slot_copies": slot_copies}


def float16_sums(comm, steps=8):
    """float16 steps on a host buffer and on a StandIn reduced on the device, each
    keeping its float32 sums: how many reduces kept them, and do they agree."""
    import asapmpi
    from asapmpi import Exchange

    asapmpi.rc.device_reduce = True
    start = (np.linspace(0, 1, 1000) * (comm.rank + 1)).astype(np.float16)
    host, dev = start.copy(), StandIn(start)
    host_sums, dev_sums = np.zeros(1000, np.float32), np.zeros(1000, np.float32)
    with Exchange(host, "ring", comm=comm, timeout=30) as a, \
            Exchange(dev, "ring", comm=comm, timeout=30) as b:
        try:
            b.keep_float32_mix(np.zeros(1000, np.float64))
            refused = ""
        except asapmpi.errors.ConfigError as exc:
            refused = str(exc)
        a.keep_float32_mix(host_sums)
        b.keep_float32_mix(dev_sums)
        for k in range(steps):
            host[...] = _device_work(host.astype(np.float64), comm.rank, k)
            dev.write(_device_work(dev.values().astype(np.float64), comm.rank, k))
            a.step()
            b.step()
        out = {"on_device": b.float32_mix_on_device, "mixes": [a.float32_mixes,
                                                               b.float32_mixes],
               "n_in": len(b.in_neighbours), "slot_copies": b._stager.ops.slot_copies}
    # the same float32 sums (each summed in its own order: within float32 rounding)
    out.update(sums_close=bool(np.allclose(host_sums, dev_sums, rtol=1e-6, atol=1e-7)),
               values_close=bool(np.allclose(host.astype(np.float32),
                                             dev.values().astype(np.float32),
                                             rtol=2e-3, atol=1e-4)),
               refused=refused)
    return out


class _RewrittenDuringCopy(StandIn):
    """A StandIn whose ops see, at step `at`, each slot's header move to the next version
    while its payload is copied (as a writer that did not wait for its ack would)."""

    at = 3

    def __asapmpi_device_ops__(self):
        from asapmpi._core.layout import HEADER_BYTES
        from asapmpi.testing.device import StandInOps

        outer = self

        class Ops(StandInOps):
            def wait_slots(self):
                if outer.to_host_copies == outer.at:
                    for _, address in self._slot_copies:
                        header = ctypes.c_int64.from_address(address - HEADER_BYTES)
                        header.value += 1
                super().wait_slots()

        return Ops


def slot_rewritten_during_copy(comm, sync="notify_ack"):
    """Every rank's slots change under their copy at step 3 (put: the slots are this
    rank's own window memory)."""
    from asapmpi import Exchange
    from asapmpi.errors import ProtocolError

    dev = _RewrittenDuringCopy(np.full(64, float(comm.rank)))
    ex = Exchange(dev, graph="ring", sync=sync, comm=comm, timeout=30, transport="put")
    error, before = "", None
    try:
        for _ in range(3):
            before = dev.values()
            ex.step()
    except ProtocolError as exc:
        error = str(exc)
    torn = sum(s["torn"] for s in ex.stats.values())
    after = dev.values()
    if not error:
        ex.free()
    return {"error": error, "torn": torn,
            "unchanged": bool(np.array_equal(before, after)),
            "own_only": bool(np.array_equal(after, before))}


def staged_split(comm, steps=10):
    """send(), device work reading the sent values, receive(): as a host buffer does."""
    from asapmpi import Exchange

    start = np.cos(np.arange(512) + comm.rank)
    host, dev = start.copy(), StandIn(start)
    with Exchange(host, graph="root-expander", comm=comm, timeout=30) as a, \
            Exchange(dev, graph="root-expander", comm=comm, timeout=30) as b:
        for _ in range(steps):
            a.send()
            b.send()
            grad_h = host * 0.5         # compute on the sent (pre-reduce) values
            grad_d = dev.values() * 0.5
            a.receive()
            b.receive()
            host -= 0.1 * grad_h
            dev.write(dev.values() - 0.1 * grad_d)
    return {"equal": bool(np.array_equal(host, dev.values()))}


def staged_consensus(comm, sync="hop:backup=1", steps=60):
    """Mixing alone drives a staged buffer to consensus under a policy whose reduces
    depend on timing; the copies track the versions stepped."""
    from asapmpi import Exchange

    dev = StandIn(np.full(256, float(comm.rank)))
    with Exchange(dev, graph="bidirectional-ring", sync=sync, comm=comm, timeout=30) as ex:
        for _ in range(steps):
            ex.step()
        version = ex.version
        stepped = ex.staging["to_host_copies"]
        slot_copies = ex._stager.ops.slot_copies
    values = dev.values()
    return {"mean": float(values.mean()), "spread": float(values.max() - values.min()),
            "copies": [stepped, dev.to_device_copies], "version": stepped,
            "exchange_version": version, "slot_copies": slot_copies}


def double_buffer_refused(comm):
    """Every rank gets the same one line (the problem travels in the allgather)."""
    from asapmpi import Exchange

    try:
        Exchange(StandIn(np.zeros(8)), graph="ring", comm=comm, double_buffer=True)
    except ConfigError as exc:
        return {"error": str(exc)}
    return {"error": ""}
