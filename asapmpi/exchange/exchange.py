"""The Exchange object: its steps, its state and its lifetime.  What it is made of is
decided elsewhere in this package: checks.py (each rank's own input), agreement.py
(what the ranks agree on), choice.py (the transport), construction.py (the window)."""
from __future__ import annotations

import os
import time
from collections import deque
from threading import get_ident
from typing import Any, Callable, Deque, Dict, Mapping, Optional, Tuple, Union

import numpy as np
from mpi4py import MPI

from .. import _core, collectives
from ..device import DeviceReduce
from ..dtypes import HALF, ITEMSIZE, nonfinite, numpy_dtype
from ..errors import (
    ConfigError,
    FreedError,
    NeighbourTimeoutError,
    NonFiniteError,
    ProcessFailedError,
)
from ..launch import cores, shm_leftovers
from ..launch.faults import install_abort_hook, survivable
from ..launch.ranks import check_world_size
from ..rc import rc
from ..sync import StepContext
from ..sync.records import Records
from ..transports import resolve
from . import survive
from .agreement import agree
from .checks import GraphSpec, check_locally
from .choice import choose_transport
from .construction import exchange_window
from .join import JoinBoard, join
from .turn import other_thread

#: steps timed before the default timeout follows the measured step times
STEPS_MEASURED = 16


def _median(ordered) -> float:
    """The median of a sorted, non-empty sequence (as np.median: the mean of the middle
    two of an even count)."""
    n = len(ordered)
    middle = n // 2
    return float(ordered[middle]) if n % 2 else 0.5 * (ordered[middle - 1] + ordered[middle])


class Exchange:
    """Mix `buffer` with its in-neighbours' copies, one step at a time.

    Parameters
    ----------
    buffer: writable C-contiguous float32 or float64 buffer (a NumPy array, say; bfloat16
        bit patterns with dtype="bfloat16").  It is sent from and reduced into in place:
        no copies.  Or a contiguous CUDA array (a torch tensor on "cuda"): it is staged
        through a pinned host buffer made once (asapmpi.device, docs/GPU.md), copied
        there before each send on a side stream, and reduced on the device from copies
        of the verified slots (or, with checksum= and for the policies whose receive
        uses the buffer after its reduce, on the host and copied back), in the device's
        stream order; `ex.staging` counts the copies.
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
        mailbox of newest versions (2e); gossip pulls one-sidedly on "put" and pushes
        each model to the peer its schedule chose on "messages" (2h).  Which
        transports fit a policy follows from what it needs (asapmpi.transports.channels:
        asapmpi.transports.families(policy)); one that does not fit is refused.  "auto"
        (default): by measurement at creation, among those that fit: the window words of
        "shared" (notify_ack, every rank on one host, the network path not forced) or else
        "put", against messages, each timed over the graph's edges per neighbour class
        (same host, other host); messages win when faster (both probes carry the
        update, except the window words of "shared", which reads in place; gossip's
        probe times gossip steps, a pull's against a push's, per model mixed;
        docs/PROTOCOL.md 2g).  ex.transport_report says what was chosen and why.
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
    dtype: the element type when the buffer's format does not say it: "bfloat16" for a
        2-byte integer buffer of bfloat16 bit patterns (tensor.view(torch.int16).numpy();
        reduced in float32, rounded to nearest even).  Default: read from the buffer.
    fault_tolerance: survive a dead rank (or a neighbour past its deadline) in place
        instead of raising (docs/FAILURES.md): the survivors shrink the communicator,
        re-form the graph, re-create this exchange on them (`comm`, `graph`, `size`,
        `rank` change; `survivals` records each failure) and go on from their current
        buffers.  Needs ULFM: Open MPI 5 launched with mpiexec --with-ft ulfm; a
        ConfigError before any communication elsewhere (use restarts there).  Not with
        double_buffer, trace_file or a device buffer yet.
    options: the policy's options, e.g. sync="hop", max_gap=2, backup=1.

    An Exchange belongs to one thread (a second thread calling in while one is inside is
    refused: asapmpi.exchange.turn).  Free it (or use it as a context manager) on every
    rank: freeing is collective.
    """

    def __init__(self, buffer, graph: Optional[GraphSpec] = None, sync: str = "notify_ack",
                 comm: Optional[MPI.Comm] = None, *,
                 weights: Union[str, Mapping[int, float], Any] = "auto",
                 timeout: Optional[float] = None, checksum: bool = False,
                 reject_nonfinite: bool = False, transport: str = "auto",
                 double_buffer: bool = False, trace_file: Optional[str] = None,
                 dtype: Optional[str] = None, fault_tolerance: bool = False, **options):
        comm = MPI.COMM_WORLD if comm is None else comm
        if isinstance(trace_file, os.PathLike):
            trace_file = os.fspath(trace_file)
        if not isinstance(comm, MPI.Comm) or comm == MPI.COMM_NULL:
            raise ConfigError("comm must be a valid mpi4py communicator")
        rank, size = comm.Get_rank(), comm.Get_size()
        #: fault tolerance (asapmpi.exchange.survive): None without it
        self._ft_comm: Optional[MPI.Comm] = None
        if fault_tolerance:
            # before any communication: one line on every rank alike
            survive.check_available()
            for wanted, what in ((double_buffer, "double_buffer=True"),
                                 (trace_file, "trace_file=")):
                if wanted:
                    raise ConfigError(f"fault_tolerance=True does not carry {what} over "
                                      f"a failure yet; leave it out")
        if rc.abort_on_error and MPI.COMM_WORLD.Get_size() > 1:
            # before anything can fail: bad input or a rank that never comes to the
            # agreement ends the job with one line per rank, not a traceback each
            install_abort_hook()
        if rc.sweep_shm:
            # what aborted jobs left in /dev/shm (an abort, Ctrl-C included, leaves the
            # MPI library's files): once per process, by the first rank of each host
            shm_leftovers.sweep_at_start(MPI.COMM_WORLD.Get_rank())
        self._win = None
        self._comm = None
        #: the thread inside step/send/receive/join, None when none is (another is
        #: refused; asapmpi.exchange.turn)
        self._inside: Optional[int] = None
        self._segments = None
        self._slots: Tuple[np.ndarray, ...] = ()
        if comm == MPI.COMM_WORLD:
            check_world_size(size)      # a singleton from a mismatched mpiexec, say
        local = check_locally(buffer, graph, sync, weights, timeout, checksum, options,
                              rank, size, transport, double_buffer, trace_file, dtype,
                              reject_nonfinite)
        switches = local["switches"]
        if fault_tolerance and local["stager"] is not None:
            raise ConfigError("fault_tolerance=True does not carry a device buffer over a "
                              "failure yet; exchange a host buffer")
        meta, g, w = agree(comm, local, rank)

        self.buffer = buffer
        self._user_buffer = buffer
        #: a device buffer's staging (asapmpi.device), else None
        self._stager = local["stager"]
        # what the policy sends from and reduces into: the buffer, or for a device
        # buffer the pinned host buffer it is staged through
        self._work = buffer if self._stager is None else self._stager.host
        #: the window as the policy sees it for a device buffer reduced on the device
        self._device_reduce: Optional[DeviceReduce] = None
        self.comm = comm
        self.hosts = [m["host"] for m in meta]
        #: this rank's host runs more ranks than it has cores (asapmpi.launch.cores): the
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
        self.reject_nonfinite = switches["reject_nonfinite"]
        self.version = 0            # steps completed, earlier runs (load_state_dict) included
        self._base = 0              # steps completed before this window existed
        self._window_version = 0    # steps completed on this window (versions start at 1)
        self._sending = False
        self._absorbed = False      # fault tolerance: a send whose step a failure ended
        self._carried = {"bytes_sent": 0, "wait_seconds": 0.0}
        self.mixing = w
        self._policy = local["policy"]
        # the graph's weights; a step whose average leaves out joined ranks uses others
        self._weights = (float(w[rank, rank]),
                         np.ascontiguousarray(w[rank, self.in_neighbours]))
        self._ctx = StepContext(*self._weights, self.timeout, switches["checksum"],
                                dtype=self.dtype)
        self.transport = "put"
        self.transport_report: Dict[str, Any] = {"requested": transport, "chosen": None,
                                                 "reason": "no window: MPI collectives"}
        self.double_buffered = False
        if self._policy.uses_window:
            self.transport, self.transport_report = choose_transport(
                transport, self._policy, comm, g, self.hosts, self.timeout, self.nbytes,
                self._slack_ns, self.oversubscribed)
            # the window class the chosen family gives this policy, and what it can do
            self._channel = resolve(self.transport, self._policy)
            # double buffering computes in the slot the neighbours read in place
            self.double_buffered = switches["double_buffer"] and \
                self._channel.in_place_read
            self._win, self._segments = exchange_window(
                comm, g, rank, self._policy, self._channel, self.nbytes,
                self.dtype, self.double_buffered,
                self.timeout, self._slack_ns)
            if getattr(self._win, "pushes", False):
                # a gossip loop never waits: where ranks share cores, it yields once a
                # step while its pushes are in flight (PushWindow.yields)
                self._win.yields = self.oversubscribed
            # the release of version 0: every slot is free for version 1 (a message
            # channel posts the receives of version 1; the others have nothing to do)
            self._win.release(0, self._ctx.checksum)
            if self.double_buffered:
                self._enter_slots()
            if self._stager is not None and self._policy.reduces_last and rc.device_reduce:
                # the policy's reduce copies each verified slot to the device and sums
                # there (asapmpi.device.reduce); nothing is copied back after it
                self._device_reduce = DeviceReduce(self._win, self._stager)
                self._stager.reduce_on_device = True
            self._policy.records = Records(path=trace_file, rank=rank)
            self._policy.start()
        else:
            self._comm = comm.Dup()
            self._ctx.comm = self._comm
            self._ctx.array = np.frombuffer(self._work, dtype=numpy_dtype(self.dtype))
        # where ranks that ran out of data say so (join()); nothing is written to it
        # while every rank trains.  By messages where the exchange has no MPI window:
        # the board must not give it one
        self._joiner = JoinBoard(comm, self.timeout,
                                 messages=not self._policy.uses_window
                                 or self.transport == "messages")
        self._joined_seen = self._joiner.joined_seen
        #: the failures this exchange survived (asapmpi.exchange.survive.recover's
        #: records: failed ranks, step, new graph, spectral gap, seconds lost)
        self.survivals: list = []
        #: fault_tolerance=True: called on each survivor with the record of a survived
        #: failure once the exchange is re-created on the survivors (ex.rank, ex.size
        #: are theirs), before the survivor's line is printed; what it returns (a short
        #: text: what the program did about it, e.g. asapmpi train's lost data shard)
        #: goes into that line and the record ("note").  No collective there: a survivor
        #: whose step the recovery ended returns one step before the others.
        self.on_survival = None
        if fault_tolerance:
            # an uncaught error on this rank now ends it as a death the others survive
            survivable()
            pol = self._policy
            self._made = {
                "sync": sync if not isinstance(sync, str) else pol.name,
                "options": dict(pol.options()) if isinstance(sync, str) else dict(options),
                "weights": weights if isinstance(weights, str) else "auto",
                "timeout": timeout, "checksum": checksum,
                "reject_nonfinite": reject_nonfinite, "dtype": dtype,
                "fixed_graph": hasattr(pol, "topology"),
                "family": graph if isinstance(graph, str) else
                ("root-expander" if graph is None else None)}
            #: this exchange's ranks as ranks of the communicator it was first made on
            self._origin = list(range(size))
            #: a communicator the exchange made itself (a shrink's): freed with it
            self._own_comm: Optional[MPI.Comm] = None
            self._ft_comm = survive.fault_comm(comm)
            if self._win is not None:
                self._win.watch(self._ft_comm)

    def _enter_slots(self) -> None:
        """Double buffering: the buffer's values move into own slot 1 (version 1 is
        computed there), and ex.buffer follows the slots from now on."""
        layout = self._policy.layouts[self.rank]
        count = self.nbytes // ITEMSIZE[self.dtype]
        def slot(s):
            return np.frombuffer(self._segments.own, dtype=numpy_dtype(self.dtype), count=count,
                                 offset=layout.segment_payload(s))
        # the policy's (flat, always writable) and the user's (in the shape of the
        # array given, one of them read-only at a time)
        self._ctx.buffers = (slot(0), slot(1))
        shape = getattr(self._user_buffer, "shape", (count,))
        self._slots = (slot(0).reshape(shape), slot(1).reshape(shape))
        self._ctx.buffers[1][...] = np.frombuffer(self._user_buffer,
                                                  dtype=numpy_dtype(self.dtype))
        self._follow_slots()

    def _follow_slots(self) -> None:
        # the next version is computed in slot (next % 2); the other is what the
        # out-neighbours may still be reading: read-only, so a stale reference fails
        # loudly instead of corrupting their reduce
        current = self._slots[(self._window_version + 1) % 2]
        other = self._slots[self._window_version % 2]
        other.flags.writeable = False
        current.flags.writeable = True
        self.buffer = self._work = current
        self._ctx.array = self._ctx.buffers[(self._window_version + 1) % 2]

    # ------------------------------------------------------------------ use

    def step(self):
        """Send the buffer to the out-neighbours and reduce the in-neighbours' into it.
        Returns the array holding the result: `ex.buffer` (with double_buffer, not the
        array computed on before)."""
        me, outer = get_ident(), self._inside
        if outer is not None and outer != me:
            raise other_thread("step")
        self._inside = me
        try:
            win = self._alive()
            if self._sending:
                raise ConfigError("send() was called without its receive(); call receive() "
                                  "before step()")
            if self._stager is not None:
                self._stager.before_send()
            self._check_finite()
            self._iteration_started()
            self._probe_failures()
            self._leave_out_joined(self._window_version + 1)
            return self._received(self._explained(self._policy.step, win))
        except Exception as exc:
            if self._ft_comm is None or not survive.is_failure(exc):
                if isinstance(exc, ProcessFailedError):
                    raise survive.named(exc, self.comm) from None
                raise
            return self._survived(exc, "step")
        finally:
            self._inside = outer

    def send(self) -> None:
        """The first half of step(): publish the buffer.  Until receive() the buffer may
        be read (gradients computed on it: Hop's parallel computation graph) but not
        written."""
        me, outer = get_ident(), self._inside
        if outer is not None and outer != me:
            raise other_thread("send")
        self._inside = me
        try:
            win = self._alive()
            if self._sending:
                raise ConfigError("send() twice without receive(); call receive() first")
            if self._stager is not None:
                self._stager.before_send()
            self._check_finite()
            self._iteration_started()
            self._probe_failures()
            self._leave_out_joined(self._window_version + 1)
            self._policy.send(self._device_reduce or win, self._work, self._window_version + 1,
                              self._ctx)
            self._sending = True
            if self.double_buffered:
                # the out-neighbours read this slot in place until they acknowledge it: a
                # write through ex.buffer now fails here instead of tearing their reduce
                self.buffer.flags.writeable = False
        except Exception as exc:
            if self._ft_comm is None or not survive.is_failure(exc):
                raise
            self._survived(exc, "send")
        finally:
            self._inside = outer

    def receive(self):
        """The second half of step(): wait for the neighbours, reduce into the buffer.
        Returns `ex.buffer`, as step()."""
        me, outer = get_ident(), self._inside
        if outer is not None and outer != me:
            raise other_thread("receive")
        self._inside = me
        try:
            win = self._alive()
            if not self._sending:
                if self._ft_comm is not None and self._absorbed:
                    # its send's step was ended by surviving a failure (_survived)
                    self._absorbed = False
                    return self.buffer
                raise ConfigError("receive() without send(); call send() first (or step())")
            self._sending = False
            return self._received(self._explained(self._policy.receive, win))
        except Exception as exc:
            if self._ft_comm is None or not survive.is_failure(exc):
                raise
            return self._survived(exc, "receive")
        finally:
            self._inside = outer

    def _probe_failures(self) -> None:
        """fault_tolerance=True under a policy whose ranks wait for no particular peer
        (gossip): one MPI_Iprobe of the fault communicator, which raises once a process
        failed or a survivor revoked it (the waits of other policies probe it
        themselves: SlotWindow.watch)."""
        if self._ft_comm is not None and self._policy.waits_for_none:
            self._ft_comm.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG)

    def _survived(self, exc: BaseException, call: str):
        """Survive the failure `exc` out of `call` (fault_tolerance=True): re-create this
        exchange on the survivors (asapmpi.exchange.survive.recover), then end the call
        there.  Every survivor goes on from the most steps any completed: a step that
        was behind them ends unmixed, the others are made again on the new exchange."""
        completed = self.version
        # (seconds lost: from the start of the step that failed; at a meeting, from now)
        survive.recover(self, exc, completed, None if call == "meet" else self._last_start)
        if call == "free":
            return self.free()
        if call == "meet":
            return None             # (meet() meets again, on the survivors)
        behind = completed + 1 <= self.version
        if call == "step":
            return self.buffer if behind else self.step()
        if call == "send":
            if behind:
                self._absorbed = True
                return None
            return self.send()
        if behind:
            return self.buffer
        self.send()
        return self.receive()

    def _received(self, done: Optional[int]):
        # the end of step() and receive(): the staged buffer back, the version advanced
        if self._stager is not None:
            self._stager.after_receive()
        self._advance(done)
        return self.buffer

    def _explained(self, call, win):
        # the policy's step or receive of the next version; a timeout says what the
        # join board knows of the ranks it names (JoinBoard.explain)
        try:
            return call(self._device_reduce or win, self._work, self._window_version + 1,
                        self._ctx)
        except NeighbourTimeoutError as exc:
            raise self._joiner.explain(exc, self.in_neighbours,
                                       self._window_version + 1) from None

    def join(self, step: Optional[Callable[[], Any]] = None) -> int:
        """This rank has no more data (uneven inputs): keep taking part in the exchange
        with no update of its own until every rank has called join(), then step on to
        the version every rank ends at, and return it (asapmpi.exchange.join).  From
        its second such step on, this rank's replica is out of the other ranks'
        averages, which are over the ranks still training.  Every rank calls it after
        its last step, before free().  `step` makes one such step
        (DecentralizedOptimizer passes its own); by default ex.step(), or receive() and
        send() while a send is open.  A neighbour that dies is still named by the
        waits' timeouts.  Call it once per epoch, the same number of times on every
        rank: a join with no step since the last one is an epoch with no data (on every
        rank, one more averaging step); a rank that joins once more than a neighbour
        that went on to free() is told so when its wait for that neighbour times out."""
        me, outer = get_ident(), self._inside
        if outer is not None and outer != me:
            raise other_thread("join")
        self._inside = me
        try:
            self._alive()
            refusal = self._policy.join_refusal()
            if refusal:
                raise ConfigError(f"join() under sync={self.sync!r}: {refusal}")
            if step is None:
                step = self._shadow_step
            # a joined rank keeps the pace of its own training steps (non-lockstep policies)
            pace = _median(sorted(self._step_seconds)) if self._step_seconds else 0.0
            return join(self._joiner, self._entered, step, self._policy.lockstep,
                        min(pace, self.timeout / 4), self.timeout, self.rank,
                        settle=self.settle if self._win is not None else None)
        finally:
            self._inside = outer

    def _leave_out_joined(self, version: int) -> None:
        """Take the ranks that joined out of the average of step `version`
        (asapmpi.exchange.join): the weights of the others, this rank's own included,
        are scaled to sum to 1 (on a complete graph: the mean of the training ranks)."""
        if not self._ctx.absent and not self._joined_seen():
            return                  # while every rank trains: one C call a step
        absent = self._joiner.absent(version)     # join counts window versions
        if absent == self._ctx.absent:
            return
        ctx, (w_self, weights) = self._ctx, self._weights
        ctx.absent = absent
        if not absent:
            ctx.w_self, ctx.weights, ctx.present = w_self, weights, None
            return
        present = np.array([r not in absent for r in self.in_neighbours], dtype=bool)
        ctx.present = present
        kept = np.where(present, weights, 0.0)
        total = w_self + float(kept.sum())
        ctx.weights, ctx.w_self = kept / total, w_self / total

    def _entered(self) -> int:
        # exchange steps entered: completed, and a send still open
        return self._window_version + (1 if self._sending else 0)

    def _shadow_step(self) -> None:
        if self._sending:
            self.receive()
            self.send()
        else:
            self.step()

    def _iteration_started(self) -> None:
        """Time whole iterations, from one step (or send) to the next: a neighbour's
        wait for this rank covers this rank's compute too, not only its exchange."""
        now = time.perf_counter()
        if self._adaptive and self._last_start is not None:
            self._step_seconds.append(now - self._last_start)
            self._timed += 1
            # refresh the derived timeout every STEPS_MEASURED iterations, from one sort
            # of at most 64 floats in Python (np.median's array and partition cost about
            # 15 us, a microsecond a step amortized: a sixth of a one-rank step)
            if self._timed % STEPS_MEASURED == 0:
                # a typical iteration times the factor, but never less than a few of the
                # longest recent ones (evaluations, checkpoints, ElasticBSP supersteps)
                times = sorted(self._step_seconds)
                derived = max(rc.timeout_factor * _median(times), 3.0 * times[-1])
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
    def staging(self) -> Optional[Dict[str, Any]]:
        """A device buffer's staging (asapmpi.device.Stager.report: the device, the
        copies each way, the seconds waited for the device), or None for a host buffer."""
        return None if self._stager is None else self._stager.report()

    @property
    def current_timeout(self) -> float:
        """The seconds the next wait on a neighbour may take (see `timeout` above)."""
        return self._ctx.timeout

    def _check_finite(self) -> None:
        if not self.reject_nonfinite:
            return
        array = self._ctx.array if self._ctx.array is not None else \
            np.frombuffer(self._work, dtype=numpy_dtype(self.dtype))
        # one pass without a temporary: NaN and Inf survive a float64 sum
        if self.dtype != "bfloat16" and np.isfinite(np.add.reduce(array, dtype=np.float64)):
            return
        bad = nonfinite(array, self.dtype)
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
            # (a mailbox's bytes_got are updates it received, sent by others; pushed
            # gossip's models are its bytes_put)
            sent = win.bytes_put + (win.bytes_got if self._policy.publish_slots
                                    and win.rma else 0)
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

    def load_state_dict(self, state: Mapping[str, Any], regroup: bool = False) -> None:
        """Continue from a state_dict() of an earlier run of the same configuration.
        Every rank of a job must load the same step count, before its first step: the
        new window starts empty, so the ranks restart its versions together.  With
        `regroup` the state may come from a job of another size or graph (a restart on
        the ranks left after a failure, asapmpi.train.resume_plan): only the policy and
        its options must match; the step count and the traffic so far carry over."""
        if self._window_version or self._sending:
            raise ConfigError("load_state_dict() must come before the first step()")
        if "version" not in state:
            raise ConfigError("exchange state has no 'version'; pass what "
                              "Exchange.state_dict() returned")
        same = (("sync", self.sync), ("size", self.size),
                ("options", dict(self._policy.options())),
                ("edges", [list(e) for e in self.graph.edges()]))
        for key, mine in same:
            if regroup and key in ("size", "edges"):
                continue
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

    def keep_float32_mix(self, array: Optional[np.ndarray]) -> None:
        """For a bfloat16 or float16 buffer: every reduce from now on also writes its
        float32 sums, before they are rounded into the buffer, to `array` (C-contiguous
        float32, one value per element of the buffer; None stops it).  `float32_mixes`
        counts the reduces that did.  Where the reduce runs on the device
        (`float32_mix_on_device`), `array` is a float32 array of the buffer's framework
        on that device instead, and a reduce that ran on the host there (checksum=) is
        not counted.  Float32 master weights take the mix from there (asapmpi.torch)."""
        if self.dtype not in HALF:
            raise ConfigError(f"keep_float32_mix is for bfloat16 or float16 buffers; this "
                              f"one is {self.dtype}, its reduce rounds nothing")
        if self._device_reduce is not None:
            if array is not None:
                self._stager.ops.check_wide(array)
            self._device_reduce.wide = array
            return
        count = self.nbytes // ITEMSIZE[self.dtype]
        if array is not None and not (isinstance(array, np.ndarray)
                                      and array.dtype == np.float32
                                      and array.flags.c_contiguous and array.size == count):
            raise ConfigError(f"keep_float32_mix takes a C-contiguous float32 NumPy array of "
                              f"{count} values (one per element of the buffer)")
        win = self._alive()
        # a policy that reduces outside the window's store (allreduce, gossip's pulls)
        # writes ctx.wide itself
        self._ctx.wide = None if array is None else array.reshape(-1)
        if win is not None:
            win.store.set_wide(self._ctx.wide)

    @property
    def float32_mixes(self) -> int:
        """Reduces that wrote their float32 sums to keep_float32_mix's array."""
        win = self._alive()
        on_device = 0 if self._device_reduce is None else self._device_reduce.wide_count
        return self._ctx.wide_count + on_device + \
            (0 if win is None else int(win.store.wide_count))

    @property
    def float32_mix_on_device(self) -> bool:
        """Whether the reduce runs on the buffer's device, so that keep_float32_mix
        takes a float32 array on that device (else a NumPy array)."""
        return self._device_reduce is not None

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
        fault_tolerance=True, a failure during it is survived first (the survivors then
        free the exchange re-created on them).  With
        double_buffer, the final values are copied back into the buffer given at
        creation first; arrays of the slots stay readable (not exchanged any more).  With
        trace_file, rank 0 writes the trace file from every rank's part first.  A rank
        that does not come to free() within the timeout (rc.timeout_startup if longer,
        under policies that let ranks drift apart) is named (NeighbourTimeoutError)
        instead of hanging the others in MPI_Win_free."""
        try:
            self._free()
        except Exception as exc:
            if self._ft_comm is None or not survive.is_failure(exc):
                raise
            self._survived(exc, "free")

    def _free(self) -> None:
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
            # a neighbour still waiting for this rank's next version learns why it
            # will not come (JoinBoard.explain)
            self._joiner.say_leaving(self._entered(), self.out_neighbours)
            # with fault tolerance, on the communicator whose revocation ends it
            collectives.arrive(self.comm if self._ft_comm is None else self._ft_comm,
                               deadline, "free() of an Exchange")
            self._joiner.free(self.in_neighbours)
            if self.trace_file and self.rank == 0:
                from .. import trace

                trace.merge_parts(self.trace_file, self)
        if self._slots and self._win is not None and not self._win.freed:
            np.frombuffer(self._user_buffer,
                          dtype=numpy_dtype(self.dtype))[...] = self.buffer.reshape(-1)
        if self._stager is not None:
            # before the window goes: the device ops may still be copying from its slots
            self._stager.close()
        if self._win is not None:
            self._win.free()
        if self._segments is not None:
            self._segments.close()
        if self._comm is not None and self._comm != MPI.COMM_NULL:
            self._comm.Free()
        if self._ft_comm is not None:
            for comm in (self._ft_comm, self._own_comm):
                if comm is not None and comm != MPI.COMM_NULL:
                    comm.Free()
            self._ft_comm = self._own_comm = None

    def meet(self, what: str = "a meeting of the exchange's ranks") -> None:
        """Collective, between steps: a barrier over the exchange's ranks, with its
        deadline (`what` names it in a timeout's message).  With fault_tolerance=True
        a failure seen there is survived first, and the survivors meet: a rank that
        ends its steps before it learns of a death (gossip waits for no particular
        peer) takes part in the survivors' recovery here instead of failing in the
        collectives that follow.  The survivors still stepping go on from the most
        steps any completed (asapmpi.exchange.survive): they end their loops too."""
        deadline = self.timeout if self._policy.lockstep else \
            max(self.timeout, rc.timeout_startup)
        while True:
            try:
                collectives.arrive(self.comm if self._ft_comm is None else self._ft_comm,
                                   deadline, what)
                return
            except Exception as exc:
                if self._ft_comm is None or not survive.is_failure(exc):
                    raise
                self._survived(exc, "meet")

    def settle(self) -> None:
        """Complete this process's pending notifies and acks (issued lazily by step()).
        asapmpi's own collectives and free() call it; call it yourself after the last
        step before waiting in an MPI call of your own that a neighbour still stepping
        could wait on (an MPI may defer issuing one-sided operations until a
        synchronization call: Open MPI's osc pt2pt over TCP does)."""
        from .._core import slotwin

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
