"""16-bit float buffers (bfloat16 bit patterns, IEEE float16): the reduce kernels against
a NumPy reference (float32 accumulation, one rounding to nearest even), and Exchanges of
them on several ranks under every policy that reduces (the slot kernel, allreduce's
float32 sum, gossip's average).

Each scenario's body is here, beside its test (`test_half_floats:NAME`)."""
from __future__ import annotations

import numpy as np
import pytest

from asapmpi.dtypes import NUMPY, bf16_to_f32, f32_to_bf16, f32_to_half, half_to_f32, nonfinite
from asapmpi.errors import ConfigError

HALVES = ["bfloat16", "float16"]


def _bits(rng, n, scale=4.0, dtype="bfloat16"):
    values = (rng.standard_normal(n) * scale).astype(np.float32)
    return f32_to_half(values, dtype, np.empty(n, dtype=NUMPY[dtype]))


def _half(values, dtype):
    """float32 `values` rounded to `dtype` (a new buffer of its NumPy type)."""
    values = np.asarray(values, dtype=np.float32)
    return f32_to_half(values, dtype, np.empty(values.shape, dtype=NUMPY[dtype]))


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


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("n_in", [0, 1, 3, 6])
@pytest.mark.parametrize("checksum", [False, True])
def test_the_kernel_accumulates_in_float32_and_rounds_once(dtype, n_in, checksum):
    from asapmpi._core import kernels

    rng = np.random.default_rng(n_in)
    n = 5000                                   # blocks of 2048 and a tail
    own = _bits(rng, n, dtype=dtype)
    ins = [_bits(rng, n, dtype=dtype) for _ in range(n_in)]
    ws = [float(w) for w in rng.uniform(0.05, 0.5, n_in)]
    w_self = 0.3
    acc = np.float32(w_self) * half_to_f32(own, dtype)
    for x, w in zip(ins, ws):
        acc = acc + np.float32(w) * half_to_f32(x, dtype)
    out = np.empty_like(own)
    bf16 = dtype == "bfloat16"
    wide = np.empty(n, dtype=np.float32)
    cks = kernels.weighted_sum(out, own, w_self, ins, ws, checksum=checksum, bfloat16=bf16,
                               wide=wide)
    assert np.array_equal(out.view(np.uint16), _half(acc, dtype).view(np.uint16))
    # the float32 sums before the rounding, as master weights take them
    assert np.array_equal(wide, acc, equal_nan=True)
    if checksum:
        assert cks == [kernels.checksum(x) for x in ins]
    kernels.weighted_sum(own, own, w_self, ins, ws, bfloat16=bf16)     # in place
    assert np.array_equal(own.view(np.uint16), out.view(np.uint16))


def test_the_float16_kernel_converts_every_value_as_numpy_does():
    # all 65536 bit patterns through the kernel unchanged (weight 1: exact), and float32
    # sums that land on subnormals, past the largest float16 (65504) and on ties,
    # rounded to nearest even as NumPy rounds
    from asapmpi._core import kernels

    every = np.arange(65536, dtype=np.uint16).view(np.float16)
    out = np.empty_like(every)
    kernels.weighted_sum(out, every, 1.0, [], [])
    nan = np.isnan(every)
    assert np.array_equal(out.view(np.uint16)[~nan], every.view(np.uint16)[~nan])
    assert np.isnan(out[nan]).all()
    rng = np.random.default_rng(1)
    values = np.concatenate([rng.uniform(-66000, 66000, 20000),
                             rng.uniform(-1e-4, 1e-4, 20000),
                             rng.standard_normal(20000) * 1e-7]).astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        high = values.astype(np.float16)
        low = ((values - high.astype(np.float32)) * 4).astype(np.float16)
    low[~np.isfinite(low)] = 0
    out = np.empty_like(high)
    kernels.weighted_sum(out, np.zeros_like(high), 0.0, [high, low], [1.0, 0.25])
    with np.errstate(over="ignore", invalid="ignore"):
        want = (np.float32(0) + high.astype(np.float32)
                + np.float32(0.25) * low.astype(np.float32)).astype(np.float16)
    both = ~np.isnan(want)
    assert np.array_equal(out.view(np.uint16)[both], want.view(np.uint16)[both])
    assert np.isinf(want).sum() > 100 and ((np.abs(want) < 6.1e-5) & (want != 0)).sum() > 100


def test_the_kernel_refuses_bfloat16_of_another_width():
    from asapmpi._core import kernels

    a = np.zeros(8, dtype=np.float32)
    with pytest.raises(ConfigError, match="2-byte integers"):
        kernels.weighted_sum(a, a, 1.0, [], [], bfloat16=True)


# ---------------------------------------------------------------- multi-rank


@pytest.mark.mpi
@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("sync, graph", [("notify_ack", "ring"), ("bsp", "ring"),
                                         ("allreduce", None)])
def test_one_step_is_the_float32_step_rounded_once(sync, graph, dtype):
    from mpilaunch import run

    for r in run("test_half_floats:one_step_against_float32", 3, "shm", timeout=120,
                 sync=sync, graph=graph, dtype=dtype):
        assert r["equal"], r


@pytest.mark.mpi
@pytest.mark.parametrize("dtype, sync", [
    ("bfloat16", "notify_ack"), ("bfloat16", "hop:backup=1"), ("bfloat16", "gossip"),
    ("bfloat16", "allreduce"), ("bfloat16", "async"), ("float16", "notify_ack"),
    ("float16", "gossip"), ("float16", "allreduce")])
def test_half_float_buffers_mix_to_consensus(dtype, sync):
    from mpilaunch import run

    res = run("test_half_floats:consensus", 4, "shm", timeout=120, sync=sync, steps=40,
              dtype=dtype)
    # doubly stochastic mixing in lockstep keeps the mean (1.5, up to rounding); with
    # backup workers, gossip's pulls or no waiting at all it lands anywhere in [0, 3]
    low, high = (1.4, 1.6) if sync in ("notify_ack", "allreduce") else (0.0, 3.0)
    for r in res:
        assert r["spread"] < 0.05, r            # from 0..3: a few ulps apart
        assert low <= r["mean"] <= high, r


@pytest.fixture(scope="module")
def torch_runs():
    """The torch scenarios below, one after another in one job of 3 ranks (one start of
    torch for all four): optimizer_half per dtype, resume_half per mode."""
    from mpilaunch import run_cases

    cases = {f"optimizer-{dtype}": ("test_half_floats:optimizer_half",
                                    {"steps": 20, "dtype": dtype}) for dtype in HALVES}
    cases.update({f"resume-{mode}": ("test_half_floats:resume_half", {"mode": mode})
                  for mode in ("serial", "parallel")})
    return run_cases(cases, 3, "shm", timeout=480)


@pytest.mark.mpi
@pytest.mark.parametrize("dtype", HALVES)
def test_an_optimizer_mixes_half_float_parameters_as_they_are(dtype, request):
    from mpilaunch import skip_above_the_core

    skip_above_the_core()
    res = request.getfixturevalue("torch_runs")[f"optimizer-{dtype}"]
    first = np.array(res[0]["params"])
    for r in res:
        assert r["dtype"] == f"torch.{dtype}" and r["exchange_dtype"] == dtype, r
        # replicas agree to an ulp or two (each rank sums in its own order)
        assert np.allclose(r["params"], first, rtol=2e-2, atol=1e-3), r
        assert r["loss_last"] < r["loss_first"], r


@pytest.mark.mpi
@pytest.mark.parametrize("mode", ["serial", "parallel"])
def test_a_bfloat16_run_with_masters_resumes_bitwise(mode, request):
    from mpilaunch import skip_above_the_core

    skip_above_the_core()
    # the state_dict between two steps holds the last mix in its masters: a run resumed
    # from it on 3 ranks ends where the uninterrupted one does, bit for bit
    for r in request.getfixturevalue("torch_runs")[f"resume-{mode}"]:
        assert r["whole"] == r["resumed"], r
        assert r["moved"], r


@pytest.mark.mpi
def test_bad_bfloat16_input_is_one_line_on_every_rank():
    from mpilaunch import run

    for r in run("test_half_floats:bad_input", 2, "shm", timeout=60):
        assert r == {"float": "dtype='bfloat16' takes the bit patterns in a 2-byte integer",
                     "mismatch": "dtype='float64' but the buffer holds float32",
                     "half": "dtype='bfloat16' takes the bit patterns in a 2-byte integer",
                     "unknown": "dtype must be one of float32, float64, bfloat16, float16"}, r


@pytest.mark.mpi
def test_bfloat16_with_float32_masters_trains_as_far_as_float32(tmp_path):
    # examples/bfloat16_weights.py: SGD at a small learning rate, most updates below half
    # a bfloat16 ulp of their weight; plain bfloat16 weights round them away, the masters
    # keep them (the mix taken in float32, a server's average rounded with error
    # feedback, gossip's pulls through the kernel's float32 output)
    import json
    import os
    import subprocess
    import sys

    pytest.importorskip("torch")
    from mpilaunch import job_command, skip_above_the_core

    skip_above_the_core()
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

    def losses(policies, *extra):
        out = tmp_path / f"{policies}.json"
        cmd, env = job_command(4, [sys.executable,
                                   os.path.join(root, "examples", "bfloat16_weights.py"),
                                   "--policies", policies, "--json", str(out), *extra],
                               timeout=240)
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=270,
                              check=False)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return json.loads(out.read_text())

    rows = losses("notify_ack,backup_ps,allreduce")
    assert [row["policy"] for row in rows] == ["notify_ack", "backup_ps", "allreduce"]
    for row in rows:
        for r in row["ranks"]:
            wide, masters, plain = r["float32"], r["bfloat16"], r["bfloat16 as it is"]
            # these runs repeat closely (exact versions, or a server's average): the
            # masters' rounding is what differs
            assert plain > wide * 1.25, row
            assert masters < wide * 1.02, row
    # gossip pulls whatever versions are newest, so each of its runs differs by timing
    # too: at 600 steps one CI run's float32 ended 20% above its usual 0.099-0.110 (0.121;
    # plain bfloat16 0.151, 1.25x), as far from float32 as the effect tested.  At 1200
    # steps float32 goes on learning (0.074-0.082 here, quiet and with 4 CPU hogs) while
    # plain bfloat16 stays stuck (0.143-0.146): the effect is 1.8-1.9x, and a run 20% off
    # in either float32 or the masters still passes the bounds below
    [row] = losses("gossip", "--steps", "1200")
    for r in row["ranks"]:
        wide, masters, plain = r["float32"], r["bfloat16"], r["bfloat16 as it is"]
        assert plain > wide * 1.4, row
        assert masters - wide < 0.3 * (plain - wide), row


# ---------------------------------------------------------------- scenario bodies (on the ranks)
# tests/mpi/run.py runs each on every rank as "test_half_floats:NAME"


def one_step_against_float32(comm, sync="notify_ack", graph="ring", dtype="bfloat16"):
    """Values exact in `dtype`, one step on a float32 buffer and on the 16-bit buffer:
    the 16-bit result is the float32 result rounded once."""
    from asapmpi import Exchange

    rng = np.random.default_rng(comm.rank)
    start = half_to_f32(_bits(rng, 3000, dtype=dtype), dtype)
    wide, bits = start.copy(), _half(start, dtype)
    opts = {"graph": graph} if graph else {}
    with Exchange(wide, sync=sync, comm=comm, timeout=30, **opts) as a, \
            Exchange(bits, sync=sync, comm=comm, timeout=30, dtype=dtype, **opts) as b:
        a.step()
        b.step()
    return {"equal": bool(np.array_equal(bits.view(np.uint16),
                                         _half(wide, dtype).view(np.uint16)))}


def consensus(comm, sync="notify_ack", steps=40, dtype="bfloat16"):
    """Every rank starts at its rank; mixing alone brings them together."""
    from asapmpi import Exchange

    bits = _half(np.full(4096, float(comm.rank)), dtype)
    opts = {} if sync in ("allreduce", "gossip") else {"graph": "bidirectional-ring"}
    with Exchange(bits, sync=sync, comm=comm, timeout=30, dtype=dtype, **opts) as ex:
        for _ in range(steps):
            ex.step()
    values = half_to_f32(bits, dtype)
    return {"mean": float(values.mean()), "spread": float(values.max() - values.min())}


def optimizer_half(comm, steps=20, dtype="bfloat16"):
    """A 16-bit model under DecentralizedOptimizer (Adam), its parameters exchanged as
    they are; returns its parameters and first and last losses."""
    import torch

    from asapmpi.torch import DecentralizedOptimizer

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(),
                                torch.nn.Linear(32, 2)).to(getattr(torch, dtype))
    # float16: Adam's default eps (1e-8) is 0 in float16, and plain torch's first step
    # already divides 0 by 0 (NaN from step 2 on, without asapmpi too)
    eps = 1e-4 if dtype == "float16" else 1e-8
    opt = DecentralizedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01, eps=eps),
                                 "complete",
                                 "notify_ack", model=model, comm=comm, timeout=30)
    g = torch.Generator().manual_seed(comm.rank)
    losses = []
    for _ in range(steps):
        x = torch.randn(64, 16, generator=g)
        y = (x @ torch.ones(16) > 0).long()
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x.to(getattr(torch, dtype))).float(),
                                                 y)
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
                            ("half", np.zeros(8, dtype=np.float16), "bfloat16"),
                            ("unknown", np.zeros(8, dtype=np.uint16), "bf16")):
        try:
            Exchange(buf, graph="ring", comm=comm, dtype=dtype)
            out[key] = ""
        except ConfigError as exc:
            text = str(exc)
            out[key] = next(m for m in (
                "dtype='bfloat16' takes the bit patterns in a 2-byte integer",
                "dtype='float64' but the buffer holds float32",
                "dtype must be one of float32, float64, bfloat16, float16") if m in text) \
                if "\n" not in text else text
    return out


def resume_half(comm, mode="serial", steps=12, cut=5):
    """bfloat16 SGD with float32 masters on a ring: steps straight through, and again
    cut at `cut` into a state_dict that a fresh optimizer resumes from; returns both
    final parameter digests."""
    import hashlib
    import io

    import torch

    from asapmpi.torch import DecentralizedOptimizer

    def make():
        torch.manual_seed(0)
        model = torch.nn.Linear(16, 4).bfloat16()
        opt = DecentralizedOptimizer(torch.optim.SGD(model.parameters(), lr=3e-3,
                                                     momentum=0.9),
                                     "ring", "notify_ack", model=model, comm=comm,
                                     mode=mode, timeout=60)
        return model, opt

    def train(model, opt, ks):
        for k in ks:
            g = torch.Generator().manual_seed(100 * k + comm.rank)
            x = torch.randn(8, 16, generator=g).bfloat16()
            opt.zero_grad()
            model(x).float().pow(2).mean().backward()
            opt.step()

    def digest(model):
        return hashlib.sha256(b"".join(p.detach().view(torch.int16).numpy().tobytes()
                                       for p in model.parameters())).hexdigest()

    model, opt = make()
    start = digest(model)
    train(model, opt, range(cut))
    saved = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, saved)
    train(model, opt, range(cut, steps))
    whole = digest(model)
    opt.free()
    model, opt = make()
    saved.seek(0)
    back = torch.load(saved, weights_only=False)
    model.load_state_dict(back["model"])
    opt.load_state_dict(back["opt"])
    train(model, opt, range(cut, steps))
    resumed = digest(model)
    opt.free()
    return {"whole": whole, "resumed": resumed, "moved": whole != start}
