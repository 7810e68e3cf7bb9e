"""Exchange: mix one buffer with the neighbours' copies over one-sided MPI.

    with asapmpi.Exchange(params, graph="root-expander", sync="notify_ack") as ex:
        for batch in data:
            train_step(params, batch)
            ex.step()        # params = w_self*params + sum_i w_i * params of in-neighbour i

With double_buffer=True the exchange keeps the buffer in its own shared memory and
step() returns where the result is (use that array from then on):

    with asapmpi.Exchange(params, double_buffer=True) as ex:
        x = ex.buffer
        for batch in data:
            train_step(x, batch)
            x = ex.step()
    # params holds the final values again

Creation is collective over `comm`.  Every rank checks its own input, then one
allgather shares what each rank was given; from it every rank builds the same global
graph and mixing matrix and runs the same checks, so bad input on any rank raises the
same ConfigError on every rank before any one-sided communication starts.
"""
from __future__ import annotations

import hashlib
import math
import os
import time
from collections import deque
from typing import Any, Deque, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
from mpi4py import MPI

from . import _core, collectives, cores, transport_probe
from ._core.layout import window_offsets
from ._core.segments import SharedSegments
from .errors import ConfigError, FreedError, MPIError, NonFiniteError
from .faults import install_abort_hook
from .launchers import network_forced
from .ranks import check_world_size
from .rc import max_transfer, rc
from .reduce.graphs import GRAPHS, Graph
from .reduce.graphs import graph as make_graph
from .reduce.user import graph_from, hosts_of
from .reduce.weights import check_stochastic, mixing_matrix, resolve_weights
from .sync import Reads, StepContext
from .sync import policy as make_policy
from .sync.records import Records
from .transports import TRANSPORTS, families, make_transport, resolve

GraphSpec = Union[Graph, str, Mapping[str, Sequence[int]], Tuple[Sequence[int], Sequence[int]],
                  Any]
WEIGHT_NAMES = ("auto", "uniform", "metropolis")
#: steps timed before the default timeout follows the measured step times
STEPS_MEASURED = 16
_DTYPES = {"f": ("float32", 4), "d": ("float64", 8)}


# ---------------------------------------------------------------------- local checks

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


def _fingerprint(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()


def _graph_spec(spec: GraphSpec, rank: int, size: int) -> Dict[str, Any]:
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
        ins, outs = _neighbour_lists(spec, rank, size)
        return {"kind": "lists", "key": None, "in": ins, "out": outs}
    g = graph_from(spec)
    if g.n != size:
        raise ConfigError(f"the graph has {g.n} ranks but the communicator has {size}; "
                          f"build it for {size} ranks")
    key = _fingerprint(repr(g.edges()).encode())
    return {"kind": "graph", "key": key, "in": g.in_neighbours(rank),
            "out": g.out_neighbours(rank), "name": g.name}


def _neighbour_lists(spec, rank: int, size: int) -> Tuple[List[int], List[int]]:
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


def _weight_spec(weights, size: int) -> Dict[str, Any]:
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
    return {"kind": "matrix", "key": _fingerprint(w.tobytes()), "matrix": w}


def _check_trace_file(path, policy) -> None:
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


def _positive_seconds(value) -> float:
    """A timeout as a positive float, or ConfigError."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"timeout must be a number of seconds, got {value!r}") from None
    if not seconds > 0 or not math.isfinite(seconds):
        raise ConfigError(f"timeout must be a positive, finite number of seconds, got "
                          f"{value!r} (for a very long wait, give it: timeout=86400)")
    return seconds


# ---------------------------------------------------------------------- global checks

def _on_one_host(comm: MPI.Comm) -> bool:
    """True when every rank of comm can map the others' memory (collective)."""
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return node.Get_size() == comm.Get_size()
    finally:
        node.Free()


def _window_hint() -> str:
    """Why MPI_Win_allocate may have failed, for Open MPI's usual reasons ("" on other
    MPIs): its RMA over TCP (osc pt2pt, 4.x) refuses MPI_THREAD_MULTIPLE, which mpi4py
    asks for by default, and Debian's openmpi-mca-params.conf excludes osc pt2pt and
    ucx, which leaves no one-sided component between hosts without RDMA."""
    if "Open MPI" not in MPI.Get_library_version():
        return ""
    if MPI.Query_thread() == MPI.THREAD_MULTIPLE:
        return ("; Open MPI's RMA over TCP (osc pt2pt) refuses MPI_THREAD_MULTIPLE, "
                "mpi4py's default: set MPI4PY_RC_THREAD_LEVEL=serialized")
    return ("; Open MPI found no one-sided (osc) component for these ranks: between hosts "
            "without RDMA allow osc pt2pt (OMPI_MCA_osc=^ucx; Debian's "
            "openmpi-mca-params.conf excludes it) or use UCX (OMPI_MCA_pml=ucx "
            "OMPI_MCA_osc=ucx)")


def _explained(exc: MPIError) -> MPIError:
    """`exc`, with Open MPI's usual reason appended when it is a failed window
    allocation (_window_hint)."""
    hint = _window_hint() if exc.call == "MPI_Win_allocate" else ""
    return MPIError(exc.code, exc.call, exc.mpi_message + hint) if hint else exc


def _choose_transport(requested: str, policy, comm: MPI.Comm, g: Graph, hosts: List[str],
                      timeout: float, nbytes: int,
                      slack_ns: int = 0) -> Tuple[str, Dict[str, Any]]:
    """The transport (channel family) of this exchange, the same on every rank, and the
    report of how it was chosen (ex.transport_report).  Collective.

    What fits the policy is the resolver's (asapmpi.transports.channels).  An explicit
    choice wins.  Under "auto", a policy that one family fits gets it; where several fit
    (window words or messages) the signals each would wait on are timed
    (asapmpi.transport_probe), per neighbour class, and the faster one taken: the step
    waits for its slowest neighbour, so a transport costs its slowest class."""
    report: Dict[str, Any] = {"requested": requested}
    fit = families(policy)
    if requested != "auto" or len(fit) == 1:
        chosen = requested if requested != "auto" else fit[0]
        if resolve(chosen, policy).one_host and not _on_one_host(comm):
            others = [f for f in fit if not resolve(f, policy).one_host]
            raise ConfigError(f"transport={chosen!r} needs every rank on one host; use "
                              f"transport={', '.join(map(repr, others))} or 'auto'")
        report.update(chosen=chosen, reason="asked for" if requested != "auto" else
                      f"the only transport sync={policy.name!r} has")
        return chosen, report
    channel = {f: resolve(f, policy) for f in fit}
    one_host = _on_one_host(comm)
    # the environment could differ between ranks: agree on the most conservative
    local = comm.allreduce(int(one_host and not network_forced()), op=MPI.MIN)
    # signals in window words (reading in place first: it copies nothing) or messages
    words = sorted((f for f in fit if channel[f].remote_atomics
                    and (local or not channel[f].one_host)),
                   key=lambda f: not channel[f].in_place_read)
    by_messages = [f for f in fit if not channel[f].remote_atomics]
    if not by_messages or not words:
        chosen = (words or by_messages)[0]
        report.update(chosen=chosen, reason=f"{'window words' if words else 'messages'}: "
                                            f"the only signals this policy has here")
        return chosen, report
    window, messages_family = words[0], by_messages[0]
    limit = channel[messages_family].max_update_bytes
    if limit is not None and nbytes > limit:
        report.update(chosen=window, reason=f"an update of {nbytes} bytes is more than "
                                            f"one message carries ({limit})")
        return window, report
    # both move the update, as the exchange will (a signal's cost does not rank them
    # for a megabyte), except where the window's reduce reads each update in place
    in_place = channel[window].in_place_read
    measured: Dict[str, Dict[str, float]] = {}
    for name in ("same host", "other host"):
        keep = [[j for j in g.out_neighbours(r)
                 if (hosts[j] == hosts[r]) == (name == "same host")] for r in range(g.n)]
        if not any(keep):
            continue
        try:
            measured[name] = transport_probe.measure(comm, Graph(g.n, keep, name), timeout,
                                                     slack_ns, nbytes, not in_place)
        except MPIError as exc:
            raise _explained(exc) from None
    if not measured:
        report.update(chosen=window, reason="no neighbours to measure")
        return window, report
    # decide on the figures the report gives (0.1 us, below the noise), so the report
    # always explains the choice; a tie keeps the window, which copies nothing
    rounds = {name: {k: round(v * 1e6, 1) for k, v in m.items()}
              for name, m in measured.items()}
    words_us = max(m["words"] for m in rounds.values())
    messages_us = max(m["messages"] for m in rounds.values())
    chosen = messages_family if messages_us < words_us else window
    report.update(chosen=chosen, reason=f"measured with {nbytes}-byte updates: window "
                                        f"words {words_us:.0f} us"
                                        f"{' (read in place)' if in_place else ''}, "
                                        f"messages {messages_us:.0f} us a round",
                  rounds=rounds, unit="us per round", message_bytes=nbytes,
                  window_bytes=8 if in_place else nbytes)
    return chosen, report


def _same_everywhere(meta: List[Dict[str, Any]], key: str, what: str) -> None:
    values = [m[key] for m in meta]
    if any(v != values[0] for v in values):
        per_rank = ", ".join(f"rank {r}: {v}" for r, v in enumerate(values))
        raise ConfigError(f"every rank must pass the same {what}; got {per_rank}")


def _global_graph(meta: List[Dict[str, Any]], comm: MPI.Comm) -> Graph:
    """The graph every rank agrees on, built identically on every rank."""
    size = comm.Get_size()
    _same_everywhere(meta, "graph_kind", "kind of graph argument (name, Graph or lists)")
    kind = meta[0]["graph_kind"]
    if kind == "name":
        _same_everywhere(meta, "graph_key", "graph name")
        name = meta[0]["graph_key"]
        if name == "hierarchical":
            # every rank reached this line on the same gathered data: the collective
            # shared-memory split below is entered by all ranks or by none
            return make_graph(name, size, hosts=hosts_of(comm))
        return make_graph(name, size)
    if kind == "graph":
        _same_everywhere(meta, "graph_key", "graph (their edges differ)")
    for r, m in enumerate(meta):
        for j in m["out"]:
            if r not in meta[j]["in"]:
                raise ConfigError(f"rank {r} sends to rank {j}, but rank {j} does not list "
                                  f"{r} as an in-neighbour")
        for j in m["in"]:
            if r not in meta[j]["out"]:
                raise ConfigError(f"rank {r} receives from rank {j}, but rank {j} does not "
                                  f"list {r} as an out-neighbour")
    return Graph(size, [m["out"] for m in meta], meta[0]["graph_name"] or "user")


def _check_connected(g: Graph) -> None:
    if g.is_strongly_connected():
        return
    seen, stack = {0}, [0]
    while stack:
        for j in g.out_neighbours(stack.pop()):
            if j not in seen:
                seen.add(j)
                stack.append(j)
    missing = sorted(set(range(g.n)) - seen)
    if missing:
        raise ConfigError(f"graph {g.name} is not connected: rank 0's updates never reach "
                          f"rank(s) {missing[:10]}; every rank must reach every other")
    raise ConfigError(f"graph {g.name} is not strongly connected: some rank's updates never "
                      f"reach rank 0; every rank must reach every other")


def _global_weights(meta: List[Dict[str, Any]], g: Graph,
                    matrix: Optional[np.ndarray]) -> np.ndarray:
    """The mixing matrix (rows = receivers), identical on every rank, checked.  A user
    matrix travels only as a fingerprint; `matrix` is this rank's copy."""
    _same_everywhere(meta, "weights_kind", "kind of weights (name, matrix or per-rank)")
    kind = meta[0]["weights_kind"]
    if kind == "row":
        w = np.zeros((g.n, g.n))
        for r, m in enumerate(meta):
            w_self, w_in = resolve_weights(r, g.in_neighbours(r), m["weights_row"])
            w[r, r] = w_self
            w[r, g.in_neighbours(r)] = w_in
    else:
        _same_everywhere(meta, "weights_key", "weights")
        w = mixing_matrix(g, meta[0]["weights_key"] if kind == "name" else matrix)
    check_stochastic(w)
    return w


# ---------------------------------------------------------------------- Exchange

class Exchange:
    """Mix `buffer` with its in-neighbours' copies, one step at a time.

    Parameters
    ----------
    buffer: writable C-contiguous float32 or float64 buffer (a NumPy array, say).  It is
        sent from and reduced into in place: no copies.
    graph: a graph name ("root-expander", "ring", "complete", ...: asapmpi.reduce.GRAPHS),
        a Graph (asapmpi.graph(...), asapmpi.graph_from(...)), an edge list or adjacency
        matrix, or this rank's neighbours as {"in": [...], "out": [...]}.  Default: the
        root expander, or the graph the policy fixes (backup_ps: a star).
        "hierarchical" by name finds the hosts with MPI's shared-memory split.
    sync: "notify_ack" (ASAP's NOTIFY-ACK over the graph); "bsp" and "async" (ASAP's
        baselines: barrier, or no wait at all; whole versions only, renormalized);
        "allreduce" (the same averaging by MPI_Allreduce over all ranks; graph must be
        left out or "complete"); "backup_ps" (a parameter server averaging the first N
        of N + b workers' updates; options backup, server); "elastic" (ElasticBSP: a
        server picks each worker's next barrier with ZipLine; options R, algorithm);
        "hop" (Hop's update and
        token queues; options max_gap, backup, ...); or a Policy class or instance
        (asapmpi.sync.Policy) of a policy outside asapmpi.sync.POLICIES.
    comm: the mpi4py communicator (default COMM_WORLD); duplicated internally.
    weights: "auto" (uniform on regular graphs, Metropolis-Hastings on other undirected
        ones), "uniform", "metropolis", an n x n matrix (rows = receivers), or this
        rank's {rank: weight} row.  The result must be doubly stochastic.
    timeout: seconds any wait on a neighbour may take.  Default: derived from measured
        iteration times, step to step (asapmpi.rc: timeout_factor x the median and at
        least 3 x the longest of the last 64, within [timeout_min, timeout]; rc.timeout
        until 16 iterations are timed).
    reject_nonfinite: refuse to send a buffer holding NaN or Inf (NonFiniteError on the
        rank that has it, before anything is sent).
    checksum: put a checksum of the payload in every slot footer and verify it.
    transport: how updates reach the slots.  "put": MPI_Put into each out-neighbour's
        slot (any MPI path).  "shared": every rank copies its update once into its own
        slot in shared memory and its out-neighbours reduce from it in place (one host
        only; notify_ack only).  "messages": every update is one two-sided message per
        out-neighbour, received straight into the reader's slot; the receive posted for
        the next version is the ack (any path: on TCP networks MPICH runs one-sided
        operations as active messages that cost each target CPU time per piece, and
        Open MPI's need the target's progress, while two-sided messages are their
        fastest path).  For hop and bsp the window becomes a mailbox: their updates
        and tokens travel as messages that the reader's waits complete into the same
        slots and words (docs/PROTOCOL.md 2d); async, backup_ps and elastic run on a
        mailbox of newest versions (2e); gossip pulls one-sidedly ("put").  Which
        transports fit a policy follows from what it needs (asapmpi.transports.channels:
        asapmpi.transports.families(policy)); one that does not fit is refused.  "auto"
        (default): by measurement at creation, among those that fit: the window words of
        "shared" (notify_ack, every rank on one host, the network path not forced) or else
        "put", against messages, each timed over the graph's edges per neighbour class
        (same host, other host); messages win when faster (against "shared", which
        reads in place, the message probe carries the update itself; docs/PROTOCOL.md
        2g).  ex.transport_report says what was chosen and why.
    double_buffer: with the shared transport, keep the buffer in two slots of this
        rank's shared memory, computed on in place and reduced from one into the other:
        no copy at all per step (the reduce moves only its own inputs and output, the
        memory-bandwidth bound).  `buffer` is copied in at creation and the values are
        then in `ex.buffer`, which step() and receive() return and which alternates
        between the two slots: after each step use the array they return (the previous
        one turns read-only: its neighbours may still be reading it).  free() copies the
        final values back into `buffer`.  On the put transport nothing changes:
        ex.buffer is `buffer`.
    trace_file: stream the policy's whole per-iteration trace (entry times, versions
        reduced, pulls, supersteps) to this HDF5 file: every rank writes its rows in
        chunks to FILE.rankNNNNN.part, and free() merges the parts into FILE (check it
        with `asapmpi trace check FILE`).  Without it only the newest
        asapmpi.rc.trace_iterations iterations are kept, in `ex.trace`: memory stays flat
        over any number of steps.
    options: the policy's options, e.g. sync="hop", max_gap=2, backup=1.

    An Exchange belongs to one thread.  Free it (or use it as a context manager) on every
    rank: freeing is collective.
    """

    def __init__(self, buffer, graph: Optional[GraphSpec] = None, sync: str = "notify_ack",
                 comm: Optional[MPI.Comm] = None, *,
                 weights: Union[str, Mapping[int, float], Any] = "auto",
                 timeout: Optional[float] = None, checksum: bool = False,
                 reject_nonfinite: bool = False, transport: str = "auto",
                 double_buffer: bool = False, trace_file: Optional[str] = None, **options):
        comm = MPI.COMM_WORLD if comm is None else comm
        if isinstance(trace_file, os.PathLike):
            trace_file = os.fspath(trace_file)
        if not isinstance(comm, MPI.Comm) or comm == MPI.COMM_NULL:
            raise ConfigError("comm must be a valid mpi4py communicator")
        rank, size = comm.Get_rank(), comm.Get_size()
        self._win = None
        self._comm = None
        self._segments = None
        self._slots: Tuple[np.ndarray, ...] = ()
        if comm == MPI.COMM_WORLD:
            check_world_size(size)      # a singleton from a mismatched mpiexec, say
        local = self._check_locally(buffer, graph, sync, weights, timeout, checksum, options,
                                    rank, size, transport, double_buffer, trace_file)
        # a rank that never comes (dead, or stuck before its Exchange) is named, not
        # waited for
        meta = collectives.allgather(comm, local["meta"], local["timeout"] or rc.timeout,
                                     "the creation of an Exchange")
        for r, m in enumerate(meta):
            if m["problem"]:
                raise ConfigError(m["problem"] if r == rank
                                  else f"rank {r} was given bad input: {m['problem']}")
        for key, what in (("dtype", "buffer dtype"), ("nbytes", "buffer size in bytes"),
                          ("sync", "sync policy"), ("checksum", "checksum option"),
                          ("options", "policy options"), ("transport", "transport"),
                          ("double_buffer", "double_buffer option"),
                          ("trace_file", "trace_file")):
            _same_everywhere(meta, key, what)
        g = _global_graph(meta, comm)
        _check_connected(g)
        local["policy"].validate(g, rank)
        w = _global_weights(meta, g, local["matrix"])

        self.buffer = buffer
        self._user_buffer = buffer
        self.comm = comm
        self.hosts = [m["host"] for m in meta]
        #: this rank's host runs more ranks than it has cores (asapmpi.cores): the
        #: waits then sleep with the kernel's coarse timer slack, else precisely
        self.oversubscribed = cores.oversubscribed(meta, rank)
        self._slack_ns = cores.sleep_slack_ns(meta, rank, rc.poll_timer_slack_ns)
        self.trace_file = trace_file
        self.dtype, self.nbytes = local["dtype"], local["nbytes"]
        self.rank, self.size = rank, size
        self.graph = g
        self.in_neighbours = g.in_neighbours(rank)
        self.out_neighbours = g.out_neighbours(rank)
        self.sync = local["policy"].name
        self.timeout = local["timeout"]
        self._adaptive = timeout is None
        self._step_seconds: Deque[float] = deque(maxlen=64)
        self._last_start: Optional[float] = None
        self._timed = 0                 # iterations timed
        self.reject_nonfinite = bool(reject_nonfinite)
        if rc.abort_on_error and MPI.COMM_WORLD.Get_size() > 1:
            install_abort_hook()
        self.version = 0            # steps completed, earlier runs (load_state_dict) included
        self._base = 0              # steps completed before this window existed
        self._window_version = 0    # steps completed on this window (versions start at 1)
        self._sending = False
        self._carried = {"bytes_sent": 0, "wait_seconds": 0.0}
        self.mixing = w
        self._policy = local["policy"]
        self._ctx = StepContext(float(w[rank, rank]),
                                np.ascontiguousarray(w[rank, self.in_neighbours]),
                                self.timeout, bool(checksum))
        self.transport = "put"
        self.transport_report: Dict[str, Any] = {"requested": transport, "chosen": None,
                                                 "reason": "no window: MPI collectives"}
        self.double_buffered = False
        if self._policy.uses_window:
            self.transport, self.transport_report = _choose_transport(
                transport, self._policy, comm, g, self.hosts, self.timeout, self.nbytes,
                self._slack_ns)
            # the window class the chosen family gives this policy, and what it can do
            self._channel = resolve(self.transport, self._policy)
            # double buffering computes in the slot the neighbours read in place
            self.double_buffered = bool(double_buffer) and self._channel.in_place_read
            self._win = self._make_window(comm)
            if self.double_buffered:
                self._enter_slots()
            self._policy.records = Records(path=trace_file, rank=rank)
            self._policy.start()
        else:
            self._comm = comm.Dup()
            self._ctx.comm = self._comm
            self._ctx.array = np.frombuffer(buffer, dtype=self.dtype)

    def _check_locally(self, buffer, graph, sync, weights, timeout, checksum, options,
                       rank, size, transport="auto", double_buffer=False,
                       trace_file=None) -> Dict[str, Any]:
        """Every check that needs no communication; problems go into the allgather so
        that no rank leaves while the others wait in it."""
        out: Dict[str, Any] = {"dtype": None, "nbytes": 0, "policy": None, "timeout": None,
                               "matrix": None}
        meta = {"problem": None, "dtype": None, "nbytes": 0, "options": None,
                "sync": getattr(sync, "name", sync),    # a name, or a Policy's
                "transport": transport, "double_buffer": double_buffer,
                "trace_file": trace_file, "host": MPI.Get_processor_name(),
                "cpu": cores.local_cpus(),
                "checksum": None, "graph_kind": None,
                "graph_key": None, "graph_name": None, "in": [], "out": [],
                "weights_kind": None, "weights_key": None, "weights_row": None}
        try:
            out["dtype"], out["nbytes"] = _buffer_info(buffer)
            out["policy"] = make_policy(sync, **options)
            meta["options"] = repr(sorted(out["policy"].options().items()))
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
            spec = _graph_spec("complete" if not pol.uses_window else graph, rank, size)
            wspec = _weight_spec("uniform" if not out["policy"].uses_window else weights,
                                 size)
            out["timeout"] = _positive_seconds(rc.timeout if timeout is None else timeout)
            if not isinstance(double_buffer, bool):
                raise ConfigError(f"double_buffer must be True or False, got "
                                  f"{double_buffer!r}")
            _check_trace_file(trace_file, pol)
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
            meta.update(dtype=out["dtype"], nbytes=out["nbytes"], checksum=bool(checksum),
                        graph_kind=spec["kind"], graph_key=spec["key"],
                        graph_name=spec.get("name"), weights_kind=wspec["kind"],
                        weights_key=wspec["key"], weights_row=wspec.get("row"))
            if spec["kind"] != "name":
                meta.update({"in": spec["in"], "out": spec["out"]})
        except (ConfigError, TypeError, ValueError) as exc:
            meta["problem"] = str(exc)
        out["meta"] = meta
        return out

    def _make_window(self, comm: MPI.Comm):
        g, rank, depth = self.graph, self.rank, self._policy.depth
        publish = self._policy.publish_slots
        channel = self._channel
        # where readers reduce in place, every rank's slots are its own (an outbox)
        outbox = channel.in_place_read
        if self.double_buffered:
            depth = 2       # version k computed in slot k % 2, reduced into the other
        layouts = [_core.Layout(g.in_degree(r), g.out_degree(r), depth, self.nbytes,
                                self._policy.user_words(r, g.n), publish, outbox)
                   for r in range(g.n)]
        # a policy that writes control words into other ranks' windows needs their offsets
        self._policy.layouts = layouts
        out_slot, out_notify, in_ack = window_offsets(g, layouts, rank)
        window = channel.window_class()
        # the policy's needs the window takes (a mailbox's retain)
        options: Dict[str, Any] = channel.window_options(self._policy)
        if outbox:
            self._segments = SharedSegments(comm, layouts[rank].segment_bytes,
                                            self.in_neighbours)
            options["outboxes"] = (self._segments.own, self._segments.peers)
        try:
            win = window(
                comm, layouts[rank], self.in_neighbours, self.out_neighbours, out_slot,
                out_notify, in_ack, _DTYPES["f" if self.dtype == "float32" else "d"][1],
                poll_yields=rc.poll_yields, poll_max_sleep_us=rc.poll_max_sleep_us,
                poll_slack_ns=self._slack_ns, flush_timeout=self.timeout, **options)
        except MPIError as exc:
            if self._segments is not None:
                self._segments.close()
            raise _explained(exc) from None
        except BaseException:
            if self._segments is not None:
                self._segments.close()
            raise
        win.max_transfer = max_transfer()
        if self._policy.reads is Reads.EXACT:
            # NOTIFY-ACK's steps go through a transport over the channel; every other
            # policy's through the window's own put, waits and ack
            self._ctx.channel = make_transport(self.transport, win,
                                               self.double_buffered)
            # the "ack" of version 0: every slot is free for version 1
            self._ctx.channel.start(self._ctx.checksum)
        return win

    def _enter_slots(self) -> None:
        """Double buffering: the buffer's values move into own slot 1 (version 1 is
        computed there), and ex.buffer follows the slots from now on."""
        layout = self._policy.layouts[self.rank]
        count = self.nbytes // np.dtype(self.dtype).itemsize
        def slot(s):
            return np.frombuffer(self._segments.own, dtype=self.dtype, count=count,
                                 offset=layout.segment_payload(s))
        # the policy's (flat, always writable) and the user's (in the shape of the
        # array given, one of them read-only at a time)
        self._ctx.buffers = (slot(0), slot(1))
        shape = getattr(self._user_buffer, "shape", (count,))
        self._slots = (slot(0).reshape(shape), slot(1).reshape(shape))
        self._ctx.buffers[1][...] = np.frombuffer(self._user_buffer, dtype=self.dtype)
        self._follow_slots()

    def _follow_slots(self) -> None:
        # the next version is computed in slot (next % 2); the other is what the
        # out-neighbours may still be reading: read-only, so a stale reference fails
        # loudly instead of corrupting their reduce
        current = self._slots[(self._window_version + 1) % 2]
        other = self._slots[self._window_version % 2]
        other.flags.writeable = False
        current.flags.writeable = True
        self.buffer = current
        self._ctx.array = self._ctx.buffers[(self._window_version + 1) % 2]

    # ------------------------------------------------------------------ use

    def step(self):
        """Send the buffer to the out-neighbours and reduce the in-neighbours' into it.
        Returns the array holding the result: `ex.buffer` (with double_buffer, not the
        array computed on before)."""
        win = self._alive()
        if self._sending:
            raise ConfigError("send() was called without its receive(); call receive() "
                              "before step()")
        self._check_finite()
        self._iteration_started()
        done = self._policy.step(win, self.buffer, self._window_version + 1, self._ctx)
        self._advance(done)
        return self.buffer

    def send(self) -> None:
        """The first half of step(): publish the buffer.  Until receive() the buffer may
        be read (gradients computed on it: Hop's parallel computation graph) but not
        written."""
        win = self._alive()
        if self._sending:
            raise ConfigError("send() twice without receive(); call receive() first")
        self._check_finite()
        self._iteration_started()
        self._policy.send(win, self.buffer, self._window_version + 1, self._ctx)
        self._sending = True
        if self.double_buffered:
            # the out-neighbours read this slot in place until they acknowledge it: a
            # write through ex.buffer now fails here instead of tearing their reduce
            self.buffer.flags.writeable = False

    def receive(self):
        """The second half of step(): wait for the neighbours, reduce into the buffer.
        Returns `ex.buffer`, as step()."""
        win = self._alive()
        if not self._sending:
            raise ConfigError("receive() without send(); call send() first (or step())")
        self._sending = False
        done = self._policy.receive(win, self.buffer, self._window_version + 1, self._ctx)
        self._advance(done)
        return self.buffer

    def _iteration_started(self) -> None:
        """Time whole iterations, from one step (or send) to the next: a neighbour's
        wait for this rank covers this rank's compute too, not only its exchange."""
        now = time.perf_counter()
        if self._adaptive and self._last_start is not None:
            self._step_seconds.append(now - self._last_start)
            self._timed += 1
            # a median per step would cost an allocation on the hot path: refresh the
            # derived timeout every STEPS_MEASURED iterations
            if self._timed % STEPS_MEASURED == 0:
                # a typical iteration times the factor, but never less than a few of the
                # longest recent ones (evaluations, checkpoints, ElasticBSP supersteps)
                times = np.asarray(self._step_seconds)
                derived = max(rc.timeout_factor * float(np.median(times)),
                              3.0 * float(times.max()))
                self._ctx.timeout = min(max(derived, rc.timeout_min), self.timeout)
        self._last_start = now

    def _advance(self, done: Optional[int]) -> None:
        # a policy that skips iterations (hop) reports the last one it completed
        self._window_version = self._window_version + 1 if done is None else done
        self.version = self._base + self._window_version
        if self._slots:
            self._follow_slots()

    @property
    def policy(self):
        """The synchronization policy object (asapmpi.sync): its options, role and
        trace; read it, do not call its steps."""
        return self._policy

    @property
    def current_timeout(self) -> float:
        """The seconds the next wait on a neighbour may take (see `timeout` above)."""
        return self._ctx.timeout

    def _check_finite(self) -> None:
        if not self.reject_nonfinite:
            return
        array = self._ctx.array if self._ctx.array is not None else \
            np.frombuffer(self.buffer, dtype=self.dtype)
        # one pass without a temporary: NaN and Inf survive a float64 sum
        if np.isfinite(np.add.reduce(array, dtype=np.float64)):
            return
        bad = np.flatnonzero(~np.isfinite(array))
        if len(bad) == 0:
            return                              # only the float64 sum overflowed
        raise NonFiniteError(f"rank {self.rank}: the buffer holds {len(bad)} NaN/Inf "
                             f"value(s) (first at element {bad[0]}) before step "
                             f"{self.version + 1}; nothing was sent: lower the learning "
                             f"rate or clip gradients")

    @property
    def bytes_sent(self) -> int:
        """Payload bytes this rank's one-sided operations moved: its puts, and the gets
        of pull gossip (slot headers, footers and control words not counted).
        sync="allreduce": an estimate, 2(n-1)/n of the buffer per call, what a ring or
        reduce-scatter + allgather all-reduce sends."""
        win = self._alive()
        if win is not None:
            # pull gossip moves its bytes with gets: count them on the rank that pulls
            # (a mailbox's bytes_got are updates it received, sent by others)
            sent = win.bytes_put + (win.bytes_got if self._policy.publish_slots else 0)
        else:
            n = self.size
            sent = self._policy.calls * (2 * (n - 1) * self.nbytes // n)
        return self._carried["bytes_sent"] + int(sent)

    @property
    def wait_seconds(self) -> float:
        """Seconds this rank has spent waiting for its neighbours (backing off in waits
        and barriers; sync="allreduce": inside MPI_Allreduce)."""
        win = self._alive()
        spent = win.wait_seconds if win is not None else self._policy.seconds
        # policies whose communication is not a wait (gossip's pulls) add their own
        spent += getattr(self._policy, "extra_wait_seconds", 0.0)
        return self._carried["wait_seconds"] + float(spent)

    def state_dict(self) -> Dict[str, Any]:
        """What a checkpoint needs to continue this exchange: steps completed, traffic
        and waiting so far, and what it was created with (checked on load)."""
        return {"version": int(self.version), "sync": self.sync,
                "options": dict(self._policy.options()), "size": self.size,
                "graph": self.graph.name, "edges": [list(e) for e in self.graph.edges()],
                "bytes_sent": self.bytes_sent, "wait_seconds": self.wait_seconds}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a state_dict() of an earlier run of the same configuration.
        Every rank of a job must load the same step count, before its first step: the
        new window starts empty, so the ranks restart its versions together."""
        if self._window_version or self._sending:
            raise ConfigError("load_state_dict() must come before the first step()")
        if "version" not in state:
            raise ConfigError("exchange state has no 'version'; pass what "
                              "Exchange.state_dict() returned")
        for key, mine in (("sync", self.sync), ("size", self.size),
                          ("options", dict(self._policy.options())),
                          ("edges", [list(e) for e in self.graph.edges()])):
            if key not in state:
                raise ConfigError(f"exchange state has no {key!r}; pass what "
                                  f"Exchange.state_dict() returned")
            theirs = state[key]
            if key == "options":
                theirs = dict(theirs)
            if theirs != mine:
                shown = "graph" if key == "edges" else key
                raise ConfigError(f"the checkpoint's exchange has {shown} "
                                  f"{state.get('graph') if key == 'edges' else theirs!r}, "
                                  f"this one {self.graph.name if key == 'edges' else mine!r}; "
                                  f"resume with the configuration that wrote it")
        self._base = int(state["version"])
        self.version = self._base
        self._carried = {"bytes_sent": int(state.get("bytes_sent", 0)),
                         "wait_seconds": float(state.get("wait_seconds", 0.0))}

    @property
    def report(self):
        """What the policy measured about the run, if anything (gossip: the congestion
        condition of its eq. (1)-(2)), else None."""
        return getattr(self._policy, "report", None)

    @property
    def global_iterations(self) -> bool:
        """True when `version` counts global iterations that a step may leave unchanged
        (sync="elastic": local steps between supersteps)."""
        return bool(getattr(self._policy, "global_iterations", False))

    @property
    def role(self) -> str:
        """"server" or "worker" under a parameter-server policy, else "peer"."""
        role = getattr(self._policy, "role", None)
        return role(self.rank) if role else "peer"

    @property
    def weights(self) -> Dict[int, float]:
        """{rank: weight} used by this rank's reduce, this rank included."""
        w = {self.rank: self._ctx.w_self}
        w.update(zip(self.in_neighbours, self._ctx.weights.tolist()))
        return w

    @property
    def stats(self) -> Dict[int, Dict[str, int]]:
        """Per in-neighbour counts of consistent, torn, stale and ahead reads."""
        win = self._alive()
        if win is None:
            return {}
        return {r: dict(zip(_core.STATUS_NAMES, map(int, row)))
                for r, row in zip(self.in_neighbours, win.stats)}

    @property
    def trace(self) -> Dict[str, np.ndarray]:
        """The policy's iteration trace (hop: entry times "lo"/"hi" of iterations 1, 2,
        ...; see asapmpi.trace), or {}."""
        tr = getattr(self._policy, "trace", None)
        if not tr:
            return {}
        return dict(tr, in_neighbours=np.array(self.in_neighbours, dtype=np.int64))

    @property
    def last_status(self) -> Dict[int, str]:
        """{in-neighbour: consistent | torn | stale | ahead} of the last reduce."""
        win = self._alive()
        if win is None:
            return {}
        return {r: _core.STATUS_NAMES[s] for r, s in zip(self.in_neighbours, win.last_status())}

    @property
    def window(self):
        """The underlying asapmpi._core.SlotWindow (for experts and tests)."""
        return self._alive()

    # ------------------------------------------------------------------ lifetime

    def _alive(self):
        if self._win is not None and not self._win.freed:
            return self._win
        if self._comm is not None and self._comm != MPI.COMM_NULL:
            return None
        raise FreedError("this Exchange was freed; create a new one")

    def free(self) -> None:
        """Release the window and communicator (collective). Safe to call twice.  With
        double_buffer, the final values are copied back into the buffer given at
        creation first; arrays of the slots stay readable (not exchanged any more).  With
        trace_file, rank 0 writes the trace file from every rank's part first.  A rank
        that does not come to free() within the timeout (rc.timeout_startup if longer,
        under policies that let ranks drift apart) is named (NeighbourTimeoutError)
        instead of hanging the others in MPI_Win_free."""
        live = (self._win is not None and not self._win.freed) or \
            (self._comm is not None and self._comm != MPI.COMM_NULL)
        if live:
            records = self._policy.records
            if records is not None:
                records.close()         # this rank's part of the trace file is complete
            # lockstep policies reach free() within a step of each other; the others
            # may leave a slow rank far behind, alive, with steps still to do
            deadline = self.timeout if self._policy.lockstep else \
                max(self.timeout, rc.timeout_startup)
            collectives.arrive(self.comm, deadline, "free() of an Exchange")
            if self.trace_file and self.rank == 0:
                from . import trace

                trace.merge_parts(self.trace_file, self)
        if self._slots and self._win is not None and not self._win.freed:
            np.frombuffer(self._user_buffer, dtype=self.dtype)[...] = self.buffer.reshape(-1)
        if self._win is not None:
            self._win.free()
        if self._segments is not None:
            self._segments.close()
        if self._comm is not None and self._comm != MPI.COMM_NULL:
            self._comm.Free()

    def settle(self) -> None:
        """Complete this process's pending notifies and acks (issued lazily by step()).
        asapmpi's own collectives and free() call it; call it yourself after the last
        step before waiting in an MPI call of your own that a neighbour still stepping
        could wait on (an MPI may defer issuing one-sided operations until a
        synchronization call: Open MPI's osc pt2pt over TCP does)."""
        from ._core import slotwin

        slotwin.settle_all(self.timeout)

    def __enter__(self) -> "Exchange":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        # Freeing is collective.  While an exception propagates, the other ranks may be
        # dead, waiting elsewhere or gone: freeing here could hang the job instead of
        # letting the error end it.  The window is then left to MPI_Finalize or MPI_Abort
        # (the asapmpi CLI aborts the job on any error).
        if exc_type is None:
            self.free()

    def __repr__(self):
        try:
            self._alive()
            state = f"version {getattr(self, 'version', 0)}"
        except FreedError:
            state = "freed"
        return (f"Exchange(rank {getattr(self, 'rank', '?')}, "
                f"in={getattr(self, 'in_neighbours', [])}, "
                f"out={getattr(self, 'out_neighbours', [])}, "
                f"sync={getattr(self, 'sync', '?')!r}, {state})")
