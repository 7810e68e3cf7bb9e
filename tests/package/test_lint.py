"""The Python sources pass ruff with the rules selected in pyproject.toml."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_ruff_clean():
    ruff = Path(sys.executable).parent / "ruff"
    assert ruff.exists(), "ruff is not installed; run dev/setup.sh"
    paths = ["asapmpi", "bindings", "tests", "dev", "setup.py", "_build"]
    proc = subprocess.run([str(ruff), "check", *paths],
                          cwd=ROOT, capture_output=True, text=True, check=False, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
