"""A sweep's tuning stage: candidates trained on tuning seeds, picked by validation alone (never
the test split), the pick's flags given to the final cells, which wait for it under every
launcher, and the report's Tuning section."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from fbat_tf.records import RunRecord
from tests.test_sweep import ROOT
from tests.tiny import FASHION_MNIST, fashion_mnist_config

needs_data = pytest.mark.skipif(
    not os.path.isdir(FASHION_MNIST), reason="needs dataset-fashion-mnist"
)


# train.py without its final test --------------------------------------------------------------


@needs_data
def test_a_run_without_its_final_test_never_builds_the_test_split(tmp_path, monkeypatch):
    """final_test=False: the run trains and validates, records no test numbers, and the data
    loader is never asked for the test split."""
    from fbat_tf import training

    asked = []
    load = training.data.load

    def spy(name, split, **kwargs):
        asked.append(split)
        return load(name, split, **kwargs)

    monkeypatch.setattr(training.data, "load", spy)
    workdir = str(tmp_path / "run")
    record = training.train(fashion_mnist_config(workdir, final_test=False))
    assert "test" not in asked and {"train", "validation"} <= set(asked)
    assert record.status == "complete" and record.final is None
    saved = RunRecord.load(os.path.join(workdir, "results.json"))
    assert saved.final is None and saved.config.final_test is False
    assert saved.selected_epoch().val_robust_accuracy is not None
    with open(os.path.join(workdir, "results.json")) as f:
        assert "final" not in json.load(f)


def test_train_py_refuses_final_test_flags_without_a_final_test(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "train.py",
            "--nofinal_test",
            "--eval_examples=10",
            "--noeval_autoattack",
            f"--workdir={tmp_path / 'run'}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("error: --eval_examples, --eval_autoattack:"), line
    assert "--nofinal_test" in line
    assert not (tmp_path / "run").exists()
