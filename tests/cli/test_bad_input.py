"""The bad-input sweep: every CLI command refuses invalid arguments with one line that
says what to change, exit code 2, no traceback, before any rank starts; and the API's
mistakes (policy options, buffers, options that differ between ranks, two threads in
one Exchange, a join too many) get one line that names them (issue 49).  Scenarios run
on several ranks live here too ("test_bad_input:NAME")."""
import os
import subprocess
import sys
import time

import numpy as np
import pytest

CASES = [
    # (arguments, what the one line must say)
    (["demo", "-n", "0"], "-n must be at least 1"),
    (["demo", "--size", "0"], "--size must be at least 1"),
    (["demo", "--steps", "-3"], "--steps must be at least 1"),
    (["demo", "--graph", "hypercube"], "invalid choice: 'hypercube'"),
    (["demo", "--sync", "hop", "--max-gap", "0"], "max_gap must be an integer >= 1"),
    (["demo", "--sync", "hop", "--staleness", "-1"], "staleness must be an integer >= 0"),
    (["demo", "--sync", "hop", "--max-gap", "2.5"],
     "hop option max_gap must be an integer >= 1, got '2.5'"),
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
    (["train", "svm", "--kill-rank", "1", "--kill-in", "step"],
     "--kill-in step needs --kill-at K"),
    (["train", "svm", "--kill-rank", "1", "--kill-in", "checkpoint", "--kill-at", "30",
      "--checkpoint-every", "20"], "--kill-in checkpoint needs --checkpoint-every N and "
                                   "--kill-at K, a multiple of N"),
    (["train", "svm", "--iters", "60", "--kill-rank", "1", "--kill-in", "checkpoint",
      "--kill-at", "80", "--checkpoint-every", "20"], "1 <= K <= --iters"),
    (["train", "svm", "--kill-rank", "3", "--kill-in", "recovery", "--kill", "1@20"],
     "--kill-in recovery kills --kill-rank R in its recovery from another rank's death: "
     "add --survive"),
    (["train", "svm", "--survive", "--kill-rank", "1", "--kill-in", "shrink", "--kill",
      "1@20"], "--kill-in shrink kills --kill-rank R in its recovery from another rank's "
               "death: add --survive and --kill RANK@ITER for that death (another rank "
               "than R)"),
    (["train", "svm", "--stop-for", "2"], "--stop-for continues a rank stopped by"),
    (["train", "svm", "--kill", "1"], "give RANK@ITERATION, e.g. 5@120"),
    (["train", "svm", "--kill", "1@5", "--kill-rank", "1"], "drop --kill-rank/--kill-at"),
    (["train", "svm", "--kill", "1@5", "--kill", "1@9"], "each rank at most once"),
    # --survive: what it cannot carry over a failure, named (issue 31)
    (["train", "svm", "--lost-shards", "drop"], "--lost-shards says what the survivors"),
    (["train", "svm", "--survive", "--sync", "allreduce"],
     "--survive cannot carry --sync allreduce"),
    (["train", "svm", "--survive", "--balance"], "--survive cannot carry --balance"),
    (["train", "svm", "--survive", "--outer", "diloco", "--local-steps", "4"],
     "--survive cannot carry --outer diloco"),
    (["train", "svm", "--survive", "--compare", "notify_ack,gossip"],
     "--survive runs one policy per job"),
    (["train", "svm", "--survive", "--restarts", "1", "--checkpoint-every", "5"],
     "--survive goes on without the dead rank, --restarts relaunches"),
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
    (["train", "svm", "--sync", "gossip", "--hop", "wide_mbps=abc"],
     "gossip option wide_mbps must be a finite number >= 0, got 'abc'"),
    (["train", "svm", "--compare", "allreduce:balance=maybe"],
     "train option balance must be true or false"),
    (["train", "svm", "--lr", "inf"], "--lr must be a finite number"),
    (["train", "svm", "--compare", "notify_ack:dtype=int8"],
     "train option dtype must be one of 'float32', 'bfloat16', 'float16', got 'int8'"),
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


# Every policy option goes through one parser (asapmpi.sync.spec): the same one line for
# text ("hop:max_gap=abc") and keywords (max_gap="abc"), naming the policy, the option,
# what it takes and what was given.
OPTION_CASES = [
    # (sync, keyword options, the one line)
    ("hop:max_gap=0", {}, "hop option max_gap must be an integer >= 1, got 0"),
    ("hop:max_gap=2.5", {}, "hop option max_gap must be an integer >= 1, got 2.5"),
    ("hop:max_gap=abc", {}, "hop option max_gap must be an integer >= 1, got 'abc'"),
    ("hop", {"max_gap": "abc"}, "hop option max_gap must be an integer >= 1, got 'abc'"),
    ("hop", {"max_gap": True}, "hop option max_gap must be an integer >= 1, got True"),
    ("hop", {"backup": -1}, "hop option backup must be an integer >= 0, got -1"),
    ("hop:staleness=-1", {}, "hop option staleness must be an integer >= 0 or none, got -1"),
    ("hop:staleness_weights=even", {},
     "hop option staleness_weights must be one of 'hop', 'uniform', got 'even'"),
    ("hop:suppress_late=maybe", {}, "hop option suppress_late must be true or false "
                                    "(true/yes/on/1 or false/no/off/0), got 'maybe'"),
    ("hop", {"suppress_late": 2}, "hop option suppress_late must be true or false"),
    ("gossip:threshold=-1", {},
     "gossip option threshold must be a finite number in (0, 1), got -1"),
    ("gossip", {"threshold": 1.0},
     "gossip option threshold must be a finite number in (0, 1), got 1.0"),
    # not a number: a ValueError of float() before
    ("gossip:wide_mbps=abc", {},
     "gossip option wide_mbps must be a finite number >= 0, got 'abc'"),
    # negative: named a "link option", not gossip's
    ("gossip:narrow_mbps=-1", {},
     "gossip option narrow_mbps must be a finite number >= 0, got -1"),
    # nan: accepted before (nan < 0 is False)
    ("gossip:latency_ms=nan", {},
     "gossip option latency_ms must be a finite number >= 0, got nan"),
    # a ValueError of int('/') before
    ("gossip:narrow=1/x", {}, "gossip option narrow must be a list of integers (as text "
                              "1/3), each >= 0, got '1/x'"),
    ("gossip:every=0", {}, "gossip option every must be an integer >= 1, got 0"),
    ("backup_ps:seed=x", {}, "backup_ps option seed must be an integer >= 0, got 'x'"),
    ("elastic:R=0", {}, "elastic option R must be an integer >= 1, got 0"),
    ("elastic:window=1.5", {}, "elastic option window must be an integer >= 1, got 1.5"),
    ("elastic:algorithm=fastest", {}, "elastic option algorithm must be one of 'zipline', "
                                      "'gridscan', 'full_gridscan', got 'fastest'"),
    ("notify_ack:max_gap=2", {},
     "notify_ack has no option(s) named ['max_gap']; it takes none"),
    ("hop", {"max_gapp": 2}, "hop has no option(s) named ['max_gapp']; its options: "
                             "max_gap, backup, staleness"),
]


@pytest.mark.parametrize("sync, keywords, message", OPTION_CASES,
                         ids=[f"{s}{k or ''}" for s, k, _ in OPTION_CASES])
def test_a_bad_policy_option_is_one_line_naming_it(sync, keywords, message):
    from asapmpi.errors import ConfigError
    from asapmpi.sync import policy

    with pytest.raises(ConfigError) as err:
        policy(sync, **keywords)
    assert message in str(err.value) and "\n" not in str(err.value), str(err.value)


@pytest.mark.parametrize("sync, keywords, message", [
    ("gossip:latency_ms=nan", {}, "gossip option latency_ms must be a finite number"),
    ("hop", {"max_gap": 2.5}, "hop option max_gap must be an integer >= 1, got 2.5"),
])
def test_the_exchange_refuses_a_bad_option_before_its_window(sync, keywords, message):
    from mpi4py import MPI

    import asapmpi
    from asapmpi.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        asapmpi.Exchange(np.zeros(8), sync=sync, comm=MPI.COMM_SELF, **keywords)
    assert message in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_options_are_compared_by_value_once_typed():
    from asapmpi.sync import policy

    # text and keyword name the same value: no "differs; give it once"
    assert policy("hop:suppress_late=no", suppress_late=False).suppress_late is False
    assert policy("gossip:threshold=0.5", threshold=0.5).threshold == 0.5
    # what every rank compares: a default and the same value given agree
    assert policy("gossip").options() == policy("gossip:narrow=", narrow=()).options()
    assert policy("hop:staleness=none").options() == policy("hop").options()


# ------------------------------------------------------------------ across ranks

def test_options_that_differ_between_ranks_are_named_alone():
    # the line named every option of every rank (680 characters for hop on 4 ranks)
    from asapmpi.errors import ConfigError
    from asapmpi.exchange.agreement import same_options
    from asapmpi.sync import policy

    meta = [{"sync": "gossip", "options": policy("gossip", every=1 + r % 2,
                                                 seed=int(r > 2)).options()}
            for r in range(8)]
    with pytest.raises(ConfigError) as err:
        same_options(meta)
    assert str(err.value) == (
        "every rank must pass the same policy options for sync='gossip'; every = 1 "
        "(ranks 0, 2, 4, 6), 2 (ranks 1, 3, 5, 7); seed = 0 (ranks 0-2), 1 (ranks 3-7)")


def test_every_rank_names_the_option_that_differs():
    from mpilaunch import run

    for res in run("test_bad_input:options_differ", 4, "shm", timeout=60):
        assert res["error"] == ("every rank must pass the same policy options for "
                                "sync='hop'; max_gap = 1 (ranks 0, 2-3), 2 (rank 1)"), res


def options_differ(comm):
    """Rank 1 gives hop another max_gap (as text; the others as a keyword)."""
    import asapmpi
    from asapmpi.errors import ConfigError

    sync, options = ("hop:max_gap=2", {}) if comm.rank == 1 else ("hop", {"max_gap": 1})
    try:
        asapmpi.Exchange(np.zeros(8), graph="ring", sync=sync, comm=comm, timeout=20,
                         **options)
    except ConfigError as exc:
        return {"error": str(exc)}
    return {"error": ""}


# ------------------------------------------------------------------ buffers

@pytest.mark.parametrize("dtype, requires_grad", [("float32", True), ("float32", False),
                                                  ("bfloat16", True)])
def test_a_tensor_is_refused_with_a_hint_that_works(dtype, requires_grad):
    # the hint was tensor.numpy(), which refuses a tensor that requires grad
    import re

    from mpi4py import MPI

    import asapmpi
    from asapmpi.errors import ConfigError

    torch = pytest.importorskip("torch")
    tensor = torch.zeros(8, dtype=getattr(torch, dtype), requires_grad=requires_grad)
    with pytest.raises(ConfigError) as err:
        asapmpi.Exchange(tensor, comm=MPI.COMM_SELF)
    hint = re.search(r"; pass (.+) \(the same memory\)$", str(err.value))
    assert hint, str(err.value)
    expr, _, kind = hint.group(1).partition(" with dtype=")
    assert expr.startswith("tensor.detach()" if requires_grad else "tensor."), expr
    array = eval(expr, {"tensor": tensor, "torch": torch})      # the hint, as written
    options = {"dtype": kind.strip("'")} if kind else {}
    with asapmpi.Exchange(array, comm=MPI.COMM_SELF, **options) as ex:
        array[...] = 1                    # 1.0 in float32; in bfloat16's bits, tiny
        ex.step()
    assert bool((tensor != 0).all())      # the tensor's own memory was exchanged


@pytest.mark.parametrize("dtype, code", [("complex64", "Zf"), ("complex128", "Zd"),
                                         ("int32", "i"), ("bool", "?")])
def test_a_buffer_of_another_dtype_is_named_by_numpy(dtype, code):
    from mpi4py import MPI

    import asapmpi
    from asapmpi.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        asapmpi.Exchange(np.zeros(8, dtype=dtype), comm=MPI.COMM_SELF)
    assert str(err.value).endswith(f"got {dtype}") and repr(code) not in str(err.value)
    with pytest.raises(ConfigError, match=f"2-byte integer buffer .*, got {dtype}$"):
        asapmpi.Exchange(np.zeros(8, dtype=dtype), comm=MPI.COMM_SELF, dtype="bfloat16")


def test_the_reduce_kernel_names_dtypes_by_numpy_too():
    from asapmpi._core.kernels import weighted_sum
    from asapmpi.errors import ConfigError

    z = np.zeros(4, dtype=np.complex64)
    with pytest.raises(ConfigError, match=r"float16 buffers, got complex64$"):
        weighted_sum(z, z, 0.5, [z], [0.5])
    f = np.zeros(4, dtype=np.float32)
    with pytest.raises(ConfigError, match=r"2-byte integers \(their bit patterns\), got "
                                          r"float32$"):
        weighted_sum(f, f, 0.5, [f], [0.5], bfloat16=True)


# ------------------------------------------------------------------ use

def test_a_second_thread_stepping_the_exchange_is_told_so(tmp_path):
    # it was caught only as torn versions: "a peer broke the protocol", then a timeout
    # on the peer that suggested join()
    from mpilaunch import run

    rank0, rank1 = run("test_bad_input:two_threads", 2, "shm", timeout=60,
                       flags=str(tmp_path))
    assert rank0["refused"] == (
        "Exchange.step() called from thread 'MainThread' while another thread is inside "
        "the same Exchange (its step, send, receive or join): an Exchange belongs to one "
        "thread; call it from one thread at a time (or give each thread its own "
        "Exchange)"), rank0
    assert rank0["versions"] == rank1["versions"] == [20], (rank0, rank1)


def two_threads(comm, flags, steps=20):
    """Rank 0 steps in a thread, which waits inside its first step for rank 1; meanwhile
    rank 0's main thread calls step() too.  Ordered by the Exchange's own state and a
    flag file, not by sleeps: rank 0's main thread calls in once the thread is inside the
    Exchange (Exchange._inside says so), and rank 1 starts stepping only after that call
    (it waits for rank 0's flag outside MPI, so the thread cannot leave its step)."""
    import threading
    import time

    import asapmpi
    from asapmpi.errors import ConfigError

    from scenarios import raise_flag, wait_for_flags

    buf = np.full(64, float(comm.rank))
    refused, failed = "", []
    with asapmpi.Exchange(buf, graph="complete", comm=comm, timeout=60) as ex:
        def loop():
            try:
                for _ in range(steps):
                    ex.step()
            except Exception as exc:    # noqa: BLE001  (reported to the test)
                failed.append(repr(exc))

        if comm.rank == 0:
            inside = threading.Thread(target=loop)
            inside.start()
            deadline = time.monotonic() + 60
            while ex._inside is None:           # the thread is not inside yet
                assert time.monotonic() < deadline, "the thread never entered step()"
                time.sleep(0.01)
            try:
                ex.step()
            except ConfigError as exc:
                refused = str(exc)
            raise_flag(flags, "called")
            inside.join()
        else:
            assert wait_for_flags(flags, ["called"], 60), "rank 0 never called step()"
            loop()
        assert not failed, failed
        return {"refused": refused, "versions": [ex.version]}


def test_a_rank_that_joins_once_more_than_its_neighbour_is_told_so():
    # its timeout said the neighbour "entered free() after 4 steps without join()", and
    # that every rank must end its loop in join(): the neighbour had
    from mpilaunch import run

    rank0, rank1 = run("test_bad_input:join_twice", 2, "shm", timeout=60)
    assert rank0["finals"] == [4] and rank1["finals"] == [4], (rank0, rank1)
    assert rank0["error"].endswith(
        "rank(s) [1] entered free() where the last join() ended (step 4) while this rank "
        "joined again (step 4): join() was called once more here than there; call it "
        "the same number of times on every rank, once per epoch"), rank0
    assert "without join()" not in rank0["error"] and not rank1["error"], (rank0, rank1)


def join_twice(comm, steps=3):
    """Both ranks step and join; rank 0 then calls join() again (rank 1 frees)."""
    import asapmpi
    from asapmpi.errors import NeighbourTimeoutError

    buf = np.full(64, float(comm.rank))
    finals, error = [], ""
    with asapmpi.Exchange(buf, graph="complete", comm=comm, timeout=2) as ex:
        for _ in range(steps):
            ex.step()
        finals.append(ex.join())
        if comm.rank == 0:
            try:
                finals.append(ex.join())
            except NeighbourTimeoutError as exc:
                error = str(exc)
    return {"finals": finals, "error": error}


def test_the_exchange_own_switches_are_booleans_too():
    # bool("no") is True: checksum="no" and reject_nonfinite="no" turned them on
    from mpi4py import MPI

    import asapmpi
    from asapmpi.errors import ConfigError

    with asapmpi.Exchange(np.zeros(8), comm=MPI.COMM_SELF, reject_nonfinite="no",
                          checksum="off") as ex:
        assert ex.reject_nonfinite is False
    with pytest.raises(ConfigError, match=r"^Exchange option checksum must be true or false "
                                          r"\(true/yes/on/1 or false/no/off/0\), got "
                                          r"'maybe'$"):
        asapmpi.Exchange(np.zeros(8), comm=MPI.COMM_SELF, checksum="maybe")


BAD_SCRIPT = """
import numpy as np
import asapmpi
asapmpi.Exchange(np.zeros(8), graph="hypercube")
"""


@pytest.mark.mpi
def test_a_user_script_given_bad_input_gets_one_line_per_rank_not_a_traceback():
    # the abort hook is installed before the Exchange checks anything (issue 49): an
    # uncaught ConfigError on every rank was a traceback on every rank
    from mpilaunch import job_command

    cmd, env = job_command(2, [sys.executable, "-c", BAD_SCRIPT], timeout=120)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=150,
                          check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Traceback" not in out, out[-3000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("asapmpi: rank ")]
    assert lines and all("ConfigError" in ln and "hypercube" in ln for ln in lines), out
