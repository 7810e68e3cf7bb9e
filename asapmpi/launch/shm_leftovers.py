"""Shared-memory files that jobs of this user left behind in /dev/shm.

A rank killed while its MPI library holds a named shared-memory segment (MPICH's
mpich_shm_*, Open MPI's vader/sm segments, UCX's, or asapmpi's own file-backed segments
when memfd is not available) leaves the file, and its memory, until someone removes
it.  A file is stale when it belongs to this user, no process maps it or holds it open
(every /proc/PID/maps and /proc/PID/fd this user can read is checked) and it has not been
touched for `min_age` seconds (a job may be between creating and mapping it).
`asapmpi doctor` lists them; `asapmpi doctor --clean` removes them, and so does the
first Exchange of each job on each host (sweep_at_start: a job that ended by an abort,
Ctrl-C included, leaves MPICH's files, and the next job removes them; rc.sweep_shm =
False or ASAPMPI_SWEEP_SHM=0 turns it off).
"""
from __future__ import annotations

import os
import time
from typing import Dict, List, Optional, Set

#: the launchers' variables for a process's rank among the ranks of its host (hydra,
#: Open MPI, Slurm)
LOCAL_RANK_VARIABLES = ("MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID")
_swept = {"done": False}

#: file name prefix -> who creates such files
OWNERS = {
    "asapmpi-": "asapmpi",
    "mpich_shm_": "MPICH",
    "vader_segment.": "Open MPI",
    "sm_segment.": "Open MPI",
    "osc_rdma": "Open MPI",
    "ucx_shm": "UCX",
    "ucx_posix": "UCX",
}
SHM_DIR = "/dev/shm"


def _in_use(directory: str) -> Set[str]:
    """Paths under `directory` that some readable process maps or holds open."""
    used: Set[str] = set()
    prefix = os.path.realpath(directory) + os.sep
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as f:
                for line in f:
                    at = line.find(prefix)
                    if at >= 0:
                        used.add(line[at:].rstrip("\n").removesuffix(" (deleted)"))
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith(prefix):
                    used.add(target)
        except OSError:
            continue            # gone meanwhile, or another user's process
    return used


def stale_files(directory: str = SHM_DIR, min_age: float = 60.0) -> List[Dict]:
    """The stale shared-memory files in `directory`: path, bytes (memory they hold),
    owner (the library that made them) and age in seconds, largest first."""
    if not os.path.isdir(directory):
        return []
    now = time.time()
    uid = os.getuid()
    candidates = []
    for name in os.listdir(directory):
        owner = next((who for p, who in OWNERS.items() if name.startswith(p)), None)
        if owner is None:
            continue
        path = os.path.join(os.path.realpath(directory), name)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            continue
        if st.st_uid != uid or now - st.st_mtime < min_age:
            continue
        candidates.append({"path": path, "bytes": st.st_blocks * 512, "owner": owner,
                           "age_s": round(now - st.st_mtime, 1)})
    if not candidates:
        return []
    used = _in_use(directory)
    found = [c for c in candidates if c["path"] not in used]
    return sorted(found, key=lambda c: -c["bytes"])


def clean(files: List[Dict]) -> List[Dict]:
    """Remove `files` (as stale_files() returns them); the ones removed."""
    removed = []
    for f in files:
        try:
            os.unlink(f["path"])
            removed.append(f)
        except FileNotFoundError:
            pass
    return removed


def summary(files: List[Dict]) -> str:
    """One line: how many stale files of which library, and the memory they hold."""
    if not files:
        return "none"
    by_owner: Dict[str, List[int]] = {}
    for f in files:
        by_owner.setdefault(f["owner"], []).append(f["bytes"])
    parts = [f"{len(v)} of {owner} ({sum(v) / 2**20:.1f} MB)"
             for owner, v in sorted(by_owner.items())]
    total = sum(f["bytes"] for f in files) / 2**20
    return f"{len(files)} file(s), {total:.1f} MB: " + ", ".join(parts)


def local_rank() -> Optional[int]:
    """This process's rank among its host's ranks, as the launcher says (None when it
    says nothing)."""
    for var in LOCAL_RANK_VARIABLES:
        value = os.environ.get(var, "")
        if value.isdigit():
            return int(value)
    return None


def sweep_at_start(world_rank: int, directory: str = SHM_DIR, min_age: float = 60.0) -> List[Dict]:
    """Once per process, on the first rank of each host (the first of the job where the
    launcher does not say): remove the stale files of jobs that ended without cleaning
    up (stale_files: nobody maps them, older than `min_age`).  Costs one directory
    listing when there are none.  The files removed."""
    if _swept["done"]:
        return []
    _swept["done"] = True
    first = local_rank()
    if (first if first is not None else world_rank) != 0:
        return []
    try:
        return clean(stale_files(directory, min_age))
    except OSError:
        return []          # best effort: a sweep never stops an Exchange from starting
