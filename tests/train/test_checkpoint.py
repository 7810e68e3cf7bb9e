"""Checkpoint files (asapmpi.train.checkpoint): a write stopped halfway leaves only its
temporary file, never a checkpoint under its name, and a resume removes what it left."""
import os

import numpy as np
import pytest

from asapmpi.train.checkpoint import CheckpointDir, load_tree


class _Stopped(Exception):
    pass


def _tree(value):
    return {"model": {"w": np.full(4, value, np.float32)}, "iteration": value,
            "metrics": {"loss": np.arange(3.0)}, "config": {"sync": "notify_ack"}}


def test_a_write_stopped_halfway_leaves_no_checkpoint_under_its_name(tmp_path):
    ckpts = CheckpointDir(str(tmp_path), 1)
    ckpts.save(20, _tree(20))
    seen = []

    def midway():
        # the file is open, under its temporary name only, with part of the tree in it
        seen.append(sorted(os.listdir(ckpts.folder)))
        raise _Stopped                  # as a rank killed here stops writing

    with pytest.raises(_Stopped):
        ckpts.save(40, _tree(40), midway)
    [names] = seen
    assert names[0] == "iter_000000020.h5" and names[1].startswith("iter_000000040.h5.tmp")
    assert ckpts.iterations() == [20] and not ckpts.readable(40)
    assert load_tree(ckpts.path(20))["iteration"] == 20
    # a resume from 20 removes the temporary file (no write of the new job finishes it)
    # and keeps the checkpoint it resumes from
    assert ckpts.drop_after(20) == []
    assert sorted(os.listdir(ckpts.folder)) == ["iter_000000020.h5"]
    # written again, whole
    ckpts.save(40, _tree(40))
    back = load_tree(ckpts.path(40))
    assert back["iteration"] == 40 and np.array_equal(back["model"]["w"], np.full(4, 40.0))
    assert list(back) == list(_tree(40))


def test_midway_comes_once_halfway_through_the_tree(tmp_path):
    calls = []
    CheckpointDir(str(tmp_path), 0).save(10, _tree(10), lambda: calls.append(1))
    assert calls == [1]
    assert load_tree(CheckpointDir(str(tmp_path), 0).path(10))["config"] == \
        {"sync": "notify_ack"}
