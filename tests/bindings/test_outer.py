"""Local steps with an outer optimizer (DiLoCo; bindings/torch/outer.py, asapmpi.outer):
the Nesterov step against torch.optim.SGD(nesterov=True), outer_lr=1 and momentum 0 as
period=H bit for bit, DiLoCo over allreduce against a reference from every rank's local
weights, exact resume, join, the trainer's and the benchmark's options, and each bad
input's one line.

Each multi-rank scenario's body is here, beside its test (`test_outer:NAME`)."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from mpi4py import MPI  # noqa: E402

from asapmpi.errors import ConfigError  # noqa: E402
from asapmpi.outer import OuterSettings  # noqa: E402
from asapmpi.torch import DecentralizedOptimizer  # noqa: E402
from asapmpi.torch.outer import OuterOptimizer  # noqa: E402

from mpilaunch import above_the_core, run  # noqa: E402

#: the round length of the tests: 3 local steps
H = 3


def _model(dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(),
                               torch.nn.Linear(5, 1)).to(dtype)


def _batch(rank, step, dtype):
    # a pure function of (rank, step): a resumed run draws what the whole one drew
    g = torch.Generator().manual_seed(1000 * rank + step)
    x = torch.randn(16, 6, generator=g).to(dtype)
    return x, (x[:, :1] * 2.0 - x[:, 1:2]).to(dtype)


def _train(model, opt, steps, rank=0, first=0):
    dtype = next(model.parameters()).dtype
    for step in range(first, first + steps):
        x, y = _batch(rank, step, dtype)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x).float(), y.float()).backward()
        opt.step()


def _flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


# ---------------------------------------------------------------------- serial

@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-13), (torch.float32, 1e-6)])
def test_the_outer_step_is_torch_sgd_with_nesterov_momentum(dtype, tol):
    # the same pseudo-gradients through OuterOptimizer and torch's SGD(nesterov=True)
    g = torch.Generator().manual_seed(3)
    start = torch.randn(257, generator=g, dtype=torch.float64).to(dtype)
    outer = OuterOptimizer(OuterSettings("diloco", H, 0.7, 0.9), 257, dtype,
                           torch.device("cpu"))
    outer.begin(start)
    ref = torch.nn.Parameter(start.clone())
    sgd = torch.optim.SGD([ref], lr=0.7, momentum=0.9, nesterov=True)
    for _ in range(6):
        mixed = (ref.detach() + 0.1 * torch.randn(257, generator=g,
                                                   dtype=torch.float64).to(dtype))
        weights = mixed.clone()
        outer.step(weights)
        ref.grad = ref.detach() - mixed
        sgd.step()
        assert torch.allclose(weights, ref.detach(), rtol=tol, atol=tol)
        assert torch.equal(outer.start, weights)          # the next round starts there
    assert outer.rounds == 6
    assert torch.allclose(outer.buffer, sgd.state[ref]["momentum_buffer"], rtol=tol,
                          atol=tol)


def test_one_rank_replays_local_steps_and_outer_nesterov_steps():
    # one rank: the exchange's mix is the identity, so the wrapper must equal a plain
    # replay: H inner steps (the inner optimizer's state kept across rounds), then
    # SGD(nesterov=True) on the round's start with gradient start - local weights.
    # Weights written after wrapping (pretrained ones) are the first round's start.
    model = _model(torch.float64)
    opt = DecentralizedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                 "complete", comm=MPI.COMM_SELF, model=model,
                                 outer="diloco", local_steps=H, outer_lr=0.6,
                                 outer_momentum=0.8)
    pretrained = _model(torch.float64, seed=5)
    model.load_state_dict(pretrained.state_dict())
    _train(model, opt, 4 * H + 1)
    plain = _model(torch.float64, seed=5)
    inner = torch.optim.SGD(plain.parameters(), lr=0.05, momentum=0.9)
    start = [torch.nn.Parameter(p.detach().clone()) for p in plain.parameters()]
    outer = torch.optim.SGD(start, lr=0.6, momentum=0.8, nesterov=True)
    for step in range(4 * H + 1):
        _train(plain, inner, 1, first=step)
        if (step + 1) % H == 0:
            for s, p in zip(start, plain.parameters()):
                s.grad = s.detach() - p.detach()
            outer.step()
            with torch.no_grad():
                for s, p in zip(start, plain.parameters()):
                    p.copy_(s)
    assert torch.allclose(_flat(model), _flat(plain), rtol=1e-12, atol=1e-12)
    assert opt.outer.rounds == 4 and opt.exchange.version == 4
    opt.free()


def _wrap(model, **kwargs):
    return DecentralizedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), "complete",
                                  comm=MPI.COMM_SELF, model=model, **kwargs)


@pytest.mark.parametrize("kwargs, words", [
    ({"outer": "adam", "local_steps": 4}, "option outer must be one of 'diloco' or none, "
                                          "got 'adam'"),
    ({"outer": "diloco", "local_steps": 4, "outer_lr": 0}, "outer_lr must be a finite "
                                                          "number > 0, got 0"),
    ({"outer": "diloco", "local_steps": 4, "outer_lr": float("nan")}, "outer_lr must be"),
    ({"outer": "diloco", "local_steps": 4, "outer_momentum": 1.0},
     "outer_momentum must be a finite number in [0, 1), got 1.0"),
    ({"outer": "diloco", "local_steps": 4, "outer_momentum": -0.1}, "outer_momentum must"),
    ({"outer": "diloco", "local_steps": 0}, "local_steps must be an integer >= 1 or none, got 0"),
    ({"outer": "diloco", "local_steps": 2.5}, "local_steps must be an integer"),
    ({"outer": "diloco"}, "outer='diloco' needs local_steps=H"),
    ({"outer": "diloco", "local_steps": 4, "period": 2}, "local_steps=4 and period=2 "
                                                         "disagree"),
    ({"local_steps": 4}, "local_steps go(es) with outer='diloco'"),
    ({"outer_lr": 0.5, "period": 2}, "outer_lr go(es) with outer='diloco'"),
    ({"outer": "diloco", "local_steps": 4, "sync": "backup_ps"},
     "outer='diloco': sync='backup_ps' has a server rank that only averages"),
    ({"outer": "diloco", "local_steps": 4, "sync": "elastic"}, "sync='elastic' has a server"),
])
def test_bad_outer_settings_are_one_line_before_any_exchange(kwargs, words):
    model = _model()
    ptrs = [p.data_ptr() for p in model.parameters()]
    sync = kwargs.pop("sync", "notify_ack")
    with pytest.raises(ConfigError) as info:
        DecentralizedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                               None if sync != "notify_ack" else "complete", sync,
                               comm=MPI.COMM_SELF, **kwargs)
    message = str(info.value)
    assert words in message and "\n" not in message, message
    if "sync" not in message:
        # refused before anything moved: the parameters are where they were
        assert [p.data_ptr() for p in model.parameters()] == ptrs


def test_period_alone_is_the_round_length_and_equal_values_are_accepted():
    for kwargs in ({"period": 4}, {"period": 4, "local_steps": 4}):
        model = _model()
        opt = _wrap(model, outer="diloco", **kwargs)
        assert opt.period == 4 and opt.outer.lr == 0.7 and opt.outer.momentum == 0.9
        opt.free()
    plain = _wrap(_model())
    assert plain.period == 1 and plain.outer is None
    plain.free()


def test_checkpoints_with_and_without_outer_state_do_not_mix():
    with_outer = _wrap(_model(), outer="diloco", local_steps=H)
    without = _wrap(_model(), period=H)
    with pytest.raises(ConfigError, match="written without an outer optimizer, this "
                                          "optimizer has one; pass the same outer="):
        with_outer.load_state_dict(without.state_dict())
    with pytest.raises(ConfigError, match="written with an outer optimizer, this "
                                          "optimizer has none"):
        without.load_state_dict(with_outer.state_dict())
    state = with_outer.state_dict()
    state["outer"] = dict(state["outer"], start=torch.zeros(3))
    with pytest.raises(ConfigError, match=r"outer state holds \(3,\) values"):
        with_outer.load_state_dict(state)
    with_outer.free()
    without.free()


def test_the_outer_state_survives_a_checkpoint_file(tmp_path):
    # the trainer's checkpoint tree: tensors as arrays, the rest as JSON leaves
    from asapmpi.train.checkpoint import load_tree, save_tree

    model = _model()
    opt = _wrap(model, outer="diloco", local_steps=H, outer_lr=0.55)
    _train(model, opt, 2 * H + 1)
    saved = opt.state_dict()["outer"]
    save_tree(str(tmp_path / "o.h5"), {k: v.numpy() if torch.is_tensor(v) else v
                                       for k, v in saved.items()})
    other = _wrap(_model(), outer="diloco", local_steps=H)
    other.outer.load_state_dict(load_tree(str(tmp_path / "o.h5")))
    assert other.outer.lr == 0.55 and other.outer.rounds == 2 and other.outer.started
    assert torch.equal(other.outer.start, opt.outer.start)
    assert torch.equal(other.outer.buffer, opt.outer.buffer)
    opt.free()
    other.free()


def test_the_trainer_and_its_run_specs_take_the_outer_options():
    from asapmpi.cli import build_parser
    from asapmpi.train import cli as train_cli
    from asapmpi.train.config import TrainConfig, parse_run

    def configs(*argv):
        return train_cli.configs(build_parser().parse_args(["train", "svm", *argv]))

    [cfg] = configs("--outer", "diloco", "--local-steps", "8", "--outer-lr", "0.5")
    assert (cfg.period, cfg.local_steps, cfg.outer_lr, cfg.outer_momentum) == (8, 8, 0.5, 0.9)
    runs = configs("--compare", "allreduce,allreduce:outer=diloco:local_steps=6,"
                                "gossip:outer=diloco:local_steps=4:outer_momentum=0")
    assert [(r.outer, r.period, r.outer_momentum) for r in runs] == \
        [(None, 1, None), ("diloco", 6, 0.9), ("diloco", 4, 0.0)]
    assert parse_run("hop:backup=1:outer=diloco:local_steps=5", "ring")[3] == \
        {"outer": "diloco", "local_steps": 5}
    for argv, words in [
            (("--local-steps", "8"), "local_steps go(es) with outer='diloco'"),
            (("--outer", "diloco"), "needs local_steps=H"),
            (("--outer", "diloco", "--local-steps", "8", "--period", "4"), "disagree"),
            (("--outer", "diloco", "--local-steps", "8", "--outer-momentum", "1"),
             "outer_momentum must be a finite number in [0, 1)"),
            (("--outer", "diloco", "--local-steps", "8", "--sync", "backup_ps"),
             "--outer diloco: sync='backup_ps' has a server rank"),
            (("--compare", "allreduce:outer=diloco:local_steps=x"),
             "local_steps must be an integer >= 1 or none, got 'x'")]:
        with pytest.raises(ConfigError) as info:
            configs(*argv)
        assert words in str(info.value) and "\n" not in str(info.value), str(info.value)
    # a checkpoint of a run without outer resumes with the same configuration
    assert TrainConfig().resolved().resume_mismatch(TrainConfig().resolved().as_dict()) is None


def test_bench_training_passes_outer_runs_to_the_trainer():
    from asapmpi.bench import training
    from asapmpi.cli import build_parser

    args = build_parser().parse_args(["bench", "training", "--one-host", "--policies",
                                      "allreduce,allreduce:outer=diloco:local_steps=8"])
    assert training.check(args) == ["allreduce", "allreduce:outer=diloco:local_steps=8"]
    bad = build_parser().parse_args(["bench", "training", "--one-host", "--policies",
                                     "allreduce,allreduce:outer=diloco:outer_lr=-1"])
    with pytest.raises(ConfigError, match="outer_lr must be a finite number > 0"):
        training.check(bad)


# ---------------------------------------------------------------------- multi-rank

@pytest.mark.mpi
@above_the_core     # the optimizer wrapper: logic above the core, MPICH only
def test_diloco_over_allreduce_and_the_plain_period_on_two_ranks():
    res = run("test_outer:rounds", 2, "shm", timeout=180)
    # DiLoCo: the start of every round is the same on both ranks, bit for bit, and is
    # torch's SGD(nesterov=True) on the mean of the ranks' local weights
    starts = [np.array(r["starts"]) for r in res]
    assert np.array_equal(starts[0], starts[1])
    ref = torch.nn.Parameter(torch.tensor(res[0]["initial"], dtype=torch.float64))
    sgd = torch.optim.SGD([ref], lr=0.7, momentum=0.9, nesterov=True)
    for k in range(len(starts[0])):
        local = np.mean([r["locals"][k] for r in res], axis=0)
        ref.grad = ref.detach() - torch.from_numpy(local)
        sgd.step()
        assert np.allclose(starts[0][k], ref.detach().numpy(), rtol=1e-12, atol=1e-12), k
    assert res[0]["rounds"] == len(starts[0]) == 3
    # outer_lr=1, outer_momentum=0 is period=H bit for bit (float32; bfloat16 with
    # master weights; both computation graphs)
    for r in res:
        for case, (plain, outer) in r["equal"].items():
            assert plain == outer, case


@pytest.mark.mpi
@above_the_core     # the optimizer wrapper: logic above the core, MPICH only
def test_a_resumed_run_continues_exactly_on_two_ranks(tmp_path):
    for r in run("test_outer:resumed", 2, "shm", timeout=180, folder=str(tmp_path)):
        for dtype, (whole, resumed) in r["params"].items():
            assert whole == resumed, dtype
        assert r["rounds"] == [4, 4]


@pytest.fixture(scope="module")
def joined_job():
    """One 2-rank job for the join test and the refusals (a job costs seconds)."""
    return run("test_outer:joined", 2, "shm", timeout=180, steps=[11, 4])


@pytest.mark.mpi
@above_the_core     # the optimizer wrapper: logic above the core, MPICH only
def test_join_keeps_the_outer_state_of_a_rank_that_ran_out_of_data(joined_job):
    res = joined_job
    allreduce = [r["allreduce"] for r in res]
    # rank 1 stepped along from step 5 on: both end at one version, one round per
    # version, and DiLoCo's state is the same on both ranks, the weights its start
    assert allreduce[0]["version"] == allreduce[1]["version"] >= 4
    for a in allreduce:
        assert a["rounds"] == a["version"] and a["start_is_weights"]
    assert allreduce[0]["params"] == allreduce[1]["params"]
    assert allreduce[0]["buffer"] == allreduce[1]["buffer"]
    # the joined rank's momentum is not zero: its outer steps went on
    assert any(abs(v) > 0 for v in allreduce[1]["buffer"])
    # hop: ranks drift, but every rank's rounds are its exchanges and its weights finite
    for r in res:
        hop = r["hop"]
        assert hop["rounds"] == hop["version"] and hop["start_is_weights"]
        assert np.all(np.isfinite(hop["params"]))


@pytest.mark.mpi
@above_the_core     # the optimizer wrapper: logic above the core, MPICH only
def test_ranks_with_different_outer_settings_are_refused_alike(joined_job):
    for r in (r["refusals"] for r in joined_job):
        assert "every rank must pass the same period, mode, buffers and outer settings" \
            in r["lr"], r
        assert "rank 1: period=3 mode=serial buffers=mix outer=('diloco', 3, 0.5, 0.9)" \
            in r["lr"], r
        assert "outer=None" in r["presence"], r


@pytest.mark.mpi
@above_the_core
def test_the_trainer_runs_diloco_and_resumes_it(tmp_path):
    # (exact resume is test_a_resumed_run_continues_exactly_on_two_ranks's: here the
    # command line, the checkpoint files and the bytes)
    import json
    import os
    import subprocess
    import sys

    from asapmpi.train.checkpoint import load_tree

    def train(out, iters, *extra):
        env = dict(os.environ)
        env.pop("PYTEST_CURRENT_TEST", None)
        proc = subprocess.run(
            [sys.executable, "-m", "asapmpi", "train", "svm", "-n", "2", "--sync",
             "allreduce", "--outer", "diloco", "--local-steps", "5", "--outer-lr", "0.8",
             "--iters", str(iters), "--eval-every", "10", "--out", str(out), "--json",
             str(tmp_path / "s.json"), "--no-progress", "--job-timeout", "150", *extra],
            capture_output=True, text=True, timeout=180, env=env, check=False)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return json.loads((tmp_path / "s.json").read_text()), proc.stdout

    train(tmp_path, 20)
    resumed, said = train(tmp_path, 40, "--resume")
    assert "'allreduce' resumes from iteration 20" in said, said
    # one exchange of the model per round of 5 steps (2 ranks: allreduce sends it once),
    # the first 4 rounds' counted in the checkpoint the run resumed from
    assert resumed["bytes_sent_per_rank"] == 40 // 5 * resumed["model_bytes"]
    for r in range(2):
        tree = load_tree(str(tmp_path / "checkpoints" / "svm-allreduce" / f"rank{r:05d}" /
                             "iter_000000040.h5"))
        outer = tree["trainer"]["outer"]
        assert (outer["rounds"], outer["lr"], outer["momentum"]) == (8, 0.8, 0.9)
        # a round ended at 40: the weights are its start (the SVM's one weight row and
        # its bias lie in the flat buffer without padding between them)
        weights = np.concatenate([v.ravel() for v in tree["model"].values()])
        assert np.array_equal(outer["start"], weights)


# ---------------------------------------------------------------- scenario bodies (on the ranks)
# tests/mpi/run.py runs each on every rank as "test_outer:NAME"


def _optimizer(comm, model, sync="allreduce", inner="momentum", **kwargs):
    params = model.parameters()
    opt = torch.optim.SGD(params, lr=0.05, momentum=0.9) if inner == "momentum" \
        else torch.optim.Adam(params, lr=0.01)
    graph = None if sync in ("allreduce", "gossip") else "complete"
    return DecentralizedOptimizer(opt, graph, sync, comm=comm, model=model, timeout=60,
                                  **kwargs)


def rounds(comm, steps=3 * H):
    """DiLoCo over allreduce in float64: every round's local weights (after its last
    inner step, before the exchange) and start; then period=H against outer_lr=1,
    outer_momentum=0 under notify_ack."""
    model = _model(torch.float64)
    opt = _optimizer(comm, model, outer="diloco", local_steps=H)
    initial = _flat(model).tolist()
    snapshots, locals_, starts = [], [], []
    # after the inner optimizer's step, before the wrapper's exchange
    opt.optimizer.register_step_post_hook(lambda *_: snapshots.append(_flat(model)))
    for step in range(steps):
        _train(model, opt, 1, comm.rank, step)
        if opt.iteration % H == 0:
            locals_.append(snapshots[-1].tolist())
            starts.append(_flat(model).tolist())
    out = {"initial": initial, "locals": locals_, "starts": starts,
           "rounds": opt.outer.rounds}
    opt.free()
    out["equal"] = {f"{dtype}-{mode}": [_run_once(comm, dtype, mode, {}),
                                        _run_once(comm, dtype, mode, {
                                            "outer": "diloco", "outer_lr": 1.0,
                                            "outer_momentum": 0.0})]
                    for dtype, mode in (("float32", "serial"), ("float32", "parallel"),
                                        ("bfloat16", "serial"))}
    return out


def _run_once(comm, dtype, mode, outer, steps=3 * H + 2):
    model = _model(getattr(torch, dtype))
    opt = _optimizer(comm, model, "notify_ack", "adam", period=H, mode=mode, **outer)
    _train(model, opt, steps, comm.rank)
    params = _flat(model).float().tolist()
    opt.free()
    return params


def resumed(comm, folder, steps=2 * H + 1, more=2 * H):
    """Train `steps` steps, checkpoint (model, optimizer with its outer state, as the
    trainer writes them), `more` steps; a fresh model and optimizer loaded from the
    checkpoint take the same `more` steps.  Their weights, in float32 and in bfloat16
    with master weights."""
    import os

    from asapmpi.torch import state
    from asapmpi.train.checkpoint import load_tree, save_tree

    out = {"params": {}, "rounds": []}
    for dtype in (torch.float32, torch.bfloat16):
        path = os.path.join(folder, f"rank{comm.rank}-{dtype}.h5")
        model = _model(dtype)
        opt = _optimizer(comm, model, "notify_ack", "adam", outer="diloco", local_steps=H)
        _train(model, opt, steps, comm.rank)
        trainer = opt.state_dict()
        tree = {"model": state.module_state(model),
                "optimizer": state.optimizer_state(trainer.pop("optimizer")),
                "trainer": _arrays(trainer)}
        save_tree(path, tree)
        _train(model, opt, more, comm.rank, steps)
        whole = _flat(model).float().tolist()
        out["rounds"].append(opt.outer.rounds)
        opt.free()

        model = _model(dtype, seed=9)
        opt = _optimizer(comm, model, "notify_ack", "adam", outer="diloco", local_steps=H,
                         broadcast=False)
        back = load_tree(path)
        state.load_module_state(model, back["model"])
        opt.load_state_dict({**back["trainer"],
                             "optimizer": state.load_optimizer_state(back["optimizer"])})
        _train(model, opt, more, comm.rank, steps)
        out["params"][str(dtype)] = [whole, _flat(model).float().tolist()]
        opt.free()
    return out


def _arrays(tree):
    # tensors as NumPy arrays, in nested dicts too (what the trainer's checkpoint does)
    return {k: _arrays(v) if isinstance(v, dict) else v.numpy() if torch.is_tensor(v)
            else v for k, v in tree.items()}


def joined(comm, steps=(11, 4)):
    """Rank r trains steps[r] steps under `with opt.join():` (allreduce, then hop);
    each run's outer state and weights; then the refusals of differing()."""
    out = {"refusals": differing(comm)}
    for sync in ("allreduce", "hop"):
        model = _model(torch.float64)
        opt = _optimizer(comm, model, sync, outer="diloco", local_steps=H)
        with opt.join():
            _train(model, opt, steps[comm.rank], comm.rank)
        weights = opt.flat.tensor[:opt.flat.params_numel]
        out[sync] = {"version": opt.exchange.version, "rounds": opt.outer.rounds,
                     "start_is_weights": bool(torch.equal(opt.outer.start, weights)),
                     "params": _flat(model).tolist(), "buffer": opt.outer.buffer.tolist()}
        opt.free()
    return out


def differing(comm):
    """Rank 1 passes another outer_lr, then no outer at all: the refusals."""
    out = {}
    for case, mine in (("lr", {"outer_lr": 0.5 if comm.rank else 0.7}),
                       ("presence", {} if comm.rank else {"outer_lr": 0.7})):
        kwargs = {"outer": "diloco", "local_steps": H, **mine} if mine else {"period": H}
        try:
            _optimizer(comm, _model(), **kwargs).free()
            out[case] = ""
        except ConfigError as exc:
            out[case] = str(exc)
    return out
