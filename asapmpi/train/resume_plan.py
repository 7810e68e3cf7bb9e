"""Which checkpoint each rank of a resumed job loads, when the job that wrote them had
other ranks: fewer after a failure (asapmpi-run/asapmpi train --restarts ... shrink),
or as many with some lost.

    plan = plan_resume("runs/mlp/checkpoints/notify_ack", size=7, lost=[2])
    plan.iteration          # the newest iteration every surviving rank saved
    plan.sources            # new rank -> old rank whose replica it takes: (0, 1, 3, ..., 7)

Every replica of decentralized training is a model of its own, close to the others: a
resumed rank may take any old rank's checkpoint at the chosen iteration, its optimizer
state and RNG with it.  The rules, in order:

- the iteration is the newest one that every old rank not in `lost` saved (a failed
  rank's missing or older checkpoints do not hold the others back); ranks that saved
  nothing at all count as lost;
- fewer new ranks than survivors (a shrink): new rank i takes the i-th survivor's
  replica (old 8 ranks, rank 2 lost, 7 new: old 3 becomes 2, ..., old 7 becomes 6); the
  failed ranks' replicas are the ones left out, then the highest-numbered survivors';
- otherwise every new rank keeps its own replica where it has one at the iteration (a
  failed rank's too: the file is whole, see checkpoint.save_tree); the places left take
  first the replicas of old ranks whose numbers no longer exist, then the nearest
  survivor's (on the ring of ranks; the lower on a tie).

A checkpoint is "saved" when it is under its final name and opens (save_tree writes a
temporary file and renames it: a rank killed while writing leaves only the temporary).
`plan()` is the pure rule; `plan_resume()` reads the folders (a resume on another number
of ranks needs every old rank's folder visible to the planning rank: a shared file
system, as a restart on other hosts needs anyway).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Dict, Iterable, List, Mapping, Optional, Tuple

from ..errors import ConfigError
from .checkpoint import CheckpointDir

_RANK_FOLDER = re.compile(r"^rank(\d{5})$")


@dataclass(frozen=True)
class ResumePlan:
    """Where a resumed job's ranks start: `iteration`, and for each new rank the old
    rank whose checkpoint it loads (`sources`); `old_size` ranks wrote them; `lost` are
    the old ranks reported failed or without a whole checkpoint at `iteration`."""

    iteration: int
    sources: Tuple[int, ...]
    old_size: int
    lost: Tuple[int, ...]

    @property
    def regrouped(self) -> bool:
        """True when some rank resumes from a checkpoint that is not its own, or the
        job's size changed: the exchange starts over on a new group (other size, graph
        or members)."""
        return self.old_size != len(self.sources) or \
            any(new != old for new, old in enumerate(self.sources))

    def describe(self) -> str:
        """One line for the log: what the resumed job starts from."""
        moved = [f"{new}<-{old}" for new, old in enumerate(self.sources) if new != old]
        lost = f"; lost ranks {list(self.lost)}" if self.lost else ""
        return (f"{len(self.sources)} ranks resume from iteration {self.iteration} of "
                f"{self.old_size} ranks' checkpoints{lost}"
                + (f"; replicas taken (new rank <- old rank): {', '.join(moved)}"
                   if moved else ""))

    def as_list(self) -> List[int]:
        """A flat form for a collective or an environment variable:
        [iteration, old_size, n_lost, *lost, *sources]."""
        return [self.iteration, self.old_size, len(self.lost), *self.lost, *self.sources]

    @classmethod
    def from_list(cls, values: List[int]) -> "ResumePlan":
        """The plan as_list() gave."""
        iteration, old_size, n_lost = (int(v) for v in values[:3])
        return cls(iteration, tuple(int(v) for v in values[3 + n_lost:]), old_size,
                   tuple(int(v) for v in values[3:3 + n_lost]))


def rank_folders(root: str) -> List[int]:
    """The old ranks that have a folder under `root`, ascending."""
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    return sorted(int(m.group(1)) for m in map(_RANK_FOLDER.match, names) if m)


def saved_iterations(root: str, rank: int, keep: int = 2) -> List[int]:
    """The iterations of `rank`'s checkpoints under `root` that are whole (under their
    final name, and they open), oldest first."""
    ckpts = CheckpointDir(root, rank, keep)
    return [it for it in ckpts.iterations() if ckpts.readable(it)]


def _nearest(rank: int, pool: List[int], ring: int) -> int:
    """The member of `pool` nearest to `rank` on a ring of `ring` ranks (the lower on a
    tie)."""
    return min(pool, key=lambda r: (min((r - rank) % ring, (rank - r) % ring), r))


def plan(saved: Mapping[int, Iterable[int]], size: int, lost: Iterable[int] = (),
         where: str = "") -> Optional[ResumePlan]:
    """The plan for `size` new ranks, from `saved` (old rank -> the iterations of its
    whole checkpoints; every old rank with a folder, an empty one included); None when
    no rank saved anything (start afresh); ConfigError in one line when the ranks not
    in `lost` share no iteration.  `where` names the checkpoints in that line."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ConfigError(f"a resume needs at least one rank, got size={size!r}")
    old_size = max(saved) + 1 if saved else 0
    sets: Dict[int, set] = {r: set(saved.get(r, ())) for r in range(old_size)}
    if not any(sets.values()):
        return None
    failed = {r for r in lost if 0 <= r < old_size}
    # a rank with no checkpoint at all (killed before its first) is as good as lost
    alive = [r for r in range(old_size) if r not in failed and sets[r]]
    there = f" under {where}" if where else ""
    if not alive:
        raise ConfigError(f"no checkpoint{there} to resume from: only the failed ranks "
                          f"{sorted(failed)} saved any; start afresh (drop --resume)")
    common = set.intersection(*(sets[r] for r in alive))
    if not common:
        shown = "; ".join(f"rank {r}: {sorted(sets[r])}" for r in alive)
        raise ConfigError(f"the ranks' checkpoints{there} share no iteration ({shown}); "
                          f"keep more of them (--keep) or start afresh (drop --resume)")
    iteration = max(common)
    usable = [r for r in range(old_size) if iteration in sets[r]]
    if size <= len(alive):
        sources = alive[:size]
    else:
        sources = [r if r in usable else -1 for r in range(size)]
        # old ranks whose numbers the new job has no more: their replicas first
        spare = [r for r in usable if r >= size]
        for new, old in enumerate(sources):
            if old < 0:
                sources[new] = spare.pop(0) if spare else \
                    _nearest(new, alive, max(old_size, size))
    unusable = {r for r in range(old_size) if r not in usable}
    return ResumePlan(iteration, tuple(sources), old_size, tuple(sorted(failed | unusable)))


def plan_resume(root: str, size: int, keep: int = 2,
                lost: Iterable[int] = ()) -> Optional[ResumePlan]:
    """plan() from the rank folders under `root` (the old job's size is the number of
    rank folders: a regrouped resume removes those beyond its own size)."""
    return plan({r: saved_iterations(root, r, keep) for r in rank_folders(root)}, size,
                lost, root)
