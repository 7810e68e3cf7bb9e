"""The command line: the demo and the core benchmark run end to end under mpiexec, user
mistakes get one line and no traceback."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

CLI = [sys.executable, "-m", "asapmpi"]


def asapmpi(*args, env=None, timeout=300):
    import os

    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run([*CLI, *args], capture_output=True, text=True, check=False,
                          timeout=timeout,
                          env=full_env)


@pytest.mark.mpi
@pytest.mark.parametrize("network", [False, True])
def test_demo_reaches_consensus_with_only_consistent_reads(network):
    args = ["demo", "-n", "4", "--steps", "60", "--size", "1000", "--job-timeout", "240"]
    proc = asapmpi(*args, *(["--network"] if network else []))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "4 ranks, graph ring, sync notify_ack" in out
    assert "reads by all ranks: 240 consistent, 0 torn, 0 stale, 0 ahead" in out
    final = float(out.rsplit("final max |x - global mean| = ", 1)[1].split()[0])
    assert final < 1e-5


@pytest.mark.mpi
def test_core_benchmark_runs_and_its_json_parses(tmp_path):
    out = tmp_path / "core.json"
    proc = asapmpi("bench", "core", "-n", "2", "--sizes", "4K,1M", "--repeats", "1",
                   "--min-time", "0.001", "--json", str(out), "--job-timeout", "240")
    assert proc.returncode == 0, proc.stderr
    assert "put/memcpy" in proc.stdout
    data = json.loads(out.read_text())
    assert data["environment"]["ranks"] == 2
    assert data["environment"]["path"] == "shared-memory"
    assert [s["size_bytes"] for s in data["sizes"]] == [4096, 1 << 20]
    for s in data["sizes"]:
        assert s["seconds"]["step"] > 0 and "kernels" in s
        assert set(s["step_phase_seconds"]) == {"wait_ack", "put", "notify", "wait_notify",
                                                "reduce", "ack"}
    assert set(data["summary"]) == {"put_vs_memcpy", "notify_verify_overhead",
                                    "kernel_vs_numpy"}
    for verdict in data["summary"].values():
        assert verdict in ("PASS", "FAIL", None)


def test_user_mistakes_are_one_line_without_traceback():
    proc = asapmpi("demo", "-n", "0")
    assert proc.returncode == 2
    assert proc.stderr.strip() == "asapmpi: error: -n must be at least 1, got 0"
    proc = asapmpi("bench", "core", "-n", "1", "--sizes", "4K")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr + proc.stdout


def test_graph_list_names_every_graph():
    from asapmpi.reduce import GRAPHS

    proc = asapmpi("graph", "--list")
    assert proc.returncode == 0
    listed = [line.split()[0] for line in proc.stdout.splitlines()]
    assert listed == list(GRAPHS)


def test_graph_report_and_png(tmp_path):
    png = tmp_path / "g.png"
    proc = asapmpi("graph", "root-expander", "-n", "25", "--model-size", "4M", "--png", str(png))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "graph root-expander on 25 ranks, 50 edges" in out
    assert "8.39 MB by the busiest rank (2 x 4.19 MB)" in out
    assert "strongly connected: yes   regular: yes   undirected: no" in out
    assert "asap 1 - sigma2(P) = 0.1419" in out and "hop |l1(W)| - |l2(W)| = 0.1419" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_graph_from_file_and_unusable_weights(tmp_path):
    from asapmpi.reduce import graph, save

    path = save(graph("star", 6), tmp_path / "star.txt")
    proc = asapmpi("graph", "--file", str(path), "--weights", "uniform")
    assert proc.returncode == 0, proc.stderr
    assert "graph star on 6 ranks" in proc.stdout
    assert "not usable for training" in proc.stdout and "metropolis" in proc.stdout


@pytest.mark.parametrize("args, message", [
    (["graph", "nope", "-n", "3"], "asapmpi: error: unknown graph 'nope'"),
    (["graph", "ring"], "asapmpi: error: pass the number of ranks with -n"),
    (["graph", "double-ring", "-n", "5"], "asapmpi: error: double-ring needs an even number"),
])
def test_graph_mistakes_are_one_line(args, message):
    proc = asapmpi(*args)
    assert proc.returncode == 2
    assert proc.stderr.startswith(message) and proc.stderr.count("\n") == 1, proc.stderr


#: every option that names a file or folder to write, after the arguments its command
#: needs to parse; (command, option, "file" or "folder")
OUTPUTS = [
    (("train", "svm", "-n", "2"), "--out", "folder"),
    (("train", "svm", "-n", "2"), "--json", "file"),
    (("train", "svm", "-n", "2"), "--png", "file"),
    (("train", "svm", "-n", "2"), "--h5", "file"),
    (("demo", "-n", "2"), "--trace", "file"),
    (("doctor",), "--json", "file"),
    (("graph", "ring", "-n", "4"), "--png", "file"),
    (("trace", "plot", "t.h5"), "--png", "file"),
    (("check-protocol",), "--json", "file"),
    (("bench", "core", "-n", "2"), "--json", "file"),
    (("bench", "consistency", "-n", "2"), "--json", "file"),
    (("bench", "consistency", "-n", "2"), "--png", "file"),
    (("bench", "consistency", "-n", "2"), "--h5", "file"),
    (("bench", "stragglers", "-n", "2"), "--json", "file"),
    (("bench", "stragglers", "-n", "2"), "--trace-dir", "folder"),
    (("bench", "zipline"), "--json", "file"),
    (("bench", "reduce"), "--json", "file"),
    (("bench", "reduce"), "--png", "file"),
    (("bench", "soak"), "--json", "file"),
    (("bench", "soak"), "--png", "file"),
    (("bench", "training"), "--json", "file"),
    (("bench", "training"), "--h5", "file"),
    (("bench", "training"), "--png", "file"),
    (("bench", "training"), "--keep", "folder"),
    (("bench", "failures"), "--json", "file"),
    (("bench", "failures"), "--keep", "folder"),
]


def _writing_options(parser, command=()):
    """(subcommand path, option string, output type) of every option of `parser` and its
    subcommands that names something to write: --out, --json, --png, --h5, --trace-dir
    or a FILE or DIR metavar."""
    import argparse

    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _writing_options(sub, (*command, name))
            continue
        long = [o for o in action.option_strings if o.startswith("--")]
        if long and (long[0] in ("--out", "--json", "--png", "--h5", "--trace-dir")
                     or action.metavar in ("FILE", "DIR")):
            found.append((command, long[0], action.type))
    return found


def test_every_option_that_writes_is_checked_by_the_one_helper():
    from asapmpi.cli import build_parser
    from asapmpi.outputs import output_file, output_folder

    found = _writing_options(build_parser())
    kinds = {output_file: "file", output_folder: "folder"}
    # each declares output_file or output_folder, and the list below tests each of them
    assert all(kind in kinds for _, _, kind in found), found
    tested = {(cmd[:2] if cmd[0] in ("bench", "trace") else cmd[:1], opt, kind)
              for cmd, opt, kind in OUTPUTS}
    assert {(cmd, opt, kinds[kind]) for cmd, opt, kind in found} == tested


@pytest.mark.parametrize("command, option, kind", OUTPUTS,
                         ids=[f"{' '.join(c[:2])} {o}" for c, o, _ in OUTPUTS])
def test_an_output_that_cannot_be_written_is_one_line_before_any_work(tmp_path, command,
                                                                      option, kind):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    path = blocker / "sub" / ("out" if kind == "folder" else "out.json")
    proc = asapmpi(*command, option, str(path), timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    prog = " ".join(command[:2] if command[0] in ("bench", "trace") else command[:1])
    assert proc.stderr.strip().splitlines() == [
        f"asapmpi {prog}: error: argument {option}: {path}: {blocker} is a file, not a "
        f"folder; choose another path"], proc.stderr
    # nothing ran: no output, nothing written
    assert proc.stdout == "" and [p.name for p in tmp_path.iterdir()] == ["a-file"]


@pytest.mark.parametrize("make, path, kind, message", [
    (None, "missing/s.json", "file", "folder {tmp}/missing does not exist; create it"),
    ("dir", "d", "file", "is a folder; name a file"),
    ("file", "f", "folder", "is a file, not a folder"),
    (None, "", "file", "an empty path; name a file"),
    (None, "", "folder", "an empty path; name a folder"),
])
def test_the_output_check_says_what_is_wrong(tmp_path, make, path, kind, message):
    from asapmpi.outputs import file_problem, folder_problem

    target = tmp_path / path if path else None
    if make == "dir":
        target.mkdir()
    elif make == "file":
        target.write_text("")
    problem = (file_problem if kind == "file" else folder_problem)(
        str(target) if path else "")
    assert problem and message.format(tmp=tmp_path) in problem, problem
    # a folder to write in is created when missing; a file's folder must exist
    assert folder_problem(str(tmp_path / "new" / "deeper")) is None
    assert file_problem(str(tmp_path / "x.json")) is None


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")
def test_an_output_where_nothing_can_be_created_is_refused():
    # /proc takes no new files, whoever asks (root passes permission bits): the check
    # tries to write rather than read the bits
    from asapmpi.outputs import file_problem, folder_problem

    assert "cannot write in folder /proc" in file_problem("/proc/s.json")
    assert "cannot be created: cannot write in folder /proc" in folder_problem("/proc/x/y")


def test_train_s_default_outputs_under_out_are_checked_too(tmp_path):
    (tmp_path / "metrics.h5").mkdir()
    proc = asapmpi("train", "svm", "-n", "2", "--out", str(tmp_path), timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"asapmpi: error: --h5 (default {tmp_path}/metrics.h5): is a folder; name a file "
        f"(in it, say)"], proc.stderr
    assert proc.stdout == ""
    # and the checkpoints' folder, which every run writes (its last checkpoint at least)
    (tmp_path / "metrics.h5").rmdir()
    (tmp_path / "checkpoints").write_text("")
    proc = asapmpi("train", "svm", "-n", "2", "--out", str(tmp_path), timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"asapmpi: error: --out {tmp_path}: the checkpoints' folder {tmp_path}/checkpoints: "
        f"is a file, not a folder; choose another path"], proc.stderr
    assert proc.stdout == "" and sorted(p.name for p in tmp_path.iterdir()) == ["checkpoints"]


@pytest.mark.mpi
def test_consistency_benchmark_outputs(tmp_path):
    import h5py

    js, h5, png = tmp_path / "c.json", tmp_path / "c.h5", tmp_path / "c.png"
    proc = asapmpi("bench", "consistency", "-n", "4", "--graph", "complete", "--size", "64K",
                   "--iters", "60", "--json", str(js), "--h5", str(h5), "--png", str(png),
                   "--job-timeout", "300")
    assert proc.returncode == 0, proc.stderr
    assert "whole (untorn) inputs per reduce" in proc.stdout
    data = json.loads(js.read_text())
    assert set(data["policies"]) == {"bsp", "async", "notify_ack"}
    na = data["policies"]["notify_ack"]
    assert na["reduces"] == 4 * 60 and na["all_consistent_percent"] == 100.0
    assert na["inputs"] == {"consistent": 4 * 60 * 3, "torn": 0, "stale": 0, "ahead": 0}
    for policy in data["policies"].values():
        assert abs(sum(policy["distribution_percent"]) - 100) < 1e-9
    with h5py.File(h5) as f:
        assert f["bsp/status"].shape == (4, 60, 3) and f["async/versions"].shape == (4, 60, 3)
        assert f.attrs["graph"] == "complete"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.mpi
def test_stragglers_benchmark_and_trace_commands(tmp_path):
    from mpilaunch import skip_above_the_core

    skip_above_the_core()
    import h5py

    traces, js = tmp_path / "traces", tmp_path / "s.json"
    proc = asapmpi("bench", "stragglers", "-n", "4", "--iters", "25", "--compute-ms", "1",
                   "--only", "none/standard,random6x/staleness5,det4x/backup1-skip10",
                   "--trace-dir", str(traces), "--json", str(js), "--job-timeout", "300")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(js.read_text())["configurations"]
    assert set(data) == {"none/standard", "random6x/staleness5", "det4x/backup1-skip10"}
    assert all(r["trace_violations"] == 0 for r in data.values())
    assert data["det4x/backup1-skip10"]["jumps"] > 0
    files = sorted(str(p) for p in traces.glob("*.h5"))
    assert len(files) == 3
    check = asapmpi("trace", "check", *files)
    assert check.returncode == 0 and check.stdout.count(": OK:") == 3, check.stdout
    png = tmp_path / "t.png"
    assert asapmpi("trace", "plot", files[0], "--png", str(png)).returncode == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # tamper: rank 0 "enters" every iteration at once, far ahead of everybody
    with h5py.File(files[0], "r+") as f:
        entries = f["rank_0/entries"]           # rows (lo, hi) of iterations first, ...
        entries[...] = entries[0, 1]
    bad = asapmpi("trace", "check", files[0])
    assert bad.returncode == 1 and "VIOLATED" in bad.stdout, bad.stdout


@pytest.mark.mpi
def test_notify_ack_trace_keeps_its_bound(tmp_path):
    from mpilaunch import run

    path = tmp_path / "na.h5"
    run("test_cli:notify_ack_trace", 4, "shm", timeout=120, trace_file=str(path))
    check = asapmpi("trace", "check", str(path))
    assert check.returncode == 0 and "setting notify_ack" in check.stdout, check.stdout


@pytest.mark.mpi
def test_demo_with_hop_skipping_slowdown_and_trace(tmp_path):
    path = tmp_path / "demo.h5"
    proc = asapmpi("demo", "-n", "4", "--graph", "ring-based", "--sync", "hop", "--max-gap",
                   "3", "--backup", "1", "--skip-trigger", "1", "--max-jump", "10",
                   "--slowdown", "deterministic", "--slow-factor", "4", "--compute-ms", "1",
                   "--steps", "40", "--size", "1024", "--trace", str(path),
                   "--job-timeout", "120")
    assert proc.returncode == 0, proc.stderr
    assert "0 torn" in proc.stdout
    check = asapmpi("trace", "check", str(path))
    assert check.returncode == 0, check.stdout


@pytest.mark.mpi
def test_demo_bad_hop_option_is_one_line_from_rank_zero():
    proc = asapmpi("demo", "-n", "3", "--graph", "ring", "--sync", "hop", "--backup", "1",
                   "--job-timeout", "60")
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.startswith("asapmpi")]
    assert lines == ["asapmpi: error: hop backup=1 must be smaller than the smallest "
                     "in-degree of the graph (1): every rank must wait for at least one "
                     "in-neighbour"], proc.stderr


def test_bench_zipline_runs_in_one_process(tmp_path):
    proc = asapmpi("bench", "zipline", "--workers", "5,20", "--R", "4", "--repeats", "2",
                   "--json", str(tmp_path / "z.json"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ZipLine" in proc.stdout and "GridScan" in proc.stdout
    assert (tmp_path / "z.json").stat().st_size > 0


def test_bench_zipline_every_input_family_and_a_bad_one(tmp_path):
    proc = asapmpi("bench", "zipline", "--workers", "5", "--R", "4", "--repeats", "1",
                   "--input", "all", "--json", str(tmp_path / "z.json"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "per input family" in proc.stdout
    for kind in ("cumulative", "uniform", "homogeneous", "sorted", "lockstep", "all-ties",
                 "one-outlier"):
        assert f"input: {kind} (" in proc.stdout
    proc = asapmpi("bench", "zipline", "--input", "uniform,bogus")
    assert proc.returncode == 2
    assert proc.stderr.startswith("asapmpi: error: --input 'bogus' is not an input family")
    assert proc.stderr.count("\n") == 1, proc.stderr


# ---------------------------------------------------------------- scenario bodies (on the ranks)
# tests/mpi/run.py runs each on every rank as "test_cli:NAME"

def notify_ack_trace(comm, trace_file, iters=100):
    """A NOTIFY-ACK run with random slowdown writes a trace that keeps its bound."""
    from asapmpi import Exchange, Slowdown, trace

    from scenarios import settled_barrier  # tests/mpi, on the ranks' path

    slow = Slowdown("random", factor=6, probability=1 / comm.size, seed=2)
    buf = np.zeros(512)
    with Exchange(buf, graph="ring", comm=comm) as ex:
        for k in range(1, iters + 1):
            slow.compute(comm.rank, k, 0.0003)
            ex.step()
        trace.save(trace_file, ex, comm)
        settled_barrier(comm)
    return {}
