"""The generic explicit-state explorer: every reachable state of a model, once each.

A model (asapmpi.modelcheck.model.Model) gives an initial state, the transitions
enabled in a state and the properties a state must keep.  `explore` visits every state
reachable from the initial one, once each (a visited set of canonical state tuples),
breadth first by default, so the first violation it meets is one of the shortest, and
rebuilds the sequence of actions that leads there by replaying the model from the
initial state.

A transition is *forced* when the code guarantees that it happens eventually (a rank's
next statement, a flush it performs, MPI matching a posted receive its owner polls);
one that MPI may or may not do on its own (a lazy word landing before any flush) is
not.  A state that is not final and enables no forced transition is a deadlock: the
ranks may block there for ever, whatever else MPI could do for them.
"""
from __future__ import annotations

import heapq
import time
from array import array
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

#: verdicts of a run
OK, VIOLATION, LIMIT = "ok", "violation", "limit"
#: orders of exploration
SEARCHES = ("bfs", "drift")


@dataclass
class Result:
    """What one exploration found.

    verdict: "ok" (every reachable state explored, no violation), "violation" (prop and
    detail say which, trace how: one action per entry from the initial state) or
    "limit" (max_states reached first: no verdict).  last_state is the state the trace
    ends in (the violating one); measures the largest value of each of the model's
    measures (model.measure, e.g. the widest gap) over the states explored.
    """

    verdict: str
    states: int
    transitions: int
    max_depth: int
    seconds: float
    prop: Optional[str] = None
    detail: str = ""
    trace: List[str] = field(default_factory=list)
    last_state: Optional[tuple] = None
    measures: Dict[str, int] = field(default_factory=dict)


def explore(model, max_states: Optional[int] = None, search: str = "bfs") -> Result:
    """Visit every state of `model` reachable from its initial state.

    Stops at the first state that violates one of the model's properties, or that is a
    deadlock (not final, no forced transition enabled), and returns it with the trace
    that reaches it; else returns verdict "ok" with the number of states, transitions
    and the deepest level explored.  With `max_states`, gives up with verdict "limit"
    once that many states were found.

    search "bfs" (breadth first) finds a shortest trace.  "drift" takes next the state
    whose ranks are furthest apart (model.drift(state)), the deepest first among
    equals: the same states in another order, reaching the runs where some ranks race
    ahead of others (gap bounds, slot reuse, jumps) after a few thousand states where
    breadth first needs all the shallower ones first; its traces are real runs, not
    necessarily the shortest.
    """
    if search not in SEARCHES:
        raise ValueError(f"search {search!r} not in {SEARCHES}")
    t0 = time.perf_counter()
    canon = model.canonical
    measure = getattr(model, "measure", None)
    drift = model.drift if search == "drift" else None
    best: Dict[str, int] = {}
    start = canon(model.initial())
    index = {start: 0}
    states = [start]
    parent = array("l", [-1])
    depth = array("l", [0])
    heap: list = [(0, 0, 0)]
    transitions = 0

    def finish(verdict: str, at: int, prop=None, detail="") -> Result:
        trace, last = [], None
        if verdict == VIOLATION:
            trace, last = _replay(model, _path(parent, states, at))
            found = model.violation(last) if prop != "deadlock" else None
            detail = found[1] if found else model.deadlock_detail(last)
        return Result(verdict, len(states), transitions, max(depth) if depth else 0,
                      time.perf_counter() - t0, prop, detail, trace, last, dict(best))

    bad = model.violation(start)
    if bad:
        return finish(VIOLATION, 0, bad[0])
    i = 0
    while True:
        if drift is None:
            if i == len(states):
                break
            at, i = i, i + 1
        else:
            if not heap:
                break
            at = heapq.heappop(heap)[2]
        state = states[at]
        if model.halted(state):     # a run that raised: nothing follows (unchecked)
            continue
        if measure is not None:
            for name, value in measure(state).items():
                if value > best.get(name, value - 1):
                    best[name] = value
        succ = model.successors(state)
        transitions += len(succ)
        if not any(forced for _, _, forced in succ) and not model.finished(state) \
                and "deadlock" in model.properties:
            return finish(VIOLATION, at, "deadlock")
        level = depth[at] + 1
        for _label, nxt, _forced in succ:
            if nxt in index:        # already a visited canonical state
                continue
            key = canon(nxt)
            if key in index:
                continue
            index[key] = len(states)
            states.append(key)
            parent.append(at)
            depth.append(level)
            if drift is not None:
                heapq.heappush(heap, (-drift(key), -level, len(states) - 1))
            bad = model.violation(key)
            if bad:
                return finish(VIOLATION, len(states) - 1, bad[0])
            if max_states is not None and len(states) >= max_states:
                return finish(LIMIT, at)
    return finish(OK, 0)


def _path(parent: array, states: List[tuple], at: int) -> List[tuple]:
    """The canonical states from the initial one to states[at]."""
    path = []
    while at >= 0:
        path.append(states[at])
        at = parent[at]
    return path[::-1]


def _replay(model, path: List[tuple]) -> Tuple[List[str], tuple]:
    """Re-run the model along `path` (canonical states) from its real initial state:
    the action labels and the last real state.  With symmetry reduction the canonical
    states may name other ranks than the run that reached them; replaying picks, at
    each step, a real successor whose canonical form is the next state."""
    state = model.initial()
    labels: List[str] = []
    for canonical in path[1:]:
        # what an action flagged names the ranks it saw: compare without it
        target = model.unflagged(canonical)
        for label, nxt, _forced in model.successors(state):
            if model.unflagged(model.canonical(nxt)) == target:
                labels.append(label)
                state = nxt
                break
        else:   # cannot happen for a deterministic model: a bug in the model
            raise RuntimeError(f"{model.name}: the trace cannot be replayed after "
                               f"{len(labels)} actions")
    return labels, state
