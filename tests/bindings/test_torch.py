"""The PyTorch bindings (asapmpi.torch): zero-copy flat parameters, the optimizer wrapper
with SGD-momentum and Adam, serial and parallel computation graphs, periods, state."""
import io

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from asapmpi.errors import ConfigError  # noqa: E402
from asapmpi.torch import DecentralizedOptimizer, FlatParameters  # noqa: E402
from asapmpi.torch import state as tstate  # noqa: E402
from asapmpi.train.checkpoint import load_tree, save_tree  # noqa: E402

from mpilaunch import PATHS, STACK, above_the_core, run_cases  # noqa: E402


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(1, 3, 3), torch.nn.Flatten(),
                               torch.nn.Linear(3 * 6 * 6, 4))


def _inside(flat, p):
    lo = flat.tensor.data_ptr()
    return lo <= p.data_ptr() and p.data_ptr() + p.numel() * p.element_size() <= lo + flat.nbytes


def test_flat_parameters_are_views_of_one_buffer_and_keep_values():
    model = _model()
    before = [p.detach().clone() for p in model.parameters()]
    ids = [id(p) for p in model.parameters()]
    flat = FlatParameters(model.parameters())
    assert [id(p) for p in model.parameters()] == ids          # same Parameter objects
    for p, b in zip(model.parameters(), before):
        assert _inside(flat, p)
        assert torch.equal(p, b)
        assert p.data_ptr() % 64 == 0                           # aligned starts
    assert np.shares_memory(flat.array, flat.tensor.numpy())
    # writing the NumPy view (what the exchange reduces into) changes the parameters
    flat.array[...] = 2.0
    assert all(bool((p == 2.0).all()) for p in model.parameters())


def test_bfloat16_parameters_live_in_the_flat_buffer_as_bit_patterns():
    model = torch.nn.Linear(5, 3).bfloat16()
    flat = FlatParameters(model.parameters())
    assert flat.exchange_dtype == "bfloat16" and flat.array.dtype == np.uint16
    assert flat.array.ctypes.data == flat.tensor.data_ptr()
    # 2.0 in bfloat16 is 0x4000: written as bits, read back by the parameters
    flat.array[...] = 0x4000
    assert all(bool((p == 2.0).all()) for p in model.parameters())


def test_flat_parameters_refuse_mixed_dtypes_and_moved_parameters():
    a = torch.nn.Parameter(torch.zeros(3))
    b = torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))
    with pytest.raises(ConfigError, match=r"got parameters of torch\.float32, torch\.float64"):
        FlatParameters([a, b])
    with pytest.raises(ConfigError, match="no parameters"):
        FlatParameters([])
    flat = FlatParameters([a])
    a.data = torch.ones(3)                                      # replaced, not updated
    with pytest.raises(ConfigError, match="moved out of the exchange buffer"):
        flat.check()


@pytest.mark.parametrize("kind", ["momentum", "adam"])
@pytest.mark.parametrize("mode", ["serial", "parallel"])
def test_one_rank_wrapper_equals_the_plain_optimizer_and_stays_zero_copy(kind, mode):
    # one rank: the reduce has no inputs, so the wrapped run must equal a plain one bitwise
    def make(params):
        return torch.optim.SGD(params, lr=0.05, momentum=0.9) if kind == "momentum" \
            else torch.optim.Adam(params, lr=0.01)

    plain, wrapped = _model(), _model()
    opt_plain = make(plain.parameters())
    opt = DecentralizedOptimizer(make(wrapped.parameters()), "complete", "notify_ack",
                                 mode=mode)
    x = torch.randn(8, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    y = torch.randint(0, 4, (8,), generator=torch.Generator().manual_seed(2))
    for _ in range(5):
        for m, o in ((plain, opt_plain), (wrapped, opt)):
            o.zero_grad()
            torch.nn.functional.cross_entropy(m(x), y).backward()
            o.step()
    for p, q in zip(plain.parameters(), wrapped.parameters()):
        assert torch.equal(p, q)
        assert _inside(opt.flat, q)
    assert opt.iteration == 5 and opt.exchange.version == 5
    assert opt.state                                            # momentum / moments exist
    opt.free()


def test_wrapper_refuses_bad_arguments():
    model = _model()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ConfigError, match="period"):
        DecentralizedOptimizer(sgd, "complete", period=0)
    with pytest.raises(ConfigError, match="mode"):
        DecentralizedOptimizer(sgd, "complete", mode="sideways")
    with pytest.raises(ConfigError, match=r"torch\.optim\.Optimizer"):
        DecentralizedOptimizer(object(), "complete")
    # refused before an exchange exists: the parameters stay in their own memory
    ptrs = [p.data_ptr() for p in model.parameters()]
    with pytest.raises(ConfigError, match="decides itself when each worker synchronizes"):
        DecentralizedOptimizer(sgd, None, sync="elastic", period=2)
    # the command line's spelling names the policy as well: elastic:R=4 is refused alike
    with pytest.raises(ConfigError, match="decides itself when each worker synchronizes"):
        DecentralizedOptimizer(sgd, None, sync="elastic:R=4", period=2)
    assert [p.data_ptr() for p in model.parameters()] == ptrs
    # a trainable parameter the optimizer does not hold would drift apart across ranks
    head = torch.optim.SGD(model[2].parameters(), lr=0.1)
    with pytest.raises(ConfigError, match=r"shapes \[\(3, 1, 3, 3\), \(3,\)\] require "
                                          r"gradients but are in no parameter group"):
        DecentralizedOptimizer(head, "complete", model=model)


class _Net(torch.nn.Module):
    """BatchNorm, an embedding tied to the output layer, a frozen layer."""

    def __init__(self, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.embed = torch.nn.Embedding(10, 6)
        self.frozen = torch.nn.Linear(6, 6)
        self.frozen.requires_grad_(False)
        self.norm = torch.nn.BatchNorm1d(6)
        self.out = torch.nn.Linear(6, 10, bias=False)
        self.out.weight = self.embed.weight

    def forward(self, tokens):
        return self.out(self.norm(torch.tanh(self.frozen(self.embed(tokens)))))


def _tokens(k):
    g = torch.Generator().manual_seed(k)
    x = torch.randint(0, 10, (16,), generator=g)
    return x, (x + 1) % 10


def test_wrapper_is_a_torch_optimizer_for_schedulers_and_scalers():
    # one rank: the wrapper under StepLR and a GradScaler equals the plain optimizer
    # under them, bitwise; the scheduler's lr reaches the wrapped optimizer.  Step 2's
    # gradients are inf: the scaler skips the update, but the wrapper still mixes.
    runs = {}
    for wrapped in (False, True):
        model = _Net()
        opt = torch.optim.AdamW(model.parameters(), lr=0.05)
        if wrapped:
            opt = DecentralizedOptimizer(opt, "complete", model=model)
            assert isinstance(opt, torch.optim.Optimizer)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
        scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
        lrs = []
        for k in range(6):
            x, y = _tokens(k)
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            if k == 2:
                loss = loss * float("inf")
            scaler.scale(loss).backward()
            before = [p.detach().clone() for p in model.parameters()]
            scaler.step(opt)
            scaler.update()
            sched.step()
            lrs.append(opt.param_groups[0]["lr"])
            unchanged = all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
            assert unchanged == (k == 2), k
            if wrapped:
                assert opt.exchange.version == k + 1         # mixed at every step
        assert scaler.get_scale() == 1024.0 * 0.5       # backed off once, for step 2
        if wrapped:
            assert opt.optimizer.param_groups[0]["lr"] == lrs[-1]
            assert opt.param_groups is opt.optimizer.param_groups
            assert opt.state is opt.optimizer.state and opt.state
            assert opt.iteration == 6
            opt.free()
        runs[wrapped] = (lrs, [t.detach().clone() for t in model.state_dict().values()])
    assert runs[True][0] == runs[False][0] == [0.05, 0.025, 0.025, 0.0125, 0.0125, 0.00625]
    for a, b in zip(runs[True][1], runs[False][1]):
        assert torch.equal(a, b)


def test_step_with_a_closure_returns_its_loss_and_zero_grad_keeps_zeros():
    model = _Net()
    opt = DecentralizedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), "complete",
                                 model=model)
    x, y = _tokens(0)

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        return loss

    loss = opt.step(closure)
    assert torch.is_tensor(loss) and loss.requires_grad
    opt.zero_grad(set_to_none=False)
    assert torch.equal(model.embed.weight.grad, torch.zeros_like(model.embed.weight))
    opt.zero_grad()
    assert model.embed.weight.grad is None
    opt.free()


@pytest.mark.parametrize("buffers", ["mix", "broadcast", "local"])
def test_tied_frozen_and_buffers_are_laid_out_by_the_buffers_option(buffers):
    model = _Net()
    frozen = model.frozen.weight.detach().clone()
    opt = DecentralizedOptimizer(torch.optim.Adam(model.parameters(), lr=0.1), "complete",
                                 model=model, buffers=buffers)
    flat = opt.flat
    # the tied weight is one Parameter: one span, still shared by both modules
    assert sum(p is model.embed.weight for p in flat.params) == 1
    assert model.out.weight is model.embed.weight and _inside(flat, model.out.weight)
    assert not any(p is model.frozen.weight for p in flat.params)
    assert [p is model.frozen.weight for p in opt.frozen].count(True) == 1
    norm = model.norm
    mixed = [b is norm.running_mean or b is norm.running_var for b in flat.buffers]
    assert mixed == ([True, True] if buffers == "mix" else [])
    broadcast = {"mix": [norm.num_batches_tracked], "broadcast": list(norm.buffers()),
                 "local": []}[buffers]
    assert [id(t) for t in opt.side.tensors] == [id(t) for t in broadcast]
    for b in flat.buffers:
        assert _inside(flat, b)
    for _ in range(3):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(_tokens(1)[0]), _tokens(1)[1]).backward()
        opt.step()
    assert torch.equal(model.frozen.weight, frozen)
    assert int(norm.num_batches_tracked) == 3
    opt.check()
    opt.free()


def _net_in(dtype=None, device=None):
    model = _Net()
    if dtype is not None:
        model.norm.to(dtype)
    if device is not None:
        model.to(device)
    return model


@pytest.mark.parametrize("make,options,message", [
    (lambda: _net_in(device="meta"), {}, r"on the CPU or one CUDA device, all float32, all "
                                         r"float64, all bfloat16 or all float16; got frozen "
                                         r"parameters on meta: move"),
    (lambda: _net_in(dtype=torch.float64), {},
     r"all bfloat16 or all float16: got parameters of torch.float32, torch.float64; "
     r"convert"),
    (_net_in, {"buffers": "everything"}, r"buffers must be one of"),
    (_net_in, {"mode": "parallel"}, r"pass buffers='broadcast' or 'local'"),
    (_net_in, {"buffers": "broadcast", "sync": "hop"},
     r"buffers='broadcast' is a collective at every mix"),
])
def test_wrapper_refuses_what_it_cannot_exchange_in_one_line(make, options, message):
    model = make()
    options = {"sync": "notify_ack", **options}
    with pytest.raises(ConfigError, match=message) as info:
        DecentralizedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), "complete",
                               model=model, **options)
    assert "\n" not in str(info.value)


def test_float_buffers_of_another_dtype_are_refused_unless_not_mixed():
    model = _Net()
    model.norm.running_mean.data = model.norm.running_mean.double()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ConfigError, match=r"buffers mixed with the parameters must be "
                                          r"torch.float32.*buffers='broadcast'"):
        DecentralizedOptimizer(sgd, "complete", model=model)
    DecentralizedOptimizer(sgd, "complete", model=model, buffers="broadcast").free()


def test_wrapper_refuses_groups_added_later_wrapping_twice_and_unfreezing():
    model = _Net()
    opt = DecentralizedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), "complete",
                                 model=model)
    with pytest.raises(ConfigError, match="add the group to the torch optimizer"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(2))]})
    with pytest.raises(ConfigError, match=r"wrap the plain torch\.optim optimizer once"):
        DecentralizedOptimizer(opt, "complete")
    with pytest.raises(ConfigError, match=r"must be a torch\.nn\.Module"):
        DecentralizedOptimizer(opt.optimizer, "complete", model=object())
    model.frozen.weight.requires_grad_(True)
    with pytest.raises(ConfigError, match="create it after unfreezing them"):
        opt.check()
    model.frozen.weight.requires_grad_(False)
    model.norm.num_batches_tracked.data = torch.tensor(0)   # replaced, not updated
    with pytest.raises(ConfigError, match="moved out of the broadcast buffer"):
        opt.check()
    opt.free()


@pytest.mark.parametrize("change", ["add_module", "new attribute", "parameter replaced",
                                    "buffer registered"])
def test_a_model_changed_after_wrapping_is_refused_at_the_next_step(change):
    # its new tensors would never be exchanged: replicas drift apart (issue 49, item 4)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    opt = DecentralizedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), "complete",
                                 model=model)

    def step():
        opt.zero_grad()
        model(torch.ones(2, 4)).sum().backward()
        opt.step()

    try:
        step()
        unrelated = torch.nn.Linear(5, 5)       # another model: registers, changes nothing
        step()
        opt.check()
        if change == "add_module":
            model.add_module("extra", torch.nn.Linear(2, 2))
        elif change == "new attribute":
            model[1] = torch.nn.Linear(3, 2)
        elif change == "parameter replaced":
            model[0].weight = torch.nn.Parameter(torch.zeros(3, 4))
        else:
            model[0].register_buffer("scale", torch.ones(3))
        what = "buffers" if change == "buffer registered" else "parameters"
        with pytest.raises(ConfigError, match=f"the model's {what} changed after the "
                                              f"DecentralizedOptimizer was created"):
            step()
        with pytest.raises(ConfigError, match="wrap the model's optimizer again"):
            opt.check()
        assert unrelated.weight.shape == (5, 5)
    finally:
        opt.free()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_state_dict_round_trip_through_the_wrapper_continues_bitwise(dtype):
    # bfloat16: the float32 master weights travel in the optimizer's state_dict
    def make():
        model = _Net().to(getattr(torch, dtype))
        opt = DecentralizedOptimizer(torch.optim.AdamW(model.parameters(), lr=0.05),
                                     "complete", model=model)
        return model, opt, torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)

    def train(model, opt, sched, ks):
        for k in ks:
            opt.zero_grad()
            x, y = _tokens(k)
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            sched.step()

    model, opt, sched = make()
    train(model, opt, sched, range(4))
    saved = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(),
                "sched": sched.state_dict()}, saved)
    train(model, opt, sched, range(4, 7))
    model2, opt2, sched2 = make()
    saved.seek(0)
    back = torch.load(saved, weights_only=False)
    model2.load_state_dict(back["model"])
    opt2.load_state_dict(back["opt"])
    sched2.load_state_dict(back["sched"])
    assert opt2.iteration == 4 and opt2.exchange.version == 4
    assert ("master" in back["opt"]) == (dtype == "bfloat16")
    train(model2, opt2, sched2, range(4, 7))
    assert opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"] == 0.0125
    for (name, a), b in zip(model.state_dict().items(), model2.state_dict().values()):
        assert torch.equal(a, b), name
    opt2.check()                       # the loaded tensors stayed in the buffers
    opt.free()
    opt2.free()


@pytest.mark.parametrize("mode", ["serial", "parallel"])
def test_one_rank_bfloat16_with_masters_is_float32_training_rounded(mode):
    # one rank: the wrapped run must equal SGD on float32 copies whose roundings the
    # bfloat16 model computes with, bitwise; without masters the updates are rounded away
    def model():
        return _model().to(torch.bfloat16)

    x = torch.randn(8, 1, 8, 8, generator=torch.Generator().manual_seed(1)).bfloat16()
    y = torch.randint(0, 4, (8,), generator=torch.Generator().manual_seed(2))
    plain = model()
    masters = [p.detach().float().clone().requires_grad_() for p in plain.parameters()]
    opt_plain = torch.optim.SGD(masters, lr=1e-3, momentum=0.9)
    wrapped, stuck = model(), model()
    opt = DecentralizedOptimizer(torch.optim.SGD(wrapped.parameters(), lr=1e-3,
                                                 momentum=0.9), "complete", mode=mode)
    opt_stuck = DecentralizedOptimizer(torch.optim.SGD(stuck.parameters(), lr=1e-3,
                                                       momentum=0.9), "complete",
                                       master_weights=False)
    assert opt.master is not None and opt_stuck.master is None
    for _ in range(6):
        opt_plain.zero_grad()
        plain.zero_grad()
        torch.nn.functional.cross_entropy(plain(x).float(), y).backward()
        for p, m in zip(plain.parameters(), masters):
            m.grad = p.grad.float()
        opt_plain.step()
        with torch.no_grad():
            for p, m in zip(plain.parameters(), masters):
                p.copy_(m)
        for m, o in ((wrapped, opt), (stuck, opt_stuck)):
            o.zero_grad()
            torch.nn.functional.cross_entropy(m(x).float(), y).backward()
            o.step()
    for p, q in zip(plain.parameters(), wrapped.parameters()):
        assert q.dtype == torch.bfloat16 and _inside(opt.flat, q)
        assert torch.equal(p, q)
    for m, ref in zip(opt.master.params, masters):
        assert torch.equal(m.detach(), ref.detach())
    # the same steps on the bfloat16 weights themselves round updates away
    moved = sum(int((p != q).sum()) for p, q in zip(plain.parameters(), stuck.parameters()))
    assert moved > 0
    assert opt.param_groups[0]["params"][0].dtype == torch.float32
    opt.free()
    opt_stuck.free()


def test_master_weights_refuse_what_they_cannot_do_in_one_line():
    with pytest.raises(ConfigError, match=r"these are torch\.float32: leave master_weights"):
        model = _model()
        DecentralizedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), "complete",
                               master_weights=True)
    with pytest.raises(ConfigError, match="master_weights must be True, False or None"):
        model = _model().bfloat16()
        DecentralizedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), "complete",
                               master_weights="yes")
    model = _model().bfloat16()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.zeros(1, 1, 8, 8, dtype=torch.bfloat16)).sum().backward()
    sgd.step()
    with pytest.raises(ConfigError, match="wrap it before its first step"):
        DecentralizedOptimizer(sgd, "complete")
    model = _model().bfloat16()
    opt = DecentralizedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), "complete",
                                 master_weights=False)
    other = _model().bfloat16()
    with_masters = DecentralizedOptimizer(torch.optim.SGD(other.parameters(), lr=0.1),
                                          "complete")
    with pytest.raises(ConfigError, match="written with master weights on"):
        opt.load_state_dict(with_masters.state_dict())
    opt.free()
    with_masters.free()


def test_checkpoint_round_trip_of_model_and_adam_state(tmp_path):
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    x = torch.randn(4, 1, 8, 8)
    for _ in range(3):
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
    rng = tstate.rng_state()
    expected = torch.randn(5)                         # what the saved generator draws
    tree = {"model": tstate.module_state(model),
            "optimizer": tstate.optimizer_state(opt.state_dict()),
            "rng": {"torch": rng}, "iteration": 3}
    save_tree(str(tmp_path / "c.h5"), tree)
    back = load_tree(str(tmp_path / "c.h5"))
    model2 = _model()
    with torch.no_grad():
        for p in model2.parameters():
            p.zero_()
    opt2 = torch.optim.Adam(model2.parameters(), lr=0.5)
    tstate.load_module_state(model2, back["model"])
    opt2.load_state_dict(tstate.load_optimizer_state(back["optimizer"]))
    for p, q in zip(model.parameters(), model2.parameters()):
        assert torch.equal(p, q)
    s1, s2 = opt.state_dict(), opt2.state_dict()
    assert s1["param_groups"] == s2["param_groups"]
    for i, entries in s1["state"].items():
        for key, value in entries.items():
            assert torch.equal(value, s2["state"][i][key]), key
    # both optimizers continue identically
    for m, o in ((model, opt), (model2, opt2)):
        o.zero_grad()
        m(x).sum().backward()
        o.step()
    for p, q in zip(model.parameters(), model2.parameters()):
        assert torch.equal(p, q)
    tstate.set_rng_state(back["rng"]["torch"])
    assert torch.equal(torch.randn(5), expected)      # the generator went back


# ---------------------------------------------------------------------- multi-rank

@pytest.mark.mpi
@pytest.mark.parametrize("path", PATHS)
def test_wrapper_matches_a_replay_of_optimizer_and_mixing(path):
    # which optimizer is wrapped, and the serial mode, are logic above the core: on MPICH
    # only; Open MPI runs the parallel mode (the exchange's thread beside the training).
    # The cases run one after another in one job: one start of torch on 4 ranks, not 4
    cases = [("momentum", "parallel")] if STACK != "mpich" else [
        ("momentum", "serial"), ("momentum", "parallel"), ("adam", "serial"),
        ("adam", "parallel")]
    results = run_cases({f"{kind}-{mode}": ("torch_wrapper_replays",
                                            {"optimizer": kind, "mode": mode})
                         for kind, mode in cases}, 4, path, timeout=300)
    for kind, mode in cases:
        for res in results[f"{kind}-{mode}"]:
            case = (kind, mode, res)
            assert max(res["errors"]) < 1e-5, case
            assert res["version"] == 6, case
            # parallel: Send(7) is already out, before step 7's Compute
            sends = 6 + (mode == "parallel")
            assert res["bytes_sent"] == sends * res["out_degree"] * res["model_bytes"], case
            # the shared transport (on one host, unless transport="auto" measured
            # messages faster): the parameters alternate between the exchange's two
            # buffers
            assert path == "shm" or not res["double_buffered"], case
            assert res["homes"] == (2 if res["double_buffered"] else 1), case


#: the 4-rank shared-memory scenarios of the tests below, run one after another in one
#: job (one start of torch on 4 ranks for all, not eight: 2-3 s of CPU a rank each);
#: key -> (scenario, kwargs, whether it is logic above the core: MPICH only)
SHM_CASES = {
    "period-3": ("torch_wrapper_replays",
                 {"optimizer": "momentum", "steps": 7, "period": 3}, True),
    "period-serial": ("torch_wrapper_replays",
                      {"optimizer": "adam", "steps": 8, "period": 2, "mode": "serial"},
                      False),
    "period-parallel": ("torch_wrapper_replays",
                        {"optimizer": "adam", "steps": 8, "period": 2, "mode": "parallel"},
                        False),
    # hop without backup workers reduces every in-neighbour's version k: exact replay
    "hop": ("torch_wrapper_replays", {"optimizer": "adam", "steps": 5, "graph": "complete",
                                      "sync": "hop", "options": {"max_gap": 2}}, True),
    "hop-backup": ("torch_wrapper_replays",
                   {"optimizer": "momentum", "steps": 8, "graph": "complete", "sync": "hop",
                    "options": {"backup": 1}}, True),
    "broadcast": ("torch_broadcast_starts_equal", {}, False),
    "state-dict": ("torch_state_dict_has_exchange", {}, True),
    "buffers": ("torch_tied_batchnorm_frozen", {}, True),
}


@pytest.fixture(scope="module")
def shm_cases():
    """SHM_CASES' per-rank results by key (on Open MPI, those not above the core)."""
    return run_cases({key: (name, kwargs) for key, (name, kwargs, above)
                      in SHM_CASES.items() if STACK == "mpich" or not above}, 4, "shm",
                     timeout=900)


@above_the_core
@pytest.mark.mpi
def test_wrapper_with_a_period_mixes_every_period_steps(shm_cases):
    for res in shm_cases["period-3"]:
        assert max(res["errors"]) < 1e-5, res["errors"]
        assert res["version"] == 2                        # steps 3 and 6
        assert res["bytes_sent"] == 2 * res["out_degree"] * res["model_bytes"]


@pytest.mark.mpi
@pytest.mark.parametrize("mode", ["serial", "parallel"])
def test_wrapper_replays_with_a_period_in_both_modes(mode, shm_cases):
    for res in shm_cases[f"period-{mode}"]:
        assert max(res["errors"]) < 1e-5, res["errors"]
        assert res["version"] == 4


@above_the_core
@pytest.mark.mpi
def test_wrapper_replays_under_hop(shm_cases):
    for res in shm_cases["hop"]:
        assert max(res["errors"]) < 1e-5, res["errors"]
        assert res["version"] == 5


@above_the_core
@pytest.mark.mpi
def test_wrapper_under_hop_with_a_backup_worker(shm_cases):
    # a backup worker's reduce leaves late inputs out: no exact replay, but every rank
    # completes every step with its parameters in the exchange buffer
    for res in shm_cases["hop-backup"]:
        assert res["version"] == 8
        assert all(np.isfinite(res["errors"]))


@pytest.mark.mpi
def test_broadcast_gives_every_rank_the_same_start(shm_cases):
    assert all(r["equal"] for r in shm_cases["broadcast"])


@above_the_core
@pytest.mark.mpi
def test_state_dict_carries_the_exchange_state(shm_cases):
    for res in shm_cases["state-dict"]:
        assert res["saved_version"] == 5 and res["saved_iteration"] == 5
        assert res["version_after"] == 6 and res["iteration_after"] == 6
        assert res["bytes_after"] > res["saved_bytes"] > 0


@above_the_core
@pytest.mark.mpi
def test_buffers_mix_with_tied_frozen_scheduler_clipping_and_bf16_on_a_ring(shm_cases):
    # 4 ranks, 40 steps on the (directed) ring, different data per rank: AdamW, StepLR
    # given the wrapper, clip_grad_norm_, bf16 autocast; run with buffers="mix" and,
    # from the same start, buffers="local" (the behaviour before buffers were mixed)
    results = shm_cases["buffers"]
    lr, expected = 0.02, []
    for k in range(1, 41):
        lr = lr * 0.8 if k % 10 == 0 else lr       # StepLR(step_size=10, gamma=0.8)
        expected.append(lr)
    for rank, res in enumerate(results):
        mix, local = res["mix"], res["local"]
        # the step mixes the buffers exactly as the parameters: W @ everyone's
        assert max(mix["mix_errors"]) < 1e-6, mix["mix_errors"]
        assert mix["buffers_in_flat"] and not local["buffers_in_flat"]
        # num_batches_tracked is rank 0's after every mix, although odd ranks ran an
        # extra forward pass at step 20; left local, they keep their own count
        assert all(mix["tracked_equal"]) and mix["batches_tracked"] == 40
        assert all(local["tracked_equal"]) == (rank % 2 == 0)
        for run_ in (mix, local):
            assert run_["lrs"] == run_["inner_lrs"] == expected
            assert run_["scheduler_warnings"] == []
            assert run_["tied"] and run_["tied_in_flat"] == 1
            assert not run_["frozen_in_flat"]
            assert run_["frozen_unchanged"] and run_["frozen_spread"] == 0.0
            assert run_["dtype"] == "torch.float32"
    mix, local = results[0]["mix"], results[0]["local"]
    # BatchNorm trains on batch statistics: the parameters are the same in both runs
    assert mix["params_spread"] == local["params_spread"] > 0
    assert mix["buffers_spread"] <= 2 * mix["params_spread"], mix
    assert local["buffers_spread"] > 4 * local["params_spread"], local


def test_learning_rate_schedules_of_the_demos():
    from asapmpi.torch.trainer import learning_rate
    from asapmpi.train.config import TrainConfig

    mlp = TrainConfig(model="mlp", iters=100, lr=0.1).resolved()
    assert [learning_rate(mlp, k) for k in (0, 50, 100, 150)] == pytest.approx(
        [0.1, 0.05, 0.0, 0.0])
    assert learning_rate(mlp, 25) > learning_rate(mlp, 26)
    svm = TrainConfig(model="svm", iters=100, lr=0.5, lam=1e-4).resolved()
    assert learning_rate(svm, 200) == pytest.approx(0.5 / (1 + 1e-4 * 0.5 * 200))
    cnn = TrainConfig(model="cnn", iters=100, lr=0.05).resolved()
    assert learning_rate(cnn, 0) == learning_rate(cnn, 99) == 0.05


@pytest.mark.mpi
@pytest.mark.parametrize("path", PATHS)
def test_a_forgotten_free_is_one_line_per_rank_and_no_traceback(path, tmp_path):
    # an optimizer (its exchange, its join board) never freed: each rank says so once,
    # and the MPI's own complaints about the registered memory are not repeated
    import subprocess
    import sys

    from mpilaunch import job_command

    script = tmp_path / "forget.py"
    script.write_text(
        "import torch\nfrom asapmpi.torch import DecentralizedOptimizer\n"
        "model = torch.nn.Linear(8, 2)\n"
        "opt = DecentralizedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), "
        "'ring', model=model, timeout=60)\n"
        "for _ in range(3):\n"
        "    opt.zero_grad()\n"
        "    model(torch.ones(4, 8)).sum().backward()\n"
        "    opt.step()\n"
        "print('trained', flush=True)\n")
    cmd, env = job_command(2, [sys.executable, str(script)], path, timeout=90)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("trained") == 2, proc.stdout
    said = sorted(line for line in proc.stderr.splitlines() if "without free()" in line)
    assert [line.split(":")[1] for line in said] == [" rank 0", " rank 1"], proc.stderr
    for noise in ("Traceback", "Exception ignored", "UCX", "mpool"):
        assert noise not in proc.stderr, proc.stderr
