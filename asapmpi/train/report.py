"""What a training run records and reports: per-rank metrics, summaries, the comparison
table, the HDF5 metrics file, the JSON summary and the convergence plot."""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

import h5py
import numpy as np

#: one row per evaluation, on every rank
FIELDS = ("mark", "iteration", "time_s", "loss", "test_accuracy", "iters_per_s",
          "bytes_sent", "wait_s")


class MetricsLog:
    """One rank's evaluations: a row per crossed mark (every `eval_every` iterations)."""

    def __init__(self):
        self.rows: List[tuple] = []

    def add(self, mark: int, iteration: int, time_s: float, loss: float,
            test_accuracy: float, iters_per_s: float, bytes_sent: int,
            wait_s: float) -> None:
        """Record one evaluation."""
        self.rows.append((mark, iteration, time_s, loss, test_accuracy, iters_per_s,
                          bytes_sent, wait_s))

    def arrays(self) -> Dict[str, np.ndarray]:
        """Column arrays {field: values} (for checkpoints and the HDF5 file)."""
        cols = list(zip(*self.rows)) if self.rows else [()] * len(FIELDS)
        return {f: np.asarray(c, dtype=np.int64 if f in ("mark", "iteration", "bytes_sent")
                              else np.float64) for f, c in zip(FIELDS, cols)}

    @classmethod
    def from_arrays(cls, arrays: Dict[str, np.ndarray]) -> "MetricsLog":
        """The inverse of arrays()."""
        log = cls()
        columns = [np.asarray(arrays[f]).tolist() for f in FIELDS]
        log.rows = [tuple(r) for r in zip(*columns)]
        return log


@dataclass
class RunResult:
    """Every rank's metrics of one run, gathered on rank 0, and what they add up to."""

    label: str
    config: Dict[str, Any]
    logs: List[Dict[str, np.ndarray]]        # per rank: MetricsLog.arrays()
    target: float
    extra: Dict[str, Any] = field(default_factory=dict)

    def curve(self) -> Dict[str, np.ndarray]:
        """Per mark: the mean test accuracy over ranks, the latest time any rank reached
        it, the mean bytes sent by then, the iteration."""
        marks = sorted({int(m) for log in self.logs for m in log["mark"]})
        acc, time_s, sent, its = [], [], [], []
        for m in marks:
            # a rank that jumped over mark m recorded its next row instead
            chosen = [(log, i) for log in self.logs
                      for i in [int(np.searchsorted(log["mark"], m))]
                      if i < len(log["mark"])]
            acc.append(np.mean([log["test_accuracy"][i] for log, i in chosen]))
            time_s.append(max(log["time_s"][i] for log, i in chosen))
            sent.append(np.mean([log["bytes_sent"][i] for log, i in chosen]))
            its.append(min(log["iteration"][i] for log, i in chosen))
        return {"mark": np.array(marks), "accuracy": np.array(acc),
                "time_s": np.array(time_s), "bytes_sent": np.array(sent),
                "iteration": np.array(its)}

    def summary(self) -> Dict[str, Any]:
        """The JSON summary: final accuracy, wall time, iterations, bytes, time to the
        target accuracy (None when not reached)."""
        last = [{f: log[f][-1] for f in FIELDS} for log in self.logs if len(log["mark"])]
        curve = self.curve()
        hit = np.nonzero(curve["accuracy"] >= self.target)[0]
        wall = max(r["time_s"] for r in last)
        return {
            "label": self.label,
            "final_test_accuracy": float(np.mean([r["test_accuracy"] for r in last])),
            "final_test_accuracy_min": float(min(r["test_accuracy"] for r in last)),
            "final_test_accuracy_max": float(max(r["test_accuracy"] for r in last)),
            "final_loss": float(np.nanmean([r["loss"] for r in last])),
            "wall_time_s": float(wall),
            "iterations": int(self.config.get("iters", max(r["iteration"] for r in last))),
            "iters_per_s": float(np.median([r["iteration"] / max(r["time_s"], 1e-9)
                                            for r in last])),
            "bytes_sent_per_rank": float(np.mean([r["bytes_sent"] for r in last])),
            "wait_fraction": float(np.mean([r["wait_s"] / max(r["time_s"], 1e-9)
                                            for r in last])),
            "target_accuracy": self.target,
            "time_to_target_s": float(curve["time_s"][hit[0]]) if len(hit) else None,
            "iterations_to_target": int(curve["iteration"][hit[0]]) if len(hit) else None,
            "bytes_to_target_per_rank": float(curve["bytes_sent"][hit[0]]) if len(hit)
            else None,
            "ranks": len(self.logs),
            **self.extra,
        }


def _fmt(value: Optional[float], spec: str, missing: str = "-") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return missing
    return format(value, spec)


def table(summaries: Sequence[Dict[str, Any]]) -> str:
    """The comparison table: one row per run."""
    head = ("run", "final acc %", "min-max %", "wall s", "it/s", "to target s",
            "MB/rank to target", "MB/rank", "wait %")
    rows = [head]
    for s in summaries:
        mb = s["bytes_sent_per_rank"] / 1e6
        to_mb = None if s["bytes_to_target_per_rank"] is None \
            else s["bytes_to_target_per_rank"] / 1e6
        rows.append((
            s["label"], _fmt(100 * s["final_test_accuracy"], ".2f"),
            f"{100 * s['final_test_accuracy_min']:.1f}-"
            f"{100 * s['final_test_accuracy_max']:.1f}",
            _fmt(s["wall_time_s"], ".2f"), _fmt(s["iters_per_s"], ".1f"),
            _fmt(s["time_to_target_s"], ".2f", "not reached"), _fmt(to_mb, ".2f"),
            _fmt(mb, ".2f"), _fmt(100 * s["wait_fraction"], ".1f")))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                       for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    target = summaries[0]["target_accuracy"] if summaries else 0
    return "\n".join(lines) + f"\n(target accuracy {100 * target:.1f}%; accuracy: mean " \
                              f"over ranks of each replica's test accuracy)"


def write_h5(path: str, results: Sequence[RunResult]) -> None:
    """Per run and rank, every metric column; per run the config and summary (JSON)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with h5py.File(path, "w") as f:
        f.attrs["order"] = json.dumps([res.label for res in results])
        for res in results:
            g = f.create_group(res.label.replace("/", "_"))
            g.attrs["config"] = json.dumps(res.config)
            g.attrs["summary"] = json.dumps(res.summary())
            g.attrs["extra"] = json.dumps(res.extra)
            g.attrs["label"] = res.label
            for r, log in enumerate(res.logs):
                rg = g.create_group(f"rank_{r}")
                for name, values in log.items():
                    rg.create_dataset(name, data=values)


def read_h5(path: str) -> List[RunResult]:
    """The runs write_h5 wrote, in the file's order of groups (the order of the runs)."""
    with h5py.File(path, "r") as f:
        results = []
        for name in f:
            g = f[name]
            ranks = sorted((k for k in g if k.startswith("rank_")),
                           key=lambda k: int(k.split("_")[1]))
            logs = [{field: np.asarray(g[r][field]) for field in g[r]} for r in ranks]
            config = json.loads(g.attrs["config"])
            summary = json.loads(g.attrs["summary"])
            results.append(RunResult(str(g.attrs.get("label", summary["label"])), config,
                                     logs, float(summary["target_accuracy"]),
                                     extra=json.loads(g.attrs.get("extra", "{}"))))
        # h5py lists groups by name; the runs' order is the order they were written
        order = {r: i for i, r in enumerate(json.loads(f.attrs["order"]))} \
            if "order" in f.attrs else {}
    return sorted(results, key=lambda r: order.get(r.label, 0))


def plot(path: str, results: Sequence[RunResult], title: str) -> str:
    """Test accuracy over time and over iterations, one line per run, as one PNG."""
    from ..plot.lines import line_panels

    over_time = {r.label: (r.curve()["time_s"], 100 * r.curve()["accuracy"])
                 for r in results}
    over_iters = {r.label: (r.curve()["iteration"], 100 * r.curve()["accuracy"])
                  for r in results}
    return line_panels([(over_time, "time (s)"), (over_iters, "iterations")], path,
                       title=title, ylabel="test accuracy (%)")
