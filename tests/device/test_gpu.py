"""Device buffers on a real GPU: torch CUDA tensors staged through pinned host memory
(asapmpi.device, asapmpi.torch.device), end to end under mpiexec, several ranks sharing
one GPU.  Skipped, with the reason, where torch sees no CUDA device: CI tests the same
code path with host memory standing in for the device (tests/device/test_device.py), and
dev/gpu-check.sh runs these on a machine with a GPU.

Each scenario's body is here, beside its test (`test_gpu:NAME`)."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu, pytest.mark.mpi,
              pytest.mark.skipif(not torch.cuda.is_available(),
                                 reason="torch sees no CUDA device here "
                                        "(dev/gpu-check.sh runs these on a GPU machine)")]


@pytest.mark.parametrize("sync", ["notify_ack", "bsp", "allreduce", "hop:backup=1"])
@pytest.mark.parametrize("on_device", [True, False], ids=["device-reduce", "host-reduce"])
def test_a_cuda_tensor_is_staged_and_reduced_as_a_host_buffer(sync, on_device):
    from mpilaunch import run

    res = run("test_gpu:cuda_against_host", 3, "shm", timeout=180, sync=sync, steps=12,
              device_reduce=on_device)
    for r in res:
        device = on_device and sync != "allreduce"
        assert r["reduce"] == ("device" if device else "host"), r
        assert r["copies"] == [r["stepped"], 0 if device else r["stepped"]], r
        assert r["torn"] == 0, r
        if sync.startswith("hop"):
            continue                # which versions hop reduces depends on timing
        assert r["stepped"] == 12, r
        # the host reduce is the same code on both: equal bit for bit; the device's
        # sum may round differently (fused multiply-adds)
        assert r["equal"] if not device else r["close"], r


def test_an_optimizer_on_cuda_trains_as_on_the_cpu_and_checkpoints_across_devices(tmp_path):
    from mpilaunch import run

    res = run("test_gpu:optimizer_cuda_against_cpu", 3, "shm", timeout=240, steps=30,
              folder=str(tmp_path))
    for r in res:
        assert r["max_diff"] < 1e-4, r
        assert r["resumed_on_cpu"] and r["resumed_on_cuda"], r


def test_bfloat16_masters_on_cuda_take_the_device_reduce_s_float32_sums():
    # issue 45, defect 3: the device reduce keeps its float32 sums for the masters
    # (float32_mixes moves with every mix), a loaded state_dict survives the next step,
    # and the run ends close to the same run on the CPU
    from mpilaunch import run

    for r in run("test_gpu:masters_on_cuda", 3, "shm", timeout=240, steps=20):
        assert r["on_device"] and r["mixes"] == 20, r
        assert r["loaded_kept"], r
        assert r["max_diff"] < 2e-2, r


# ---------------------------------------------------------------- scenario bodies (on the ranks)
# tests/mpi/run.py runs each on every rank as "test_gpu:NAME"


def cuda_against_host(comm, sync="notify_ack", steps=12, device_reduce=True):
    """The same steps on a host buffer and on a CUDA tensor: exact device work (a
    halving and a sum of dyadic numbers: correctly rounded on both)."""
    import asapmpi
    from asapmpi import Exchange

    asapmpi.rc.device_reduce = device_reduce
    start = np.linspace(0, 1, 4096) * (comm.rank + 1)
    host = start.copy()
    dev = torch.from_numpy(start.copy()).cuda()
    graph = {} if sync == "allreduce" else \
        {"graph": "bidirectional-ring" if sync.startswith("hop") else "ring"}
    with Exchange(host, sync=sync, comm=comm, timeout=60, **graph) as a, \
            Exchange(dev, sync=sync, comm=comm, timeout=60, **graph) as b:
        for k in range(steps):
            host *= 0.5
            host += 0.25 * (comm.rank + 1) * k
            dev.mul_(0.5).add_(0.25 * (comm.rank + 1) * k)
            a.step()
            b.step()
        staging = b.staging
        torn = sum(s["torn"] for s in b.stats.values())
    got = dev.cpu().numpy()
    return {"equal": bool(np.array_equal(host, got)),
            "close": bool(np.allclose(host, got, rtol=1e-12, atol=1e-15)),
            "copies": [staging["to_host_copies"], staging["to_device_copies"]],
            "stepped": staging["to_host_copies"], "reduce": staging["reduce"],
            "torn": int(torn), "staging": staging}


def _train(comm, device, steps, state=None):
    from asapmpi.torch import DecentralizedOptimizer

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(),
                                torch.nn.Linear(64, 4)).double().to(device)
    opt = DecentralizedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05,
                                                 momentum=0.9),
                                 "ring", "notify_ack", model=model, comm=comm, timeout=60)
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
    g = torch.Generator().manual_seed(comm.rank)
    for _ in range(steps):
        x = torch.randn(64, 32, generator=g, dtype=torch.float64).to(device)
        y = torch.randint(0, 4, (64,), generator=g).to(device)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    flat = torch.cat([p.detach().reshape(-1).cpu() for p in model.parameters()]).numpy()
    saved = {"model": model.state_dict(), "opt": opt.state_dict()}
    opt.free()
    return flat, saved


def optimizer_cuda_against_cpu(comm, steps=30, folder="."):
    """The same float64 training on the CPU and on CUDA; a checkpoint saved on the GPU
    resumes on the CPU, and one saved on the CPU resumes on the GPU."""
    cpu, _ = _train(comm, "cpu", steps)
    cuda, saved = _train(comm, "cuda", steps)
    path = f"{folder}/ckpt{comm.rank}.pt"
    torch.save(saved, path)
    on_cpu, saved_cpu = _train(comm, "cpu", 2, torch.load(path, map_location="cpu"))
    torch.save(saved_cpu, path)
    on_cuda, _ = _train(comm, "cuda", 2, torch.load(path, map_location="cuda"))
    return {"max_diff": float(np.abs(cpu - cuda).max()),
            "resumed_on_cpu": bool(np.isfinite(on_cpu).all()),
            "resumed_on_cuda": bool(np.isfinite(on_cuda).all())}


def _train_bf16(comm, device, steps):
    from asapmpi.torch import DecentralizedOptimizer

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(),
                                torch.nn.Linear(64, 4)).bfloat16().to(device)
    opt = DecentralizedOptimizer(torch.optim.SGD(model.parameters(), lr=1e-3),
                                 "ring", "notify_ack", model=model, comm=comm, timeout=60)
    g = torch.Generator().manual_seed(comm.rank)
    for _ in range(steps):
        x = torch.randn(64, 32, generator=g).bfloat16().to(device)
        y = torch.randint(0, 4, (64,), generator=g).to(device)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x).float(), y).backward()
        opt.step()
    mixes = opt.exchange.float32_mixes
    on_device = opt.exchange.float32_mix_on_device
    flat = torch.cat([m.detach().reshape(-1).cpu() for m in opt.master.params]).numpy()
    # a state_dict loaded between steps is what the next step starts from
    model.load_state_dict({k: torch.full_like(v, 0.25) for k, v in model.state_dict().items()})
    opt.optimizer.param_groups[0]["lr"] = 0.0
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x).float(), y).backward()
    opt.step()
    kept = all(bool((p.detach() == 0.25).all()) for p in model.parameters())
    opt.free()
    return flat, mixes, on_device, kept


def masters_on_cuda(comm, steps=20):
    """bfloat16 training with float32 masters on CUDA (reduced on the device) and on the
    CPU: the device reduce's float32 sums reach the masters."""
    import asapmpi

    asapmpi.rc.device_reduce = True
    cuda, mixes, on_device, kept = _train_bf16(comm, "cuda", steps)
    cpu, _, _, _ = _train_bf16(comm, "cpu", steps)
    return {"mixes": mixes, "on_device": on_device, "loaded_kept": kept,
            "max_diff": float(np.abs(cpu - cuda).max())}
