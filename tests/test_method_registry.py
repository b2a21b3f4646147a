"""A new training method is its module plus one registry line: train.py then makes a flag of its
option, records it, and builds the method with it; a sweep definition names the method and its
option, as it does the library's own methods."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from tests.test_sweep import PGD_OWN, TINY_FLAGS
from tests.trees import project_copy, run_sweep

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FASHION_MNIST = "/usr/share/datasets/fashion-mnist"

TOY_MODULE = '''
import tensorflow as tf

from fbat_tf.methods.base import Method, train_on
from fbat_tf.methods.declarations import Entry, Option

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
TOY_LINE = "from fbat_tf.methods import toy  # noqa: E402\nregister(toy.ENTRY)\n"


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir(FASHION_MNIST), reason="needs dataset-fashion-mnist")
def test_a_toy_method_with_one_option_trains_through_train_py_and_a_sweep(tmp_path):
    """In a copy of the project with the toy's module and its registry line, a sweep definition
    names the toy and sets its option; sweep.py trains the cell with train.py. The option is on
    train.py's command line, in the run's config and in the method the steps ran: the largest
    move the toy logs is scale·ε, which pixels between 0.25 and 0.75 reach."""
    tree = pathlib.Path(project_copy(tmp_path))
    (tree / "fbat_tf" / "methods" / "toy.py").write_text(TOY_MODULE)
    with open(tree / "fbat_tf" / "methods" / "__init__.py", "a") as f:
        f.write(TOY_LINE)

    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(tree))
    helped = subprocess.run(
        [sys.executable, "train.py", "--helpfull"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "--toy_scale: Toy step in units of eps." in helped.stdout

    definition = {
        "description": "a toy method",
        "flags": {**TINY_FLAGS, "epochs": 1},
        "grid": [{"method": ["toy"], "toy_scale": [0.25], "eps": [255]}],
        "evaluation": PGD_OWN,
    }
    (tree / "configs" / "sweeps" / "toy.json").write_text(json.dumps(definition))
    done = run_sweep(tree, "--sweep=toy")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    (cell,) = (tree / "results" / "toy").glob("toy-*")
    assert "--toy_scale=0.25" in (cell / "flags.txt").read_text().split("\n")
    results = json.loads((cell / "results.json").read_text())
    assert results["status"] == "complete"
    assert results["config"]["method_options"] == {"scale": 0.25}
    assert results["method"]["scale"] == 0.25
    assert results["history"][0]["toy_max_shift"] == pytest.approx(0.25, abs=1e-6)
    assert "toy toy_scale=0.25" in (tree / "results" / "toy" / "sweep.md").read_text()

    # An option value out of its declared range is refused before any work, naming it.
    refused = subprocess.run(
        [sys.executable, "train.py", "--method=toy", "--toy_scale=-1", f"--workdir={tmp_path}/r"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode != 0 and "toy_scale" in refused.stderr
    assert not (tmp_path / "r").exists()
    # Without the registry line the name is refused before any work.
    unknown = subprocess.run(
        [sys.executable, "train.py", "--method=toy", f"--workdir={tmp_path}/r"],
        cwd=ROOT,
        env=dict(env, PYTHONPATH=ROOT),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert unknown.returncode != 0 and "--method" in unknown.stderr
    assert not (tmp_path / "r").exists()
