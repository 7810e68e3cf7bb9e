"""The training frameworks asapmpi embeds in, run under mpiexec as a user would: Hugging
Face's Trainer (asapmpi.torch.hf, examples/hf_trainer.py) and PyTorch Lightning
(asapmpi.torch.lightning, examples/lightning_module.py).  Each needs its optional extra;
without it the test is skipped."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from mpilaunch import above_the_core

pytestmark = [pytest.mark.mpi, above_the_core]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _example(name, ranks, *args, timeout=240):
    """Run examples/NAME on `ranks` ranks; return the summary its rank 0 wrote."""
    from mpilaunch import job_command

    out = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"asapmpi-{name}-{os.getpid()}.json")
    cmd, env = job_command(ranks, [sys.executable, os.path.join(ROOT, "examples", name),
                                   *args, "--json", out], timeout=timeout)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True,
                          timeout=timeout + 30, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    with open(out) as f:
        summary = json.load(f)
    os.unlink(out)
    return summary, proc


def test_the_hugging_face_trainer_trains_4_ranks_and_resumes_exactly(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    summary, proc = _example("hf_trainer.py", 4, "--check-resume", "--out", str(tmp_path))
    assert summary["steps"] == 60 and summary["ranks"] == 4, summary
    assert summary["loss_last"] < 0.7 * summary["loss_first"], summary
    # the average at the end of train() closed the gap the mixing left
    assert summary["replica_gap"] < 1e-6 < summary["replica_gap_before_average"] < 1e-3, \
        summary
    assert summary["resume_exact"], summary
    # each rank wrote its own checkpoints; rank 0 alone logged
    assert sorted(os.listdir(tmp_path)) == [f"rank{r:05d}" for r in range(4)]
    assert proc.stdout.count("'train_runtime'") == 2, proc.stdout    # two train() calls
    assert "MASTER_ADDR" not in proc.stderr


def test_the_lightning_strategy_trains_4_ranks_and_resumes_exactly(tmp_path):
    pytest.importorskip("lightning")
    summary, proc = _example("lightning_module.py", 4, "--check-resume", "--out",
                             str(tmp_path))
    # 2000 examples in DistributedSampler shards of 500, batches of 32, 4 epochs
    assert summary["steps"] == 64 and summary["ranks"] == 4, summary
    assert summary["loss_last"] < 0.6 * summary["loss_first"], summary
    assert summary["replica_gap"] < 1e-6 < summary["replica_gap_before_average"], summary
    assert summary["resume_exact"], summary
    assert summary["checkpoints"] == [f"checkpoints/rank{r:05d}/epoch={e}.ckpt"
                                      for r in range(4) for e in range(4)], summary
    assert "MASTER_ADDR" not in proc.stderr and "Traceback" not in proc.stderr
