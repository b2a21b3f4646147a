"""A new attack is its module plus one registry line: evaluate.py then makes flags of its
options, builds it by name and labels it, as it does the library's own attacks."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from fbat_tf import data
from fbat_tf.classifiers import load_classifier
from tests.test_sweep import TINY_FLAGS
from tests.trees import project_copy, run_sweep

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
TOY_LINE = """

def _toy():
    from fbat_tf.attacks.toy import Toy

    return Toy


REGISTRY["toy"] = Entry(
    "toy",
    _toy,
    "Toy-{strength}",
    (Option("strength", 1.0, "Toy step in units of eps.", lower_bound=0.0),),
)
"""


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir(FASHION_MNIST), reason="needs dataset-fashion-mnist")
def test_a_toy_attack_with_one_option_runs_in_a_sweep_and_through_evaluate_py(tmp_path):
    """In a copy of the project with the toy's module and its registry line, a sweep definition
    names the toy with an option; sweep.py trains a tiny cell and evaluate.py attacks it with
    the toy. Its number equals the same perturbation computed here on the cell's model."""
    tree = pathlib.Path(project_copy(tmp_path))
    (tree / "fbat_tf" / "attacks" / "toy.py").write_text(TOY_MODULE)
    with open(tree / "fbat_tf" / "attacks" / "__init__.py", "a") as f:
        f.write(TOY_LINE)

    definition = {
        "description": "a toy attack",
        "flags": {**TINY_FLAGS, "max_train_examples": 1024, "lr_max": 0.05},
        "grid": [{"method": ["standard"], "eps": [255]}],
        "evaluation": {
            "batch_size": 64,
            "attacks": [
                {"attack": "toy", "eps": "own", "examples": 64, "options": {"strength": 0.5}}
            ],
        },
    }
    (tree / "configs" / "sweeps" / "toy.json").write_text(json.dumps(definition))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(tree))
    done = run_sweep(tree, "--sweep=toy")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    cell = tree / "results" / "toy" / "standard-eps255"
    measured = json.loads((cell / "eval-toy.json").read_text())
    assert measured["toy_strength"] == 0.5
    assert "Toy-0.5" in (tree / "results" / "toy" / "sweep.md").read_text()
    command = (tree / "results" / "toy" / "logs" / "standard-eps255.evaluate.log").read_text()
    assert "--attacks=toy" in command and "--toy_strength=0.5" in command

    # The same perturbation, computed here on the cell's selected model and 64 test images.
    model, _ = load_classifier(str(cell))
    x, y = next(iter(data.load("fashion_mnist", "test", batch_size=64, max_examples=64)))
    x_adv = np.clip(x + 0.5 * (255 / 255) * np.sign(x - 0.5), 0.0, 1.0)
    predicted = np.argmax(model(tf.constant(x_adv, tf.float32), training=False), axis=-1)
    clean_predicted = np.argmax(model(x, training=False), axis=-1)
    # Robust: right at the toy's point and on the clean image.
    expected = float(np.mean((predicted == y.numpy()) & (clean_predicted == y.numpy())))
    clean = float(np.mean(clean_predicted == y.numpy()))
    assert measured["clean_accuracy"] == pytest.approx(clean, abs=1e-9)
    # The toy changes predictions, so a toy that was not applied would be seen.
    assert np.any(predicted != clean_predicted)
    assert measured["robust_accuracy"]["toy@255"] == pytest.approx(expected, abs=1e-9)

    # Without the registry line the name is refused before any work.
    refused = subprocess.run(
        [sys.executable, "evaluate.py", f"--model_path={cell}", "--attacks=toy"],
        cwd=ROOT,
        env=dict(env, PYTHONPATH=ROOT),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert refused.returncode != 0 and "--attacks takes names from" in refused.stderr
