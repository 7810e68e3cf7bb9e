"""A host's CPU budget entered only while a measurement runs (emulated hosts).

launch/netns-hosts gives each emulated host a cgroup with a CPU quota.  With
NETNS_HOSTS_BUDGET=deferred (asapmpi bench training sets it), a rank starts in its set's
unlimited cgroup (PREFIX-free) and moves itself into its share of its host's
(netns-hosts/HOSTNAME, the host's name being its cgroup's; HOSTNAME-rK with the host's
quota over its ranks, after split()) while its training clock runs, out again for the
pauses the clock leaves out (evaluations, checkpoints) and at the end.  A host with a
quarter of the CPU then computes slower, but does not also take minutes to import torch,
generate its data and shut down, and its evaluations do not hold the other hosts up
for seconds that no real host would spend.

    budget = ClockBudget.from_environment()    # None unless the budget is deferred
    budget.split(index_on_host, ranks_on_host)
    budget.enter()
    with budget.paused(): evaluate()
    budget.leave()
"""
from __future__ import annotations

import contextlib
import os
import socket
from typing import Iterator, Optional

from ..errors import AsapError

# where netns-hosts puts the hosts' cgroups: cgroup v1's cpu hierarchy, then v2's
ROOTS = ("/sys/fs/cgroup/cpu/netns-hosts", "/sys/fs/cgroup/netns-hosts")
ENV = "NETNS_HOSTS_BUDGET"


class ClockBudget:
    """Moves this process between its host's cgroup (`inside`) and the unlimited one
    (`outside`); every thread moves with it (cgroup.procs)."""

    def __init__(self, inside: str, outside: str):
        self.inside, self.outside = inside, outside
        self.entered = False

    @classmethod
    def from_environment(cls, root: Optional[str] = None) -> Optional["ClockBudget"]:
        """The budget of this host when NETNS_HOSTS_BUDGET=deferred, else None.
        AsapError in one line when the host's cgroup cannot be found."""
        mode = os.environ.get(ENV, "")
        if not mode:
            return None
        if mode != "deferred":
            raise AsapError(f"{ENV}={mode}: leave it unset, or set it to 'deferred'")
        host = socket.gethostname()
        prefix, sep, index = host.rpartition("-h")
        if not (sep and index.isdigit()):
            raise AsapError(f"{ENV}=deferred, but this host's name {host!r} is not an "
                            f"emulated host's (PREFIX-hI): start the job through "
                            f"launch/netns-hosts mpiexec, or unset {ENV}")
        for base in ([root] if root else ROOTS):
            if os.path.isdir(os.path.join(base, host)):
                return cls(os.path.join(base, host), os.path.join(base, f"{prefix}-free"))
        raise AsapError(f"{ENV}=deferred, but host {host} has no cgroup under "
                        f"{' or '.join([root] if root else ROOTS)}: give the hosts budgets "
                        f"first (launch/netns-hosts cpu), or unset {ENV}")

    def split(self, index: int, count: int) -> None:
        """Hold this process to its 1/`count` share of the host's budget instead of the
        whole of it shared: a cgroup of its own beside the host's (HOST-rINDEX, removed by
        netns-hosts down), with the host's period and 1/count of its quota.

        Two processes sharing one small quota burned 25-30x the CPU per step on a 2-vCPU
        VM (docs/BENCHMARKS.md), one process per quota did not; and MPI launchers bind
        one rank per core on real hosts, so a waiting rank's share is not its
        host-mate's there either."""
        if count <= 1:
            return
        period, quota = _read_quota(self.inside)
        mine = f"{self.inside}-r{index}"
        try:
            os.makedirs(mine, exist_ok=True)
            _write_quota(mine, period, None if quota is None else max(1000, quota // count))
        except OSError as e:
            raise AsapError(f"could not make the cgroup {mine} for this rank's share of "
                            f"its host's CPU budget: {e.strerror or e}") from None
        self.inside = mine

    def _move(self, cgroup: str) -> None:
        try:
            with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
        except OSError as e:
            raise AsapError(f"could not move rank process {os.getpid()} into the cgroup "
                            f"{cgroup}: {e.strerror or e}") from None

    def enter(self) -> None:
        """Run inside the host's budget from now on."""
        self._move(self.inside)
        self.entered = True

    def leave(self) -> None:
        """Run unlimited from now on (a pause, or the end of the measurement)."""
        if self.entered:
            self._move(self.outside)
            self.entered = False

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Unlimited for the block, back inside afterwards if it was inside before."""
        was = self.entered
        self.leave()
        try:
            yield
        finally:
            if was:
                self.enter()


def _read_quota(cgroup: str):
    """(period us, quota us or None) of a cgroup, v1 or v2."""
    v1 = os.path.join(cgroup, "cpu.cfs_quota_us")
    if os.path.exists(v1):
        with open(v1) as f:
            quota = int(f.read())
        with open(os.path.join(cgroup, "cpu.cfs_period_us")) as f:
            period = int(f.read())
        return period, (None if quota < 0 else quota)
    with open(os.path.join(cgroup, "cpu.max")) as f:
        quota_text, period_text = f.read().split()
    return int(period_text), (None if quota_text == "max" else int(quota_text))


def _write_quota(cgroup: str, period: int, quota: Optional[int]) -> None:
    if os.path.exists(os.path.join(cgroup, "cpu.cfs_quota_us")):
        # the quota first: lifting it before changing the period is always allowed
        for name, value in (("cpu.cfs_quota_us", -1), ("cpu.cfs_period_us", period),
                            ("cpu.cfs_quota_us", -1 if quota is None else quota)):
            with open(os.path.join(cgroup, name), "w") as f:
                f.write(str(value))
        return
    with open(os.path.join(cgroup, "cpu.max"), "w") as f:
        f.write(f"{'max' if quota is None else quota} {period}")
