"""What a training run records and reports: per-rank metrics, summaries, the comparison
table, the HDF5 metrics file, the JSON summary and the convergence plot.

The classifiers are evaluated by test accuracy, the language model by held-out loss
(asapmpi.train.metric): the log's column, the summary's names, the target's direction,
the table and the plot follow the run's metric."""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

import h5py
import numpy as np

from .metric import ACCURACY, LOSS, METRICS, Metric, bits_per_char, of_summary

#: one row per evaluation, on every rank (a run evaluated by held-out loss has the
#: column test_loss in place of test_accuracy: fields())
FIELDS = ("mark", "iteration", "time_s", "loss", "test_accuracy", "iters_per_s",
          "bytes_sent", "wait_s")


def fields(metric: Metric = ACCURACY) -> tuple:
    """The log's columns for a run evaluated by `metric`."""
    return tuple(metric.column if f == ACCURACY.column else f for f in FIELDS)


class MetricsLog:
    """One rank's evaluations: a row per crossed mark (every `eval_every` iterations)."""

    def __init__(self, metric: Metric = ACCURACY):
        self.rows: List[tuple] = []
        self.metric = metric

    def add(self, mark: int, iteration: int, time_s: float, loss: float,
            test_metric: float, iters_per_s: float, bytes_sent: int,
            wait_s: float) -> None:
        """Record one evaluation (`loss`: the mean training loss since the last one;
        `test_metric`: the test accuracy or held-out loss, by the log's metric)."""
        self.rows.append((mark, iteration, time_s, loss, test_metric, iters_per_s,
                          bytes_sent, wait_s))

    def arrays(self) -> Dict[str, np.ndarray]:
        """Column arrays {field: values} (for checkpoints and the HDF5 file)."""
        names = fields(self.metric)
        cols = list(zip(*self.rows)) if self.rows else [()] * len(names)
        return {f: np.asarray(c, dtype=np.int64 if f in ("mark", "iteration", "bytes_sent")
                              else np.float64) for f, c in zip(names, cols)}

    @classmethod
    def from_arrays(cls, arrays: Dict[str, np.ndarray]) -> "MetricsLog":
        """The inverse of arrays() (the metric read from the columns' names)."""
        log = cls(LOSS if LOSS.column in arrays else ACCURACY)
        columns = [np.asarray(arrays[f]).tolist() for f in fields(log.metric)]
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
    #: what the test column holds and which way is better: "accuracy" or "loss"
    metric: str = "accuracy"

    @property
    def measure(self) -> Metric:
        """The run's Metric."""
        return METRICS[self.metric]

    def curve(self) -> Dict[str, np.ndarray]:
        """Per mark: the mean test accuracy (or held-out loss: the key is the metric's)
        over ranks, the latest time any rank reached it, the mean bytes sent by then,
        the iteration."""
        column = self.measure.column
        marks = sorted({int(m) for log in self.logs for m in log["mark"]})
        acc, time_s, sent, its = [], [], [], []
        for m in marks:
            # a rank that jumped over mark m recorded its next row instead
            chosen = [(log, i) for log in self.logs
                      for i in [int(np.searchsorted(log["mark"], m))]
                      if i < len(log["mark"])]
            acc.append(np.mean([log[column][i] for log, i in chosen]))
            time_s.append(max(log["time_s"][i] for log, i in chosen))
            sent.append(np.mean([log["bytes_sent"][i] for log, i in chosen]))
            its.append(min(log["iteration"][i] for log, i in chosen))
        return {"mark": np.array(marks), self.measure.key: np.array(acc),
                "time_s": np.array(time_s), "bytes_sent": np.array(sent),
                "iteration": np.array(its)}

    def summary(self) -> Dict[str, Any]:
        """The JSON summary: final accuracy (or held-out loss, and its bits per
        character), wall time, iterations, bytes, time to the target (None when not
        reached)."""
        m = self.measure
        last = [{f: log[f][-1] for f in fields(m)} for log in self.logs
                if len(log["mark"])]
        curve = self.curve()
        hit = np.nonzero(m.reached(curve[m.key], self.target))[0]
        wall = max(r["time_s"] for r in last)
        final = float(np.mean([r[m.column] for r in last]))
        per_char = {} if m.higher_is_better else \
            {"final_bits_per_char": bits_per_char(final)}
        return {
            "label": self.label,
            f"final_test_{m.key}": final,
            f"final_test_{m.key}_min": float(min(r[m.column] for r in last)),
            f"final_test_{m.key}_max": float(max(r[m.column] for r in last)),
            **per_char,
            "final_loss": float(np.nanmean([r["loss"] for r in last])),
            "wall_time_s": float(wall),
            "iterations": int(self.config.get("iters", max(r["iteration"] for r in last))),
            "iters_per_s": float(np.median([r["iteration"] / max(r["time_s"], 1e-9)
                                            for r in last])),
            "bytes_sent_per_rank": float(np.mean([r["bytes_sent"] for r in last])),
            "wait_fraction": float(np.mean([r["wait_s"] / max(r["time_s"], 1e-9)
                                            for r in last])),
            f"target_{m.key}": self.target,
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
    m = of_summary(summaries[0]) if summaries else ACCURACY
    head = ("run", "final acc %", "min-max %", "wall s", "it/s", "to target s",
            "MB/rank to target", "MB/rank", "wait %") if m.higher_is_better else \
        ("run", "held-out loss", "min-max", "bits/char", "wall s", "it/s", "to target s",
         "MB/rank to target", "MB/rank", "wait %")
    rows = [head]
    for s in summaries:
        mb = s["bytes_sent_per_rank"] / 1e6
        to_mb = None if s["bytes_to_target_per_rank"] is None \
            else s["bytes_to_target_per_rank"] / 1e6
        final = (_fmt(100 * s["final_test_accuracy"], ".2f"),
                 f"{100 * s['final_test_accuracy_min']:.1f}-"
                 f"{100 * s['final_test_accuracy_max']:.1f}") if m.higher_is_better else \
            (_fmt(s["final_test_loss"], ".3f"),
             f"{s['final_test_loss_min']:.3f}-{s['final_test_loss_max']:.3f}",
             _fmt(s["final_bits_per_char"], ".2f"))
        rows.append((
            s["label"], *final,
            _fmt(s["wall_time_s"], ".2f"), _fmt(s["iters_per_s"], ".1f"),
            _fmt(s["time_to_target_s"], ".2f", "not reached"), _fmt(to_mb, ".2f"),
            _fmt(mb, ".2f"), _fmt(100 * s["wait_fraction"], ".1f")))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                       for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    if not m.higher_is_better:
        return "\n".join(lines) + f"\n(target held-out loss " \
            f"{m.target_text(summaries[0]['target_loss'])}; loss: mean over ranks of each " \
            f"replica's cross-entropy per character on the same held-out sample, in nats)"
    target = summaries[0]["target_accuracy"] if summaries else 0
    return "\n".join(lines) + f"\n(target accuracy {100 * target:.1f}%; accuracy: mean " \
                              f"over ranks of each replica's test accuracy)"


def write_h5(path: str, results: Sequence[RunResult]) -> None:
    """Per run and rank, every metric column; per run the config and summary (JSON).
    Written beside `path` and renamed over it: a process ended while writing leaves the
    file it had, never half of one."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    part = f"{path}.tmp{os.getpid()}"
    with h5py.File(part, "w") as f:
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
    os.replace(part, path)


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
            m = of_summary(summary)
            results.append(RunResult(str(g.attrs.get("label", summary["label"])), config,
                                     logs, float(summary[f"target_{m.key}"]),
                                     extra=json.loads(g.attrs.get("extra", "{}")),
                                     metric=m.key))
        # h5py lists groups by name; the runs' order is the order they were written
        order = {r: i for i, r in enumerate(json.loads(f.attrs["order"]))} \
            if "order" in f.attrs else {}
    return sorted(results, key=lambda r: order.get(r.label, 0))


def plot(path: str, results: Sequence[RunResult], title: str) -> str:
    """Test accuracy (or held-out loss) over time and over iterations, one line per run,
    as one PNG."""
    from ..plot.lines import line_panels

    m = results[0].measure if results else ACCURACY
    over_time = {r.label: (r.curve()["time_s"], m.scale * r.curve()[m.key])
                 for r in results}
    over_iters = {r.label: (r.curve()["iteration"], m.scale * r.curve()[m.key])
                  for r in results}
    return line_panels([(over_time, "time (s)"), (over_iters, "iterations")], path,
                       title=title, ylabel=m.label)
