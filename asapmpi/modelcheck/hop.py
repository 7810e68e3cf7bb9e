"""Hop on the put transport (asapmpi/sync/hop.py, docs/HOP.md): rotating slots, token
counters, backup workers, bounded staleness, skipping iterations and suppressed late
updates.

Rank r in iteration k (entered at creation for k = 1):

  SEND   put(k, suppress_if_acked): every out-neighbour j whose token word (the count
         j published, read atomically) shows it can no longer use update k (backup: j
         completed >= k; staleness: >= k + s) is skipped; MPI_Put header, payload,
         footer of version k into slot k mod depth at the others (parts land in any
         order)
  FLUSH  MPI_Win_flush_all (completes the puts and every word r issued before), then
         the notify word of that slot at the same out-neighbours, lazily
  RECV   Rec(v), v = k (or T-1 after a jump): standard: every in-neighbour's notify of
         slot v mod depth == v; backup b: at least in-degree - b of them == v;
         staleness s: wait_newest, every in-neighbour has a notify in [v - s, v] in one
         of its slots (the newest <= v is taken)
  READ   the verified reduce of v (standard: require_all; backup: only_notified, the
         inputs whose notify is v when the reduce starts; staleness: reduce_versions of
         the newest versions, seqlock).  After the reduce of k the jump decision reads
         the token words: behind = min_j completed(j) + 1 - k; at least skip_trigger:
         T = k + max(1, min(max_jump, behind, max_gap + 1)) and Rec(T-1) follows; else
         T = k + 1
  ENTER  wait until every token word >= T - 1 - max_gap (read atomically), then publish
         T - 1 completed iterations into the word r owns at every in-neighbour, lazily;
         iteration T is entered
  DONE   once r completed the run's iterations: free() settles its words

A waiting rank may settle its words in flight (Waits.settle_pending) unless the variant is
"no-settle".  Broken variants: "skip-uncapped" (the jump without its cap max_gap + 1,
the deadlock found in review) and "shallow" (one slot too few: depth = max_gap + s).
"""
from __future__ import annotations

from typing import List, Optional

from ..reduce.graphs import Graph
from . import verify
from .model import Violation
from .onesided import OneSidedModel
from .rma import Puts, Words

SEND, FLUSH, RECV, READ, ENTER, DONE, EXIT = range(7)
PHASES = ("sends", "flushes the puts of", "waits for the notifies of", "reduces",
          "waits for the tokens to enter", "is done after", "has left after")
VARIANTS = ("correct", "no-settle", "skip-uncapped", "shallow")


class HopModel(OneSidedModel):
    """Hop's queue-based protocol over lazy words and unordered puts."""

    final_pc = EXIT

    name = "hop"

    def __init__(self, graph: Graph, iterations: int, max_gap: int = 1, backup: int = 0,
                 staleness: Optional[int] = None,
                 skip_trigger: Optional[int] = None, max_jump: int = 1,
                 suppress_late: bool = True, variant: str = "correct", parts: bool = False,
                 properties=("overlap", "version", "error", "gap", "deadlock"),
                 symmetry: bool = True, landings: str = "demand"):
        if variant not in VARIANTS:
            raise ValueError(f"variant {variant!r} not in {VARIANTS}")
        if backup and staleness is not None:
            raise ValueError("backup workers or staleness, not both (as hop.py)")
        if skip_trigger is not None and not backup and staleness is None:
            raise ValueError("skipping needs backup workers or staleness (as hop.py)")
        if backup and backup >= min(graph.in_degree(r) for r in range(graph.n)):
            raise ValueError("backup must be smaller than every in-degree")
        super().__init__(graph, iterations, properties, symmetry, landings,
                         settle=variant != "no-settle")
        self.max_gap, self.backup, self.staleness = max_gap, backup, staleness
        # hop.py _useless_after: an out-neighbour that completed k + this cannot use
        # update k (None: standard Hop, every update is used)
        self.useless = None
        if backup:
            self.useless = 0
        elif staleness is not None:
            self.useless = staleness
        self.skip_trigger, self.max_jump = skip_trigger, max_jump
        self.suppress_late, self.variant = suppress_late, variant
        self.depth = max_gap + 1 + (staleness or 0) - (variant == "shallow")
        c = self.cells
        self.pc = [c.add("pc", (r,)) for r in range(self.n)]
        self.k = [c.add("k", (r,), default=1) for r in range(self.n)]
        # the version being received (k, or T - 1 after a jump) and the target T
        self.v = [c.add("v", (r,), default=1) for r in range(self.n)]
        self.t = [c.add("t", (r,)) for r in range(self.n)]
        self.words = Words(c, self.n)
        self.puts = Puts(c, self.n, parts)
        self.notify, self.token, self.slot, self.use, self.skip = {}, {}, {}, {}, {}
        for s, r in self.edges:
            # r's count of completed iterations, in the word r owns at s
            self.token[s, r] = self.words.add("token", r, s, label=f"token at rank {s}")
            # s skips r in the current put (suppressed late update)
            self.skip[s, r] = c.add("skip", (s, r))
            self.use[s, r] = c.add("use", (s, r), default=())
            for d in range(self.depth):
                self.notify[s, r, d] = self.words.add("notify", s, r, (d,),
                                                      f"notify {d} at rank {r}")
                self.slot[s, r, d] = self.puts.add(s, r, (d,))

    # ------------------------------------------------------------------ properties

    def violation(self, state) -> Optional[Violation]:
        if "overlap" in self.properties:
            for (s, r), use in self.use.items():
                if state[use]:
                    v = state[use][0]
                    put = state[self.slot[s, r, v % self.depth].put]
                    if put:
                        return ("overlap", f"rank {r} reads version {v} in slot "
                                           f"{v % self.depth} of rank {s} while rank {s}'s "
                                           f"put of version {put} into it is in flight")
        return super().violation(state) or self.gap_violation(state, self.k, self.max_gap)

    def measure(self, state) -> dict:
        """The largest Iter(i) - Iter(j) over the edges i -> j, and the longest jump
        under way (T - k; 1: none)."""
        return {"gap": max(state[self.k[i]] - state[self.k[j]] for i, j in self.edges),
                "jump": max(state[t] - state[k] if state[t] else 1
                            for t, k in zip(self.t, self.k))}

    def waiting(self, state, r: int) -> str:
        pc, k, v, t = (state[self.pc[r]], state[self.k[r]], state[self.v[r]],
                       state[self.t[r]])
        if pc == RECV:
            what = (f"rank {r} (iteration {k}) waits for the notifies of version {v} "
                    f"(seen: " + ", ".join(
                        f"rank {i} = {state[self.notify[i, r, v % self.depth][0]]}"
                        for i in self.ins[r]) + ")")
        elif pc == ENTER:
            what = (f"rank {r} waits for tokens >= {t - 1 - self.max_gap} to enter "
                    f"iteration {t} (seen: " + ", ".join(
                        f"rank {j} = {state[self.token[r, j][0]]}" for j in self.outs[r])
                    + ")")
        else:
            what = f"rank {r} {PHASES[pc]} iteration {k}"
        if self.words.pending(state, r):
            what += ", its own words still in flight"
        return what

    # ------------------------------------------------------------------ transitions

    def reads(self, state, r: int):
        pc, k, v = state[self.pc[r]], state[self.k[r]], state[self.v[r]]
        tokens = [self.token[r, j][0] for j in self.outs[r]]
        if pc == SEND:
            return (tokens if self.suppress_late and self.useless is not None else ()), ()
        # staleness reads every slot's notify word and may reduce any slot
        slots = range(self.depth) if self.staleness is not None else (v % self.depth,)
        if pc == RECV:
            return ([self.notify[i, r, d][0] for i in self.ins[r] for d in slots],
                    [self.slot[i, r, d] for i in self.ins[r] for d in slots])
        if pc == READ:
            jump = self.skip_trigger is not None and v == k
            return (tokens if jump else ()), [self.slot[i, r, d] for i in self.ins[r]
                                               for d in slots]
        if pc == ENTER:
            return tokens, ()
        return (), ()

    def waiting_for(self, state, r: int) -> Optional[str]:
        pc = state[self.pc[r]]
        if pc == RECV:
            return f"the notifies of version {state[self.v[r]]}"
        if pc == ENTER:
            return f"the tokens to enter iteration {state[self.t[r]]}"
        return None

    def step(self, state, r: int) -> List[tuple]:
        pc, k = state[self.pc[r]], state[self.k[r]]
        s = list(state)
        if pc == SEND:
            sent = []
            for j in self.outs[r]:
                # _useless_after(k): backup k (j is past iteration k), staleness k + s
                # (j is past even k + s), standard: never
                late = (self.suppress_late and self.useless is not None
                        and state[self.token[r, j][0]] >= k + self.useless)
                s[self.skip[r, j]] = int(late)
                if not late:
                    self.puts.issue(s, self.slot[r, j, k % self.depth], k)
                    sent.append(j)
            s[self.pc[r]] = FLUSH
            return [(f"rank {r}: MPI_Put version {k} into slot {k % self.depth} at ranks "
                     f"{_names(sent)}" + (f" (suppressed: {_names(set(self.outs[r]) - set(sent))})"
                                          if len(sent) < len(self.outs[r]) else ""),
                     tuple(s), True)]
        if pc == FLUSH:
            self.puts.flush(s, r)
            self.words.settle(s, r)
            for j in self.outs[r]:
                if not state[self.skip[r, j]]:
                    self.words.issue(s, self.notify[r, j, k % self.depth][1], k)
                s[self.skip[r, j]] = 0
            s[self.pc[r]] = RECV
            s[self.v[r]] = k
            return [(f"rank {r}: MPI_Win_flush_all, notify version {k} (lazy)", tuple(s),
                     True)]
        if pc == RECV:
            v = state[self.v[r]]
            if self.staleness is not None:
                return self._newest(state, s, r, v)
            arrived = [i for i in self.ins[r]
                       if state[self.notify[i, r, v % self.depth][0]] == v]
            if len(arrived) < len(self.ins[r]) - self.backup:
                return []
            return [self._begin(state, s, r, v, arrived)]
        if pc == READ:
            return [self._end(state, s, r, k)]
        if pc == ENTER:
            t = state[self.t[r]]
            if not all(state[self.token[r, j][0]] >= t - 1 - self.max_gap
                       for j in self.outs[r]):
                return []
            for i in self.ins[r]:
                self.words.issue(s, self.token[i, r][1], t - 1)
            s[self.k[r]] = t
            s[self.t[r]] = 0
            s[self.pc[r]] = DONE if t - 1 >= self.iterations else SEND
            return [(f"rank {r}: tokens >= {t - 1 - self.max_gap} seen, publish {t - 1} "
                     f"completed to ranks {_names(self.ins[r])} (lazy), enter iteration {t}",
                     tuple(s), True)]
        if pc == DONE:
            self.words.settle(s, r)
            s[self.pc[r]] = EXIT
            return [(f"rank {r}: free() settles its words and leaves", tuple(s), True)]
        return []

    def _begin(self, state, s: list, r: int, v: int, arrived: List[int]) -> tuple:
        refused = []
        # backup: only_notified, the notifies as the reduce finds them (= arrived: the
        # wait and the reduce's look at the notify words are one action here)
        for i in (arrived if self.backup else self.ins[r]):
            ok, why = verify.begin(state, s, self.slot[i, r, v % self.depth],
                                   self.use[i, r], v)
            if not ok:
                refused.append(f"rank {i}: {why}")
        if refused:
            why = " (notified, so it must be whole)" if self.backup else " (ProtocolError)"
            self.flag(s, self.BAD, "error", f"rank {r}: version {v} not usable from "
                                            + "; ".join(refused) + why)
        s[self.pc[r]] = READ
        return (f"rank {r}: reduce version {v} begins, inputs from ranks "
                f"{_names(arrived if self.backup else self.ins[r])}", tuple(s), True)

    def _newest(self, state, s: list, r: int, v: int) -> List[tuple]:
        """Staleness: wait_newest(v, max(v - s, 1)) then reduce_versions of what it
        returned: per in-neighbour the newest version <= v of its notify words."""
        versions = {i: max([w for w in (state[self.notify[i, r, d][0]]
                                        for d in range(self.depth)) if w <= v] or [0])
                    for i in self.ins[r]}
        if min(versions.values(), default=v) < max(v - self.staleness, 1):
            return []
        refused = []
        for i, vi in versions.items():
            ok, why = verify.begin(state, s, self.slot[i, r, vi % self.depth],
                                   self.use[i, r], vi)
            if not ok:
                refused.append(f"rank {i}: {why}")
        if refused:
            self.flag(s, self.BAD, "error", f"rank {r}: notified versions not whole: "
                                            + "; ".join(refused))
        s[self.pc[r]] = READ
        return [(f"rank {r}: reduce of iteration {v} begins with versions "
                 + ", ".join(f"{vi} of rank {i}" for i, vi in versions.items()),
                 tuple(s), True)]

    def _end(self, state, s: list, r: int, k: int) -> tuple:
        v = state[self.v[r]]
        for i in self.ins[r]:
            if state[self.use[i, r]]:
                vi = state[self.use[i, r]][0]
                found = verify.end(state, s, self.slot[i, r, vi % self.depth],
                                   self.use[i, r], f"rank {i}", r)
                # reduce_versions is a seqlock reduce: it drops a torn input
                if found and not (found[0] and self.staleness is not None):
                    self.flag(s, self.BAD, "error" if found[0] else "version", found[1])
        label = f"rank {r}: reduce version {v} ends"
        if v != k:      # the reduce of T - 1 after a jump
            s[self.pc[r]] = ENTER
            return (label, tuple(s), True)
        target = self._jump_target(state, r, k)
        s[self.t[r]] = target
        if target > k + 1:
            s[self.pc[r]] = RECV
            s[self.v[r]] = target - 1
            return (f"{label}; tokens "
                    + ", ".join(f"rank {j} = {state[self.token[r, j][0]]}"
                                for j in self.outs[r])
                    + f": jump to iteration {target}, Rec({target - 1}) first",
                    tuple(s), True)
        s[self.pc[r]] = ENTER
        return (label, tuple(s), True)

    def _jump_target(self, state, r: int, k: int) -> int:
        """hop.py _jump_target: k + 1, or further when r trails every out-neighbour by
        at least skip_trigger iterations (tokens read atomically)."""
        if self.skip_trigger is None or not self.outs[r]:
            return k + 1
        completed = min(state[self.token[r, j][0]] for j in self.outs[r])
        behind = completed + 1 - k
        if behind < self.skip_trigger:
            return k + 1
        if self.variant == "skip-uncapped":
            return k + max(1, min(self.max_jump, behind))
        return k + max(1, min(self.max_jump, behind, self.max_gap + 1))


def _names(ranks) -> str:
    return ", ".join(str(r) for r in sorted(ranks)) or "none"
