"""A new training method or attack is its module plus one registry line: train.py then makes a
flag of the method's option, records it and builds the method with it; evaluate.py makes flags
of the attack's options, builds it by name and labels it; a sweep definition names both, with
their options, as it does the library's own methods and attacks."""

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
from tests.test_sweep import TINY_FLAGS_WITHOUT_FINAL_TEST
from tests.trees import project_copy, run_sweep

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FASHION_MNIST = "/usr/share/datasets/fashion-mnist"

# Written as the library's methods are: TensorFlow named through fbat_tf/lazy.py, so that the
# registry imports the module without it and train.py parses (and refuses) flags at once.
TOY_METHOD = '''
from fbat_tf.lazy import later
from fbat_tf.methods.base import Method, train_on
from fbat_tf.methods.declarations import Entry, Option

tf = later("tensorflow")

OPTIONS = (Option("scale", float, 0.5, "Toy step in units of eps.", lower_bound=0.0),)


class Toy(Method):
    """Trains on every pixel moved by scale·ε away from mid-grey, clipped to [0, 1]; logs the
    largest move of the batch."""

    name = "toy"
    log_names = ("loss", "adv_accuracy", "toy_max_shift")

    def __init__(self, eps, scale=OPTIONS[0].default):
        super().__init__(eps)
        self.scale = float(scale)

    def gradients(self, model, x, y, seed, loss_scale=None):
        x_adv = tf.clip_by_value(x + self.scale * self.eps * tf.sign(x - 0.5), 0.0, 1.0)
        grads, logs = train_on(model, x_adv, y, loss_scale)
        return grads, {**logs, "toy_max_shift": tf.reduce_max(tf.abs(x_adv - x))}

    def config(self):
        return {**super().config(), "scale": self.scale}


ENTRY = Entry(Toy, OPTIONS)
'''
TOY_METHOD_LINE = "from fbat_tf.methods import toy  # noqa: E402\nregister(toy.ENTRY)\n"

TOY_ATTACK = '''
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
TOY_ATTACK_LINE = """

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


def _program(where, *args: str) -> subprocess.CompletedProcess:
    """`python args...` in the folder `where`, its own code first on the path (the project copy
    with the toys, or the repository without them)."""
    return subprocess.run(
        [sys.executable, *args],
        cwd=where,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(where)),
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir(FASHION_MNIST), reason="needs dataset-fashion-mnist")
def test_a_toy_method_and_a_toy_attack_with_one_option_each_run_in_a_sweep(tmp_path):
    """In a copy of the project with both toys' modules and registry lines, a sweep definition
    names the toy method and sets its option, and evaluates with the toy attack and its option;
    sweep.py trains the one cell with train.py and evaluate.py attacks it with the toy.

    The method's option is on train.py's command line, in the run's config and in the method
    the steps ran: the largest move the toy logs is scale·ε, which pixels between 0.25 and 0.75
    reach. The attack's number equals the same perturbation computed here on the cell's
    model."""
    tree = pathlib.Path(project_copy(tmp_path))
    (tree / "fbat_tf" / "methods" / "toy.py").write_text(TOY_METHOD)
    with open(tree / "fbat_tf" / "methods" / "__init__.py", "a") as f:
        f.write(TOY_METHOD_LINE)
    (tree / "fbat_tf" / "attacks" / "toy.py").write_text(TOY_ATTACK)
    with open(tree / "fbat_tf" / "attacks" / "__init__.py", "a") as f:
        f.write(TOY_ATTACK_LINE)

    helped = _program(tree, "train.py", "--helpfull")
    assert "--toy_scale: Toy step in units of eps." in helped.stdout

    definition = {
        "description": "a toy method evaluated by a toy attack",
        "flags": {
            **TINY_FLAGS_WITHOUT_FINAL_TEST,
            "epochs": 1,
            "max_train_examples": 1024,
            "lr_max": 0.05,
        },
        "grid": [{"method": ["toy"], "toy_scale": [0.25], "eps": [255]}],
        "evaluation": {
            "batch_size": 64,
            "attacks": [
                {"attack": "toy", "eps": "own", "examples": 64, "options": {"strength": 0.5}}
            ],
        },
    }
    (tree / "configs" / "sweeps" / "toy.json").write_text(json.dumps(definition))
    done = run_sweep(tree, "--sweep=toy")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    (cell,) = (tree / "results" / "toy").glob("toy-*")
    report = (tree / "results" / "toy" / "sweep.md").read_text()

    # The method: its option on the command line, in the config, in the steps.
    assert "--toy_scale=0.25" in (cell / "flags.txt").read_text().split("\n")
    results = json.loads((cell / "results.json").read_text())
    assert results["status"] == "complete"
    assert results["config"]["method_options"] == {"scale": 0.25}
    assert results["method"]["scale"] == 0.25
    assert results["history"][0]["toy_max_shift"] == pytest.approx(0.25, abs=1e-6)
    assert "toy toy_scale=0.25" in report

    # The attack: its option on evaluate.py's command line, in its record and its label.
    measured = json.loads((cell / "eval-toy.json").read_text())
    assert measured["toy_strength"] == 0.5
    assert "Toy-0.5" in report
    command = (tree / "results" / "toy" / "logs" / f"{cell.name}.evaluate.log").read_text()
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

    # An option value out of its declared range is refused before any work, naming it.
    refused = _program(
        tree, "train.py", "--method=toy", "--toy_scale=-1", f"--workdir={tmp_path}/r"
    )
    assert refused.returncode != 0 and "toy_scale" in refused.stderr
    assert not (tmp_path / "r").exists()
    # Without the registry lines the names are refused before any work.
    unknown = _program(ROOT, "train.py", "--method=toy", f"--workdir={tmp_path}/r")
    assert unknown.returncode != 0 and "--method" in unknown.stderr
    assert not (tmp_path / "r").exists()
    refused = _program(ROOT, "evaluate.py", f"--model_path={cell}", "--attacks=toy")
    assert refused.returncode != 0 and "--attacks takes names from" in refused.stderr
