"""A MirroredStrategy step over two logical CPU devices equals the single-device step on the
same global batch (weights after two SGD-with-momentum steps with weight decay, 1e-5 relative).

Logical devices must be configured before TensorFlow starts, so the comparisons run in a fresh
interpreter: one for all of them (a module fixture), each test reading its own part. The random
start of the mirrored-against-one-device steps is replaced by noise that depends on each example
alone, so that one device and two replicas (which draw per-replica streams) start from the same
δ.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.workers import local_tf_configs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The parts of the two-device interpreter are made once for the module's tests: pytest-xdist
# runs them on one worker (--dist loadgroup, pyproject.toml).
pytestmark = pytest.mark.xdist_group("distribute")


def _with_model(script: str) -> str:
    """The child's source with MODEL and FASTAT_DATA defined right after its imports (the first
    blank line after `from fbat_tf.trainer import AdversarialTrainer`)."""
    anchor = "from fbat_tf.trainer import AdversarialTrainer\n"
    assert anchor in script
    return script.replace(anchor, anchor + MODEL + FASTAT_DATA, 1)


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

# The two global batches of 8 and the Fast-AT the multi-worker test trains (after `import
# numpy as np` and `from fbat_tf import methods`).
FASTAT_DATA = """

def data():
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, (16, 6, 6, 2)).astype(np.float32)
    return x, rng.integers(0, 3, 16).astype(np.int32)


def fastat():
    return methods.create("fastat", eps=16 / 255)
"""

# One interpreter with two logical CPUs; each part named on its command line runs in turn and
# gives a dict, or the traceback that stopped it ("failed"), on the RESULT line.
TWO_DEVICES = """
import json
import sys
import traceback

import numpy as np
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import keras
from fbat_tf import constraints, methods
from fbat_tf.distribute import create_strategy
from fbat_tf.trainer import AdversarialTrainer

real_noise = constraints.uniform_noise
# One strategy of each name for every part: MirroredStrategy instances of one process number
# their collective ops alike, and a second one's would meet the first's (a shape mismatch).
STRATEGIES = {}


def strategy_named(name):
    if name not in STRATEGIES:
        STRATEGIES[name] = create_strategy(name)
    return STRATEGIES[name]


def run(strategy_name, name):
    strategy = strategy_named(strategy_name)
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


def mirrored_step(name):
    # Noise of each example alone, for this comparison only.
    constraints.uniform_noise = lambda x, eps, seed: eps * tf.sin(1000.0 * x + 1.0)
    try:
        single, one, single_state = run("default", name)
        mirrored, two, mirrored_state = run("mirrored", name)
    finally:
        constraints.uniform_noise = real_noise
    error = max(
        float(np.max(np.abs(a - b)) / np.max(np.abs(a))) for a, b in zip(single, mirrored)
    )
    return {
        "replicas": [one, two],
        "error": error,
        "single_state": single_state,
        "mirrored_state": mirrored_state,
    }


def replica_noise():
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, (8, 6, 6, 2)).astype(np.float32)
    y = rng.integers(0, 3, 8).astype(np.int32)
    strategy = strategy_named("mirrored")
    with strategy.scope():
        mirrored = model()
        trainer = AdversarialTrainer(
            mirrored, methods.create("fastat", eps=16 / 255), weight_decay=0.0, seed=5,
            jit_compile=False,
        )
        trainer.compile(optimizer=keras.optimizers.SGD(0.5))
    seeds = [
        s.numpy() for s in strategy.experimental_local_results(strategy.run(trainer.step_seed))
    ]
    trainer.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(8), epochs=1, verbose=0)

    # One device: each half of the batch with its replica's seed, the gradients averaged.
    single = model()
    method = methods.create("fastat", eps=16 / 255)
    halves = [
        method.gradients(
            single, x[4 * i : 4 * i + 4], y[4 * i : 4 * i + 4], tf.constant(seeds[i])
        )[0]
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
        method.gradients(
            single, x[4 * i : 4 * i + 4], y[4 * i : 4 * i + 4], tf.constant(seeds[0])
        )[0]
        for i in range(2)
    ]
    other = max(
        float(np.max(np.abs(a.numpy() + b.numpy() - c.numpy() - d.numpy())))
        for a, b, c, d in zip(*halves, *same)
    )
    return {"differ": seeds[0].tolist() != seeds[1].tolist(), "error": error, "other": other}


def one_process():
    # The multi-worker test's reference, on one device: two SGD steps on the global batches of
    # 8, each the mean of its halves' gradients, half i drawing with fold_in([5, step], i) as
    # replica i does.
    x, y = data()
    single = model()
    for step in range(2):
        halves = []
        for i in range(2):
            rows = slice(8 * step + 4 * i, 8 * step + 4 * i + 4)
            seed = tf.random.experimental.stateless_fold_in(
                tf.constant([5, step], tf.int64), tf.constant(i, tf.int64)
            )
            halves.append(fastat().gradients(single, x[rows], y[rows], tf.cast(seed, tf.int32))[0])
        for w, a, b in zip(single.trainable_variables, *halves):
            w.assign(w - 0.5 * (a + b) / 2)
    return {"weights": [w.numpy().tolist() for w in single.trainable_variables]}


PARTS = {
    "fastbat": lambda: mirrored_step("fastbat"),
    "elle": lambda: mirrored_step("elle"),
    "replica_noise": replica_noise,
    "one_process": one_process,
}
results = {}
for part in sys.argv[1:]:
    try:
        results[part] = PARTS[part]()
    except Exception:
        results[part] = {"failed": traceback.format_exc()}
print("RESULT " + json.dumps(results))
"""


def _result(stdout: str, stderr: str, returncode: int) -> dict:
    """The JSON of the last RESULT line a child printed."""
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    assert returncode == 0 and lines, stderr[-3000:]
    return json.loads(lines[-1][len("RESULT ") :])


@pytest.fixture(scope="module")
def two_devices() -> dict:
    """Every part of TWO_DEVICES, run once in a fresh interpreter."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            _with_model(TWO_DEVICES),
            "fastbat",
            "elle",
            "replica_noise",
            "one_process",
        ],
        capture_output=True,
        text=True,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT),
        timeout=600,
    )
    return _result(done.stdout, done.stderr, done.returncode)


def _part(two_devices: dict, name: str) -> dict:
    part = two_devices[name]
    assert "failed" not in part, f"the two-device child's part {name!r} failed:\n{part['failed']}"
    return part


@pytest.mark.slow
@pytest.mark.parametrize("method", ["fastbat", "elle"])
def test_mirrored_step_equals_single_device_step(method, two_devices):
    import numpy as np

    result = _part(two_devices, method)
    assert result["replicas"] == [1, 2]
    assert result["error"] < 1e-5
    # A method's own scalar state (ELLE-A's λ and E_lin statistic) moves as on one device.
    single_state, mirrored_state = result["single_state"], result["mirrored_state"]
    assert single_state.keys() == mirrored_state.keys()
    for key, value in single_state.items():
        assert np.isclose(mirrored_state[key], value, rtol=1e-5, atol=1e-9), (key, single_state)
    assert method != "elle" or single_state["count"] == 2.0, single_state


@pytest.mark.parametrize(
    ("task", "chief"),
    [({"type": "worker", "index": 0}, True), ({"type": "worker", "index": 1}, False)],
)
def test_only_worker_zero_writes(monkeypatch, task, chief):
    import types

    import tensorflow as tf

    from fbat_tf.distribute import is_chief

    cluster = {"worker": ["localhost:12345", "localhost:12346"]}
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": task}))
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    assert is_chief(types.SimpleNamespace(cluster_resolver=resolver)) is chief


@pytest.mark.slow
def test_each_replica_draws_its_own_noise_and_the_step_matches_one_device(two_devices):
    result = _part(two_devices, "replica_noise")
    assert result["differ"] is True
    assert result["error"] < 1e-5
    assert result["other"] > 1e-4  # the noise matters to the step


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
    # The chief's part is its checkpoint: its run skips the final test (never built).
    chief = train(
        fashion_mnist_config(str(workdir), max_train_examples=128, epochs=1, final_test=False)
    )
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

import numpy as np
import tensorflow as tf
import keras
from fbat_tf import methods
from fbat_tf.distribute import create_strategy, is_chief
from fbat_tf.trainer import AdversarialTrainer

x, y = data()
strategy = create_strategy("multi_worker")
with strategy.scope():
    trained = model()
    trainer = AdversarialTrainer(trained, fastat(), weight_decay=0.0, seed=5, jit_compile=False)
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
"""


@pytest.mark.slow
def test_two_worker_processes_take_the_steps_of_one_process(two_devices):
    """MultiWorkerMirroredStrategy across two processes on 127.0.0.1 (TF_CONFIG), two steps of
    Fast-AT with real noise: both workers end with the weights one process computes from the
    same global batches, each half with its replica's seed (the two-device child's part
    "one_process", on one device); worker 0 alone is the chief."""
    import numpy as np

    children = []
    for tf_config in local_tf_configs(2):
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT, TF_CONFIG=tf_config)
        children.append(
            subprocess.Popen(
                [sys.executable, "-c", _with_model(MULTI_WORKER_SCRIPT)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
        )
    results = []
    for child in children:
        stdout, stderr = child.communicate(timeout=300)
        results.append(_result(stdout, stderr, child.returncode))
    expected = _part(two_devices, "one_process")["weights"]

    assert [r["chief"] for r in results] == [True, False]
    assert all(r["replicas"] == 2 for r in results)
    for result in results:
        for got, want in zip(result["weights"], expected, strict=True):
            want = np.asarray(want)
            assert np.max(np.abs(np.asarray(got) - want)) / np.max(np.abs(want)) < 1e-5
