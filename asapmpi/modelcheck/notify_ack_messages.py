"""NOTIFY-ACK on the message transport (transports/messages.py, _core/messages.pxi;
docs/PROTOCOL.md section 2c): version k is one two-sided message per out-neighbour,
matched by tag k mod TAG_MODULUS and received straight into the reader's slot; the
receive posted for k is the ack of k-1.

Rank r, from the start (the receives of version 1 are posted at creation), step k:

  SEND   send_update(k): a message of version k, tag k mod M, to every out-neighbour
         (sync, MPI_Issend: complete only once the reader's receive matched it; eager,
         the MPI_Isend of before 5bde6b8 under the eager limit: complete at once)
         [checksum: then the checksum, a second message with the same tag, MPI_Isend:
         complete at once]
  WAIT   wait_updates(k): every receive of k complete and every send of k complete
  READ   stamp the slots, verified reduce; then post the receives of k+1 (the ack):
         the payload's, then [checksum] the checksum's, same tag

MPI matches a message with the oldest posted receive of its channel (sender, reader,
communicator) that has its tag, and never a message before an older one of the same
channel and tag (non-overtaking); it may do so at any time, and does once the reader
polls (a forced transition).  A channel holds its unmatched messages, oldest first,
as (version, kind) with kind 0 for a payload, 1 for a checksum; a reader's posted
receives are (version, kind) too, in posting order.
"""
from __future__ import annotations

from typing import List, Optional

from ..reduce.graphs import Graph
from .model import Model, Violation

SEND, WAIT, READ, DONE = range(4)
PHASES = ("sends", "waits for the messages of", "reduces", "is done after")
SENDS = ("sync", "eager")
KINDS = ("payload", "checksum")


class NotifyAckMessages(Model):
    """NOTIFY-ACK by two-sided messages with tags modulo `tag_modulus`."""

    final_pc = DONE

    name = "notify-ack-messages"

    def __init__(self, graph: Graph, iterations: int, send: str = "sync",
                 tag_modulus: int = 32768,
                 properties=("overlap", "version", "error", "gap", "ahead", "alias",
                             "deadlock"),
                 symmetry: bool = True, checksum: bool = False):
        if send not in SENDS:
            raise ValueError(f"send {send!r} not in {SENDS}")
        if tag_modulus < 1:
            raise ValueError(f"tag_modulus must be at least 1, got {tag_modulus}")
        super().__init__(graph, iterations, properties, symmetry)
        self.send, self.modulus, self.checksum = send, tag_modulus, checksum
        self.kinds = (0, 1) if checksum else (0,)
        c = self.cells
        self.pc = [c.add("pc", (r,)) for r in range(self.n)]
        self.k = [c.add("k", (r,), default=1) for r in range(self.n)]
        self.chan, self.recv, self.slot, self.use = {}, {}, {}, {}
        for s, r in self.edges:
            # (version, kind) of the messages in flight from s to r, unmatched, oldest
            # first
            self.chan[s, r] = c.add("channel", (s, r), default=())
            # r's receives from s posted and not yet matched, in posting order
            self.recv[s, r] = c.add("receives", (s, r),
                                    default=tuple((1, kind) for kind in self.kinds))
            # what the last matched receives wrote: (payload version, checksum version)
            self.slot[s, r] = c.add("slot", (s, r), default=(0, 0))
            # the version r's reduce reads from the slot (0: not reading)
            self.use[s, r] = c.add("use", (s, r))

    # ------------------------------------------------------------------ properties

    def violation(self, state) -> Optional[Violation]:
        props = self.properties
        for (s, r), use in self.use.items():
            if "overlap" in props and state[use] and state[self.recv[s, r]]:
                return ("overlap", f"rank {r} reads version {state[use]} from its slot for "
                                   f"rank {s} while a receive into it is posted")
        bad = super().violation(state) or self.gap_violation(state, self.k, 1,
                                                               both_ways=True)
        if bad:
            return bad
        if "ahead" in props:
            bad = self.gap_violation(state, self.k, 1, prop="ahead")
            if bad:
                return bad
        if "alias" in props:
            for (s, r), chan in self.chan.items():
                versions = sorted({v for v, _ in state[chan]})
                tags = [v % self.modulus for v in versions]
                if len(set(tags)) < len(tags):
                    return ("alias", f"versions {versions} from rank {s} to rank {r} are "
                                     f"in flight at once with tags {tags} (modulus "
                                     f"{self.modulus})")
        return None

    def measure(self, state) -> dict:
        """How far a sender runs ahead of a reader, and the most versions in flight on
        one channel."""
        return {"ahead": max(state[self.k[s]] - state[self.k[r]] for s, r in self.edges),
                "in flight": max(len({v for v, _ in state[c]}) for c in self.chan.values())}

    def waiting(self, state, r: int) -> str:
        pc, k = state[self.pc[r]], state[self.k[r]]
        what = f"rank {r} {PHASES[pc]} version {k}"
        if pc == WAIT:
            late = [f"receive from {i}" for i in self.ins[r] if state[self.recv[i, r]]]
            late += [f"send to {j}" for j in self.outs[r] if not self._sent(state, r, j, k)]
            what += " (" + ", ".join(late) + " incomplete)"
        return what

    # ------------------------------------------------------------------ transitions

    def _sent(self, state, r: int, j: int, k: int) -> bool:
        """Whether r's sends of version k to j are complete (a checksum's MPI_Isend is
        eager: complete at once)."""
        return self.send == "eager" or (k, 0) not in state[self.chan[r, j]]

    def successors(self, state) -> List[tuple]:
        out = []
        for r in range(self.n):
            step = self._rank(state, r)
            if step:
                out.append(step)
        for (s, r), chan in self.chan.items():
            out.extend(self._matches(state, s, r, chan))
        return out

    def _matches(self, state, s: int, r: int, chan: int) -> List[tuple]:
        """Every message of the channel that MPI may match now: the oldest of its tag,
        with the oldest posted receive of that tag."""
        out, seen = [], set()
        posted = state[self.recv[s, r]]
        for pos, (v, kind) in enumerate(state[chan]):
            tag = v % self.modulus
            if tag in seen:
                continue            # an older message of this tag goes first
            seen.add(tag)
            for rpos, (want, wkind) in enumerate(posted):
                if want % self.modulus != tag:
                    continue
                x = list(state)
                x[chan] = state[chan][:pos] + state[chan][pos + 1:]
                x[self.recv[s, r]] = posted[:rpos] + posted[rpos + 1:]
                payload, check = state[self.slot[s, r]]
                x[self.slot[s, r]] = (v, check) if wkind == 0 else (payload, v)
                if (v, kind) != (want, wkind):
                    self.flag(x, self.BAD, "version",
                              f"rank {r}'s receive of the {KINDS[wkind]} of version {want} "
                              f"from rank {s} (tag {tag}) matched the {KINDS[kind]} of "
                              f"version {v}")
                out.append((f"MPI matches rank {r}'s receive of the {KINDS[wkind]} of "
                            f"version {want} (tag {tag}) with rank {s}'s {KINDS[kind]} of "
                            f"version {v}", tuple(x), True))
                break
        return out

    def _rank(self, state, r: int) -> Optional[tuple]:
        pc, k = state[self.pc[r]], state[self.k[r]]
        s = list(state)
        if pc == SEND:
            for j in self.outs[r]:
                s[self.chan[r, j]] = (*state[self.chan[r, j]],
                                      *((k, kind) for kind in self.kinds))
            s[self.pc[r]] = WAIT
            how = "MPI_Issend" if self.send == "sync" else "MPI_Isend (eager)"
            extra = " and its checksum (MPI_Isend)" if self.checksum else ""
            return (f"rank {r}: {how} version {k}{extra} (tag {k % self.modulus}) to ranks "
                    f"{_names(self.outs[r])}", tuple(s), True)
        if pc == WAIT:
            if any(state[self.recv[i, r]] for i in self.ins[r]) or not all(
                    self._sent(state, r, j, k) for j in self.outs[r]):
                return None
            # stamp header and footer with k, the reduce loads them: the slot holds
            # what the receives wrote
            want = (k, k if self.checksum else 0)
            wrong = [f"rank {i}: {state[self.slot[i, r]]}" for i in self.ins[r]
                     if state[self.slot[i, r]] != want]
            if wrong:
                self.flag(s, self.BAD, "version", f"rank {r} reduces as version {k} "
                                                  f"(payload, checksum) what it received "
                                                  f"from " + "; ".join(wrong))
            for i in self.ins[r]:
                s[self.use[i, r]] = k
            s[self.pc[r]] = READ
            return (f"rank {r}: wait_updates({k}) complete, reduce version {k} begins",
                    tuple(s), True)
        if pc == READ:
            for i in self.ins[r]:
                s[self.use[i, r]] = 0
            if k == self.iterations:
                s[self.pc[r]] = DONE
                return (f"rank {r}: reduce version {k} ends; done", tuple(s), True)
            for i in self.ins[r]:
                s[self.recv[i, r]] = tuple((k + 1, kind) for kind in self.kinds)
            s[self.pc[r]] = SEND
            s[self.k[r]] = k + 1
            return (f"rank {r}: reduce version {k} ends, post the receives of version "
                    f"{k + 1} (tag {(k + 1) % self.modulus}) from ranks "
                    f"{_names(self.ins[r])}", tuple(s), True)
        return None


def _names(ranks) -> str:
    return ", ".join(str(r) for r in ranks) or "none"
