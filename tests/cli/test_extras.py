"""Optional dependencies: the core imports with only mpi4py, NumPy and h5py; every command
or module that needs an extra says, in one line and before any work, which `pip install`
to run.  Each check runs in a fresh interpreter where the extras' modules cannot be
imported (sys.modules[name] = None makes `import name` fail), so an import added
anywhere in the core's import graph fails here.  tests/package/test_build.py checks the same
in a real virtual environment that has only the core's dependencies."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from asapmpi.errors import ConfigError
from asapmpi.extras import MissingExtra, check, missing, require

EXTRAS = ("torch", "sklearn", "scipy", "matplotlib", "tqdm")

WITHOUT_EXTRAS = textwrap.dedent(f"""
    import sys
    for name in {EXTRAS!r}:
        sys.modules[name] = None
""")


def python_without_extras(code: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", WITHOUT_EXTRAS + textwrap.dedent(code),
                           *argv], capture_output=True, text=True, timeout=120, check=False)


def test_core_imports_without_any_extra():
    proc = python_without_extras("""
        import asapmpi, asapmpi.sync, asapmpi.reduce, asapmpi._core, asapmpi.trace
        from asapmpi.sync.zipline import zipline
        from asapmpi.cli import build_parser
        build_parser()                 # every subcommand's options, as `asapmpi -h` does
        print(zipline([[0.0, 2.0], [1.0, 3.0]]).spread)
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in
                        ("torch", "sklearn", "scipy", "matplotlib", "tqdm")
                        and sys.modules[m] is not None)
        print("extras loaded:", loaded)
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:2] == ["1.0", "extras loaded: []"], proc.stdout


@pytest.mark.parametrize("argv, extra, names", [
    (["train", "svm", "-n", "2"], "train", "torch, scikit-learn, scipy, tqdm, matplotlib"),
    (["graph", "ring", "-n", "4", "--png", "g.png"], "plot", "matplotlib"),
    (["bench", "soak", "-n", "2", "--png", "s.png"], "plot", "matplotlib"),
])
def test_command_without_its_extra_names_the_pip_install(argv, extra, names, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", WITHOUT_EXTRAS + "from asapmpi.cli import main\n"
                                                "sys.exit(main(sys.argv[1:]))", *argv],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, check=False)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stderr.count("\n") == 1, proc.stderr          # one line, no traceback
    assert f"needs {names}: pip install 'asapmpi[{extra}]'" in proc.stderr, proc.stderr
    assert not list(tmp_path.iterdir())                        # nothing was run


def test_torch_bindings_without_torch_name_the_pip_install():
    proc = python_without_extras("""
        try:
            import asapmpi.torch
        except ImportError as exc:
            print(type(exc).__name__, exc)
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == \
        "MissingExtra asapmpi.torch needs torch: pip install 'asapmpi[torch]'"


def test_require_missing_and_check():
    assert require("json", "train", "x").dumps([1]) == "[1]"
    with pytest.raises(MissingExtra, match=r"^the reader needs scikit-learn: pip install "
                                           r"'asapmpi\[train\]' \(or pass a file\)$"):
        require("sklearn.no_such_module_here", "train", "the reader", "or pass a file")
    assert missing(["json", "no_such_module_here", "os.path"]) == ["no_such_module_here"]
    check(["json"], "plot", "nothing")
    with pytest.raises(MissingExtra) as info:
        check(["no_such_a", "json", "no_such_b"], "plot", "drawing")
    assert str(info.value) == "drawing needs no_such_a, no_such_b: pip install 'asapmpi[plot]'"
    # the command line prints a ConfigError in one line; code probing imports still works
    assert isinstance(info.value, ConfigError) and isinstance(info.value, ImportError)
