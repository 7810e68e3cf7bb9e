"""Checkpoints in HDF5: one file per rank and iteration, written atomically.

A checkpoint is a tree: dicts of dicts whose leaves are NumPy arrays, numbers, strings,
booleans or None.  Dicts become HDF5 groups, arrays datasets, everything else
attributes (JSON-encoded, so types survive), keys in a group keep their order.

    ckpts = CheckpointDir("runs/svm/checkpoints/notify_ack", rank, keep=2)
    ckpts.save(200, {"model": {...}, "iteration": 200, ...})
    it = ckpts.latest_common(comm, 60)       # newest iteration every rank has, or None
    tree = ckpts.load(it)

A killed job leaves at worst a temporary file behind (the rename is atomic), never a
half-written checkpoint under its final name.  Ranks of an asynchronous job reach an
iteration at different times: each keeps its last `keep` checkpoints, and a resume
starts every rank from the newest iteration all of them saved.
"""
from __future__ import annotations

import json
import os
import re
from typing import Any, Callable, Dict, List, Optional

import h5py
import numpy as np

from ..errors import ConfigError

_NAME = re.compile(r"^iter_(\d{9})\.h5$")
_TMP = re.compile(r"^iter_\d{9}\.h5\.tmp\d+$")
_LEAF = "__value__"      # attribute holding a JSON leaf
_KEYS = "__keys__"       # attribute holding a group's key order


def _write(group: h5py.Group, tree: Dict[str, Any],
           midway: Optional[Callable[[], None]] = None) -> None:
    keys = []
    for index, (raw, value) in enumerate(tree.items()):
        if midway is not None and index == len(tree) // 2:
            midway()
        key = str(raw)
        if "/" in key or key.startswith("__"):
            raise ConfigError(f"checkpoint key {key!r} may not contain '/' or start with '__'")
        keys.append(key)
        if isinstance(value, dict):
            _write(group.create_group(key), value)
        elif isinstance(value, np.ndarray):
            group.create_dataset(key, data=value)
        else:
            try:
                group.create_group(key).attrs[_LEAF] = json.dumps(value)
            except TypeError:
                raise ConfigError(f"checkpoint entry {key!r} of type {type(value).__name__} "
                                  f"is neither an array, a dict nor a JSON value") from None
    group.attrs[_KEYS] = json.dumps(keys)


def _read(group: h5py.Group) -> Any:
    if _LEAF in group.attrs:
        return json.loads(group.attrs[_LEAF])
    out: Dict[str, Any] = {}
    for key in json.loads(group.attrs[_KEYS]):
        item = group[key]
        out[key] = item[()] if isinstance(item, h5py.Dataset) else _read(item)
    return out


def save_tree(path: str, tree: Dict[str, Any],
              midway: Optional[Callable[[], None]] = None) -> None:
    """Write `tree` to the HDF5 file `path` atomically: a temporary file, fsync, rename,
    fsync of the folder.  A process killed at any point leaves either the whole file
    under its name or none (a restart after a failure must never read half a
    checkpoint); the fsyncs make that hold across a crash of the host too.  `midway`
    (fault injection: the trainer's --kill-in checkpoint) is called with the file half
    written and open."""
    tmp = f"{path}.tmp{os.getpid()}"
    with h5py.File(tmp, "w") as f:
        _write(f, tree, midway)
    _fsync(tmp, os.O_RDONLY)
    os.replace(tmp, path)
    _fsync(os.path.dirname(path) or ".", os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))


def _fsync(path: str, flags: int) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    except OSError:
        pass        # a file system without fsync of folders (some network ones)
    finally:
        os.close(fd)


def load_tree(path: str) -> Dict[str, Any]:
    """Read a tree written by save_tree."""
    try:
        with h5py.File(path, "r") as f:
            return _read(f)
    except OSError as exc:
        raise ConfigError(f"cannot read checkpoint {path}: {exc}") from None


def load_entry(path: str, key: str) -> Any:
    """Read only the entry `key` of the top level of a tree written by save_tree (the
    configuration of a checkpoint, say, without its model)."""
    try:
        with h5py.File(path, "r") as f:
            return _read(f[key])
    except (OSError, KeyError) as exc:
        raise ConfigError(f"cannot read {key!r} of checkpoint {path}: {exc}") from None


def common_iteration(root: str, ranks: int, keep: int = 2) -> Optional[int]:
    """Without MPI: the newest iteration every one of `ranks` ranks has a checkpoint of
    under `root`, as CheckpointDir.latest_common would agree on, or None."""
    sets = [set(CheckpointDir(root, r, keep).iterations()) for r in range(ranks)]
    common = set.intersection(*sets) if sets else set()
    return max(common) if common else None


class CheckpointDir:
    """The checkpoints of one rank of one run: `root/rankNNNNN/iter_NNNNNNNNN.h5`."""

    def __init__(self, root: str, rank: int, keep: int = 2):
        if keep < 1:
            raise ConfigError(f"keep at least one checkpoint, got keep={keep}")
        self.root = root
        self.rank = rank
        self.keep = keep
        self.folder = os.path.join(root, f"rank{rank:05d}")

    def path(self, iteration: int) -> str:
        """The file of this rank's checkpoint at `iteration`."""
        return os.path.join(self.folder, f"iter_{iteration:09d}.h5")

    def iterations(self) -> List[int]:
        """Iterations this rank has checkpoints of, oldest first."""
        try:
            names = os.listdir(self.folder)
        except FileNotFoundError:
            return []
        return sorted(int(m.group(1)) for m in map(_NAME.match, names) if m)

    def save(self, iteration: int, tree: Dict[str, Any],
             midway: Optional[Callable[[], None]] = None) -> str:
        """Save `tree` as this rank's checkpoint at `iteration`; drop all but the newest
        `keep`.  Returns the file written.  `midway`: as save_tree's."""
        os.makedirs(self.folder, exist_ok=True)
        path = self.path(iteration)
        save_tree(path, tree, midway)
        for old in self.iterations()[:-self.keep]:
            os.remove(self.path(old))
        return path

    def clear(self) -> int:
        """Delete this rank's checkpoints (and temporary files a killed job left);
        return how many checkpoints there were."""
        try:
            names = os.listdir(self.folder)
        except FileNotFoundError:
            return 0
        found = 0
        for name in names:
            if _NAME.match(name) or _TMP.match(name):
                found += bool(_NAME.match(name))
                os.remove(os.path.join(self.folder, name))
        return found

    def drop_after(self, iteration: int) -> List[int]:
        """Delete this rank's checkpoints newer than `iteration` (a resume from
        `iteration` abandons them: a later restart must not mix them with the resumed
        run's), and the temporary files of writes a killed job left (each the size of
        a checkpoint, and no write of this job will finish them); return the
        checkpoints' iterations."""
        newer = [it for it in self.iterations() if it > iteration]
        for it in newer:
            os.remove(self.path(it))
        try:
            names = os.listdir(self.folder)
        except FileNotFoundError:
            names = []
        for name in filter(_TMP.match, names):
            os.remove(os.path.join(self.folder, name))
        return newer

    def readable(self, iteration: int) -> bool:
        """True when this rank's checkpoint at `iteration` opens and has the key list
        save_tree writes last into its root (a file under its final name is whole unless
        something other than save_tree wrote it, or the disk failed)."""
        try:
            with h5py.File(self.path(iteration), "r") as f:
                return _KEYS in f.attrs
        except OSError:
            return False

    def load(self, iteration: int) -> Dict[str, Any]:
        """This rank's checkpoint at `iteration`."""
        return load_tree(self.path(iteration))

    def latest_common(self, comm, timeout: float) -> Optional[int]:
        """Collective: the newest iteration every rank of `comm` has a checkpoint of, or
        None when some rank has none (or their sets do not meet); NeighbourTimeoutError
        naming the ranks that did not take part within `timeout` seconds."""
        from .. import collectives

        mine = set(self.iterations())
        every = collectives.allgather(comm, sorted(mine), timeout,
                                      "the agreement on a checkpoint to resume from")
        common = set(every[0]).intersection(*map(set, every[1:]))
        return max(common) if common else None
