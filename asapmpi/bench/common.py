"""Helpers the benchmarks share, their commands and their jobs alike: sizes and other
option values, the MPI path a job runs on, tables, and printing or writing a report.
Nothing here starts MPI: `asapmpi --help` imports it.
"""
from __future__ import annotations

import argparse
import json
import math
import os
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..launchers import network_forced

_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_sizes(text: str) -> List[int]:
    """'4K,64K,1M' -> [4096, 65536, 1048576]: bytes, each a positive multiple of 4."""
    sizes = []
    for item in text.split(","):
        token = item.strip().upper()
        token = token[:-1] if token.endswith("B") else token
        mult = _UNITS.get(token[-1:], 1)
        digits = token[:-1] if token[-1:] in _UNITS else token
        try:
            nbytes = int(digits) * mult
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"bad size {item!r}; write e.g. 4K, 1M, 4096") from None
        if nbytes <= 0 or nbytes % 4:
            raise argparse.ArgumentTypeError(f"size {item!r} must be a positive multiple "
                                             f"of 4 bytes (float32)")
        sizes.append(nbytes)
    return sizes


def positive(kind: type) -> Callable[[str], Any]:
    """An argparse type: a finite number of `kind` above zero."""
    def convert(text: str) -> Any:
        value = kind(text)
        if not 0 < value < math.inf:        # nan and inf too
            raise argparse.ArgumentTypeError(f"must be a finite positive number, got {text}")
        return value
    convert.__name__ = kind.__name__
    return convert


def publish(report: Dict[str, Any], text: str, json_path: Optional[str] = None,
            png_path: Optional[str] = None,
            draw: Optional[Callable[[Dict[str, Any], str], Any]] = None) -> None:
    """Print a benchmark's `text`, write its `report` to `json_path` and draw it to
    `png_path` with `draw`, each when asked for."""
    print(text, flush=True)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(report, f, indent=1)
            f.write("\n")
    if png_path and draw is not None:
        draw(report, png_path)


def rma_path() -> str:
    """'network' when the MPI is told not to use shared memory for local ranks
    ('network (UCX)' when that is Open MPI's UCX), else 'shared-memory'."""
    if not network_forced():
        return "shared-memory"
    return "network (UCX)" if os.environ.get("OMPI_MCA_pml") == "ucx" else "network"


def size_label(nbytes: int) -> str:
    """4096 -> '4 KB', 1048576 -> '1 MB' (binary units)."""
    for unit, mult in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if nbytes >= mult and nbytes % mult == 0:
            return f"{nbytes // mult} {unit}"
    return f"{nbytes} B"


def format_time(t: float) -> str:
    return f"{t * 1e6:.1f} us" if t < 1e-3 else f"{t * 1e3:.2f} ms"


def render_table(title: str, columns: Sequence[Tuple[str, str]], rows: Sequence[Sequence[str]]
            ) -> List[str]:
    """A fixed-width table: two header lines per column, first column left-aligned."""
    widths = [max(len(c[0]), len(c[1]), *(len(r[i]) for r in rows))
              for i, c in enumerate(columns)]

    def line(cells: Sequence[str]) -> str:
        first = cells[0].ljust(widths[0])
        return "  ".join([first] + [c.rjust(w) for c, w in zip(cells[1:], widths[1:])])

    return ["", title, line([c[0] for c in columns]), line([c[1] for c in columns]),
            "-" * len(line([c[0] for c in columns]))] + [line(r) for r in rows]
