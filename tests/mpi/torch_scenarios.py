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
