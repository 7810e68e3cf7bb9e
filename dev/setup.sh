#!/usr/bin/env bash
# Set up everything asapmpi needs on a fresh machine, idempotently:
# a virtual environment in .venv (or $ASAPMPI_VENV), the embedded MPI (the PyPI mpich
# wheel) with mpi4py and the build tools, then asapmpi itself, rebuilt only when its
# sources changed.  Prints the environment's python on the last line.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${ASAPMPI_VENV:-$ROOT/.venv}"
PY="$VENV/bin/python"

if [ ! -x "$PY" ]; then
    echo "setup: creating $VENV" >&2
    python3 -m venv "$VENV"
fi
"$PY" -m pip install --quiet --disable-pip-version-check -r "$ROOT/dev/requirements.txt" >&2

# Rebuild only when a source file of the package changed.
STAMP="$VENV/.asapmpi-build-stamp"
HASH="$( (cd "$ROOT" && find asapmpi bindings setup.py pyproject.toml _build -type f \
        \( -name '*.py' -o -name '*.pyx' -o -name '*.pxi' -o -name '*.pxd' -o -name '*.h' \
           -o -name '*.txt' -o -name '*.toml' \) ! -name '_build_config.py' -print0 \
        | sort -z | xargs -0 sha1sum; echo "ASAPMPI_OPTIMIZE=${ASAPMPI_OPTIMIZE:-3}") \
        | sha1sum | cut -d' ' -f1)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$HASH" ] || ! "$PY" -c 'import asapmpi._core' 2>/dev/null; then
    echo "setup: building and installing asapmpi" >&2
    (cd "$ROOT" && "$PY" -m pip install --quiet --disable-pip-version-check \
        --no-build-isolation --no-deps --editable . >&2)
    echo "$HASH" > "$STAMP"
fi
# Bytecode for the package, as pip writes it for an installed one: an editable install
# runs from these sources, and where PYTHONDONTWRITEBYTECODE is set (this machine's image
# sets it) every process compiled what it imported, 0.1-0.3 s of CPU for each rank of a
# job.  Only files changed since the last run are compiled; an edit after it makes its
# file's bytecode stale, which Python notices (source mtime) and compiles as before.
"$PY" -m compileall -q "$ROOT/asapmpi" "$ROOT/bindings" >&2
echo "$PY"
