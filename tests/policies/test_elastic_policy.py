"""sync="elastic": ElasticBSP on a parameter server, barriers chosen by ZipLine."""
import pytest

from asapmpi.errors import ConfigError
from asapmpi.sync import ElasticBSP

from mpilaunch import PATHS, run


def test_options_are_checked():
    with pytest.raises(ConfigError, match="R must be an integer >= 1"):
        ElasticBSP(R=0)
    with pytest.raises(ConfigError, match="algorithm must be one of"):
        ElasticBSP(algorithm="fastest")
    with pytest.raises(ConfigError, match="at least one worker"):
        ElasticBSP().topology(1)


@pytest.mark.mpi
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("transport", ["auto", "messages"])
def test_fast_workers_run_more_local_iterations_and_every_superstep_replays(path,
                                                                            transport):
    results = run("elastic_assigns_by_speed", 4, path, timeout=300, transport=transport)
    if transport != "auto":
        assert {r["transport"] for r in results} == {transport}
    server = results[0]
    assert server["mismatch"] < 1e-12
    # all ranks leave after the same superstep, at the same global iteration
    assert len({r["version"] for r in results}) == 1 and results[0]["version"] >= 40
    assert len({r["supersteps"] for r in results}) == 1
    assert all(r["monotonic"] for r in results)
    slow, fast = server["mean_counts"][0], server["mean_counts"][1:]
    # rank 1 is 4x slower: the others are given more iterations per superstep
    assert min(fast) > 1.5 * slow, server["mean_counts"]
