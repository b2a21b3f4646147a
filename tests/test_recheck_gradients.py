"""`python -m fbat_tf.recheck_gradients`: an evaluation whose zero-gradient check counted points
the model gets wrong (the check before it looked only at the points classified right) gets the
check computed again from its model, on its points: the committed L2 PGD-AT MLP, whose first 64
test points include 9 where the old check saw a zero DLR gradient, all of them misclassified.
The file's other parts stay as they were, the old check is kept beside the new, a second run
changes nothing, and a link is left alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tests.test_indicators import MLP
from tests.test_train_cli import FASHION_MNIST, ROOT

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not os.path.isdir(FASHION_MNIST), reason="needs dataset-fashion-mnist"),
]

OLD = {"fired": True, "detail": "9 of 64 points: the DLR gradient is zero", "keys": []}


def old_style_zero_points() -> int:
    """The check as it was: the DLR gradient at APGD's start on every one of the 64 points."""
    import keras

    from fbat_tf import checks, constraints, data
    from fbat_tf.attacks import losses

    mlp = keras.saving.load_model(MLP)
    x, y = next(iter(data.load("fashion_mnist", "test", batch_size=64, max_examples=64)))[:2]
    y = tf.cast(y, tf.int32)
    start = checks.apgd_start(x, 1.5, "l2", constraints.as_seed(0))
    grad = checks.input_gradients(mlp, start, lambda z: losses.dlr(z, y))
    zero = np.abs(grad).sum(1) == 0
    right = np.argmax(mlp(x), -1) == y.numpy()
    assert not (zero & right).any()  # every such point is one the model gets wrong
    return int(zero.sum())


def evaluation() -> dict:
    return {
        "examples": 64,
        "clean_accuracy": 0.656,
        "robust_accuracy": {"pgd@l2:1.5": 0.3},
        "per_batch": [{"examples": 64, "clean_accuracy": 0.656, "robust_accuracy": {}}],
        "dataset": "fashion_mnist",
        "model_path": MLP,
        "split": "test",
        "validation_from": "train",
        "seed": 0,
        "norm": "l2",
        "fold_weights": False,
        "indicators": {
            "points": 32,
            "seconds": 1.0,
            "attacks": {},
            "checks": {"zero_gradients": OLD},
        },
    }


def recheck(*paths: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fbat_tf.recheck_gradients", *paths],
        cwd=ROOT,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_check_that_counted_misclassified_points_is_computed_again(tmp_path):
    assert old_style_zero_points() == 9
    run = tmp_path / "run"
    run.mkdir()
    path = run / "eval-pgd.json"
    path.write_text(json.dumps(evaluation()))
    (tmp_path / "elsewhere.json").write_text(json.dumps(evaluation()))
    (run / "eval-linked.json").symlink_to(tmp_path / "elsewhere.json")
    copy = tmp_path / "run" / "code" / "abc" / "eval-pgd.json"  # a sweep's pinned code copy
    copy.parent.mkdir(parents=True)
    copy.write_text(json.dumps(evaluation()))

    done = recheck(str(tmp_path))
    assert done.returncode == 0, done.stderr[-2000:]
    rewritten = json.loads(path.read_text())
    check = rewritten["indicators"]["checks"]["zero_gradients"]
    assert check["fired"] is False
    assert check["detail"].startswith("0 of the 42 points the model classifies right")
    assert check["rechecked"]["before"] == OLD
    assert check["rechecked"]["code"]["package"] == "fbat-tf"
    # Nothing else changed.
    expected = evaluation()
    rewritten["indicators"]["checks"]["zero_gradients"] = OLD
    assert rewritten == expected
    assert f"{path}: quiet: 0 of the 42 points" in done.stdout
    assert "1 checks computed again, 1 of them changed" in done.stdout
    assert f"{run / 'eval-linked.json'}: a link, left as it is" in done.stdout
    assert json.loads((tmp_path / "elsewhere.json").read_text()) == evaluation()
    assert json.loads(copy.read_text()) == evaluation()

    again = recheck(str(path))
    assert again.returncode == 0 and "0 checks computed again" in again.stdout
    missing = recheck(str(tmp_path / "nothing"))
    assert missing.returncode == 2 and "nothing: no such file or folder" in missing.stderr
