"""The bad-input sweep: every CLI command refuses invalid arguments with one line that
says what to change, exit code 2, no traceback, before any rank starts."""
import os
import subprocess
import sys
import time

import pytest

CASES = [
    # (arguments, what the one line must say)
    (["demo", "-n", "0"], "-n must be at least 1"),
    (["demo", "--size", "0"], "--size must be at least 1"),
    (["demo", "--steps", "-3"], "--steps must be at least 1"),
    (["demo", "--graph", "hypercube"], "invalid choice: 'hypercube'"),
    (["demo", "--sync", "hop", "--max-gap", "0"], "max_gap must be an integer >= 1"),
    (["demo", "--sync", "hop", "--staleness", "-1"], "staleness must be an integer >= 0"),
    (["graph", "nope", "-n", "4"], "unknown graph 'nope'"),
    (["graph", "ring", "-n", "0"], "a graph needs a positive number of ranks"),
    (["graph", "ring", "-n", "4", "--model-size", "-1"], "--model-size"),
    (["bench", "core", "--sizes", "0"], "--sizes"),
    (["bench", "core", "--repeats", "0"], "--repeats"),
    (["bench", "consistency", "--sync", "fast"], "fast"),
    (["bench", "consistency", "--iters", "0"], "--iters"),
    (["bench", "consistency", "--size", "0"], "--size"),
    (["bench", "stragglers", "--iters", "0"], "--iters"),
    (["bench", "stragglers", "--max-gap", "0"], "max_gap must be an integer >= 1"),
    (["bench", "zipline", "--workers", "0"], "--workers"),
    (["bench", "zipline", "--R", "x"], "--R"),
    (["bench", "soak", "--runs", "allreduce"], "allreduce exchanges no slots"),
    (["bench", "soak", "--runs", "hop:backup=-1"], "backup must be an integer"),
    (["bench", "soak", "--steps", "0"], "--steps must be >= 1"),
    (["bench", "soak", "--size", "3"], "--size"),
    (["bench", "soak", "-n", "1"], "-n must be at least 2"),
    (["bench", "soak", "--job-timeout", "inf"], "--job-timeout must be a positive number"),
    (["bench", "soak", "--job-timeout", "nan"], "--job-timeout must be a positive number"),
    (["bench", "soak", "--seconds", "inf"], "--seconds >= 0"),
    (["bench", "reduce", "--job-timeout", "nan"], "must be a finite positive number"),
    (["train", "svm", "--kill-in", "start"], "--kill-in need --kill-rank"),
    (["trace", "check", "/no/such/trace.h5"], "/no/such/trace.h5"),
    (["train", "svm", "--iters", "-1"], "--iters must be an integer >= 1"),
    (["train", "svm", "--batch-size", "0"], "--batch-size must be an integer >= 1"),
    (["train", "svm", "--sync", "ring"], "invalid choice: 'ring'"),
    (["train", "svm", "--graph", "torus"], "invalid choice: 'torus'"),
    (["train", "svm", "--sync", "hop", "--hop", "backup=-1"], "backup must be an integer"),
    (["train", "svm", "--sync", "gossip", "--hop", "every=0"], "every must be an integer"),
    (["train", "svm", "--sync", "elastic", "--hop", "R=0"], "R must be an integer >= 1"),
    (["train", "svm", "--sync", "hop", "--hop", "suppress_late=maybe"],
     "suppress_late must be true or false"),
    (["train", "svm", "--lr", "inf"], "--lr must be a finite number"),
    (["train", "cnn", "--period", "0"], "--period must be an integer >= 1"),
    (["doctor", "--json", "/no/such/dir/r.json"], "/no/such/dir"),
    (["nonsense"], "invalid choice: 'nonsense'"),
]


# marked mpi so that both MPI families run it: a check made inside the ranks instead of
# before they start shows up as the launcher's own abort lines, which Open MPI's
# mpiexec prints and MPICH's does not (bench consistency and stragglers did that)
@pytest.mark.mpi
@pytest.mark.parametrize("args,message", CASES, ids=[" ".join(a) for a, _ in CASES])
def test_bad_cli_input_is_one_line(args, message):
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "asapmpi", *args], capture_output=True,
                          text=True, timeout=120, check=False)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert "PMI" not in proc.stderr and time.monotonic() - start < 60


def test_bench_soak_inside_an_mpi_job_says_run_it_outside():
    # it launches one job per run: started by mpiexec, every rank would launch them all
    env = dict(os.environ, PMI_RANK="0")
    proc = subprocess.run([sys.executable, "-m", "asapmpi", "bench", "soak"],
                          capture_output=True, text=True, timeout=120, check=False, env=env)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "run it outside mpiexec/srun" in proc.stderr, proc.stderr


@pytest.mark.parametrize("text, value", [("no", False), ("OFF", False), ("false", False),
                                         ("0", False), ("yes", True), ("on", True),
                                         ("True", True), ("1", True)])
def test_a_boolean_option_takes_its_words_and_nothing_else(text, value):
    # bool("no") is True: "hop:suppress_late=no" once turned suppression on
    from asapmpi.errors import ConfigError
    from asapmpi.sync.hop import Hop
    from asapmpi.sync.spec import split_spec

    _, options = split_spec(f"hop:suppress_late={text}")
    assert Hop(**options).suppress_late is value
    assert Hop(suppress_late=text).suppress_late is value
    with pytest.raises(ConfigError, match="hop option suppress_late must be true or false"):
        Hop(suppress_late="maybe")
