"""Runs of one seed are paired whatever their method: the same initial weights and the same
first training batch (results.json's `pairing`, which reports check before pairing runs), and
evaluate.py attacks the same test points with the same seed."""

from __future__ import annotations

import dataclasses
import os

import keras
import pytest

from fbat_tf import data, run
from fbat_tf.training import fingerprint, train
from tests.tiny import fashion_mnist_config

FASHION_MNIST = "/usr/share/datasets/fashion-mnist"


def tiny(tmp_path, method: str, seed: int):
    config = fashion_mnist_config(
        str(tmp_path / f"{method}-{seed}"), method=method, seed=seed, width=2, batch_size=16
    )
    # Pairing is decided before the first step: no final test is needed to see it.
    return train(
        dataclasses.replace(config, max_train_examples=64, steps_per_epoch=1, final_test=False)
    )


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir(FASHION_MNIST), reason="needs dataset-fashion-mnist")
def test_runs_of_one_seed_share_initial_weights_and_data_order_whatever_the_method(tmp_path):
    runs = {
        (method, seed): tiny(tmp_path, method, seed)
        for method, seed in (("standard", 0), ("fastbat", 0), ("free", 0), ("standard", 1))
    }
    pairing = {key: result.pairing for key, result in runs.items()}
    assert pairing["standard", 0] == pairing["fastbat", 0] == pairing["free", 0]
    # Another seed draws other weights and another first batch: the check can fail.
    other = pairing["standard", 1]
    assert other["initial_weights"] != pairing["standard", 0]["initial_weights"]
    assert other["first_batch"] != pairing["standard", 0]["first_batch"]

    # The fingerprints are of what the run trained from: the first batch of the seed's stream,
    # and the weights a model of the run's architecture gets from the seed.
    stream = data.load(
        "fashion_mnist", "train", batch_size=16, max_examples=64, seed=0, repeat=True
    )
    batch = next(iter(stream))
    assert pairing["fastbat", 0]["first_batch"] == fingerprint(batch)
    keras.utils.set_random_seed(0)
    model = run.build_architecture("small_cnn", "fashion_mnist", "relu", 2)
    assert pairing["fastbat", 0]["initial_weights"] == fingerprint(model.get_weights())


def test_a_sweeps_cells_are_evaluated_on_the_same_points_with_the_same_seed():
    """What pairs the evaluations of runs: every cell's evaluate.py command is the same but for
    its own run directory and results file (the first N test images, evaluate.py's default
    --seed), whatever the cell's method and seed."""
    from fbat_tf import sweeps

    definition = sweeps.load_definition(
        os.path.join(
            os.path.dirname(os.path.dirname(__file__)),
            "study",
            "definitions",
            "fashion_mnist_fast.json",
        )
    )
    cells = sweeps.expand(definition)
    commands = {}
    for cell in cells:
        for name, words in sweeps.commands(definition, cell, "out").items():
            if name != "train":
                kept = [w for w in words if "out/" not in w]
                commands.setdefault(name, set()).add(tuple(kept))
    assert set(commands) == {"pgd", "autoattack"}
    # One command per evaluation and ε: nothing of a cell's method or seed reaches it.
    for name, found in commands.items():
        assert len(found) == len(definition.eps_values()), name
        assert not any(w.startswith("--seed") for command in found for w in command)
