#!/usr/bin/env bash
# Build asapmpi with another MPI's mpicc in a copy of the source tree, idempotently:
#     dev/build-copy.sh VENV MPICC NAME
# (dev/setup-openmpi.sh, dev/setup-openmpi5.sh).  An in-place build would overwrite the
# MPICH build's extension modules in the checkout, so the copy ($VENV/src) holds the
# checkout's files as they are now (committed or not), refreshed on every run, and is
# rebuilt only when a source file changed.  NAME prefixes the messages.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$1"
MPICC="$2"
NAME="$3"
PY="$VENV/bin/python"
SRC="$VENV/src"
mkdir -p "$SRC"
# drop what the checkout no longer has; keep the build's outputs
find "$SRC" -type f ! -name '*.so' ! -name '*.c' ! -name '_build_config.py' \
    ! -path '*/build/*' ! -path '*.egg-info/*' -delete
(cd "$ROOT" && git ls-files -z --cached --others --exclude-standard \
    | xargs -0 -I{} sh -c 'test -f "{}" && printf "%s\0" "{}"' \
    | tar --null -T - -cf -) | (cd "$SRC" && tar -xf -)
STAMP="$VENV/.asapmpi-build-stamp"
HASH="$(cd "$SRC" && find asapmpi bindings setup.py pyproject.toml _build -type f \
        \( -name '*.py' -o -name '*.pyx' -o -name '*.pxi' -o -name '*.pxd' -o -name '*.h' \
           -o -name '*.txt' -o -name '*.toml' \) ! -name '_build_config.py' -print0 \
        | sort -z | xargs -0 sha1sum | sha1sum | cut -d' ' -f1)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$HASH" ] \
        || ! (cd "$SRC" && "$PY" -c 'import asapmpi._core') 2>/dev/null; then
    echo "$NAME: building asapmpi with $MPICC" >&2
    (cd "$SRC" && MPICC="$MPICC" "$PY" -m pip install --quiet --disable-pip-version-check \
        --no-build-isolation --no-deps --editable . >&2)
    echo "$HASH" > "$STAMP"
fi
# bytecode, as dev/setup.sh writes it for the checkout
(cd "$SRC" && "$PY" -m compileall -q asapmpi bindings >&2)
