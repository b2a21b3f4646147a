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

from tests.workers import local_tf_configs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _with_model(script: str) -> str:
    """The child's source with MODEL defined right after its imports (the first blank line
    after `from fbat_tf.trainer import AdversarialTrainer`)."""
    anchor = "from fbat_tf.trainer import AdversarialTrainer\n"
    assert anchor in script
    return script.replace(anchor, anchor + MODEL, 1)


# The little batch-norm-free model every child below trains (after `import keras`).
MODEL = """
def model():
    keras.utils.set_random_seed(0)
    return keras.Sequential([
        keras.Input((6, 6, 2)),
        keras.layers.Conv2D(4, 3),
        keras.layers.Activation("softplus"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(3),
    ])
"""

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
        classifier = model()
        method = methods.create(name, eps=8 / 255)
        method.build((8, 6, 6, 2))
        trainer = AdversarialTrainer(classifier, method, jit_compile=True)
        trainer.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9))
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, (8, 6, 6, 2)).astype(np.float32)
    y = rng.integers(0, 3, 8).astype(np.int32)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(8).repeat(2)
    trainer.fit(dataset, epochs=1, steps_per_epoch=2, verbose=0, shuffle=False)
    state = {k: float(v.numpy()) for k, v in method.variables().items() if v.shape.rank == 0}
    weights = [w.numpy() for w in classifier.trainable_variables]
    return weights, strategy.num_replicas_in_sync, state


name = sys.argv[1]
single, one, single_state = run("default", name)
mirrored, two, mirrored_state = run("mirrored", name)
# A method's own scalar state (ELLE-A's λ and E_lin statistic) moves as on one device.
assert single_state.keys() == mirrored_state.keys()
for key, value in single_state.items():
    assert np.isclose(mirrored_state[key], value, rtol=1e-5, atol=1e-9), (key, single_state)
assert name != "elle" or single_state["count"] == 2.0, single_state
error = max(
    float(np.max(np.abs(a - b)) / np.max(np.abs(a))) for a, b in zip(single, mirrored)
)
moved = max(float(np.max(np.abs(a))) for a in single)
print("RESULT", one, two, error, moved)
"""


def _result(script: str, *args: str) -> list[str]:
    """The words of the RESULT line that `script` (with the model) prints in a fresh process."""
    result = subprocess.run(
        [sys.executable, "-c", _with_model(script), *args],
        capture_output=True,
        text=True,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT),
        timeout=300,
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT")]
    assert result.returncode == 0 and lines, result.stderr[-3000:]
    return lines[-1].split()


@pytest.mark.slow
@pytest.mark.parametrize("method", ["fastbat", "elle"])
def test_mirrored_step_equals_single_device_step(method):
    _, one, two, error, _ = _result(SCRIPT, method)
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


@pytest.mark.slow
def test_each_replica_draws_its_own_noise_and_the_step_matches_one_device():
    _, differ, error, other = _result(REPLICA_NOISE_SCRIPT)
    assert differ == "True"
    assert float(error) < 1e-5
    assert float(other) > 1e-4  # the noise matters to the step


@pytest.mark.slow
def test_a_non_chief_worker_trains_without_writing_into_the_workdir(tmp_path, monkeypatch):
    """train() on a worker that is not the chief (the chief test patched to say so) resumes
    from the chief's checkpoint in the workdir, runs the rest of the run, callbacks included,
    and leaves the workdir and the temporary directory as they were."""
    import glob
    import tempfile

    from fbat_tf import distribute
    from fbat_tf.training import train
    from tests.tiny import fashion_mnist_config

    workdir = tmp_path / "run"
    chief = train(fashion_mnist_config(str(workdir), max_train_examples=128, epochs=1))
    assert chief.optimizer_steps == 2

    def mtimes():
        return {p: os.path.getmtime(p) for p in glob.glob(str(workdir / "**"), recursive=True)}

    written = mtimes()

    monkeypatch.setattr(distribute, "is_chief", lambda strategy: False)
    scratch = os.path.join(tempfile.gettempdir(), "fbat_worker_*")
    before = set(glob.glob(scratch))
    results = train(fashion_mnist_config(str(workdir), max_train_examples=128, epochs=2))
    assert results.status == "complete" and results.optimizer_steps == 4
    assert [e.epoch for e in results.history] == [2]  # epoch 1 came from the chief
    assert mtimes() == written
    assert set(glob.glob(scratch)) == before


MULTI_WORKER_SCRIPT = """
import json
import sys

import numpy as np
import tensorflow as tf
import keras
from fbat_tf import methods
from fbat_tf.distribute import create_strategy, is_chief
from fbat_tf.trainer import AdversarialTrainer



def data():
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, (16, 6, 6, 2)).astype(np.float32)
    return x, rng.integers(0, 3, 16).astype(np.int32)


def method():
    return methods.create("fastat", eps=16 / 255)


x, y = data()
if sys.argv[1] == "worker":
    strategy = create_strategy("multi_worker")
    with strategy.scope():
        trained = model()
        trainer = AdversarialTrainer(trained, method(), weight_decay=0.0, seed=5, jit_compile=False)
        trainer.compile(optimizer=keras.optimizers.SGD(0.5))
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(8).with_options(options)
    history = trainer.fit(dataset, epochs=1, verbose=0)
    print("RESULT", json.dumps({
        "chief": is_chief(strategy),
        "replicas": strategy.num_replicas_in_sync,
        "loss": history.history["loss"],
        "weights": [w.numpy().tolist() for w in trained.trainable_variables],
    }))
else:
    # One process: two SGD steps on the global batches of 8, each the mean of its halves'
    # gradients, half i drawing with fold_in([5, step], i) as replica i does.
    single = model()
    for step in range(2):
        halves = []
        for i in range(2):
            rows = slice(8 * step + 4 * i, 8 * step + 4 * i + 4)
            seed = tf.random.experimental.stateless_fold_in(
                tf.constant([5, step], tf.int64), tf.constant(i, tf.int64)
            )
            halves.append(method().gradients(single, x[rows], y[rows], tf.cast(seed, tf.int32))[0])
        for w, a, b in zip(single.trainable_variables, *halves):
            w.assign(w - 0.5 * (a + b) / 2)
    weights = [w.numpy().tolist() for w in single.trainable_variables]
    print("RESULT", json.dumps({"weights": weights}))
"""


@pytest.mark.slow
def test_two_worker_processes_take_the_steps_of_one_process():
    """MultiWorkerMirroredStrategy across two processes on 127.0.0.1 (TF_CONFIG), two steps of
    Fast-AT with real noise: both workers end with the weights one process computes from the
    same global batches, each half with its replica's seed; worker 0 alone is the chief."""
    import json

    import numpy as np

    children = []
    for tf_config in local_tf_configs(2):
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT, TF_CONFIG=tf_config)
        children.append(
            subprocess.Popen(
                [sys.executable, "-c", _with_model(MULTI_WORKER_SCRIPT), "worker"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
        )
    reference = subprocess.run(
        [sys.executable, "-c", _with_model(MULTI_WORKER_SCRIPT), "single"],
        capture_output=True,
        text=True,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT),
        timeout=300,
    )
    results = []
    for child in children:
        stdout, stderr = child.communicate(timeout=300)
        lines = [line for line in stdout.splitlines() if line.startswith("RESULT")]
        assert child.returncode == 0 and lines, stderr[-3000:]
        results.append(json.loads(lines[-1][len("RESULT ") :]))
    lines = [line for line in reference.stdout.splitlines() if line.startswith("RESULT")]
    assert reference.returncode == 0 and lines, reference.stderr[-3000:]
    expected = json.loads(lines[-1][len("RESULT ") :])["weights"]

    assert [r["chief"] for r in results] == [True, False]
    assert all(r["replicas"] == 2 for r in results)
    for result in results:
        for got, want in zip(result["weights"], expected, strict=True):
            want = np.asarray(want)
            assert np.max(np.abs(np.asarray(got) - want)) / np.max(np.abs(want)) < 1e-5
