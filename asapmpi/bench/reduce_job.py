"""One job of `asapmpi bench reduce`: every measurement on this communicator and path.

    mpiexec -n N python -m asapmpi.bench.reduce_job SPEC_JSON OUT_JSON

SPEC_JSON holds sizes (bytes), graphs, policies, repeats, min_time, gloo (bool) and
timeout; rank 0 writes OUT_JSON: the environment and one record per size with the
seconds per call (median over repeats of the slowest rank, asapmpi.bench.timing.Timer) of
  memcpy      np.copyto of SIZE bytes, every rank at once (at small sizes a copy
              within the core's caches);
  allreduce   comm.Allreduce(IN_PLACE, SUM) of the float32 buffer through mpi4py;
  gloo        torch.distributed.all_reduce of the same buffer, gloo backend (TCP on
              127.0.0.1), when torch is importable;
  exchange    per graph, the MPI's own exchange of it (MPIExchange): a receive from
              every in-neighbour, a standard send of the buffer to every
              out-neighbour, MPI_Waitall, through mpi4py: the messages an averaging
              step on that graph moves, without asapmpi (backup_ps and elastic: a
              round of their star, the server receiving every worker's buffer before
              it sends its own to every worker; gossip, which pulls a random peer per
              step: MPIPairExchange, a Sendrecv with a peer drawn per call; bsp,
              whose every step ends in a barrier of all ranks: the exchange with an
              MPI_Barrier between the sends and the wait);
  steps       Exchange.step() for every graph and policy (elastic: a superstep, the
              server's step() and a worker's steps up to its next exchange with it),
              and each graph's maximum
              in- and out-degree, with the transport the Exchange chose; every
              policy's step loops take turns with an Allreduce's in every repeat (and
              with its exchange, "floor_graph" naming the graph exchanged), and those
              of the policies in "paired_policies" (on shared memory) with a
              memory-bandwidth copy's too ("paired": seconds per call of each, repeat
              by repeat), so that a ratio compares loops timed in the same seconds of
              a machine whose speed drifts;
and, once per job, the memory bandwidth (the memory bound's unit): bytes per second a
rank moves when every rank copies arrays 4x the last-level cache at once.
"""
from __future__ import annotations

import json
import statistics
import sys
from functools import partial
from typing import Any, Callable, Dict, Optional

import numpy as np
from mpi4py import MPI

import asapmpi
from asapmpi import Exchange
from asapmpi._core import slotwin
from asapmpi._core.mpiabi import library_version
from asapmpi.collectives import waitall_watched
from asapmpi.reduce import graph as make_graph

from .common import rma_path, size_label
from .runs import FIXED_GRAPH_POLICIES, OWN_GRAPH_POLICIES, policy_of, split_spec
from .timing import Timer, measure_memory_bandwidth, time_memcpy


class Gloo:
    """torch.distributed's gloo all_reduce on this job's ranks (asapmpi.torch.gloo: only
    the bindings import torch), or unavailable (`reason` says why) when torch cannot be
    imported."""

    def __init__(self, comm: MPI.Comm, timeout: float):
        self.group, self.reason = None, None
        try:
            from ..torch.gloo import GlooGroup
        except ImportError as exc:
            self.reason = f"torch not importable ({exc})"
            return
        self.group = GlooGroup(comm, timeout)

    def all_reduce_call(self, buf: np.ndarray) -> Optional[Callable[[], None]]:
        """A callable running all_reduce on a tensor sharing `buf`'s memory, or None."""
        return None if self.group is None else self.group.all_reduce_call(buf)

    def close(self) -> None:
        """Tear the process group down."""
        if self.group is not None:
            self.group.close()
            self.group = None


class MPIExchange:
    """The MPI's own exchange over graph `g`, the floor of an averaging step's messages:
    calling it posts a receive of the buffer's size from every in-neighbour, sends the
    buffer to every out-neighbour (standard mode) and waits for all of them.  With a
    `server` (the centre of a star) it is a parameter server's round instead: the server
    sends only once every worker's buffer arrived (its parameters depend on them all).
    With `barrier`, every rank enters an MPI_Barrier of `comm` after posting its sends
    and before waiting for them: BSP's messages (put, barrier, reduce).  Collective:
    every rank of `comm` calls it the same number of times; close() frees it."""

    def __init__(self, comm: MPI.Comm, g, nbytes: int, server: Optional[int] = None,
                 timeout: float = 60.0, barrier: bool = False):
        rank = comm.Get_rank()
        self.timeout = timeout
        self.barrier = barrier
        self.graph = g.name + (" + barrier" if barrier else "")
        self.serving = rank == server
        # a communicator of its own: no message of it can match another's receive
        self.comm = comm.Dup()
        self.ins, self.outs = g.in_neighbours(rank), g.out_neighbours(rank)
        self.send = np.zeros(nbytes // 4, dtype=np.float32)
        self.recv = [np.empty_like(self.send) for _ in self.ins]

    def __call__(self) -> None:
        # blocking waits (what this floor measures), under the watchdog: a rank that
        # never sends ends the job naming the neighbours, not a hang
        requests = [self.comm.Irecv(buf, source) for buf, source in zip(self.recv, self.ins)]
        if self.serving:
            waitall_watched(requests, self.timeout, "the MPI exchange's receives", self.ins)
            requests = []
        requests += [self.comm.Isend(self.send, dest) for dest in self.outs]
        if self.barrier:
            with slotwin.Watched(self.timeout, "the MPI exchange's barrier", "every rank"):
                self.comm.Barrier()
        waitall_watched(requests, self.timeout, "the MPI exchange's messages",
                        sorted(set(self.ins) | set(self.outs)))

    def close(self) -> None:
        """Free the communicator (collective)."""
        self.comm.Free()


class MPIPairExchange:
    """The floor of a gossip step's messages: each call, every rank receives the buffer
    from one peer and sends its own to another (MPI_Sendrecv), the pairs a rotation by
    an offset drawn per call from a generator seeded alike on every rank.  A gossip pull
    moves one buffer into each rank from a random peer; a rotation is the cheapest such
    pattern (no rank serves two pulls), so step / this is what gossip adds to the one
    message a pull needs.  Collective as MPIExchange; close() frees it."""

    graph = "random pairs"

    def __init__(self, comm: MPI.Comm, nbytes: int, timeout: float = 60.0, seed: int = 0):
        self.timeout = timeout
        self.comm = comm.Dup()
        self.rank, self.n = comm.Get_rank(), comm.Get_size()
        self.send = np.zeros(nbytes // 4, dtype=np.float32)
        self.recv = np.empty_like(self.send)
        self._offsets = np.random.default_rng(seed)

    def __call__(self) -> None:
        shift = int(self._offsets.integers(1, self.n))
        source, dest = (self.rank + shift) % self.n, (self.rank - shift) % self.n
        # nonblocking halves under the watchdog (a blocking Sendrecv to a dead peer
        # would hang): the same messages as MPI_Sendrecv
        requests = [self.comm.Irecv(self.recv, source), self.comm.Isend(self.send, dest)]
        waitall_watched(requests, self.timeout, "the MPI pair exchange's messages",
                        sorted({source, dest}))

    def close(self) -> None:
        """Free the communicator (collective)."""
        self.comm.Free()


def time_exchange_step(timer: Timer, comm: MPI.Comm, nbytes: int, graph: str, policy: str,
                       timeout: float,
                       references: Optional[Dict[str, Callable[[], Any]]] = None
                       ) -> Dict[str, Any]:
    """Seconds per Exchange.step() of a float32 buffer of nbytes, and the transport
    ("shared double-buffered", "messages", "put").
    With `references` (name -> callable) the step's loops and theirs take turns in every
    repeat, and "paired" holds each one's seconds per call, repeat by repeat."""
    buf = np.full(nbytes // 4, 1.0, dtype=np.float32)
    sync, options = split_spec(policy)
    # double-buffered where the transport allows it (shared memory): what the torch
    # bindings run, and the exchange without a copy per step
    with Exchange(buf, graph=None if sync in OWN_GRAPH_POLICIES else graph, sync=sync,
                  comm=comm, timeout=timeout, double_buffer=True, **options) as ex:
        transport = ex.transport + (" double-buffered" if ex.double_buffered else "")
        step = partial(superstep, ex) if sync == "elastic" else ex.step
        timer.settle = ex.settle
        try:
            if references:
                names = ["step", *references]
                series = timer.interleaved([step, *references.values()])
                result = {"seconds": statistics.median(series[0]), "transport": transport,
                          "paired": dict(zip(names, series))}
            else:
                result = {"seconds": timer.seconds_per_call(step),
                          "transport": transport}
        finally:
            timer.settle = None
        if sync == "gossip":
            result["mixed_per_step"] = gossip_mixed_per_step(comm, ex)
        ex.settle()
        comm.Barrier()          # nobody frees its window while a neighbour still puts
        return result


def gossip_mixed_per_step(comm: MPI.Comm, ex: Exchange) -> float:
    """Models a gossip rank mixed per step, over all ranks and every step the timer ran
    (warm-up included): 1 for pulls (every pull mixes one); pushes mix what arrived, so
    a step that is fast because its models wait or are replaced shows here."""
    mixed = float(ex.policy.mixed)
    steps = comm.allreduce(ex.version, op=MPI.SUM)
    return comm.allreduce(mixed, op=MPI.SUM) / max(steps, 1)


def superstep(ex: Exchange) -> None:
    """One ElasticBSP superstep on this rank: the server's step(), or a worker's steps
    up to and including its next exchange with the server (the local steps between are
    free here: nothing is computed), so that every rank's timed loop runs the same
    supersteps."""
    done = ex.policy.supersteps_done
    while ex.policy.supersteps_done == done:
        ex.step()


def floor_of(policy: str, graph: str, n: int):
    """(graph, server, barrier) whose MPIExchange is the floor of `policy`'s step on
    `graph`: that graph for the policies that average over it (server None), with a
    barrier of all ranks where each step has one (bsp), backup_ps's and elastic's own
    star and server (they run on it whatever the graph), and ("random pairs", None,
    False) for gossip (a pull from a random peer per step: MPIPairExchange)."""
    sync = split_spec(policy)[0]
    if sync == "gossip":
        return MPIPairExchange.graph, None, False
    pol = policy_of(policy)
    if sync in FIXED_GRAPH_POLICIES:
        return pol.topology(n), pol.server, pol.barrier_per_step
    return make_graph(graph, n), None, pol.barrier_per_step


def step_references(policy: str, spec: Dict[str, Any],
                    references: Dict[str, Callable[[], Any]],
                    exchange: Optional[MPIExchange]) -> Dict[str, Callable[[], Any]]:
    """What a policy's step loops take turns with: the Allreduce; its exchange (None:
    none); for the paired policies every reference (the bandwidth copy on shared
    memory)."""
    chosen = dict(references) if policy in spec.get("paired_policies", ()) else \
        {"allreduce": references["allreduce"]}
    if exchange is not None:
        chosen["exchange"] = exchange
    return chosen


def degrees(graph: str, n: int) -> Dict[str, int]:
    """The largest in- and out-degree of the named graph on n ranks."""
    g = make_graph(graph, n)
    return {"in": max(len(g.in_neighbours(r)) for r in range(n)),
            "out": max(len(g.out_neighbours(r)) for r in range(n))}


def measure(comm: MPI.Comm, spec: Dict[str, Any], progress=None) -> Dict[str, Any]:
    """Every figure of the spec on `comm`; the same dict on every rank."""
    timer = Timer(comm, spec["repeats"], spec["min_time"])
    bandwidth = measure_memory_bandwidth(timer, comm)
    references: Dict[str, Callable[[], Any]] = {}
    if rma_path() == "shared-memory":
        # the bound applies on shared memory only; on the network path these arrays
        # (2 x 128 MB per rank here) got a rank of 8 with 64 MB windows OOM-killed
        stream_src = np.ones(bandwidth["array_bytes"] // 4, dtype=np.float32)
        references["stream"] = partial(np.copyto, np.zeros_like(stream_src), stream_src)
    records = []
    for nbytes in spec["sizes"]:
        if progress:
            progress(f"{size_label(nbytes)} on {comm.Get_size()} ranks ({rma_path()})")
        zeros = np.zeros(nbytes // 4, dtype=np.float32)     # zeros stay zeros when summed
        allreduce = partial(comm.Allreduce, MPI.IN_PLACE, zeros, op=MPI.SUM)
        references["allreduce"] = allreduce
        record: Dict[str, Any] = {"size": nbytes,
                                  "memcpy": time_memcpy(timer, nbytes),
                                  "allreduce": timer.seconds_per_call(allreduce),
                                  "gloo": None, "steps": {}}
        record["exchange"] = {}
        for graph in spec["graphs"]:
            exchange = MPIExchange(comm, make_graph(graph, comm.Get_size()), nbytes,
                                   timeout=spec["timeout"])
            record["exchange"][graph] = timer.seconds_per_call(exchange)
            record["steps"][graph] = {}
            for policy in spec["policies"]:
                floor = floor_of(policy, graph, comm.Get_size())
                floor_exchange, own = exchange, False
                if floor[0] == MPIPairExchange.graph:       # gossip's pulls
                    floor_exchange, own = MPIPairExchange(comm, nbytes, spec["timeout"]), True
                elif floor[1] is not None or floor[2]:      # a server's round, a barrier
                    floor_exchange, own = MPIExchange(
                        comm, floor[0], nbytes, floor[1], spec["timeout"], floor[2]), True
                record["steps"][graph][policy] = dict(
                    time_exchange_step(timer, comm, nbytes, graph, policy, spec["timeout"],
                                       step_references(policy, spec, references,
                                                       floor_exchange)),
                    floor_graph=floor_exchange and floor_exchange.graph)
                # not in a finally: a rank that failed aborts the job (main), and a
                # collective free there would wait for ranks that never come
                if own:
                    floor_exchange.close()
            exchange.close()
        records.append(record)
    # gloo last, in a loop of its own: a live process group keeps threads that take CPU
    # from everything timed while it exists (3.5 ms instead of 1.5 ms per network step
    # at 8 ranks on 2 cores)
    gloo = Gloo(comm, spec["timeout"]) if spec.get("gloo", True) else None
    if gloo is not None:
        if progress:
            progress(f"gloo all_reduce on {comm.Get_size()} ranks")
        try:
            for record in records:
                call = gloo.all_reduce_call(np.zeros(record["size"] // 4, dtype=np.float32))
                record["gloo"] = timer.seconds_per_call(call) if call else None
        finally:
            gloo.close()
    return {"ranks": comm.Get_size(), "path": rma_path(),
            "mpi_library": library_version(),
            "asapmpi": asapmpi.__version__,
            "gloo": None if gloo is None else (gloo.reason or "ok"),
            "degrees": {g: degrees(g, comm.Get_size()) for g in spec["graphs"]},
            "memory_bandwidth": bandwidth,
            "records": records}


def main(argv=None) -> int:
    """Run the spec of argv[0] on MPI.COMM_WORLD; rank 0 writes the result to argv[1]."""
    spec_text, out_path = (sys.argv[1:] if argv is None else argv)[:2]
    comm = MPI.COMM_WORLD
    try:
        spec = json.loads(spec_text)
        result = measure(comm, spec, progress=_progress if comm.Get_rank() == 0 and
                         spec.get("verbose") else None)
    except BaseException as exc:  # noqa: BLE001  (a failing rank must not leave the others waiting)
        from asapmpi.launch.faults import abort_job

        abort_job(exc)
    if comm.Get_rank() == 0:
        with open(out_path, "w") as f:
            json.dump(result, f, indent=1)
    return 0


def _progress(message: str) -> None:
    print(f"[asapmpi bench reduce] {message}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
