"""bfloat16 buffers: the reduce kernel against a NumPy reference (float32 accumulation,
one rounding to nearest even), and Exchanges of bfloat16 bit patterns on several ranks
under every policy that reduces (the slot kernel, allreduce's float32 sum, gossip's
average).

Each scenario's body is here, beside its test (`test_bfloat16:NAME`)."""
from __future__ import annotations

import numpy as np
import pytest

from asapmpi.dtypes import bf16_to_f32, f32_to_bf16, nonfinite
from asapmpi.errors import ConfigError


def _bits(rng, n, scale=4.0):
    return f32_to_bf16((rng.standard_normal(n) * scale).astype(np.float32))


def test_conversions_round_to_nearest_even_and_keep_nan():
    values = np.array([1.0, 1.00390625, 1.01171875, -2.5, np.inf, np.nan, 0.0, -0.0],
                      dtype=np.float32)
    back = bf16_to_f32(f32_to_bf16(values))
    # 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1); 1 + 3*2^-8 up
    assert back[:4].tolist() == [1.0, 1.0, 1.015625, -2.5]
    assert np.isinf(back[4]) and np.isnan(back[5]) and back[6] == 0 and np.signbit(back[7])
    assert nonfinite(f32_to_bf16(values), "bfloat16").tolist() == [4, 5]
    torch = pytest.importorskip("torch")
    t = torch.from_numpy(np.random.default_rng(1).standard_normal(1000).astype(np.float32))
    ours = f32_to_bf16(t.numpy())
    assert np.array_equal(ours, t.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16))


@pytest.mark.parametrize("n_in", [0, 1, 3, 6])
@pytest.mark.parametrize("checksum", [False, True])
def test_the_kernel_accumulates_in_float32_and_rounds_once(n_in, checksum):
    from asapmpi._core import kernels

    rng = np.random.default_rng(n_in)
    n = 5000                                   # blocks of 2048 and a tail
    own = _bits(rng, n)
    ins = [_bits(rng, n) for _ in range(n_in)]
    ws = [float(w) for w in rng.uniform(0.05, 0.5, n_in)]
    w_self = 0.3
    acc = np.float32(w_self) * bf16_to_f32(own)
    for x, w in zip(ins, ws):
        acc = acc + np.float32(w) * bf16_to_f32(x)
    out = np.empty_like(own)
    cks = kernels.weighted_sum(out, own, w_self, ins, ws, checksum=checksum, bfloat16=True)
    assert np.array_equal(out, f32_to_bf16(acc))
    if checksum:
        assert cks == [kernels.checksum(x) for x in ins]
    kernels.weighted_sum(own, own, w_self, ins, ws, bfloat16=True)     # in place
    assert np.array_equal(own, out)


def test_the_kernel_refuses_bfloat16_of_another_width():
    from asapmpi._core import kernels

    a = np.zeros(8, dtype=np.float32)
    with pytest.raises(ConfigError, match="2-byte integers"):
        kernels.weighted_sum(a, a, 1.0, [], [], bfloat16=True)


# ---------------------------------------------------------------- multi-rank


@pytest.mark.mpi
@pytest.mark.parametrize("sync, graph", [("notify_ack", "ring"), ("bsp", "ring"),
                                         ("allreduce", None)])
def test_one_step_is_the_float32_step_rounded_once(sync, graph):
    from mpilaunch import run

    for r in run("test_bfloat16:one_step_against_float32", 3, "shm", timeout=120,
                 sync=sync, graph=graph):
        assert r["equal"], r


@pytest.mark.mpi
@pytest.mark.parametrize("sync", ["notify_ack", "hop:backup=1", "gossip", "allreduce",
                                  "async"])
def test_bfloat16_buffers_mix_to_consensus(sync):
    from mpilaunch import run

    res = run("test_bfloat16:consensus", 4, "shm", timeout=120, sync=sync, steps=40)
    # doubly stochastic mixing in lockstep keeps the mean (1.5, up to rounding); with
    # backup workers, gossip's pulls or no waiting at all it lands anywhere in [0, 3]
    low, high = (1.4, 1.6) if sync in ("notify_ack", "allreduce") else (0.0, 3.0)
    for r in res:
        assert r["spread"] < 0.05, r            # from 0..3: a few bfloat16 ulps apart
        assert low <= r["mean"] <= high, r


@pytest.mark.mpi
def test_an_optimizer_mixes_bfloat16_parameters_as_they_are():
    from mpilaunch import run

    res = run("test_bfloat16:optimizer_bfloat16", 3, "shm", timeout=120, steps=20)
    first = np.array(res[0]["params"])
    for r in res:
        assert r["dtype"] == "torch.bfloat16" and r["exchange_dtype"] == "bfloat16", r
        # replicas agree to a bfloat16 ulp or two (each rank sums in its own order)
        assert np.allclose(r["params"], first, rtol=2e-2, atol=1e-3), r
        assert r["loss_last"] < r["loss_first"], r


@pytest.mark.mpi
def test_bad_bfloat16_input_is_one_line_on_every_rank():
    from mpilaunch import run

    for r in run("test_bfloat16:bad_input", 2, "shm", timeout=60):
        assert r == {"float": "dtype='bfloat16' takes the bit patterns in a 2-byte integer",
                     "mismatch": "dtype='float64' but the buffer holds float32",
                     "unknown": "dtype must be one of float32, float64, bfloat16"}, r


# ---------------------------------------------------------------- scenario bodies (on the ranks)
# tests/mpi/run.py runs each on every rank as "test_bfloat16:NAME"


def one_step_against_float32(comm, sync="notify_ack", graph="ring"):
    """Values exact in bfloat16, one step on a float32 buffer and on bfloat16 bits: the
    bfloat16 result is the float32 result rounded once."""
    from asapmpi import Exchange

    rng = np.random.default_rng(comm.rank)
    start = bf16_to_f32(_bits(rng, 3000))
    wide, bits = start.copy(), f32_to_bf16(start)
    opts = {"graph": graph} if graph else {}
    with Exchange(wide, sync=sync, comm=comm, timeout=30, **opts) as a, \
            Exchange(bits, sync=sync, comm=comm, timeout=30, dtype="bfloat16", **opts) as b:
        a.step()
        b.step()
    return {"equal": bool(np.array_equal(bits, f32_to_bf16(wide)))}


def consensus(comm, sync="notify_ack", steps=40):
    """Every rank starts at its rank; mixing alone brings them together."""
    from asapmpi import Exchange

    bits = f32_to_bf16(np.full(4096, float(comm.rank), dtype=np.float32))
    opts = {} if sync in ("allreduce", "gossip") else {"graph": "bidirectional-ring"}
    with Exchange(bits, sync=sync, comm=comm, timeout=30, dtype="bfloat16", **opts) as ex:
        for _ in range(steps):
            ex.step()
    values = bf16_to_f32(bits)
    return {"mean": float(values.mean()), "spread": float(values.max() - values.min())}


def optimizer_bfloat16(comm, steps=20):
    """A bfloat16 model under DecentralizedOptimizer (Adam), its parameters exchanged
    as bfloat16; returns its parameters and first and last losses."""
    import torch

    from asapmpi.torch import DecentralizedOptimizer

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(),
                                torch.nn.Linear(32, 2)).bfloat16()
    opt = DecentralizedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01), "complete",
                                 "notify_ack", model=model, comm=comm, timeout=30)
    g = torch.Generator().manual_seed(comm.rank)
    losses = []
    for _ in range(steps):
        x = torch.randn(64, 16, generator=g)
        y = (x @ torch.ones(16) > 0).long()
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x.bfloat16()).float(), y)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    params = torch.cat([p.detach().float().reshape(-1) for p in model.parameters()])
    out = {"dtype": str(next(model.parameters()).dtype),
           "exchange_dtype": opt.exchange.dtype, "params": params.tolist(),
           "loss_first": sum(losses[:3]) / 3, "loss_last": sum(losses[-3:]) / 3}
    opt.free()
    return out


def bad_input(comm):
    """The refusals of dtype=, the same line on every rank."""
    from asapmpi import Exchange

    out = {}
    for key, buf, dtype in (("float", np.zeros(8, dtype=np.float32), "bfloat16"),
                            ("mismatch", np.zeros(8, dtype=np.float32), "float64"),
                            ("unknown", np.zeros(8, dtype=np.uint16), "bf16")):
        try:
            Exchange(buf, graph="ring", comm=comm, dtype=dtype)
            out[key] = ""
        except ConfigError as exc:
            text = str(exc)
            out[key] = next(m for m in (
                "dtype='bfloat16' takes the bit patterns in a 2-byte integer",
                "dtype='float64' but the buffer holds float32",
                "dtype must be one of float32, float64, bfloat16") if m in text) \
                if "\n" not in text else text
    return out
