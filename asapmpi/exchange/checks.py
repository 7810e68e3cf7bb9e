"""The checks each rank makes on its own Exchange arguments, before any communication.

Nothing here talks to another rank: a problem becomes one line in what the rank shares
in the allgather (asapmpi.exchange.agreement), so that every rank raises the same
ConfigError instead of some leaving while the others wait.
"""
from __future__ import annotations

import hashlib
import math
import os
from typing import Any, Dict, List, Mapping, Sequence, Tuple, Union

import numpy as np
from mpi4py import MPI

from ..device import Stager, device_buffer
from ..dtypes import ITEMSIZE, dtype_name
from ..errors import ConfigError
from ..launch import cores
from ..options import Option, Options
from ..rc import rc
from ..reduce.graphs import GRAPHS, Graph
from ..reduce.user import graph_from
from ..sync import policy as make_policy
from ..transports import TRANSPORTS, families, resolve

GraphSpec = Union[Graph, str, Mapping[str, Sequence[int]], Tuple[Sequence[int], Sequence[int]],
                  Any]
WEIGHT_NAMES = ("auto", "uniform", "metropolis")
#: buffer format -> (dtype name, item size)
DTYPES = {"f": ("float32", 4), "d": ("float64", 8), "e": ("float16", 2)}


def buffer_info(buffer, dtype=None) -> Tuple[str, int]:
    """Return (element type, nbytes) of a writable C-contiguous float32, float64 or
    float16 buffer, or
    of a 2-byte integer buffer of bfloat16 bit patterns given with dtype="bfloat16"."""
    try:
        view = memoryview(buffer)
    except TypeError:
        hint = f"; pass {tensor_hint(buffer)} (the same memory)" if \
            type(buffer).__module__.startswith("torch") else ""
        raise ConfigError(f"buffer must support the buffer protocol (a NumPy array, for "
                          f"example) or be a CUDA array, got {type(buffer).__name__}"
                          f"{hint}") from None
    with view:
        fmt = view.format.lstrip("@=<")
        if dtype == "bfloat16":
            if fmt not in ("H", "h"):
                raise ConfigError(f"dtype='bfloat16' takes the bit patterns in a 2-byte "
                                  f"integer buffer (tensor.view(torch.int16).numpy()), got "
                                  f"{dtype_name(buffer)}")
            name = "bfloat16"
        elif fmt not in DTYPES:
            raise ConfigError(f"buffer dtype must be float32, float64 or float16 (or "
                              f"bfloat16 bit patterns with dtype='bfloat16'), got "
                              f"{dtype_name(buffer)}")
        else:
            name = DTYPES[fmt][0]
            if dtype is not None and dtype != name:
                raise ConfigError(f"dtype={dtype!r} but the buffer holds {name}; leave "
                                  f"dtype out (it is read from the buffer)")
        if not view.c_contiguous:
            raise ConfigError("buffer must be C-contiguous; pass np.ascontiguousarray(x)")
        if view.readonly:
            raise ConfigError("buffer must be writable: step() reduces into it")
        if view.nbytes == 0:
            raise ConfigError("buffer is empty; pass at least one element")
        return name, view.nbytes


def tensor_hint(tensor) -> str:
    """The expression that gives a CPU torch tensor's memory as a NumPy array, for the
    tensor at hand: .detach() where it requires grad (tensor.numpy() refuses it), the
    int16 view of bfloat16 (NumPy has no bfloat16)."""
    expr = "tensor.detach()" if getattr(tensor, "requires_grad", False) else "tensor"
    if str(getattr(tensor, "dtype", "")) == "torch.bfloat16":
        return f"{expr}.view(torch.int16).numpy() with dtype='bfloat16'"
    return f"{expr}.numpy()"


def fingerprint(data: bytes) -> str:
    """A short digest that stands for `data` in the allgather."""
    return hashlib.sha1(data).hexdigest()


def graph_spec(spec: GraphSpec, rank: int, size: int) -> Dict[str, Any]:
    """What this rank was given as a graph, reduced to what the allgather compares."""
    if spec is None:
        raise ConfigError("pass graph=: a graph name such as 'root-expander', a Graph, or "
                          "this rank's neighbours as {'in': [...], 'out': [...]}")
    if isinstance(spec, str):
        if spec not in GRAPHS:
            raise ConfigError(f"unknown graph {spec!r}; choose one of {sorted(GRAPHS)}")
        return {"kind": "name", "key": spec, "in": [], "out": []}
    if isinstance(spec, Mapping) or (isinstance(spec, tuple) and len(spec) == 2
                                     and not isinstance(spec[0], int)):
        ins, outs = neighbour_lists(spec, rank, size)
        return {"kind": "lists", "key": None, "in": ins, "out": outs}
    g = graph_from(spec)
    if g.n != size:
        raise ConfigError(f"the graph has {g.n} ranks but the communicator has {size}; "
                          f"build it for {size} ranks")
    key = fingerprint(repr(g.edges()).encode())
    return {"kind": "graph", "key": key, "in": g.in_neighbours(rank),
            "out": g.out_neighbours(rank), "name": g.name}


def neighbour_lists(spec, rank: int, size: int) -> Tuple[List[int], List[int]]:
    """(in, out) from {'in': [...], 'out': [...]} or (in, out), checked."""
    if isinstance(spec, Mapping):
        if set(spec) != {"in", "out"}:
            raise ConfigError(f"a neighbour mapping needs exactly the keys 'in' and 'out', "
                              f"got {sorted(spec)}")
        ins, outs = spec["in"], spec["out"]
    else:
        ins, outs = spec
    result = []
    for label, given in (("in", ins), ("out", outs)):
        nbrs = [int(j) for j in given]
        for j in nbrs:
            if not 0 <= j < size:
                raise ConfigError(f"{label}-neighbour {j} is outside the communicator "
                                  f"(ranks 0..{size - 1})")
            if j == rank:
                raise ConfigError(f"rank {rank} lists itself as an {label}-neighbour")
        if len(set(nbrs)) != len(nbrs):
            raise ConfigError(f"{label}-neighbours list a rank twice: {nbrs}")
        result.append(sorted(nbrs))
    return result[0], result[1]


def weight_spec(weights, size: int) -> Dict[str, Any]:
    """What this rank was given as weights, for the allgather."""
    if weights is None:
        weights = "auto"
    if isinstance(weights, str):
        if weights not in WEIGHT_NAMES:
            raise ConfigError(f"unknown weights {weights!r}; choose one of {WEIGHT_NAMES}, a "
                              f"matrix, or {{rank: weight}}")
        return {"kind": "name", "key": weights}
    if isinstance(weights, Mapping):
        return {"kind": "row", "key": None, "row": dict(weights)}
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != (size, size):
        raise ConfigError(f"a weight matrix for {size} ranks must be {size}x{size}, got "
                          f"{w.shape}")
    return {"kind": "matrix", "key": fingerprint(w.tobytes()), "matrix": w}


def check_trace_file(path, policy) -> None:
    """A trace file must be a path in a writable folder, for a policy that traces."""
    if path is None:
        return
    if not isinstance(path, str) or not path:
        raise ConfigError(f"trace_file must be a file name, got {path!r}")
    if not policy.uses_window:
        raise ConfigError(f"sync={policy.name!r} keeps no trace; leave trace_file out")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        raise ConfigError(f"trace_file {path!r}: folder {folder} does not exist or is not "
                          f"writable; create it or write the trace elsewhere")


def positive_seconds(value) -> float:
    """A timeout as a positive float, or ConfigError."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"timeout must be a number of seconds, got {value!r}") from None
    if not seconds > 0 or not math.isfinite(seconds):
        raise ConfigError(f"timeout must be a positive, finite number of seconds, got "
                          f"{value!r} (for a very long wait, give it: timeout=86400)")
    return seconds


#: the Exchange's own switches, parsed as the policies' options are (asapmpi.options)
SWITCHES = Options(
    Option("checksum", bool, False, "a checksum of the payload in every slot footer"),
    Option("double_buffer", bool, False, "compute in one of two slots the neighbours "
           "read in place (the shared transport)"),
    Option("reject_nonfinite", bool, False, "refuse to send a buffer holding NaN or Inf"),
)


def check_locally(buffer, graph, sync, weights, timeout, checksum, options,
                   rank, size, transport="auto", double_buffer=False,
                   trace_file=None, dtype=None, reject_nonfinite=False) -> Dict[str, Any]:
    """Every check rank `rank` makes on its own input, with no communication: what it
    was given goes into "meta" for the allgather (asapmpi.exchange.agreement), with the
    problem found as one line ("problem", None when there is none), so that no rank
    leaves while the others wait in the allgather; "dtype", "nbytes", "policy",
    "timeout", "matrix" and "switches" (SWITCHES, parsed) are what this rank keeps."""
    out: Dict[str, Any] = {"dtype": None, "nbytes": 0, "policy": None, "timeout": None,
                           "matrix": None, "stager": None, "switches": {}}
    meta = {"problem": None, "dtype": None, "nbytes": 0, "options": {},
            "sync": getattr(sync, "name", sync),    # a name, or a Policy's
            "transport": transport, "double_buffer": double_buffer,
            "trace_file": trace_file, "host": MPI.Get_processor_name(), "device": None,
            "cpu": cores.local_cpus(),
            "checksum": None, "graph_kind": None,
            "graph_key": None, "graph_name": None, "in": [], "out": [],
            "weights_kind": None, "weights_key": None, "weights_row": None}
    try:
        out["switches"] = SWITCHES.parse("Exchange", {
            "checksum": checksum, "double_buffer": double_buffer,
            "reject_nonfinite": reject_nonfinite})
        checksum, double_buffer = (out["switches"][k] for k in ("checksum", "double_buffer"))
        meta["double_buffer"] = double_buffer
        if dtype not in (None, *ITEMSIZE):
            raise ConfigError(f"dtype must be one of {', '.join(ITEMSIZE)}, got {dtype!r}")
        device = device_buffer(buffer)
        if device is None:
            out["dtype"], out["nbytes"] = buffer_info(buffer, dtype)
        else:
            if double_buffer:
                raise ConfigError("double_buffer=True computes in host shared memory; a "
                                  "device buffer is staged through pinned host memory "
                                  "instead: leave double_buffer out")
            out["dtype"], out["nbytes"] = device.dtype, device.nbytes
            meta["device"] = device.device
            # the pinned host buffer the host channel sends from (made once, here:
            # a failure is this rank's problem line, not a hang in the allgather)
            out["stager"] = Stager(device)
        out["policy"] = make_policy(sync, **options)
        # compared across ranks by name and options: "hop:backup=1" on one rank and
        # sync="hop", backup=1 on another are the same policy
        meta["sync"] = out["policy"].name
        meta["options"] = dict(out["policy"].options())
        pol = out["policy"]
        if not pol.uses_window and graph not in (None, "root-expander", "complete"):
            raise ConfigError(f"sync={sync!r} averages over all ranks; leave graph out "
                              f"or pass 'complete'")
        if hasattr(pol, "topology"):
            # the policy fixes the graph (a parameter server's star)
            fixed = pol.topology(size)
            if graph not in (None, "root-expander", fixed.name):
                raise ConfigError(f"sync={sync!r} runs on a {fixed.name} around rank "
                                  f"{getattr(pol, 'server', 0)}; leave graph out")
            graph = fixed
        elif graph is None:
            graph = "root-expander"
        spec = graph_spec("complete" if not pol.uses_window else graph, rank, size)
        wspec = weight_spec("uniform" if not out["policy"].uses_window else weights,
                             size)
        out["timeout"] = positive_seconds(rc.timeout if timeout is None else timeout)
        check_trace_file(trace_file, pol)
        if transport not in TRANSPORTS:
            raise ConfigError(f"transport must be one of {', '.join(TRANSPORTS)}, got "
                              f"{transport!r}")
        # which channel families fit the policy: the resolver's (one line naming
        # what fits when the one asked for does not)
        if transport != "auto":
            limit = resolve(transport, pol).max_update_bytes
            if limit is not None and out["nbytes"] > limit:
                raise ConfigError(f"transport={transport!r} sends each update as one "
                                  f"message of at most {limit} bytes, not "
                                  f"{out['nbytes']}; use transport='put' or 'auto'")
        elif pol.uses_window and not families(pol):
            raise ConfigError(f"no transport fits sync={pol.name!r} (it reads "
                              f"{pol.reads.value})")
        out["matrix"] = wspec.get("matrix")
        meta.update(dtype=out["dtype"], nbytes=out["nbytes"], checksum=checksum,
                    graph_kind=spec["kind"], graph_key=spec["key"],
                    graph_name=spec.get("name"), weights_kind=wspec["kind"],
                    weights_key=wspec["key"], weights_row=wspec.get("row"))
        if spec["kind"] != "name":
            meta.update({"in": spec["in"], "out": spec["out"]})
    except (ConfigError, TypeError, ValueError) as exc:
        meta["problem"] = str(exc)
    out["meta"] = meta
    return out
