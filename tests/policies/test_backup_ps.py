"""Synchronous SGD with backup workers (sync="backup_ps"): the server averages exactly
N = workers - b contributions of the current iteration and never a late one."""
import pytest

from asapmpi.errors import ConfigError
from asapmpi.sync import BackupPS

from mpilaunch import PATHS, run


def test_options_and_topology_are_checked():
    with pytest.raises(ConfigError, match="backup must be an integer >= 0"):
        BackupPS(backup=-1)
    with pytest.raises(ConfigError, match="smaller than the number of workers"):
        BackupPS(backup=3).topology(4)
    with pytest.raises(ConfigError, match="outside the communicator"):
        BackupPS(server=5).topology(4)
    with pytest.raises(ConfigError, match="at least one worker"):
        BackupPS().topology(1)
    g = BackupPS(server=2).topology(5)
    assert g.in_neighbours(2) == [0, 1, 3, 4] and g.out_neighbours(4) == [2]


@pytest.mark.mpi
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("backup", [0, 1, 2])
def test_server_applies_only_current_contributions(backup, path):
    results = run("backup_ps_never_applies_late", 5, path, timeout=300, backup=backup)
    server = results[0]
    assert server["iterations"] == 60
    assert server["mismatch"] < 1e-12          # every reduce replays exactly
    if backup and path == "shm":
        # the slow worker was left out of most iterations, yet training went on ...
        assert server["slow_chosen"] < 30
        # ... and, having fallen behind, it skipped ahead to the current parameters
        assert results[-1]["jumps"] > 0
    elif backup:
        # TCP without asynchronous progress: the server's flush of its put to the slow
        # worker completes only when that worker enters MPI, so the slow worker paces
        # the iterations (docs/PROTOCOL.md); its contributions are still dropped
        assert server["slow_chosen"] < 60
    else:
        assert server["slow_chosen"] == 60       # b = 0: everybody, every iteration
        assert all(r["jumps"] == 0 for r in results[1:])


@pytest.mark.mpi
@pytest.mark.parametrize("path", PATHS)
def test_on_messages_the_slow_worker_never_paces_the_server(path):
    # the mailbox of newest versions: the server's theta to the slow worker waits for
    # that worker's channel, never the server itself, on either path
    results = run("backup_ps_never_applies_late", 5, path, timeout=300, backup=1,
                  transport="messages")
    server = results[0]
    assert {r["transport"] for r in results} == {"messages"}
    assert server["iterations"] == 60 and server["mismatch"] < 1e-12
    assert server["slow_chosen"] < 30
    assert results[-1]["jumps"] > 0
