"""The PyTorch bindings (asapmpi.torch): zero-copy flat parameters, the optimizer wrapper
with SGD-momentum and Adam, serial and parallel computation graphs, periods, state."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from asapmpi.errors import ConfigError  # noqa: E402
from asapmpi.torch import DecentralizedOptimizer, FlatParameters  # noqa: E402
from asapmpi.torch import state as tstate  # noqa: E402
from asapmpi.train.checkpoint import load_tree, save_tree  # noqa: E402

from mpilaunch import PATHS, run  # noqa: E402


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


def test_flat_parameters_refuse_mixed_dtypes_and_moved_parameters():
    a = torch.nn.Parameter(torch.zeros(3))
    b = torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))
    with pytest.raises(ConfigError, match="all be float32 or all float64"):
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
@pytest.mark.parametrize("kind,mode", [("momentum", "serial"), ("adam", "serial"),
                                       ("momentum", "parallel"), ("adam", "parallel")])
def test_wrapper_matches_a_replay_of_optimizer_and_mixing(kind, mode, path):
    results = run("torch_wrapper_replays", 4, path, timeout=300, optimizer=kind, mode=mode)
    for res in results:
        assert max(res["errors"]) < 1e-5, res["errors"]
        assert res["version"] == 6
        # parallel: Send(7) is already out, before step 7's Compute
        sends = 6 + (mode == "parallel")
        assert res["bytes_sent"] == sends * res["out_degree"] * res["model_bytes"]
        # shared memory: the parameters alternate between the exchange's two buffers
        assert res["double_buffered"] == (path == "shm")
        assert res["homes"] == (2 if path == "shm" else 1)


@pytest.mark.mpi
def test_wrapper_with_a_period_mixes_every_period_steps():
    results = run("torch_wrapper_replays", 4, "shm", timeout=300, optimizer="momentum",
                  steps=7, period=3)
    for res in results:
        assert max(res["errors"]) < 1e-5, res["errors"]
        assert res["version"] == 2                        # steps 3 and 6
        assert res["bytes_sent"] == 2 * res["out_degree"] * res["model_bytes"]


@pytest.mark.mpi
@pytest.mark.parametrize("mode", ["serial", "parallel"])
def test_wrapper_replays_with_a_period_in_both_modes(mode):
    results = run("torch_wrapper_replays", 4, "shm", timeout=300, optimizer="adam",
                  steps=8, period=2, mode=mode)
    for res in results:
        assert max(res["errors"]) < 1e-5, res["errors"]
        assert res["version"] == 4


@pytest.mark.mpi
def test_wrapper_replays_under_hop():
    # hop without backup workers reduces every in-neighbour's version k: exact replay
    results = run("torch_wrapper_replays", 4, "shm", timeout=300, optimizer="adam",
                  steps=5, graph="complete", sync="hop", options={"max_gap": 2})
    for res in results:
        assert max(res["errors"]) < 1e-5, res["errors"]
        assert res["version"] == 5


@pytest.mark.mpi
def test_wrapper_under_hop_with_a_backup_worker():
    # a backup worker's reduce leaves late inputs out: no exact replay, but every rank
    # completes every step with its parameters in the exchange buffer
    results = run("torch_wrapper_replays", 4, "shm", timeout=300, optimizer="momentum",
                  steps=8, graph="complete", sync="hop", options={"backup": 1})
    for res in results:
        assert res["version"] == 8
        assert all(np.isfinite(res["errors"]))


@pytest.mark.mpi
def test_broadcast_gives_every_rank_the_same_start():
    assert all(r["equal"] for r in run("torch_broadcast_starts_equal", 4, "shm", timeout=120))


@pytest.mark.mpi
def test_state_dict_carries_the_exchange_state():
    for res in run("torch_state_dict_has_exchange", 4, "shm", timeout=120):
        assert res["saved_version"] == 5 and res["saved_iteration"] == 5
        assert res["version_after"] == 6 and res["iteration_after"] == 6
        assert res["bytes_after"] > res["saved_bytes"] > 0
