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
