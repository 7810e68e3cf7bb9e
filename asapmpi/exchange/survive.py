"""Surviving a dead rank in place (ULFM): Exchange(fault_tolerance=True).

A process failure (ULFM's MPI_ERR_PROC_FAILED or MPI_ERR_REVOKED out of any MPI call of
the exchange, asapmpi.errors.ProcessFailedError) or a neighbour that misses its deadline
(NeighbourTimeoutError) inside a step is handled, not raised:

1. revoke the exchange's fault communicator (a duplicate of its communicator that every
   wait of its windows probes between polls: SlotWindow.watch), so that every survivor,
   wherever it waits, fails out of its wait and comes here too;
2. shrink it (MPIX_Comm_shrink: an agreement among the survivors on who failed); the
   failed ranks are those of the old communicator missing from the new one;
3. agree on the step to go on from: the most steps any survivor completed, M (lockstep
   policies keep the survivors within one step, so a survivor one step behind ends its
   step there, unmixed; the others redo theirs);
4. leave the old exchange's resources without waiting on the dead: its windows and
   communicators are never freed (collective over a dead rank), their requests go to
   the leftovers with the memory they touch (SlotWindow.abandon);
5. re-form the graph on the survivors (the same family for n-1 ranks where it exists and
   suits the policy, else the old graph re-wired around the dead, else complete), with
   its weights, and create the exchange again with the same policy and options on the
   shrunk communicator, from each survivor's current buffer; the survivors then agree
   (MPIX_Comm_agree) that every one of them made it: if a rank died meanwhile, they
   all leave what they made and go back to 2, from the shrunk communicator;
6. say so, one line per survivor: who died, at which step, the new graph and its
   spectral gap, the seconds lost.

Nothing here runs without fault_tolerance=True, and nothing of it is on the path of a
step that does not fail: a step is one try block more (free when nothing is raised).
"""
from __future__ import annotations

import atexit
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from mpi4py import MPI

from ..errors import ConfigError, MPIError, NeighbourTimeoutError, ProcessFailedError
from ..launch.faults import ft_enabled_at_run_time
from ..reduce.graphs import Graph
from ..reduce.graphs import graph as make_graph
from ..reduce.spectral import spectral_gap
from ..reduce.weights import check_stochastic, mixing_matrix

#: what the abandoned exchanges leave: kept referenced for the life of the process, so
#: that nothing MPI may still read or write is freed (docs/PROTOCOL.md, leftovers)
_ABANDONED: List[Tuple[Any, ...]] = []

#: the longest MPI_Finalize may take in a process that survived a failure: once in
#: about 15 runs here Open MPI's closing fence (PMIx) waited for the dead rank for ever
#: (under load more often: 2 of test_survive's 4 shrinking jobs in one full suite).  A
#: whole 4-rank job that survives a kill, finalize included, takes 2.2-2.9 s quiet
FINALIZE_DEADLINE_S = 10.0
#: an exception escaped the program (sys.excepthook saw it): the exit code then
_escaped = []

#: the ULFM calls this needs from mpi4py's Comm
ULFM_CALLS = ("Revoke", "Shrink", "Agree", "Get_failed", "Ack_failed")


def _library() -> str:
    return " ".join(MPI.Get_library_version().splitlines()[0].split())


def refusal(at_run_time: bool = True) -> str:
    """"" when this MPI can survive a dead rank in place, else why not (one sentence,
    with what to use instead).  `at_run_time`: also that this job was launched with
    fault tolerance on (`asapmpi doctor`, outside any job, asks about the MPI only)."""
    library = _library()
    instead = ("use restarts instead (asapmpi-run --restarts K, asapmpi train --restarts "
               "K: docs/FAILURES.md)")
    missing = [c for c in ULFM_CALLS if not hasattr(MPI.Comm, c)]
    if missing:
        return (f"this mpi4py has no {', '.join(missing)} (ULFM); {instead}")
    if "Open MPI" not in library or library.startswith(("Open MPI v1", "Open MPI v2",
                                                         "Open MPI v3", "Open MPI v4")):
        return (f"fault_tolerance=True needs an MPI that survives a dead rank in place "
                f"(ULFM: Open MPI 5 launched with mpiexec --with-ft ulfm); this is "
                f"{library}; {instead}")
    if MPI.ERR_PROC_FAILED == MPI.ERR_UNKNOWN:
        return (f"{library} was built without ULFM's error classes (ompi_info: FT MPI "
                f"support: no); {instead}")
    if at_run_time and not ft_enabled_at_run_time():
        return (f"{library} has ULFM but this job was not launched with it: launch with "
                f"mpiexec --with-ft ulfm (asapmpi.launchers.command(..., "
                f"fault_tolerance=True)), or {instead}")
    return ""


def check_available() -> None:
    """ConfigError (one line, before any communication) unless this MPI can survive a
    dead rank in place."""
    why = refusal()
    if why:
        raise ConfigError(why)


def is_failure(exc: BaseException) -> bool:
    """True for what a survivor handles: a process failure or revocation from any MPI
    call (asapmpi's or mpi4py's), or a neighbour that missed its deadline."""
    if isinstance(exc, (ProcessFailedError, NeighbourTimeoutError)):
        return True
    if isinstance(exc, MPI.Exception):
        code = exc.Get_error_code()
    elif isinstance(exc, MPIError):
        code = exc.code
    else:
        return False
    try:
        cls = MPI.Get_error_class(code)
    except MPI.Exception:
        return False
    return cls != MPI.ERR_UNKNOWN and cls in (MPI.ERR_PROC_FAILED, MPI.ERR_REVOKED,
                                              MPI.ERR_PROC_FAILED_PENDING)


def named(exc: ProcessFailedError, comm: MPI.Comm) -> ProcessFailedError:
    """`exc` saying which ranks of `comm` MPI knows to have failed (ULFM's
    MPIX_Comm_get_failed), for an exchange that does not survive them."""
    try:
        failed_group, group = comm.Get_failed(), comm.Get_group()
        try:
            ranks = MPI.Group.Translate_ranks(failed_group,
                                              list(range(failed_group.Get_size())), group)
        finally:
            failed_group.Free()
            group.Free()
    except MPI.Exception:
        return exc
    if not ranks:
        return exc
    shown = ", ".join(str(r) for r in sorted(ranks))
    out = ProcessFailedError(exc.code, exc.call, f"{exc.mpi_message}: rank(s) {shown} "
                             f"failed (an Exchange created with fault_tolerance=True "
                             f"would survive them)", exc.revoked)
    out.ranks = sorted(int(r) for r in ranks)
    return out


def fault_comm(comm: MPI.Comm) -> MPI.Comm:
    """The exchange's fault communicator: a duplicate of `comm` that returns errors.
    Nothing is sent on it; its revocation interrupts every survivor's waits."""
    ft = comm.Dup()
    ft.Set_errhandler(MPI.ERRORS_RETURN)
    return ft


# ---------------------------------------------------------------------- the graph


def rewired(g: Graph, survivors: Sequence[int]) -> Graph:
    """`g` on `survivors` (old ranks, new rank = index): every edge between survivors
    kept, and every path through a dead rank bridged (each in-neighbour of a dead rank
    sends to each of its out-neighbours); named "<name>-rewired"."""
    alive = set(survivors)
    index = {old: new for new, old in enumerate(survivors)}
    outs: List[set] = [set() for _ in survivors]
    # through chains of dead ranks: follow out-edges until a survivor
    def reach(start: int) -> set:
        seen, stack, found = {start}, [start], set()
        while stack:
            for j in g.out_neighbours(stack.pop()):
                if j in alive:
                    found.add(j)
                elif j not in seen:
                    seen.add(j)
                    stack.append(j)
        return found
    for old in survivors:
        for j in reach(old):
            if j != old:
                outs[index[old]].add(index[j])
    return Graph(len(survivors), [sorted(o) for o in outs], f"{g.name}-rewired")


def _fits(g: Graph, policy, weights) -> Optional[str]:
    """Why `g` cannot carry `policy` with `weights` ("" if it can)."""
    if not g.is_strongly_connected():
        return "not strongly connected"
    try:
        policy.validate(g, 0)
        check_stochastic(mixing_matrix(g, weights))
    except ConfigError as exc:
        return str(exc)
    return ""


def new_graph(old: Graph, family: Optional[str], survivors: Sequence[int], policy,
              weights) -> Tuple[Graph, str]:
    """The graph the survivors go on with, and how it was chosen: the family `family`
    for their number where it exists and fits the policy, else `old` re-wired around
    the dead, else complete."""
    n = len(survivors)
    tried = []
    if family is not None:
        try:
            g = make_graph(family, n)
            why = _fits(g, policy, weights)
        except ConfigError as exc:
            g, why = None, str(exc)
        if g is not None and not why:
            return g, f"the {family} family on {n} ranks"
        tried.append(f"{family} on {n} ranks: {why}")
    g = rewired(old, survivors)
    why = _fits(g, policy, weights)
    if not why:
        return g, "the old graph re-wired around the dead" + \
            (f" ({'; '.join(tried)})" if tried else "")
    tried.append(f"re-wired: {why}")
    g = make_graph("complete", n)
    return g, f"complete ({'; '.join(tried)})"


# ---------------------------------------------------------------------- recovery


def _shrink(ft: MPI.Comm) -> Tuple[MPI.Comm, List[int]]:
    """Revoke `ft`, shrink it: (the survivors' communicator, the survivors' ranks in
    `ft`, new rank order)."""
    try:
        ft.Revoke()
    except MPI.Exception:
        pass                        # revoked already (by another survivor)
    shrunk = ft.Shrink()
    shrunk.Set_errhandler(MPI.ERRORS_RETURN)
    old_group, new_group = ft.Get_group(), shrunk.Get_group()
    try:
        survivors = MPI.Group.Translate_ranks(new_group, list(range(shrunk.Get_size())),
                                              old_group)
    finally:
        old_group.Free()
        new_group.Free()
    return shrunk, [int(r) for r in survivors]


def _bounded_exit() -> None:
    # atexit, after the program's own end: MPI_Finalize (mpi4py's, which runs after
    # every atexit handler) gets FINALIZE_DEADLINE_S; past them this process ends with
    # 1 if an exception escaped the program, else 0 (a sys.exit(n) is not seen)
    from .._core import slotwin

    slotwin.bound_the_exit(FINALIZE_DEADLINE_S, 1 if _escaped else 0)


def _noting_hook(previous):
    def hook(kind, value, traceback):
        _escaped.append(kind)
        previous(kind, value, traceback)
    return hook


def _bound_the_exit_once() -> None:
    if getattr(_bound_the_exit_once, "done", False):
        return
    _bound_the_exit_once.done = True
    sys.excepthook = _noting_hook(sys.excepthook)
    atexit.register(_bounded_exit)


def abandon(ex) -> None:
    """Leave `ex`'s windows, boards and communicators without any MPI call that could
    wait on a dead rank; keep them referenced for the life of the process."""
    win = getattr(ex, "_win", None)
    if win is not None:
        win.abandon()
    joiner = getattr(ex, "_joiner", None)
    if joiner is not None:
        joiner.abandon()
    _ABANDONED.append((win, getattr(ex, "_segments", None), getattr(ex, "_joiner", None),
                       getattr(ex, "_comm", None), getattr(ex, "_ft_comm", None),
                       getattr(ex, "comm", None)))


#: fault injection (asapmpi train --kill-in shrink): called on each survivor right
#: after every shrink of a recovery, before the survivors' exchange is made
after_shrink: Optional[Callable[[], None]] = None


def _remake(ex, ft: MPI.Comm, completed: int, made: Dict[str, Any], old_graph: Graph):
    """Shrink `ft` and make `ex` again on the survivors; if a rank dies while they make
    it, shrink again and make it again, until it is made on ranks that all lived
    through it.  Returns (the new exchange, its communicator, the survivors' ranks in
    `ft`, the step to go on from, how the graph was chosen, the policy's options, the
    tries).  Every try ends in an agreement (MPIX_Comm_agree, whose result and whose
    failure are the same on every survivor) on whether every survivor made it, so
    that all of them go on with it or all try again."""
    comm, survivors = ft, list(range(ft.Get_size()))
    # an MPI error of the last try that did not say a process failed: raised if the
    # next shrink finds every rank of that try alive (it was no death)
    unexplained: Optional[BaseException] = None
    for attempt in range(1, ft.Get_size() + 1):
        shrunk, kept = _shrink(comm)
        if unexplained is not None and len(kept) == comm.Get_size():
            raise unexplained
        survivors = [survivors[r] for r in kept]
        if after_shrink is not None:
            after_shrink()
        fresh = None
        ok = 1
        unexplained = None
        try:
            # the step every survivor goes on from: the most any completed
            steps = shrunk.allreduce(int(completed), op=MPI.MAX)
            fresh, how, options = _make_on(ex, shrunk, survivors, made, old_graph)
        except (MPI.Exception, MPIError, NeighbourTimeoutError) as exc:
            # a rank that dies while a window is allocated over it may surface as that
            # call's own error, not as a process failure (Open MPI 5.0.11's
            # MPI_Win_allocate: MPI_ERR_WIN): every MPI error here is taken for a death
            # until the next shrink says otherwise
            if not is_failure(exc):
                unexplained = exc
            ok = 0
            try:
                shrunk.Revoke()     # the others' calls on it end too
            except MPI.Exception:
                pass
        try:
            ok = shrunk.Agree(ok)
        except MPI.Exception as exc:
            if not is_failure(exc):
                raise
            ok = 0
        if ok:
            return fresh, shrunk, survivors, steps, how, options, attempt
        if fresh is not None:
            abandon(fresh)
        _ABANDONED.append((shrunk,))
        comm = shrunk
    raise ProcessFailedError(MPI.ERR_PROC_FAILED, "recovery",
                             f"the survivors' exchange could not be made in "
                             f"{ft.Get_size()} tries: a rank died in every one")


def _make_on(ex, shrunk: MPI.Comm, survivors: List[int], made: Dict[str, Any],
             old_graph: Graph):
    """`ex` made again on `shrunk` (collective over it): (the new exchange, how its
    graph was chosen, its policy's options).  What a failure leaves of a half-made one
    is abandoned, never freed."""
    # the graph and its weights on the survivors; a server that died is replaced by
    # the first survivor (its replica becomes the parameters)
    options = dict(made["options"])
    if "server" in options:
        server = int(options["server"])
        options["server"] = survivors.index(server) if server in survivors else 0
    weights = made["weights"] if isinstance(made["weights"], str) else "auto"
    if made["fixed_graph"]:
        g, how = None, "the policy's own graph"
    else:
        g, how = new_graph(old_graph, made["family"], survivors, ex._policy, weights)
    fresh = type(ex).__new__(type(ex))
    try:
        fresh.__init__(ex._work if ex._stager is None else ex._user_buffer, graph=g,
                       sync=made["sync"], comm=shrunk, weights=weights,
                       timeout=made["timeout"], checksum=made["checksum"],
                       reject_nonfinite=made["reject_nonfinite"], transport=ex.transport,
                       dtype=made["dtype"], fault_tolerance=True, **options)
    except BaseException:
        abandon(fresh)
        raise
    return fresh, how, options


def recover(ex, exc: BaseException, completed: int, began: Optional[float]) -> Dict[str, Any]:
    """Survive the failure `exc` seen by Exchange `ex` (whose rank had completed
    `completed` steps): shrink, re-form, re-create `ex` in place on the survivors.
    Returns the record of it (also appended to ex.survivals).  Collective over the
    survivors; every one of them comes here from its own wait."""
    t0 = time.perf_counter()
    made = ex._made
    ft = ex._ft_comm
    old_graph, old_origin = ex.graph, list(ex._origin)
    old_rank = ex.rank
    carried = {"bytes_sent": ex.bytes_sent, "wait_seconds": ex.wait_seconds}
    survivals = list(ex.survivals)
    abandon(ex)
    _bound_the_exit_once()
    fresh, shrunk, survivors, steps, how, options, attempts = _remake(
        ex, ft, completed, made, old_graph)
    failed = sorted(set(range(ft.Get_size())) - set(survivors))
    origin = [old_origin[r] for r in survivors]
    fresh._base = steps
    fresh.version = steps
    fresh._carried = carried
    fresh._origin = origin
    fresh._made = made
    fresh._own_comm = shrunk        # freed with the exchange
    gap = spectral_gap(fresh.graph)
    record = {"failed": [old_origin[r] for r in failed], "step": completed + 1,
              "resumed_at": steps, "size": fresh.size, "graph": fresh.graph.name,
              "how": how, "spectral_gap": gap, "seconds": None,
              "recovery_seconds": time.perf_counter() - t0,
              "cause": type(exc).__name__, "attempts": attempts}
    if "server" in options:
        # a parameter server's policy: which survivor serves now (the old one, or the
        # first survivor in its place, whose replica became the parameters)
        record["server"] = origin[int(options["server"])]
    fresh.survivals = [*survivals, record]
    hook = getattr(ex, "on_survival", None)
    ex.__dict__.clear()
    ex.__dict__.update(fresh.__dict__)
    ex.on_survival = hook
    # what the program does about it (asapmpi train: the lost data shard), said in the
    # same line and counted in the seconds lost; no collective there: a survivor whose
    # step the recovery ended returns a step before the others
    note = hook(record) if hook is not None else None
    if note:
        record["note"] = note
    record["seconds"] = time.perf_counter() - (began if began is not None else t0)
    what = (f"the failure of rank(s) {', '.join(str(r) for r in record['failed'])}"
            if record["failed"] else "a missed deadline (no rank failed)")
    print(f"asapmpi: rank {old_origin[old_rank]}: survived {what} "
          f"in step {completed + 1}; going on from step {steps} on {fresh.size} ranks, "
          f"graph {fresh.graph.name} ({how}), spectral gap {gap:.3f}"
          + (f", server rank {record['server']}" if "server" in record else "")
          + (f"; made {attempts} times (a rank died in the recovery)"
             if attempts > 1 else "")
          + (f"; {note}" if note else "")
          + f"; {record['seconds']:.2f} s lost", file=sys.stderr, flush=True)
    return record
