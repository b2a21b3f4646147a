"""A MirroredStrategy step over two logical CPU devices equals the single-device step on the
same global batch (weights after two SGD-with-momentum steps with weight decay, 1e-5 relative).

Logical devices must be configured before TensorFlow starts, so each comparison runs in a
fresh interpreter. The random start is replaced by noise that depends on each example alone,
so that one device and two replicas (which draw per-replica streams) start from the same δ.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = """
import sys
import numpy as np
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import keras
from fbat_tf import constraints, methods
from fbat_tf.distribute import create_strategy
from fbat_tf.trainer import AdversarialTrainer

constraints.uniform_noise = lambda x, eps, seed: eps * tf.sin(1000.0 * x + 1.0)


def run(strategy_name, name):
    strategy = create_strategy(strategy_name)
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([
            keras.Input((6, 6, 2)),
            keras.layers.Conv2D(4, 3),
            keras.layers.Activation("softplus"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(3),
        ])
        trainer = AdversarialTrainer(model, methods.create(name, eps=8 / 255), jit_compile=True)
        trainer.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9))
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, (8, 6, 6, 2)).astype(np.float32)
    y = rng.integers(0, 3, 8).astype(np.int32)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(8).repeat(2)
    trainer.fit(dataset, epochs=1, steps_per_epoch=2, verbose=0, shuffle=False)
    return [w.numpy() for w in model.trainable_variables], strategy.num_replicas_in_sync


name = sys.argv[1]
single, one = run("default", name)
mirrored, two = run("mirrored", name)
error = max(
    float(np.max(np.abs(a - b)) / np.max(np.abs(a))) for a, b in zip(single, mirrored)
)
moved = max(float(np.max(np.abs(a))) for a in single)
print("RESULT", one, two, error, moved)
"""


@pytest.mark.parametrize("method", ["fastbat"])
def test_mirrored_step_equals_single_device_step(method):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, method],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT")]
    assert result.returncode == 0 and lines, result.stderr[-3000:]
    _, one, two, error, _ = lines[-1].split()
    assert (int(one), int(two)) == (1, 2)
    assert float(error) < 1e-5


@pytest.mark.parametrize(
    ("task", "chief"),
    [({"type": "worker", "index": 0}, True), ({"type": "worker", "index": 1}, False)],
)
def test_only_worker_zero_writes(monkeypatch, task, chief):
    import json
    import types

    import tensorflow as tf

    from fbat_tf.distribute import is_chief

    cluster = {"worker": ["localhost:12345", "localhost:12346"]}
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": task}))
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    assert is_chief(types.SimpleNamespace(cluster_resolver=resolver)) is chief


REPLICA_NOISE_SCRIPT = """
import numpy as np
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import keras
from fbat_tf import methods
from fbat_tf.distribute import create_strategy
from fbat_tf.trainer import AdversarialTrainer


def model():
    keras.utils.set_random_seed(0)
    return keras.Sequential([
        keras.Input((6, 6, 2)),
        keras.layers.Conv2D(4, 3),
        keras.layers.Activation("softplus"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(3),
    ])


rng = np.random.default_rng(0)
x = rng.uniform(0, 1, (8, 6, 6, 2)).astype(np.float32)
y = rng.integers(0, 3, 8).astype(np.int32)
strategy = create_strategy("mirrored")
with strategy.scope():
    mirrored = model()
    trainer = AdversarialTrainer(
        mirrored, methods.create("fastat", eps=16 / 255), weight_decay=0.0, seed=5,
        jit_compile=False,
    )
    trainer.compile(optimizer=keras.optimizers.SGD(0.5))
seeds = [s.numpy() for s in strategy.experimental_local_results(strategy.run(trainer.step_seed))]
trainer.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(8), epochs=1, verbose=0)

# One device: each half of the batch with its replica's seed, the gradients averaged.
single = model()
method = methods.create("fastat", eps=16 / 255)
halves = [
    method.gradients(single, x[4 * i : 4 * i + 4], y[4 * i : 4 * i + 4], tf.constant(seeds[i]))[0]
    for i in range(2)
]
expected = [w.numpy() - 0.5 * (a.numpy() + b.numpy()) / 2 for w, a, b in zip(
    single.trainable_variables, *halves)]
error = max(
    float(np.max(np.abs(e - w.numpy())) / np.max(np.abs(e)))
    for e, w in zip(expected, mirrored.trainable_variables)
)
# The same seed for both halves gives another step.
same = [
    method.gradients(single, x[4 * i : 4 * i + 4], y[4 * i : 4 * i + 4], tf.constant(seeds[0]))[0]
    for i in range(2)
]
other = max(
    float(np.max(np.abs(a.numpy() + b.numpy() - c.numpy() - d.numpy())))
    for a, b, c, d in zip(*halves, *same)
)
print("RESULT", seeds[0].tolist() != seeds[1].tolist(), error, other)
"""


def test_each_replica_draws_its_own_noise_and_the_step_matches_one_device():
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)
    result = subprocess.run(
        [sys.executable, "-c", REPLICA_NOISE_SCRIPT],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT")]
    assert result.returncode == 0 and lines, result.stderr[-3000:]
    _, differ, error, other = lines[-1].split()
    assert differ == "True"
    assert float(error) < 1e-5
    assert float(other) > 1e-4  # the noise matters to the step


def test_a_non_chief_worker_trains_without_writing_into_the_workdir(tmp_path, monkeypatch):
    """train() on a worker that is not the chief (the chief test patched to say so) runs the
    whole run, callbacks included, and leaves the workdir and the temporary directory as they
    were."""
    import glob
    import tempfile

    from fbat_tf import distribute
    from fbat_tf.training import TrainConfig, train

    monkeypatch.setattr(distribute, "is_chief", lambda strategy: False)
    workdir = tmp_path / "run"
    scratch = os.path.join(tempfile.gettempdir(), "fbat_worker_*")
    before = set(glob.glob(scratch))
    results = train(
        TrainConfig(
            workdir=str(workdir),
            method="fastat",
            dataset="fashion_mnist",
            model="small_cnn",
            width=4,
            epochs=1,
            batch_size=64,
            max_train_examples=128,
            val_examples=64,
            val_attack_steps=1,
            eval_examples=64,
            eval_pgd_steps=1,
            eval_pgd_restarts=1,
            eval_autoattack=False,
            jit_compile=False,
            download=False,
            tensorboard_every=0,
            verbose=0,
        )
    )
    assert results["status"] == "complete" and results["optimizer_steps"] == 2
    assert not workdir.exists()
    assert set(glob.glob(scratch)) == before
