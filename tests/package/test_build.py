"""The ways to build asapmpi's Cython core, each into a temporary copy of the repository.

- CMake against a named mpicc (CMakeLists.txt);
- pip with MPICC naming a site MPI (setup.py's wrapper path, no embedded MPI);
- plain `pip install .` in a fresh virtual environment, where the in-tree backend pulls
  the mpich wheel into the isolated build environment, which pip deletes afterwards;
- and the import-time check that the extension and mpi4py agree on the MPI ABI.

Nothing is ever built inside the working tree: every build happens in a copy under
pytest's tmp_path.
"""
import importlib.util
import os
import shutil
import subprocess
import sys
import textwrap
import venv
from pathlib import Path

import pytest

pytestmark = pytest.mark.build

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent            # the dev venv: mpicc, mpiexec, python
MPICC = BIN / "mpicc"

# What a build produces or a developer keeps around, never part of a source copy: the
# environments above all (.venv, and dev/test.sh's .venv-openmpi and .venv-openmpi5,
# 1.5 GB each: copied four times, they cost the build tests about 55 s a copy)
IGNORE = shutil.ignore_patterns(".venv*", "build", "dist", ".git", "*.egg-info", "*.so",
                                "*.c", "_build_config.py", "__pycache__", ".pytest_cache",
                                ".ruff_cache", "results", "asapmpi-runs", "*.h5")

# A serial check of an imported core: where it came from, what it was built with, and
# that the fused kernel agrees with NumPy.  Prints the build record's fields.
IMPORT_CHECK = textwrap.dedent("""
    import sys
    import numpy as np
    import asapmpi._core as c, asapmpi._core._build_config as b
    import asapmpi.sync._sweep as sweep
    root = sys.argv[1]
    for mod in (c, c.kernels, c.slotwin, b, sweep):
        assert mod.__file__.startswith(root), (mod.__name__, mod.__file__, root)
    assert sweep.covering_window(np.array([[0.0, 2.0], [1.0, 3.0]]))[0] == 0.0
    rng = np.random.default_rng(0)
    for dtype in (np.float32, np.float64):
        own, x1, x2 = (rng.standard_normal(1000).astype(dtype) for _ in range(3))
        out = np.empty_like(own)
        c.kernels.weighted_sum(out, own, 0.5, [x1, x2], [0.25, 0.25])
        ref = dtype(0.5) * own + dtype(0.25) * x1 + dtype(0.25) * x2
        np.testing.assert_allclose(out, ref, rtol=1e-6 if dtype == np.float32 else 1e-12)
    print("BUILT_BY", b.BUILT_BY)
    print("OPTIMIZE", b.OPTIMIZE)
    print("MPI_ABI", b.MPI_ABI)
    print("EMBEDDED", b.EMBEDDED)
    print("MPICC", b.MPICC)
    print("LIBRARY_DIRS", *b.LIBRARY_DIRS)
""")

# Two ranks on a ring mix their buffers once: both end at the mean, every read consistent.
RING_SMOKE = textwrap.dedent("""
    import numpy as np
    import asapmpi
    from mpi4py import MPI
    rank = MPI.COMM_WORLD.Get_rank()
    x = np.full(64, float(rank))
    with asapmpi.Exchange(x, graph="ring", timeout=30) as ex:
        ex.step()
        stats = ex.stats
    assert np.allclose(x, 0.5), x
    assert [s["consistent"] for s in stats.values()] == [1], stats
    oks = MPI.COMM_WORLD.gather(rank)   # one line from rank 0: ranks' output may interleave
    if rank == 0:
        print("ring ok", oks, flush=True)
""")


def copy_repo(dst: Path) -> Path:
    """Copy the repository's sources (no builds, no venv, no git) to dst and return it."""
    shutil.copytree(REPO, dst, ignore=IGNORE)
    size = sum(f.stat().st_size for f in dst.rglob("*") if f.is_file())
    assert size < 64 << 20, f"a source copy of {size >> 20} MiB: IGNORE misses a build folder"
    return dst


def clean_env(**extra) -> dict:
    """The environment minus anything that would pick another MPI or package copy."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "MPICC",
                        "LD_LIBRARY_PATH", "MPI4PY_MPIABI", "MPI4PY_LIBMPI")}
    env.update(extra)
    return env


def run(cmd, timeout, **kw) -> subprocess.CompletedProcess:
    """Run cmd; fail the test with its output if it exits non-zero."""
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, check=False,
                          timeout=timeout, **kw)
    assert proc.returncode == 0, (
        f"{' '.join(map(str, cmd))} exited {proc.returncode}\n"
        f"--- stdout\n{proc.stdout[-6000:]}\n--- stderr\n{proc.stderr[-6000:]}")
    return proc


def record(stdout: str) -> dict:
    """The 'KEY value' lines IMPORT_CHECK prints, as a dict."""
    return dict(line.split(" ", 1) for line in stdout.splitlines() if " " in line)


def import_check(python, root: Path, cwd: Path, **env) -> dict:
    """Import the core from `root` (a copy or an install) with `python`; return its record."""
    proc = run([python, "-c", IMPORT_CHECK, str(root)], timeout=120, cwd=cwd,
               env=clean_env(**env))
    return record(proc.stdout)


@pytest.fixture(scope="module")
def cmake_build(tmp_path_factory):
    """Configure and build with CMake into a source copy; return (copy, build dir)."""
    # dev/requirements.txt installs cmake into the environment: a missing one is a
    # broken set-up, not a reason to skip
    here = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    cmake = shutil.which("cmake", path=here)
    assert cmake, "cmake is not installed; run dev/setup.sh"
    tmp = tmp_path_factory.mktemp("cmake")
    src = copy_repo(tmp / "src")
    build = tmp / "build"
    # -O0 (ASAPMPI_OPTIMIZE): what is checked here is the build's path and layout; a
    # sixth of -O3's compile time
    run([cmake, "-S", src, "-B", build, f"-DPython_EXECUTABLE={sys.executable}",
         f"-DMPI_C_COMPILER={MPICC}", f"-DASAPMPI_OUTPUT_DIR={src / 'asapmpi' / '_core'}",
         "-DASAPMPI_OPTIMIZE=0"],
        timeout=180, env=clean_env())
    run([cmake, "--build", build, "--parallel", "2"], timeout=600, env=clean_env())
    return src, build


def test_cmake_build(cmake_build):
    src, _ = cmake_build
    # every listed module lands in its own package's folder (asapmpi.sync._sweep too)
    built = sorted(".".join(p.relative_to(src).with_suffix("").with_suffix("").parts)
                   for p in (src / "asapmpi").rglob("*.so"))
    listed = [line.split()[0] for line in
              (REPO / "asapmpi" / "_core" / "extensions.txt").read_text().splitlines()
              if line.split("#", 1)[0].strip()]
    assert built == sorted(listed) and "asapmpi._core.slotwin" in built, (built, listed)
    rec = import_check(sys.executable, src, cwd=src.parent, PYTHONPATH=str(src))
    assert rec["BUILT_BY"] == "cmake"
    assert rec["OPTIMIZE"] == "0"             # -DASAPMPI_OPTIMIZE=0 above
    assert rec["MPI_ABI"] == "mpich"          # the dev venv's mpich wheel
    assert rec["MPICC"] == str(MPICC)
    assert rec["EMBEDDED"] == "False"
    assert rec["LIBRARY_DIRS"] == str(BIN.parent / "lib")


def test_cmake_install(cmake_build, tmp_path):
    """`cmake --install --prefix` lays out an importable package under site-packages."""
    _, build = cmake_build
    run([shutil.which("cmake"), "--install", build, "--prefix", tmp_path / "prefix"],
        timeout=120, env=clean_env())
    site = tmp_path / "prefix" / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    site = site / "site-packages"
    assert (site / "asapmpi" / "exchange" / "exchange.py").is_file()
    assert list((site / "asapmpi" / "sync").glob("_sweep*.so")), "the sweep not installed"
    rec = import_check(sys.executable, site, cwd=tmp_path, PYTHONPATH=str(site))
    assert rec["BUILT_BY"] == "cmake"
    assert rec["OPTIMIZE"] == "0"             # -DASAPMPI_OPTIMIZE=0 above


def test_site_mpi_build(tmp_path):
    """MPICC names the MPI: setup.py builds against it and records it, no embedded MPI."""
    assert MPICC.exists(), f"no mpicc next to {sys.executable}; run dev/setup.sh"
    src = copy_repo(tmp_path / "src")
    target = tmp_path / "target"
    run([sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps",
         "--no-cache-dir", "--target", target, src],
        timeout=600, cwd=tmp_path, env=clean_env(MPICC=str(MPICC), ASAPMPI_OPTIMIZE="0"))
    rec = import_check(sys.executable, target, cwd=tmp_path, PYTHONPATH=str(target))
    assert rec["BUILT_BY"] == "setup.py"
    # the level asked for (a development build: a sixth of -O3's compile time)
    assert rec["OPTIMIZE"] == "0"
    assert rec["EMBEDDED"] == "False"
    assert rec["MPICC"] == str(MPICC)
    assert rec["MPI_ABI"] == "mpich"


@pytest.mark.timeout(1500)
def test_isolated_pip_install(tmp_path):
    """A fresh venv and a plain `pip install <repo>`: the fresh-machine path, with the
    core's dependencies only (no extra).

    The build environment, with the mpich wheel it pulled in, is deleted when pip is done;
    the installed extension must find libmpi through the venv, not through that folder.
    """
    src = copy_repo(tmp_path / "src")
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    vbin = env_dir / "bin"
    path = os.pathsep.join([str(vbin)] + [p for p in os.environ.get("PATH", "").split(os.pathsep)
                                         if p and Path(p) != BIN])
    env = clean_env(PATH=path)
    # -O0 (ASAPMPI_OPTIMIZE, which must reach pip's isolated build): this checks the
    # install's path and layout; -O3, what users get, compiled 25 CPU-s more here.  The
    # default level is test_the_default_build_is_O3's
    run([vbin / "python", "-m", "pip", "install", "-q", src], timeout=1200, cwd=tmp_path,
        env=dict(env, ASAPMPI_OPTIMIZE="0"))
    platlib = "import sysconfig; print(sysconfig.get_path('platlib'))"
    site = Path(run([vbin / "python", "-c", platlib], timeout=60, env=env).stdout.strip())

    rec = import_check(vbin / "python", site, cwd=tmp_path, PATH=path)
    assert rec["BUILT_BY"] == "setup.py"
    assert rec["OPTIMIZE"] == "0"       # the variable reached the isolated build
    assert rec["EMBEDDED"] == "True"
    # The wrapper it was built with lived in pip's build environment, which is gone now.
    build_libdir = rec["LIBRARY_DIRS"]
    assert not Path(rec["MPICC"]).is_relative_to(env_dir), rec
    assert not Path(build_libdir).exists(), rec

    # Load slotwin with the dynamic linker alone, before mpi4py could map libmpi: its
    # libmpi.so.12 must be found through its own rpath, in this venv.
    (slotwin,) = (site / "asapmpi" / "_core").glob("slotwin.*.so")
    probe = ("import ctypes, sys; ctypes.CDLL(sys.argv[1]); "
             "maps = open('/proc/self/maps').read(); "
             "print([l.split()[-1] for l in maps.splitlines() if 'libmpi.so' in l][0])")
    libmpi = run([vbin / "python", "-c", probe, slotwin], timeout=60, cwd=tmp_path,
                 env=env).stdout.strip()
    assert Path(libmpi).resolve().is_relative_to(env_dir.resolve()), libmpi

    proc = run([vbin / "mpiexec", "-n", "2", vbin / "python", "-c", RING_SMOKE],
               timeout=180, cwd=tmp_path, env=env)
    assert proc.stdout.strip() == "ring ok [0, 1]", proc.stdout

    # The venv holds the core's dependencies only (mpi4py, NumPy, h5py, the mpich wheel):
    # the training command names its extra in one line, before launching anything.
    absent = run([vbin / "python", "-c", "import importlib.util as u; print([m for m in "
                  "('torch', 'sklearn', 'scipy', 'matplotlib', 'tqdm') if u.find_spec(m)])"],
                 timeout=60, cwd=tmp_path, env=env).stdout.strip()
    assert absent == "[]", absent
    train = subprocess.run([str(vbin / "asapmpi"), "train", "svm", "-n", "2"],
                           capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env,
                           check=False)
    assert train.returncode == 2 and train.stderr.count("\n") == 1, train.stderr
    assert "pip install 'asapmpi[train]'" in train.stderr, train.stderr


def test_a_bad_optimization_level_is_one_line_before_building(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "setup.py"), "--name"], cwd=tmp_path,
                          env=clean_env(ASAPMPI_OPTIMIZE="fast"), capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "asapmpi: ASAPMPI_OPTIMIZE='fast': give 0, 1, 2 or 3 (the -O level), or leave it "
        "unset for 3"], proc.stderr


def test_the_default_build_is_O3():
    """What users get: setup.py's level with ASAPMPI_OPTIMIZE unset, as the suite's own
    build (dev/setup.sh, pip install .) was made."""
    if "ASAPMPI_OPTIMIZE" in os.environ:
        pytest.skip("ASAPMPI_OPTIMIZE is set: this build's level is the variable's")
    from asapmpi._core import _build_config

    assert _build_config.OPTIMIZE == "3"


def test_abi_mismatch_is_a_clear_error(tmp_path):
    """A core built for another MPI ABI than mpi4py's refuses to load, and says why."""
    spec = importlib.util.find_spec("asapmpi")   # locates the package without importing it
    core = Path(spec.origin).parent / "_core"
    built = sorted(core.glob("*.so"))
    assert built, f"no built extension in {core}; run dev/setup.sh"
    src = copy_repo(tmp_path / "src")
    for so in built:
        shutil.copy2(so, src / "asapmpi" / "_core")
    libdir = tmp_path / "openmpi-lib"        # the library the record says it linked
    libdir.mkdir()
    for name in ("libmpi.so", "libmpi.so.40"):
        (libdir / name).write_bytes(b"")
    (src / "asapmpi" / "_core" / "_build_config.py").write_text(
        "MPI_ABI = 'openmpi'\nMPICC = '/opt/openmpi/bin/mpicc'\nEMBEDDED = False\n"
        f"LIBRARIES = ['mpi']\nLIBRARY_DIRS = [{str(libdir)!r}]\n"
        "VERSION = 'Open MPI v5.0.0'\nBUILT_BY = 'test'\n")
    code = textwrap.dedent("""
        import sys
        try:
            import asapmpi._core
        except Exception as exc:
            errors = sys.modules["asapmpi.errors"]
            assert errors.__file__.startswith(sys.argv[1]), errors.__file__
            assert isinstance(exc, errors.MPIMismatchError), repr(exc)
            assert isinstance(exc, ImportError), repr(exc)
            print(exc)
        else:
            sys.exit("asapmpi._core imported although it claims the openmpi ABI")
    """)
    proc = run([sys.executable, "-c", code, str(src)], timeout=120, cwd=tmp_path,
               env=clean_env(PYTHONPATH=str(src)))
    message = proc.stdout
    assert "openmpi ABI" in message and "mpich ABI" in message, message
    assert "/opt/openmpi/bin/mpicc" in message, message
    assert "rebuild" in message and "MPICC=" in message, message
    # the other way out that works: mpi4py loads the very library asapmpi linked
    # (MPI4PY_MPIABI alone then fails to find libmpi.so.40)
    assert f"MPI4PY_LIBMPI={libdir / 'libmpi.so.40'}" in message, message
    assert "MPI4PY_MPIABI" not in message, message
