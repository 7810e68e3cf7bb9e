"""Exchange: mix one buffer with the neighbours' copies over one-sided MPI.

    with asapmpi.Exchange(params, graph="ring", sync="notify_ack") as ex:
        for batch in data:
            train_step(params, batch)
            ex.step()        # params = w_self*params + sum_i w_i * params of in-neighbour i

Creation is collective over `comm`: every rank's input is checked, locally and then
across ranks in one allgather, before any one-sided communication starts, and every
rank raises the same ConfigError when any rank's input is bad.
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
from mpi4py import MPI

from . import _core
from .errors import ConfigError, FreedError
from .rc import rc
from .reduce.graph import Graph
from .reduce.graph import graph as make_graph
from .reduce.weights import resolve_weights
from .sync import StepContext
from .sync import policy as make_policy

GraphSpec = Union[Graph, str, Mapping[str, Sequence[int]], Tuple[Sequence[int], Sequence[int]]]

_DTYPES = {"f": ("float32", 4), "d": ("float64", 8)}


def _buffer_info(buffer) -> Tuple[str, int]:
    """Return (dtype name, nbytes) of a writable C-contiguous float32/float64 buffer."""
    try:
        view = memoryview(buffer)
    except TypeError:
        raise ConfigError(f"buffer must support the buffer protocol (a NumPy array, for "
                          f"example), got {type(buffer).__name__}") from None
    with view:
        fmt = view.format.lstrip("@=<")
        if fmt not in _DTYPES:
            raise ConfigError(f"buffer dtype must be float32 or float64, got format "
                              f"{view.format!r}")
        if not view.c_contiguous:
            raise ConfigError("buffer must be C-contiguous; pass np.ascontiguousarray(x)")
        if view.readonly:
            raise ConfigError("buffer must be writable: step() reduces into it")
        if view.nbytes == 0:
            raise ConfigError("buffer is empty; pass at least one element")
        return _DTYPES[fmt][0], view.nbytes


def _neighbours(spec: GraphSpec, rank: int, size: int) -> Tuple[List[int], List[int]]:
    """Return (in-neighbours, out-neighbours) of `rank` from a graph specification."""
    if spec is None:
        raise ConfigError("pass graph=: a graph name such as 'ring', a Graph, or this "
                          "rank's neighbours as {'in': [...], 'out': [...]}")
    if isinstance(spec, str):
        spec = make_graph(spec, size)
    if isinstance(spec, Graph):
        if spec.n != size:
            raise ConfigError(f"the graph has {spec.n} ranks but the communicator has {size}; "
                              f"build it for {size} ranks")
        return spec.in_neighbours(rank), spec.out_neighbours(rank)
    if isinstance(spec, Mapping):
        if set(spec) != {"in", "out"}:
            raise ConfigError(f"a neighbour mapping needs exactly the keys 'in' and 'out', "
                              f"got {sorted(spec)}")
        ins, outs = spec["in"], spec["out"]
    else:
        try:
            ins, outs = spec
        except (TypeError, ValueError):
            raise ConfigError(f"graph must be a name, a Graph, or (in, out) neighbour lists; "
                              f"got {type(spec).__name__}") from None
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


def _positive_seconds(value) -> float:
    """A timeout as a positive float, or ConfigError."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"timeout must be a number of seconds, got {value!r}") from None
    if not seconds > 0 or math.isnan(seconds):
        raise ConfigError(f"timeout must be a positive number of seconds, got {value!r}")
    return seconds


def _check_across_ranks(meta: List[Dict[str, Any]], rank: int) -> None:
    """Raise the same ConfigError on every rank if the gathered inputs disagree."""
    for r, m in enumerate(meta):
        if m["problem"]:
            if r == rank:
                raise ConfigError(m["problem"])
            raise ConfigError(f"rank {r} was given bad input: {m['problem']}")
    for key, what in (("dtype", "dtype"), ("nbytes", "size in bytes"), ("sync", "sync policy"),
                      ("checksum", "checksum option")):
        values = {m[key] for m in meta}
        if len(values) > 1:
            per_rank = ", ".join(f"rank {r}: {m[key]}" for r, m in enumerate(meta))
            raise ConfigError(f"every rank must pass a buffer/option of the same {what}; got "
                              f"{per_rank}")
    for r, m in enumerate(meta):
        for j in m["out"]:
            if r not in meta[j]["in"]:
                raise ConfigError(f"rank {r} sends to rank {j}, but rank {j} does not list "
                                  f"{r} as an in-neighbour")
        for j in m["in"]:
            if r not in meta[j]["out"]:
                raise ConfigError(f"rank {r} receives from rank {j}, but rank {j} does not "
                                  f"list {r} as an out-neighbour")


class Exchange:
    """Mix `buffer` with its in-neighbours' copies, one step at a time.

    Parameters
    ----------
    buffer: writable C-contiguous float32 or float64 buffer (a NumPy array, say).  It is
        sent from and reduced into in place: no copies.
    graph: a graph name ("ring", "complete", ...), a Graph, or this rank's neighbours as
        {"in": [...], "out": [...]}.
    sync: the synchronization policy; "notify_ack" (ASAP's NOTIFY-ACK).
    comm: the mpi4py communicator (default COMM_WORLD); duplicated internally.
    weights: {rank: weight} for this rank and its in-neighbours, summing to 1; default
        1/(in-degree + 1) each.
    timeout: seconds any wait on a neighbour may take (default asapmpi.rc.timeout).
    checksum: put a checksum of the payload in every slot footer and verify it.
    """

    def __init__(self, buffer, graph: GraphSpec = None, sync: str = "notify_ack",
                 comm: Optional[MPI.Comm] = None, *, weights: Optional[Mapping[int, float]] = None,
                 timeout: Optional[float] = None, checksum: bool = False):
        comm = MPI.COMM_WORLD if comm is None else comm
        if not isinstance(comm, MPI.Comm) or comm == MPI.COMM_NULL:
            raise ConfigError("comm must be a valid mpi4py communicator")
        rank, size = comm.Get_rank(), comm.Get_size()
        self._win = None
        problem = None
        ins: List[int] = []
        outs: List[int] = []
        dtype, nbytes = None, 0
        try:
            dtype, nbytes = _buffer_info(buffer)
            ins, outs = _neighbours(graph, rank, size)
            self._policy = make_policy(sync)
            w_self, w_in = resolve_weights(rank, ins, weights)
            timeout = _positive_seconds(rc.timeout if timeout is None else timeout)
        except (ConfigError, TypeError, ValueError) as exc:
            # every local problem is reported through the allgather below, so that no
            # rank leaves while the others wait in it
            problem = str(exc)
        meta = comm.allgather({"problem": problem, "in": ins, "out": outs, "dtype": dtype,
                               "nbytes": nbytes, "sync": sync, "checksum": bool(checksum)})
        _check_across_ranks(meta, rank)

        depth = self._policy.depth
        layouts = [_core.Layout(len(m["in"]), len(m["out"]), depth, nbytes) for m in meta]
        out_slot = [layouts[j].slot_disp(meta[j]["in"].index(rank)) for j in outs]
        out_notify = [layouts[j].notify_disp(meta[j]["in"].index(rank)) for j in outs]
        in_ack = [layouts[i].ack_disp(meta[i]["out"].index(rank)) for i in ins]
        self._win = _core.SlotWindow(
            comm, layouts[rank], ins, outs, out_slot, out_notify, in_ack,
            _DTYPES["f" if dtype == "float32" else "d"][1],
            poll_yields=rc.poll_yields, poll_max_sleep_us=rc.poll_max_sleep_us,
            flush_timeout=timeout,
        )
        self.buffer = buffer
        self.dtype = dtype
        self.nbytes = nbytes
        self.rank = rank
        self.size = size
        self.in_neighbours = ins
        self.out_neighbours = outs
        self.sync = sync
        self.timeout = timeout
        self.version = 0
        self._ctx = StepContext(w_self, np.asarray(w_in, dtype=np.float64), timeout,
                                bool(checksum))

    # ------------------------------------------------------------------ use

    def step(self) -> None:
        """Send the buffer to the out-neighbours and reduce the in-neighbours' into it."""
        win = self._alive()
        self._policy.step(win, self.buffer, self.version + 1, self._ctx)
        self.version += 1

    @property
    def weights(self) -> Dict[int, float]:
        """{rank: weight} used by the reduce, this rank included."""
        w = {self.rank: self._ctx.w_self}
        w.update(zip(self.in_neighbours, self._ctx.weights.tolist()))
        return w

    @property
    def stats(self) -> Dict[int, Dict[str, int]]:
        """Per in-neighbour counts of consistent, torn, stale and ahead reads."""
        counts = self._alive().stats
        return {r: dict(zip(_core.STATUS_NAMES, map(int, row)))
                for r, row in zip(self.in_neighbours, counts)}

    @property
    def window(self):
        """The underlying asapmpi._core.SlotWindow (for experts and tests)."""
        return self._alive()

    # ------------------------------------------------------------------ lifetime

    def _alive(self):
        if self._win is None or self._win.freed:
            raise FreedError("this Exchange was freed; create a new one")
        return self._win

    def free(self) -> None:
        """Release the window (collective). Safe to call twice."""
        if self._win is not None:
            self._win.free()

    def __enter__(self) -> "Exchange":
        return self

    def __exit__(self, *exc) -> None:
        self.free()

    def __repr__(self):
        state = "freed" if self._win is None or self._win.freed else f"version {self.version}"
        return (f"Exchange(rank {getattr(self, 'rank', '?')}, "
                f"in={getattr(self, 'in_neighbours', [])}, "
                f"out={getattr(self, 'out_neighbours', [])}, "
                f"sync={getattr(self, 'sync', '?')!r}, {state})")
