"""What every protocol model shares: a flat state tuple of named cells, symmetry
reduction over the graph's automorphisms, and the checks common to all protocols.

A state is one flat tuple.  Every position is a named cell, e.g. ("pc", (2,), ()) for
rank 2's program counter or ("notify", (0, 1), ()) for the notify word rank 0 writes
at rank 1.  Cells never hold rank numbers nor masks over neighbour indices, only
versions, counters, program counters and tuples of those, so relabelling the ranks
by a graph automorphism is a permutation of positions.  Two states that differ only
by such a relabelling behave alike (every property here is symmetric), so the
explorer keeps one of them: the smallest tuple of the orbit (symmetry reduction).
"""
from __future__ import annotations

from itertools import permutations
from operator import itemgetter
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from ..reduce.graphs import Graph

Key = Tuple[str, Tuple[int, ...], Tuple[int, ...]]
#: a property broken in a state: (property, what happened)
Violation = Tuple[str, str]

#: the properties a model can check, in the order they are reported
PROPERTIES = ("overlap", "version", "error", "gap", "ahead", "alias", "stage", "monotone",
              "inflight", "freed", "agree", "rule", "dead", "named", "deadlock")
DESCRIPTIONS = {
    "overlap": "no reduce reads a slot its writer may be writing",
    "version": "every reduced input is the version the policy claims (never a torn or "
               "other version, silently)",
    "error": "no reduce finds an input it needs torn or missing (ProtocolError, or an "
             "input announced whole that is not)",
    "gap": "the iteration gap bound holds on every edge",
    "ahead": "a sender is at most one version ahead of its reader",
    "alias": "no two messages in flight on one channel share a tag",
    "stage": "no send stage is refilled while a send from it is in flight",
    "monotone": "the versions a reader sees from a sender never decrease",
    "inflight": "at most two messages unmatched per channel (sender -> reader)",
    "freed": "no request or message outlives free(): nothing MPI writes or reads lands "
             "in memory already released",
    "agree": "join: every rank ends each round at the same J and no rank enters a step "
             "above it",
    "rule": "join: a rank entering step s leaves out exactly the in-neighbours that "
            "joined its round at c with c + 1 < s (from the history, not the board)",
    "dead": "join: with a rank dead in the agreement nobody completes it after the "
            "death, and every other rank ends in a wait with a deadline",
    "named": "join: with a rank dead in the agreement, a timeout of another rank names it",
    "deadlock": "no reachable state blocks for ever before the last iteration",
}


class Cells:
    """The named positions of a flat state tuple."""

    def __init__(self):
        self.keys: List[Key] = []
        self.pos: Dict[Key, int] = {}
        self.defaults: list = []

    def add(self, name: str, ranks: Sequence[int] = (), extra: Sequence[int] = (),
            default=0) -> int:
        """A new cell named `name` for `ranks` (relabelled by symmetries) and `extra`
        (kept: slot indices, parts); returns its position."""
        key = (name, tuple(ranks), tuple(extra))
        if key in self.pos:
            raise ValueError(f"cell {key} twice")
        self.pos[key] = len(self.keys)
        self.keys.append(key)
        self.defaults.append(default)
        return self.pos[key]

    def __len__(self) -> int:
        return len(self.keys)

    def getter(self, perm: Sequence[int]) -> Callable[[tuple], tuple]:
        """The function that relabels a state by the rank permutation `perm` (rank r
        becomes perm[r]): the cell of r's key takes the position of perm[r]'s."""
        src = [0] * len(self.keys)
        for i, (name, ranks, extra) in enumerate(self.keys):
            src[self.pos[(name, tuple(perm[r] for r in ranks), extra)]] = i
        return itemgetter(*src)


def automorphisms(graph: Graph, limit: int = 8) -> List[Tuple[int, ...]]:
    """The permutations of the ranks that map the graph's edges onto its edges
    (identity first).  Graphs above `limit` ranks get the identity only."""
    n = graph.n
    ident = tuple(range(n))
    if n > limit:
        return [ident]
    edges = set(graph.edges())
    found = [ident]
    for perm in permutations(range(n)):
        if perm != ident and all((perm[i], perm[j]) in edges for i, j in edges):
            found.append(perm)
    return found


class Model:
    """Base class of the protocol models: the cells, the graph, the properties checked
    and symmetry reduction.  Subclasses build their cells in __init__ (self.k: the cell
    of each rank's iteration, which every model has) and define successors(),
    finished(), violation() (their own checks, then this class's) and waiting()."""

    name = "model"

    def __init__(self, graph: Graph, iterations: int, properties: Sequence[str],
                 symmetry: bool = True):
        unknown = set(properties) - set(PROPERTIES)
        if unknown:
            raise ValueError(f"unknown properties {sorted(unknown)}")
        self.graph = graph
        self.n = graph.n
        self.iterations = iterations
        self.properties = tuple(p for p in PROPERTIES if p in properties)
        self.outs = [graph.out_neighbours(r) for r in range(self.n)]
        self.ins = [graph.in_neighbours(r) for r in range(self.n)]
        self.edges = list(graph.edges())
        self.cells = Cells()
        # a global cell: what an action saw that breaks a property, as (property,
        # detail); the transition that saw it leads to a state that reports it
        self.BAD = self.cells.add("bad", default=())
        self.symmetry = symmetry
        self._getters: Optional[list] = None
        #: a rank slowed down without bound: it takes a step only when no other rank
        #: can (None: every rank at any time).  Only the runs of such a schedule are
        #: explored: a violation found is real, "ok" holds for those runs alone
        self.straggler: Optional[int] = None

    # ------------------------------------------------------------------ the state

    def initial(self) -> tuple:
        """The state before the first step (every cell at its default)."""
        return tuple(self.cells.defaults)

    def canonical(self, state: tuple) -> tuple:
        """The representative of the state's orbit under the graph's automorphisms, or
        the state itself without symmetry reduction.  Among the relabellings that give
        the smallest sequence of per-rank cells (program counters, iterations), the
        smallest tuple: a function of the orbit alone, and much cheaper than comparing
        every relabelling in full."""
        if self._getters is None:
            self._prepare_symmetry()
        if not self._getters:
            return state
        local = [g(state) for g in self._rank_getters]
        sigs = [g(local) for g in self._sig_getters]
        best = min(sigs)
        chosen = [g for sig, g in zip(sigs, self._getters) if sig == best]
        return chosen[0](state) if len(chosen) == 1 else min(g(state) for g in chosen)

    def _symmetry_perms(self) -> list:
        """The relabellings of the ranks that map the model onto itself."""
        perms = automorphisms(self.graph) if self.symmetry else []
        if self.straggler is not None:      # only the relabellings that keep it
            perms = [p for p in perms if p[self.straggler] == self.straggler]
        return perms

    def _prepare_symmetry(self) -> None:
        perms = self._symmetry_perms()
        self._getters, self._sig_getters = [], []
        if len(perms) < 2:
            return
        for p in perms:
            inverse = [0] * self.n
            for r, image in enumerate(p):
                inverse[image] = r
            self._getters.append(self.cells.getter(p))
            # the per-rank cells seen in the order of the relabelled ranks
            self._sig_getters.append(itemgetter(*inverse))
        # each rank's own cells, as one tuple (the global "bad" cell comes along so
        # that itemgetter returns a tuple even for a single cell)
        self._rank_getters = [itemgetter(self.BAD, *(i for i, (_, ranks, _) in
                                                     enumerate(self.cells.keys)
                                                     if ranks == (r,)))
                              for r in range(self.n)]

    def unflagged(self, state: tuple) -> tuple:
        """The state without what an action flagged (the flag's text names ranks, which
        a relabelling of the state does not rename)."""
        return (*state[:self.BAD], (), *state[self.BAD + 1:])

    #: the program counter of a rank that has completed its iterations (and settled
    #: what it owed); every model keeps its ranks' counters in self.pc
    final_pc: int = -1

    def finished(self, state: tuple) -> bool:
        """Every rank has completed its iterations (and settled what it owed)."""
        return all(state[p] == self.final_pc for p in self.pc)

    def successors(self, state: tuple) -> list:
        """The transitions enabled in `state`: (label, next state, forced)."""
        raise NotImplementedError

    def halted(self, state: tuple) -> bool:
        """Whether the run stopped: a reduce raised ProtocolError (or broke a property
        that is not checked): nothing happens after it in this run."""
        return bool(state[self.BAD])

    def violation(self, state: tuple) -> Optional[Violation]:
        """The first checked property `state` breaks, or None."""
        bad = state[self.BAD]
        if bad and bad[0] in self.properties:
            return bad
        return None

    def deadlock_detail(self, state: tuple) -> str:
        """Why nothing can happen in a deadlocked state: what each rank waits for."""
        return "; ".join(self.waiting(state, r) for r in range(self.n))

    def waiting(self, state: tuple, rank: int) -> str:
        """What `rank` is doing in `state`, in words."""
        return f"rank {rank}"

    # ------------------------------------------------------------------ helpers

    @staticmethod
    def flag(s: list, bad_pos: int, prop: str, detail: str) -> None:
        """Record in the state under construction `s` that an action broke `prop`
        (the first such observation wins)."""
        if not s[bad_pos]:
            s[bad_pos] = (prop, detail)

    def note(self, s: list, prop: str, detail: str) -> None:
        """Record that an action broke `prop`, if it is checked: a silent failure (a
        wrong version reduced, a stage refilled) that the run itself does not notice,
        so that a run checked for other properties goes on past it."""
        if prop in self.properties:
            self.flag(s, self.BAD, prop, detail)

    def drift(self, state: tuple) -> int:
        """How far the ranks are ahead of the slowest: the sum over the ranks of their
        iteration minus the smallest (the explorer's "drift" search takes such states
        first)."""
        its = [state[p] for p in self.k]
        return sum(its) - len(its) * min(its)

    def gap_violation(self, state: tuple, it: Sequence[int], bound: int,
                      prop: str = "gap", both_ways: bool = False) -> Optional[Violation]:
        """Iter(i) - Iter(j) <= bound on every edge i -> j (and j -> i with
        `both_ways`), with it[r] the position of rank r's iteration."""
        if prop not in self.properties:
            return None
        for i, j in self.edges:
            a, b = state[it[i]], state[it[j]]
            if a - b > bound or (both_ways and b - a > bound):
                return (prop, f"rank {i} is in iteration {a} and its out-neighbour {j} in "
                              f"iteration {b}: the bound {bound} is broken")
        return None
