"""A new attack is its module plus one registry line: evaluate.py then makes flags of its
options, builds it by name and labels it, as it does the library's own attacks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from fbat_tf import data
from tests.test_evaluate_cli import small_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FASHION_MNIST = "/usr/share/datasets/fashion-mnist"

TOY_MODULE = '''
import tensorflow as tf

from fbat_tf.attacks.base import Attack


class Toy(Attack):
    """Every pixel moved by strength·ε away from mid-grey, then clipped to [0, 1]."""

    def __init__(self, eps, strength=1.0):
        self.eps = float(eps)
        self.strength = float(strength)

    def perturb(self, model, x, y, seed):
        step = self.strength * self.eps * tf.sign(x - 0.5)
        return tf.clip_by_value(x + step, 0.0, 1.0)
'''
TOY_LINE = (
    'REGISTRY["toy"] = Entry("toy", "fbat_tf.attacks.toy:Toy", "Toy-{strength}", '
    '(Option("strength", 1.0, "Toy step in units of eps.", lower_bound=0.0),))\n'
)


@pytest.mark.skipif(not os.path.isdir(FASHION_MNIST), reason="needs dataset-fashion-mnist")
def test_a_toy_attack_with_one_option_runs_through_evaluate_py(tmp_path):
    tree = tmp_path / "tree"
    ignore = shutil.ignore_patterns("__pycache__")
    for package in ("fbat_tf", "flags"):
        shutil.copytree(os.path.join(ROOT, package), tree / package, ignore=ignore)
    shutil.copy(os.path.join(ROOT, "evaluate.py"), tree / "evaluate.py")
    (tree / "fbat_tf" / "attacks" / "toy.py").write_text(TOY_MODULE)
    with open(tree / "fbat_tf" / "attacks" / "__init__.py", "a") as f:
        f.write(TOY_LINE)

    model_path = str(tmp_path / "model.keras")
    model = small_model(None)
    model.save(model_path)
    results = tmp_path / "eval.json"
    command = [
        sys.executable,
        "evaluate.py",
        f"--model_path={model_path}",
        "--dataset=fashion_mnist",
        "--attacks=toy",
        "--toy_strength=0.5",
        "--eps=40",
        "--n_examples=64",
        f"--results={results}",
    ]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(tree))
    done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| Toy-0.5 | 40 |" in done.stdout
    measured = json.loads(results.read_text())
    assert measured["toy_strength"] == 0.5

    # The same perturbation, computed here on the same 64 test images.
    x, y = next(iter(data.load("fashion_mnist", "test", batch_size=64, max_examples=64)))
    x_adv = np.clip(x + 0.5 * (40 / 255) * np.sign(x - 0.5), 0.0, 1.0)
    predicted = np.argmax(model(tf.constant(x_adv, tf.float32), training=False), axis=-1)
    expected = float(np.mean(predicted == y.numpy()))
    clean = float(np.mean(np.argmax(model(x, training=False), axis=-1) == y.numpy()))
    assert expected != clean  # the attack moves the accuracy, so the check can fail
    assert measured["robust_accuracy"]["toy@40"] == pytest.approx(expected, abs=1e-9)

    # Without the registry line the name is refused before any work.
    refused = subprocess.run(
        command[:4] + ["--attacks=toy", f"--results={tmp_path / 'other.json'}"],
        cwd=ROOT,
        env=dict(env, PYTHONPATH=ROOT),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert refused.returncode != 0 and "--attacks takes names from" in refused.stderr
