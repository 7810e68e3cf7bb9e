"""asapmpi-run (hydra and Open MPI flags, a real 2-rank job), the job-size check,
asapmpi doctor on both paths, the Slurm template, reject_nonfinite."""
import json
import os
import stat
import subprocess
import sys

import numpy as np
import pytest

import asapmpi
from asapmpi.errors import ConfigError, NeighbourTimeoutError
from asapmpi.launchers import command, flavour, network_forced

from mpilaunch import STACK, run

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUN = [sys.executable, os.path.join(ROOT, "launch", "asapmpi-run")]


def _fake_mpiexec(folder, banner):
    folder.mkdir(exist_ok=True)
    path = folder / "mpiexec"
    path.write_text(f"#!/bin/sh\necho '{banner}'\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_flavours_and_their_flags(tmp_path):
    hydra = _fake_mpiexec(tmp_path, "HYDRA build details:")
    assert flavour(hydra) == "mpich"
    cmd, env = command("mpich", hydra, 8, ["python", "x.py"], hosts="h.txt",
                       job_timeout=90, network="tcp", keep_going=True)
    assert cmd == [hydra, "-n", "8", "-f", "h.txt", "-disable-auto-cleanup", "python", "x.py"]
    assert env["MPIEXEC_TIMEOUT"] == "90" and env["MPIR_CVAR_NOLOCAL"] == "1"
    assert env["ASAPMPI_EXPECTED_SIZE"] == "8" and network_forced(env)
    ompi = _fake_mpiexec(tmp_path / "ompi", "mpiexec (Open MPI) 5.0.3")
    assert flavour(ompi) == "openmpi"
    cmd, env = command("openmpi", ompi, 8, ["python", "x.py"], job_timeout=90)
    assert cmd[:3] == [ompi, "-n", "8"] and "--oversubscribe" in cmd
    assert cmd[cmd.index("--timeout") + 1] == "90" and "mpi_yield_when_idle" in cmd
    assert "MPIEXEC_TIMEOUT" not in env and not network_forced(env)
    cmd, env = command("openmpi", ompi, 2, ["x"], network="tcp", keep_going=True)
    assert env["OMPI_MCA_btl"] == "tcp,self"
    assert env["OMPI_MCA_orte_abort_on_non_zero_status"] == "0"
    assert network_forced(env)
    _, env = command("openmpi", ompi, 2, ["x"], network="ucx")
    assert env["OMPI_MCA_osc"] == "ucx" and env["UCX_TLS"] == "tcp,self"
    assert network_forced(env)
    with pytest.raises(ConfigError, match="mpich has no forced network path 'ucx'"):
        command("mpich", hydra, 2, ["x"], network="ucx")
    with pytest.raises(ConfigError, match="neither MPICH's hydra nor Open MPI"):
        flavour(_fake_mpiexec(tmp_path / "other", "something else"))


@pytest.mark.mpi
def test_asapmpi_run_starts_a_job_that_sees_its_size_and_slowdown(tmp_path):
    # each rank writes its own file: hydra may interleave the ranks' stdout mid-line
    # (a fresh-clone run once read "33" out of two ranks' "3 3 4.0" lines)
    code = ("from mpi4py import MPI; import os, asapmpi.launch.slowdown as s; "
            "c = MPI.COMM_WORLD; "
            f"open(os.path.join({str(tmp_path)!r}, str(c.Get_rank())), 'w').write("
            "f\"{c.Get_size()} {os.environ['ASAPMPI_EXPECTED_SIZE']} "
            "{s.from_environment(3).factor_for(1, 7)}\")")
    proc = subprocess.run([*RUN, "-n", "3", "--job-timeout", "60", "--slowdown",
                           "deterministic", "--slow-factor", "4", "--slow-ranks", "1", "--",
                           sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["0", "1", "2"]
    assert all(p.read_text() == "3 3 4.0" for p in tmp_path.iterdir())
    # the command it ran, on stderr
    assert ("MPIEXEC_TIMEOUT=60" if STACK == "mpich" else "--timeout 60") in proc.stderr


def test_asapmpi_run_refuses_bad_input_in_one_line(tmp_path):
    for args, message in ((["-n", "0", "--", "x"], "-n must be at least 1"),
                          (["-n", "2"], "no program to run"),
                          (["-n", "2", "--hosts", str(tmp_path / "none"), "--", "x"],
                           "no such file"),
                          (["-n", "2", "--slowdown", "random", "--slow-factor", "0.5", "--",
                            "x"], "slowdown factor must be >= 1"),
                          (["-n", "2", "--job-timeout", "nan", "--", "x"],
                           "--job-timeout must be a number of seconds"),
                          (["-n", "2", "--mpi-args", '"', "--", "x"], "--mpi-args"),
                          (["-n", "x"], "invalid int value: 'x'"),
                          (["-n", "2", "--slowdown", "deterministic", "--slow-ranks", "5",
                            "--", "x"], "are outside 0..1")):
        proc = subprocess.run([*RUN, *args], capture_output=True, text=True, timeout=60,
                              check=False)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and message in lines[0], proc.stderr


def _recording_mpiexec(folder):
    """A fake hydra that answers --version and writes every call of it to `folder`/calls:
    whether asapmpi-run started a job shows there, and no real hydra ever reads a bad
    hosts file (it would crash, or spin until killed)."""
    folder.mkdir(exist_ok=True)
    path = folder / "mpiexec"
    path.write_text(f"#!/bin/sh\necho \"$*\" >> {folder / 'calls'}\n"
                    "echo 'HYDRA build details:'\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


@pytest.mark.parametrize("text, line, message", [
    ("localhost:-2\n", 1, "'localhost:-2': -2 slots; a host needs at least 1"),
    ("# two hosts\n\nhost:abc\n", 3, "'host:abc': the slot count 'abc' is not a whole "
                                       "number"),
    ("localhost:0\n", 1, "'localhost:0': 0 slots; a host needs at least 1"),
    ("node1:2\n:2\n", 2, "':2' has no host name"),
    ("localhost:\n", 1, "'localhost:' has no slot count after ':'"),
    ("localhost:2:3\n", 1, "'localhost:2:3' has more than one ':'"),
    ("localhost:2  # the workstation\n", 1, "'#' after the host: hydra takes only "
                                            "binding=VALUE or user=VALUE there"),
    ("localhost:2 slots=4\n", 1, "'slots=4' after the host"),
    ("# nothing but comments\n\n", None, "names no host"),
])
def test_asapmpi_run_refuses_a_hosts_file_hydra_would_misread(tmp_path, text, line, message):
    # hydra (MPICH 5.0.2) reads slot counts with atoi: localhost:-2 spins at 100% CPU
    # deaf to SIGTERM, host:abc and localhost:0 end in SIGFPE, without a word
    hosts = tmp_path / "hosts.txt"
    hosts.write_text(text)
    mpiexec = _recording_mpiexec(tmp_path / "bin")
    proc = subprocess.run([*RUN, "-n", "2", "--mpiexec", mpiexec, "--hosts", str(hosts),
                           "--", "x"], capture_output=True, text=True, timeout=60,
                          check=False)
    lines = proc.stderr.strip().splitlines()
    where = f"--hosts {hosts}" + (f", line {line}: " if line else " ")
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"asapmpi-run: error: {where}") and message in lines[0], \
        proc.stderr
    if line:    # and what to write instead
        assert "write HOST or HOST:SLOTS" in lines[0] or "hydra takes only" in lines[0]
    # no job was started: the launcher was only asked its version
    assert (tmp_path / "bin" / "calls").read_text().split("\n")[:-1] == ["--version"]


@pytest.mark.parametrize("mpi_args, env, message", [
    ("-hosts localhost:0", {}, "--mpi-args -hosts localhost:0: 'localhost:0': 0 slots"),
    ("-hosts node1:2,node2:x", {}, "'node2:x': the slot count 'x' is not a whole number"),
    ("--hostlist=:4", {}, "--mpi-args --hostlist :4: ':4' has no host name"),
    ("-f {bad}", {}, "--mpi-args -f {bad}, line 1: 'localhost:-2': -2 slots"),
    ("-machinefile {tmp}/none", {}, "--mpi-args -machinefile {tmp}/none: no such file"),
    ("", {"HYDRA_HOST_FILE": "{bad}"}, "HYDRA_HOST_FILE={bad}, line 1: 'localhost:-2'"),
])
def test_asapmpi_run_checks_hosts_given_to_hydra_any_other_way(tmp_path, mpi_args, env,
                                                               message):
    bad = tmp_path / "bad.txt"
    bad.write_text("localhost:-2\n")
    mpiexec = _recording_mpiexec(tmp_path / "bin")
    fill = {"bad": bad, "tmp": tmp_path}
    proc = subprocess.run([*RUN, "-n", "2", "--mpiexec", mpiexec,
                           f"--mpi-args={mpi_args.format(**fill)}", "--", "x"],
                          capture_output=True, text=True, timeout=60, check=False,
                          env={**os.environ, **{k: v.format(**fill) for k, v in env.items()}})
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert message.format(**fill) in lines[0], proc.stderr
    assert (tmp_path / "bin" / "calls").read_text().split("\n")[:-1] == ["--version"]


def test_asapmpi_run_passes_a_good_hosts_file_on(tmp_path):
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("# the cluster\n\n  node1:2 user=me\nnode2\nnode3:+4 binding=rr\n")
    mpiexec = _recording_mpiexec(tmp_path / "bin")
    proc = subprocess.run([*RUN, "-n", "2", "--mpiexec", mpiexec, "--hosts", str(hosts),
                           "--", "x"], capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "bin" / "calls").read_text().split("\n")[:-1] == [
        "--version", f"-n 2 -f {hosts} x"]


def test_a_singleton_from_a_foreign_launcher_says_so():
    code = ("import numpy as np, asapmpi\n"
            "try:\n asapmpi.Exchange(np.zeros(4))\n"
            "except asapmpi.ConfigError as e: print(e)\n")
    env = dict(os.environ, ASAPMPI_EXPECTED_SIZE="4")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=60, check=False)
    assert "this job has 1 rank(s) but its launcher started 4" in proc.stdout, proc.stderr


@pytest.mark.mpi
@pytest.mark.parametrize("network", [False, True])
def test_doctor_passes_and_reports_the_path(tmp_path, network):
    args = [sys.executable, "-m", "asapmpi", "doctor", "--json", str(tmp_path / "d.json")]
    proc = subprocess.run(args + (["--network"] if network else []), capture_output=True,
                          text=True, timeout=200, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = {c["check"]: c for c in json.loads((tmp_path / "d.json").read_text())}
    assert all(c["passed"] for c in report.values())
    assert report["ABI match"]["detail"] == "yes"
    assert report["window memory model"]["detail"] == "MPI_WIN_UNIFIED"
    path = report["RMA path"]["detail"]
    assert path.startswith("network (forced") if network else path.startswith("shared")
    # device buffers: what the CUDA driver sees, what the MPI says of device pointers,
    # the path
    assert report["MPI CUDA support"]["detail"].startswith(("yes", "no", "not reported"))
    staged = report["device buffer path"]["detail"]
    if report["CUDA devices"]["detail"].startswith("none"):
        assert staged.startswith("none: device buffers need a CUDA device")
    else:
        assert staged.startswith("staged through pinned host memory")


class _FakeDriver:
    """The CUDA driver's four calls as ctypes sees them: two devices, or a failing init."""

    def __init__(self, init=0, names=(b"H100 80GB", b"A100")):
        self.init, self.names = init, names

    def cuInit(self, flags):
        return self.init

    def cuDeviceGetCount(self, count):
        count._obj.value = len(self.names)
        return 0

    def cuDeviceGet(self, device, ordinal):
        device._obj.value = ordinal
        return 0

    def cuDeviceGetName(self, buf, size, device):
        buf.value = self.names[device.value]
        return 0


def test_doctor_asks_the_cuda_driver_not_torch(monkeypatch):
    # the core never imports torch (asapmpi.torch's): the devices come from the driver
    import ctypes

    from asapmpi.device import support

    monkeypatch.setattr(ctypes, "CDLL", lambda name: _FakeDriver())
    assert support.cuda_devices() == (True, "2: cuda:0 H100 80GB, cuda:1 A100")
    monkeypatch.setattr(ctypes, "CDLL", lambda name: _FakeDriver(init=100))
    assert support.cuda_devices() == (False, "none (cuInit failed: CUresult 100)")
    monkeypatch.setattr(ctypes, "CDLL", lambda name: _FakeDriver(names=()))
    assert support.cuda_devices()[0] is False
    monkeypatch.undo()
    assert support.cuda_devices("/nonexistent/libcuda.so.1") == (
        False, "none (no CUDA driver: /nonexistent/libcuda.so.1 cannot be loaded)")


def test_doctor_fails_when_the_smoke_test_fails(tmp_path, monkeypatch, capsys):
    import argparse

    from asapmpi.cli import doctor

    broken = _fake_broken(tmp_path)
    name, ok, detail = doctor._smoke_checks(broken, dict(os.environ))[0]
    assert name == "2-rank smoke test" and ok is False and "exit 3" in detail
    monkeypatch.setattr(doctor, "_smoke_checks", lambda *a: [(name, ok, detail)])
    parser = argparse.ArgumentParser()
    doctor.add_arguments(parser)               # every option at its default
    assert doctor.run(parser.parse_args([])) == 1
    assert "FAIL  2-rank smoke test" in capsys.readouterr().out


def _fake_broken(tmp_path):
    path = tmp_path / "broken-mpiexec"
    path.write_text("#!/bin/sh\n[ \"$1\" = --version ] && echo 'HYDRA build details:' && exit 0\n"
                    "echo 'cannot start' >&2\nexit 3\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_slurm_template_is_valid_bash_and_uses_pmix():
    path = os.path.join(ROOT, "launch", "slurm", "asapmpi-train.sbatch")
    subprocess.run(["bash", "-n", path], check=True, timeout=30)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    for needle in ("srun --mpi=pmix", "--cpu-bind=cores", "OMPI_MCA_osc=ucx",
                   "RDMAV_FORK_SAFE=1", "--resume"):
        assert needle in text


@pytest.mark.mpi
def test_reject_nonfinite_refuses_before_sending():
    results = run("test_launcher:nonfinite_update", 2, "shm", timeout=120)
    assert "rank 1: the buffer holds 1 NaN/Inf value(s) (first at element 5) before " \
           "step 3; nothing was sent" in results[1]["error"]
    assert "from rank 1 (expected 3" in results[0]["error"]   # its neighbour times out


# ---------------------------------------------------------------- scenario bodies (on the ranks)
# tests/mpi/run.py runs each on every rank as "test_launcher:NAME"

def nonfinite_update(comm, n=100):
    """reject_nonfinite: rank 1's buffer gets a NaN before step 3; it refuses to send,
    its neighbour times out waiting for it."""
    buf = np.zeros(n)
    ex = asapmpi.Exchange(buf, graph="ring", comm=comm, timeout=2.0, reject_nonfinite=True)
    error = None
    try:
        for k in range(1, 6):
            if comm.Get_rank() == 1 and k == 3:
                buf[5] = np.nan
            ex.step()
    except (asapmpi.NonFiniteError, NeighbourTimeoutError) as exc:
        error = str(exc)
    return {"error": error}
