"""Oversubscription from the ranks' affinity masks and cgroup quotas, and the waits'
sleeps with their own timer slack (serial)."""
import ctypes
import os

import pytest

from asapmpi._core import kernels
from asapmpi.errors import ConfigError
from asapmpi.launch import cores

PR_GET_TIMERSLACK = 30


def _rank(host, cpus, quota=None):
    return {"host": host, "cpu": {"cpus": cpus, "quota": quota}}


def test_host_cores_are_the_union_of_the_masks_of_that_hosts_ranks():
    meta = [_rank("a", [0]), _rank("a", [1]), _rank("a", [1, 2]), _rank("b", [0])]
    assert cores.host_cores(meta, "a") == 3
    assert cores.host_cores(meta, "b") == 1
    assert not cores.oversubscribed(meta, 0)        # 3 ranks, 3 cores
    assert not cores.oversubscribed(meta, 3)
    meta.append(_rank("a", [0, 1]))
    assert cores.oversubscribed(meta, 0) and cores.oversubscribed(meta, 2)
    assert not cores.oversubscribed(meta, 3)        # host b is not


def test_quotas_cap_the_cores_per_distinct_cgroup_and_only_when_all_have_one():
    every = list(range(64))
    one = {"cgroup": "/job", "cores": 2.0}
    meta = [_rank("a", every, one) for _ in range(4)]
    assert cores.host_cores(meta, "a") == 2.0 and cores.oversubscribed(meta, 0)
    # each rank in a cgroup of its own: their quotas add up
    meta = [_rank("a", every, {"cgroup": f"/task{r}", "cores": 1.0}) for r in range(4)]
    assert cores.host_cores(meta, "a") == 4.0 and not cores.oversubscribed(meta, 0)
    # a rank without a quota may use every core of its mask
    meta = [_rank("a", every, one), _rank("a", every, None), _rank("a", every, one)]
    assert cores.host_cores(meta, "a") == 64


def test_slack_is_precise_with_a_core_per_rank_coarse_when_oversubscribed_or_as_set():
    alone = [_rank("a", [0]), _rank("a", [1])]
    crowded = [_rank("a", [0, 1]) for _ in range(8)]
    assert cores.sleep_slack_ns(alone, 0) == cores.PRECISE_SLACK_NS
    assert cores.sleep_slack_ns(crowded, 0) == cores.DEFAULT_SLACK_NS
    assert cores.sleep_slack_ns(crowded, 0, configured=7000) == 7000


def test_cgroup_quota_is_the_tightest_cpu_max_on_the_way_down(tmp_path):
    membership = tmp_path / "cgroup"
    root = tmp_path / "fs"
    (root / "jobs" / "one").mkdir(parents=True)
    membership.write_text("0::/jobs/one\n")
    assert cores.cgroup_quota(str(root), str(membership)) is None       # no cpu.max
    (root / "cpu.max").write_text("max 100000\n")
    (root / "jobs" / "one" / "cpu.max").write_text("max 100000\n")
    assert cores.cgroup_quota(str(root), str(membership)) is None       # unlimited
    (root / "jobs" / "cpu.max").write_text("150000 100000\n")
    assert cores.cgroup_quota(str(root), str(membership)) == {"cgroup": "/jobs/one",
                                                              "cores": 1.5}
    (root / "jobs" / "one" / "cpu.max").write_text("50000 100000\n")
    assert cores.cgroup_quota(str(root), str(membership))["cores"] == 0.5
    membership.write_text("12:cpu:/legacy\n")                            # cgroup v1 only
    assert cores.cgroup_quota(str(root), str(membership)) is None
    assert cores.cgroup_quota(str(root), str(tmp_path / "missing")) is None


def test_local_cpus_are_this_process_affinity():
    assert cores.local_cpus()["cpus"] == sorted(os.sched_getaffinity(0))


@pytest.mark.skipif(not os.path.exists("/proc/self/timerslack_ns"), reason="Linux only")
def test_a_precise_sleep_leaves_the_callers_timer_slack_as_it_was():
    libc = ctypes.CDLL(None, use_errno=True)
    before = libc.prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0)
    assert before > 0
    kernels.sleep_us(1, 1000)
    kernels.sleep_us(1, 0)
    assert libc.prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0) == before
    with pytest.raises(ConfigError, match="slack_ns >= 0"):
        kernels.sleep_us(1, -1)
