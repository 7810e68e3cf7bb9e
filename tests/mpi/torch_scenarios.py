"""Multi-rank scenarios of the PyTorch bindings (run by run.py, names start with torch_)."""
import numpy as np
import torch

from asapmpi.torch import DecentralizedOptimizer


def _model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))


def _batch(rank, k):
    g = torch.Generator().manual_seed(1000 * rank + k)
    return torch.randn(16, 7, generator=g), torch.randint(0, 3, (16,), generator=g)


def _make(kind, params):
    if kind == "momentum":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9)
    return torch.optim.Adam(params, lr=0.01)


def _flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().copy()


def _grads(model, x, y):
    model.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()


def torch_wrapper_replays(comm, optimizer="momentum", mode="serial", steps=6, graph="ring",
                          sync="notify_ack", period=1, options=None):
    """Every step of the wrapper equals a replay: a shadow copy of the model runs the
    plain optimizer; the mix is W @ (everyone's parameters), gathered with allgather.
    serial: Appl, then mix.  parallel: mix the pre-step parameters, then Appl the
    gradients computed before the mix."""
    rank = comm.Get_rank()
    model, shadow = _model(rank), _model(rank)        # different starts: broadcast off
    opt = DecentralizedOptimizer(_make(optimizer, model.parameters()), graph, sync,
                                 period=period, mode=mode, broadcast=False, comm=comm,
                                 **(options or {}))
    shadow_opt = _make(optimizer, shadow.parameters())
    w = opt.exchange.mixing
    homes = set()
    errors = []
    for k in range(1, steps + 1):
        x, y = _batch(rank, k)
        mixes = k % period == 0
        _grads(model, x, y)
        _grads(shadow, x, y)
        if mode == "serial" or not mixes:
            shadow_opt.step()
            if mixes:
                mixed = w[rank] @ np.array(comm.allgather(_flat(shadow)), dtype=np.float64)
                _set(shadow, mixed)
        else:
            mixed = w[rank] @ np.array(comm.allgather(_flat(shadow)), dtype=np.float64)
            _set(shadow, mixed)
            shadow_opt.step()
        opt.step()
        errors.append(float(np.max(np.abs(_flat(model) - _flat(shadow)))))
        # zero-copy: every parameter lives in the buffer the exchange reduces into
        assert opt.flat.array is opt.exchange.buffer
        flat_lo = opt.flat.tensor.data_ptr()
        assert opt.flat.array.ctypes.data == flat_lo
        for p in model.parameters():
            assert flat_lo <= p.data_ptr() < flat_lo + opt.flat.nbytes, \
                "a parameter left the exchange buffer"
        opt.flat.check()
        homes.add(flat_lo)
    sent = opt.exchange.bytes_sent
    version = opt.exchange.version
    double_buffered = opt.exchange.double_buffered
    final = _flat(model)
    opt.free()
    # after free the parameters are back in private memory, with the final values
    assert opt.flat.array is opt.flat.home
    assert len(opt.flat._views) == 1, "the freed exchange's memory is still referenced"
    assert all(opt.flat.tensor.data_ptr() <= p.data_ptr()
               < opt.flat.tensor.data_ptr() + opt.flat.nbytes for p in model.parameters())
    assert np.array_equal(_flat(model), final)
    return {"errors": errors, "bytes_sent": sent, "version": version,
            "homes": len(homes), "double_buffered": double_buffered,
            "model_bytes": int(opt.flat.nbytes), "out_degree": len(opt.exchange.out_neighbours)}


def _set(model, flat):
    with torch.no_grad():
        offset = 0
        for p in model.parameters():
            n = p.numel()
            p.copy_(torch.from_numpy(flat[offset:offset + n].astype(np.float32)).view_as(p))
            offset += n


def torch_broadcast_starts_equal(comm):
    """broadcast=True gives every rank rank 0's initial parameters."""
    model = _model(comm.Get_rank())
    opt = DecentralizedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), "ring",
                                 "notify_ack", comm=comm)
    values = comm.allgather(_flat(model))
    opt.free()
    return {"equal": all(np.array_equal(values[0], v) for v in values)}


def torch_state_dict_has_exchange(comm, steps=5):
    """state_dict carries the exchange's version and traffic; load_state_dict continues
    the count on a new exchange."""
    rank = comm.Get_rank()
    model = _model(0)
    opt = DecentralizedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), "ring",
                                 "hop", comm=comm, max_gap=2)
    for k in range(steps):
        _grads(model, *_batch(rank, k))
        opt.step()
    state = opt.state_dict()
    opt.free()
    model2 = _model(0)
    opt2 = DecentralizedOptimizer(torch.optim.SGD(model2.parameters(), lr=0.1), "ring",
                                  "hop", comm=comm, max_gap=2)
    opt2.load_state_dict(state)
    _grads(model2, *_batch(rank, steps))
    opt2.step()
    result = {"saved_version": state["exchange"]["version"],
              "saved_iteration": state["iteration"],
              "saved_bytes": state["exchange"]["bytes_sent"],
              "version_after": opt2.exchange.version, "iteration_after": opt2.iteration,
              "bytes_after": opt2.exchange.bytes_sent}
    opt2.free()
    return result


class _TiedNet(torch.nn.Module):
    """An embedding tied to the output layer, a frozen layer and BatchNorm."""

    def __init__(self, vocab=16, dim=8):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.frozen = torch.nn.Linear(dim, dim)
        self.frozen.requires_grad_(False)
        self.norm = torch.nn.BatchNorm1d(dim)
        self.out = torch.nn.Linear(dim, vocab, bias=False)
        self.out.weight = self.embed.weight

    def forward(self, tokens):
        return self.out(self.norm(torch.tanh(self.frozen(self.embed(tokens)))))


def _tokens(rank, k, skew, vocab=16, batch=32):
    # each rank draws mostly from its own quarter of the vocabulary: different data, so
    # different BatchNorm statistics on every rank
    g = torch.Generator().manual_seed(7000 * rank + k)
    weights = torch.ones(vocab)
    weights[4 * rank % vocab:4 * rank % vocab + 4] = skew
    x = torch.multinomial(weights, batch, replacement=True, generator=g)
    return x, (x * 3 + 1) % vocab


def _flat_of(tensors):
    return torch.cat([t.detach().double().reshape(-1) for t in tensors]).numpy().copy()


def _spread(comm, tensors):
    """Max over elements of (max - min across ranks)."""
    every = np.array(comm.allgather(_flat_of(tensors)))
    return float((every.max(axis=0) - every.min(axis=0)).max())


def _train_tied(comm, buffers, steps, lr, gamma, skew):
    """40 steps (AdamW, StepLR on the wrapper, clipping, bf16 autocast) of _TiedNet on
    this rank's data; the checks and the spreads of the result."""
    import warnings
    rank = comm.Get_rank()
    torch.manual_seed(rank)                      # different starts: the broadcast fixes
    model = _TiedNet()
    frozen0 = comm.bcast(model.frozen.weight.detach().clone(), root=0)
    opt = DecentralizedOptimizer(torch.optim.AdamW(model.parameters(), lr=lr,
                                                   weight_decay=0.01),
                                 "ring", "notify_ack", comm=comm, model=model,
                                 buffers=buffers)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=gamma)
    float_buffers = [b for b in model.buffers() if b.is_floating_point()]
    w = opt.exchange.mixing
    lrs, inner_lrs, mix_errors, tracked_equal = [], [], [], []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for k in range(1, steps + 1):
            x, y = _tokens(rank, k, skew)
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = model(x)
            torch.nn.functional.cross_entropy(logits.float(), y).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            # replay: the step mixes the buffers the forward pass wrote as it mixes
            # the parameters, W @ (everyone's buffers)
            before = _flat_of(float_buffers)
            expected = w[rank] @ np.array(comm.allgather(before), dtype=np.float64)
            opt.step()
            mix_errors.append(float(np.abs(_flat_of(float_buffers) - expected).max()))
            tracked = int(model.norm.num_batches_tracked)
            tracked_equal.append(tracked == comm.bcast(tracked, root=0))
            sched.step()
            lrs.append(opt.param_groups[0]["lr"])
            inner_lrs.append(opt.optimizer.param_groups[0]["lr"])
            if k == steps // 2 and rank % 2:
                with torch.no_grad():      # an extra train-mode forward on odd ranks
                    model(_tokens(rank, 10_000 + k, skew)[0])
    flo, nbytes = opt.flat.tensor.data_ptr(), opt.flat.nbytes
    result = {
        "mix_errors": mix_errors, "tracked_equal": tracked_equal,
        "buffers_spread": _spread(comm, float_buffers),
        "params_spread": _spread(comm, [model.embed.weight, model.norm.weight,
                                        model.norm.bias]),
        "lrs": lrs, "inner_lrs": inner_lrs,
        "scheduler_warnings": [str(w.message) for w in caught
                               if "lr_scheduler" in str(w.filename)],
        "batches_tracked": int(model.norm.num_batches_tracked),
        "batches_tracked_0": int(comm.bcast(int(model.norm.num_batches_tracked), root=0)),
        "tied": model.out.weight is model.embed.weight,
        "tied_in_flat": sum(p is model.embed.weight for p in opt.flat.params),
        "frozen_in_flat": any(p is model.frozen.weight for p in opt.flat.params),
        "frozen_unchanged": bool(torch.equal(model.frozen.weight, frozen0)),
        "frozen_spread": _spread(comm, [model.frozen.weight, model.frozen.bias]),
        "buffers_in_flat": all(flo <= b.data_ptr() < flo + nbytes for b in float_buffers),
        "dtype": str(model.embed.weight.dtype),
    }
    opt.free()
    return result


def torch_tied_batchnorm_frozen(comm, steps=40, lr=0.02, gamma=0.8, skew=3.0):
    """_train_tied with buffers mixed (the default) and, from the same start, left local."""
    return {buffers: _train_tied(comm, buffers, steps, lr, gamma, skew)
            for buffers in ("mix", "local")}
