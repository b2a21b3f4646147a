"""Evaluation under MirroredStrategy on two logical CPU devices counts exactly what one device
counts: the same clean and robust correct examples, batch by batch split over the replicas, and
each example's outcome in the same place.

Logical devices must be configured before TensorFlow starts, so the evaluations on two logical
CPUs run in a fresh interpreter (one for all of them) and each worker in its own. The attacks
draw their random starts from per-call seeds, and a replica's shard is one call, so two replicas
start from other points than one device would. The tests replace the noise of every random start
(`constraints.uniform_noise`, which PGD's start and APGD's start both draw from) by a function of
each example alone; the attacks are then deterministic per example and the counts must be equal
as integers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.workers import local_tf_configs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FASHION_MNIST = "/usr/share/datasets/fashion-mnist"

# Runs first in every child: two logical CPUs, and random starts that depend on the example only.
PRELUDE = """
import sys
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
from fbat_tf import constraints

constraints.uniform_noise = lambda x, eps, seed: eps * tf.sin(1000.0 * x + 1.0)
"""

# A worker of MultiWorkerMirroredStrategy: the strategy first, before any other TensorFlow work.
WORKER_PRELUDE = """
import sys

from fbat_tf import distribute

MULTI_WORKER = distribute.create_strategy("multi_worker")
from fbat_tf import constraints
import tensorflow as tf

constraints.uniform_noise = lambda x, eps, seed: eps * tf.sin(1000.0 * x + 1.0)
"""

LIBRARY = """
import json
import numpy as np
import keras
from fbat_tf import classifiers, evaluation
from fbat_tf.attacks.apgd import APGD
from fbat_tf.attacks.autoattack import AutoAttack
from fbat_tf.attacks.pgd import PGD
from fbat_tf.distribute import create_strategy

EPS = 8 / 255
rng = np.random.default_rng(0)
x = rng.uniform(0, 1, (10, 6, 6, 2)).astype(np.float32)
keras.utils.set_random_seed(0)
reference = keras.Sequential([
    keras.Input((6, 6, 2)),
    keras.layers.Flatten(),
    keras.layers.Dense(16, activation="softplus"),
    keras.layers.Dense(4),
])
# Labels the model gets right but for the first two, so that there is something to attack.
y = np.argmax(reference(x), axis=-1).astype(np.int32)
y[:2] = (y[:2] + 1) % 4
weights = reference.get_weights()


class Shards:
    # The identity attack, noting the device and size of every shard it is given.

    def __init__(self):
        self.seen = []

    def __call__(self, model, x, y, seed):
        self.seen.append((x.device.split(":")[-1], int(x.shape[0])))
        return x, {}


def run(strategy_name, batch_size, fold):
    if strategy_name == "multi_worker":
        strategy = MULTI_WORKER
    else:
        strategy = create_strategy(strategy_name)
    with strategy.scope():
        model = keras.models.clone_model(reference)
        model.set_weights(weights)
    classifier = classifiers.InferenceGraph(model) if fold else model
    ensemble = AutoAttack(EPS, version="custom", attacks={
        "apgd-ce": APGD(EPS, "ce", steps=4),
        "apgd-t": APGD(EPS, "dlr_targeted", steps=3, n_target_classes=2),
    })
    shards = Shards()
    attacks = {
        ("pgd", EPS): PGD(EPS, steps=3, restarts=1),
        ("aa", EPS): ensemble,
        ("none", EPS): shards,
    }
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch_size)
    result = evaluation.evaluate(classifier, dataset, attacks, strategy=strategy).to_dict()
    result["shards"] = shards.seen
    return result


results = {}
for key in sys.argv[1:]:  # e.g. mirrored-folded/3
    strategy, batch_size = key.split("/")
    name = strategy.removesuffix("-folded")
    results[key] = run(name, int(batch_size), fold=strategy.endswith("-folded"))
print("RESULT " + json.dumps(results))
"""


def _start(code: str, *args: str, prelude: str = PRELUDE, **env_vars: str) -> subprocess.Popen:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT, **env_vars)
    return subprocess.Popen(
        [sys.executable, "-c", prelude + code, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=env,
    )


def _finish(process: subprocess.Popen) -> subprocess.CompletedProcess:
    stdout, stderr = process.communicate(timeout=300)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def _child(code: str, *args: str) -> subprocess.CompletedProcess:
    return _finish(_start(code, *args))


def _counts(result: dict) -> dict:
    """Accuracies as integer counts of examples (of evaluation.evaluate or evaluate.py)."""
    n = result["examples"]
    per_attack = result["autoattack_per_attack"]
    return {
        "examples": n,
        "clean": round(result["clean_accuracy"] * n),
        "robust": {k: round(v * n) for k, v in result["robust_accuracy"].items()},
        "per_attack": {
            name: {part: round(v * n) for part, v in parts.items()}
            for name, parts in per_attack.items()
        },
    }


def _result(process: subprocess.Popen) -> dict:
    """What a child printed on its RESULT line."""
    child = _finish(process)
    lines = [line for line in child.stdout.splitlines() if line.startswith("RESULT ")]
    assert child.returncode == 0 and lines, child.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT ") :])


@pytest.mark.slow
def test_mirrored_evaluation_counts_what_one_device_counts():
    """PGD and a short AutoAttack (APGD-CE, APGD-T) on 10 examples: batches of 4 split 2 + 2
    (the last 1 + 1), batches of 3 split 2 + 1 (the last 1 + an empty shard); the attacked
    model's weights as variables mirrored on both devices, and folded into constants. Two
    worker processes of MultiWorkerMirroredStrategy (TF_CONFIG on 127.0.0.1), batches of 3,
    count the same on each worker."""
    # One interpreter for every evaluation on the two logical CPUs (each interpreter's start-up
    # costs about 5 s of CPU), beside the two workers.
    keys = ("default/4", "default/3", "mirrored/4", "mirrored/3", "mirrored-folded/3")
    child = _start(LIBRARY, *keys)
    workers = [
        _start(LIBRARY, "multi_worker/3", prelude=WORKER_PRELUDE, TF_CONFIG=tf_config)
        for tf_config in local_tf_configs(2)
    ]
    results = _result(child)
    for index, process in enumerate(workers):
        results[f"worker{index}/3"] = _result(process)["multi_worker/3"]

    single = _counts(results["default/4"])
    # The comparison means something: the attacks break some examples, not all.
    assert single["examples"] == 10
    assert single["clean"] == 8
    assert 0 < single["robust"]["pgd@8"] < single["clean"]
    aa, robust = single["per_attack"]["aa@8"], single["robust"]["aa@8"]
    assert aa["clean"] == single["clean"] > aa["apgd-ce"] > aa["apgd-t"] == robust > 0
    # The labels of the first two examples are the wrong ones.
    outcomes = results["default/4"]["outcomes"]
    assert outcomes["clean"] == "0011111111"
    assert set(outcomes) == {"clean", "pgd@8", "aa@8", "aa@8/apgd-ce", "aa@8/apgd-t", "none@8"}
    assert outcomes["none@8"] == outcomes["clean"]  # the identity attack
    for key in (
        "default/3",
        "mirrored/4",
        "mirrored/3",
        "mirrored-folded/3",
        "worker0/3",
        "worker1/3",
    ):
        assert _counts(results[key]) == single, key
        # And each example's own outcomes, in dataset order, whichever replica or worker
        # evaluated it.
        assert results[key]["outcomes"] == results["default/4"]["outcomes"], key
        replicas = 1 if key.startswith("default") else 2
        assert results[key]["replicas"] == replicas
        # Each part of the ensemble was timed, on every replica.
        assert set(results[key]["autoattack_seconds"]["aa@8"]) == {"apgd-ce", "apgd-t"}
    # Each replica attacked its own shard on its own device, the empty one included.
    assert results["default/3"]["shards"] == [["0", 3]] * 3 + [["0", 1]]
    split = [["0", 2], ["1", 1]] * 3 + [["0", 1], ["1", 0]]
    assert results["mirrored/3"]["shards"] == results["mirrored-folded/3"]["shards"] == split
    assert results["mirrored/4"]["shards"] == [["0", 2], ["1", 2]] * 2 + [["0", 1], ["1", 1]]
    # Each worker attacked its own shards of the global batches of 3.
    assert results["worker0/3"]["shards"] == [["0", 2]] * 3 + [["0", 1]]
    assert results["worker1/3"]["shards"] == [["0", 1]] * 3 + [["0", 0]]
    np.testing.assert_allclose(results["mirrored/3"]["loss"], results["default/4"]["loss"], 1e-6)
    assert all(t > 0 for t in results["mirrored/3"]["time_s"].values())


# evaluate.py's main() once per --strategy in one interpreter on two logical CPUs (through
# tests/in_process.py: the flags parsed by absl, main as the program runs it), each strategy's
# results written to the file its last argument names: one start-up for both.
EVALUATE_CLI = """
import pytest

from tests import in_process

*common, directory = sys.argv[1:]
for strategy in ("default", "mirrored"):
    with pytest.MonkeyPatch.context() as patch:
        done = in_process.evaluate(
            *common, f"--strategy={strategy}", f"--results={directory}/{strategy}.json",
            monkeypatch=patch,
        )
    if done.returncode:
        sys.exit(f"--strategy={strategy}: " + done.stderr[-3000:])
"""


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir(FASHION_MNIST), reason="needs dataset-fashion-mnist")
def test_evaluate_py_with_mirrored_strategy_writes_what_default_writes(tmp_path):
    """evaluate.py's main() on a .keras model (folded weights, PGD and APGD-CE at two ε):
    --strategy=mirrored on two logical CPUs writes the counts of --strategy=default, 40
    examples in global batches of 12 (the last one 4), and records strategy and replicas."""
    import keras

    from fbat_tf import data

    # A linear classifier fitted for a moment: right often enough, and breakable at these ε.
    keras.utils.set_random_seed(1)
    model = keras.Sequential(
        [keras.Input((28, 28, 1)), keras.layers.Flatten(), keras.layers.Dense(10)]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    model.fit(
        data.load("fashion_mnist", "train", max_examples=1024, batch_size=64),
        verbose=0,
        shuffle=False,
    )
    model_path = str(tmp_path / "model.keras")
    model.save(model_path)
    common = [
        f"--model_path={model_path}",
        "--eval_dataset=fashion_mnist",
        "--n_examples=40",
        "--batch_size=12",
        "--eps=8,32",
        "--attacks=pgd,apgd-ce",
        "--pgd_steps=3",
        "--pgd_restarts=1",
    ]
    child = _child(EVALUATE_CLI, *common, str(tmp_path))
    assert child.returncode == 0, child.stderr[-3000:]
    reports = {
        strategy: json.loads((tmp_path / f"{strategy}.json").read_text())
        for strategy in ("default", "mirrored")
    }
    assert (reports["default"]["strategy"], reports["default"]["replicas"]) == ("default", 1)
    assert (reports["mirrored"]["strategy"], reports["mirrored"]["replicas"]) == ("mirrored", 2)
    assert _counts(reports["mirrored"]) == _counts(reports["default"])
    assert reports["mirrored"]["outcomes"] == reports["default"]["outcomes"]
    assert {len(held) for held in reports["default"]["outcomes"].values()} == {40}
    counts = _counts(reports["default"])
    assert counts["examples"] == 40
    assert 0 < counts["robust"]["pgd@8"] < counts["clean"]


def test_evaluate_py_refuses_a_strategy_it_cannot_run_before_any_work(tmp_path):
    """Each refused --strategy (run side by side) fails naming the flag and writes nothing."""
    cases = {"tpu": "--strategy=tpu", "gpus": "--strategy"}
    children = {}
    for name in cases:
        (tmp_path / name).mkdir()
        children[name] = subprocess.Popen(
            [
                sys.executable,
                os.path.join(ROOT, "evaluate.py"),
                f"--model_path={tmp_path / name}",
                f"--strategy={name}",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
        )
    for name, says in cases.items():
        _, stderr = children[name].communicate(timeout=120)
        assert children[name].returncode != 0, name
        assert says in stderr, name
        assert not list((tmp_path / name).iterdir()), name
