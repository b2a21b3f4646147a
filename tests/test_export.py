"""Tests for export/: the SavedModel TF-Serving loads, its model card, the CLI and the client.

    python -m pytest tests/test_export.py -q

A tiny small_cnn, trained a few SGD steps on synthetic images, and a fake run directory
(results.json + checkpoints/best.weights.h5) stand in for a training run. The export is read back
the ways a server would read it: `saved_model_cli show --all` for the signatures, and
`tf.saved_model.load` in a fresh process that cannot import fbat_tf, fed TF-Serving REST bodies
and a gRPC PredictRequest. Every output is compared with the Keras model the export came from.
The client's senders talk to small local stand-ins for TF-Serving (127.0.0.1 only) that run the
export.
"""

from __future__ import annotations

import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from concurrent import futures

import keras
import numpy as np
import pytest
import tensorflow as tf

from export import client, savedmodel, versions
from fbat_tf import classifiers, data, evaluation, models
from fbat_tf.attacks.apgd import APGD

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATASET = "fashion_mnist"
NAME = "fashion_mnist-small_cnn-fastbat"
EPS = 8 / 255
ATOL = 1e-5
# Label k's name, as Fashion-MNIST's authors list them (zalandoresearch/fashion-mnist README).
FASHION_MNIST_NAMES = [
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
]

# TF-Serving's predict API for a signature with one input, as its REST documentation describes it:
# the row format lists one instance per example ("instances"), the columnar one the batch
# ("inputs"), and the response mirrors the request ("predictions": one object per example, or
# "outputs": one list per output). The fresh process runs this file; the local stand-in servers
# below exec it for `predict` and `respond`.
SERVER_SCRIPT = r"""
import json
import sys

import numpy as np
import tensorflow as tf


def predict(model, body):
    signature = model.signatures[body.get("signature_name", "serving_default")]
    ((key, spec),) = signature.structured_input_signature[1].items()
    if "instances" in body:
        value = [row[key] if isinstance(row, dict) else row for row in body["instances"]]
    else:
        value = body["inputs"][key] if isinstance(body["inputs"], dict) else body["inputs"]
    batch = tf.constant(np.asarray(value, dtype=spec.dtype.as_numpy_dtype))
    return {name: tensor.numpy() for name, tensor in signature(**{key: batch}).items()}


def listed(value):
    # JSON of an output as TF-Serving's REST API writes it: strings as UTF-8 text.
    if isinstance(value, bytes):
        return value.decode()
    if value.dtype == object:
        return [listed(item) for item in value]
    return value.tolist()


def respond(outputs, columnar):
    if columnar:
        return {"outputs": {name: listed(value) for name, value in outputs.items()}}
    count = len(next(iter(outputs.values())))
    rows = [{name: listed(value[i]) for name, value in outputs.items()} for i in range(count)]
    return {"predictions": rows}


def grpc_predict(model, serialized):
    from tensorflow_serving.apis import predict_pb2

    request = predict_pb2.PredictRequest.FromString(serialized)
    signature = model.signatures[request.model_spec.signature_name]
    inputs = {key: tf.constant(tf.make_ndarray(t)) for key, t in request.inputs.items()}
    return {name: tensor.numpy() for name, tensor in signature(**inputs).items()}


def attempt(signature, value):
    try:
        signature(images=tf.constant(value))
        return {"rejected": False}
    except (tf.errors.InvalidArgumentError, ValueError, TypeError) as error:
        return {"rejected": True, "error": type(error).__name__, "message": str(error)}


if __name__ == "__main__":
    sys.modules["fbat_tf"] = None  # from here on, `import fbat_tf` raises ImportError
    model_dir, requests_path, out_path = sys.argv[1:]
    with open(requests_path) as f:
        requests = json.load(f)
    model = tf.saved_model.load(model_dir)
    served = {}
    for name, body in requests["rest"].items():
        served[name] = {k: listed(v) for k, v in predict(model, body).items()}
    if requests.get("grpc"):
        with open(requests["grpc"], "rb") as f:
            outputs = grpc_predict(model, f.read())
        served["grpc"] = {k: listed(v) for k, v in outputs.items()}
    float_signature = model.signatures["serving_default"]
    uint8_signature = model.signatures["serve_uint8"]
    good = np.full([1, 28, 28, 1], 0.5, np.float32)
    rejections = {
        "above_one": attempt(float_signature, good + 0.6),
        "below_zero": attempt(float_signature, good - 0.6),
        "nan": attempt(float_signature, np.where(good > 0, np.nan, good).astype(np.float32)),
        "pixels_0_255_as_float": attempt(float_signature, good * 255),
        "wrong_size": attempt(float_signature, np.zeros([1, 32, 32, 1], np.float32)),
        "wrong_channels": attempt(float_signature, np.zeros([1, 28, 28, 3], np.float32)),
        "no_batch_axis": attempt(float_signature, np.zeros([28, 28, 1], np.float32)),
        "float64": attempt(float_signature, good.astype(np.float64)),
        "uint8_wrong_size": attempt(uint8_signature, np.zeros([1, 32, 32, 1], np.uint8)),
        "ends_0_and_1": attempt(float_signature, np.eye(28, dtype=np.float32)[None, ..., None]),
    }
    with open(out_path, "w") as f:
        json.dump(
            {
                "served": served,
                "rejections": rejections,
                "fbat_tf_modules": [
                    m
                    for m, v in sys.modules.items()
                    if (m == "fbat_tf" or m.startswith("fbat_tf.")) and v
                ],
            },
            f,
        )
"""


def _emulation():
    namespace = {"__name__": "tf_serving_emulation"}
    exec(SERVER_SCRIPT, namespace)  # the definitions only: __main__ does not run
    return namespace


def _env() -> dict[str, str]:
    return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")


def _keras_outputs(classifier: keras.Model, images: np.ndarray) -> dict[str, np.ndarray]:
    """Logits from Keras; softmax and argmax in numpy, independently of the exported graph."""
    logits = np.asarray(classifier(images, training=False), dtype=np.float64)
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return {
        "logits": logits,
        "probabilities": shifted / shifted.sum(axis=-1, keepdims=True),
        "classes": logits.argmax(axis=-1),
    }


def _assert_matches_keras(outputs, expected) -> None:
    np.testing.assert_allclose(np.asarray(outputs["logits"]), expected["logits"], atol=ATOL)
    np.testing.assert_allclose(
        np.asarray(outputs["probabilities"]), expected["probabilities"], atol=ATOL
    )
    np.testing.assert_array_equal(np.asarray(outputs["classes"]), expected["classes"])
    names = [n.decode() if isinstance(n, bytes) else n for n in outputs["class_names"]]
    assert names == [FASHION_MNIST_NAMES[k] for k in expected["classes"]]


def _results(history_times=(2.0, 3.5)) -> dict:
    """A results.json as fbat_tf.training writes it, with known numbers to find in the card."""
    return {
        "config": {
            "workdir": "unused",
            "method": "fastbat",
            "dataset": DATASET,
            "model": "small_cnn",
            "width": 4,
            "activation": "relu",
            "eps": EPS,
            "method_options": {"lambda_inv": None, "ig_coef": 0.1},
            "epochs": 2,
            "batch_size": 16,
            "lr_max": 0.2,
            "lr_schedule": "cyclic",
            "momentum": 0.9,
            "weight_decay": 5e-4,
            "max_train_examples": 64,
            "val_attack_steps": 10,
            "val_restarts": 1,
            "val_examples": 32,
            "eval_pgd_steps": 50,
            "eval_pgd_restarts": 10,
            "precision": "float32",
            "jit_compile": False,
            "seed": 0,
        },
        "status": "complete",
        "history": [
            {
                "epoch": 1,
                "epoch_time": history_times[0],
                "val_clean_accuracy": 0.5,
                "val_robust_accuracy": 0.25,
                "val_best": 1.0,
            },
            {
                "epoch": 2,
                "epoch_time": history_times[1],
                "val_clean_accuracy": 0.4,
                "val_robust_accuracy": 0.125,
                "val_best": 0.0,
            },
        ],
        "method": {
            "name": "fastbat",
            "eps": EPS,
            "lambda_inv": 5000 / 255,
            "ig_coef": 0.1,
            "ig": "hessian_free",
            "linearization": "pgd_nosign",
        },
        "dataset": DATASET,
        "model": "small_cnn",
        "device": "CPU",
        "epochs": 2,
        "optimizer_steps": 8,
        "final": {
            "test_examples": 32,
            "test_clean_accuracy": 0.4375,
            "test_pgd_robust_accuracy": 0.1875,
            "pgd_steps": 50,
            "pgd_restarts": 10,
            "eval_time_s": 1.25,
        },
    }


def _banded_images(rng: np.random.Generator, count: int, bands: int = 6):
    """uint8 images whose brightness band (0 dark .. bands-1 bright) is their label."""
    band = np.arange(count) % bands
    low = band * 255 // bands
    noise = rng.integers(0, 256 // bands, size=(count, 28, 28, 1))
    return (low[:, None, None, None] + noise).astype(np.uint8), band


# The module's fixtures are built once for all its tests: pytest-xdist runs them on one worker
# (--dist loadgroup, pyproject.toml).
pytestmark = [pytest.mark.xdist_group("export"), pytest.mark.slow]


@pytest.fixture(scope="module")
def classifier() -> keras.Model:
    info = data.info(DATASET)
    keras.utils.set_random_seed(0)
    model = models.build(
        "small_cnn", info.num_classes, info.image_shape, info.mean, info.std, width=4
    )
    # A dozen SGD steps on images labelled by brightness move the weights and the batch-norm
    # statistics away from their initial values, and make the classes differ between images.
    images, labels = _banded_images(np.random.default_rng(0), 64)
    model.compile(
        optimizer=keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=False,
    )
    model.fit(images / np.float32(255), labels, batch_size=16, epochs=3, verbose=0, shuffle=False)
    return model


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, classifier) -> str:
    workdir = str(tmp_path_factory.mktemp("run"))
    os.makedirs(os.path.join(workdir, "checkpoints"))
    classifier.save_weights(os.path.join(workdir, "checkpoints", "best.weights.h5"))
    with open(os.path.join(workdir, "results.json"), "w") as f:
        json.dump(_results(), f)
    return workdir


@pytest.fixture(scope="module")
def images_uint8() -> np.ndarray:
    pixels, _ = _banded_images(np.random.default_rng(1), 6)
    pixels[0] = 0  # the ends of the range are valid input
    pixels[1] = 255
    return pixels


@pytest.fixture(scope="module")
def images_float(images_uint8) -> np.ndarray:
    return images_uint8.astype(np.float32) / np.float32(255)


@pytest.fixture(scope="module")
def exported(tmp_path_factory, run_dir) -> str:
    export_dir = str(tmp_path_factory.mktemp("served"))
    return savedmodel.export_run(run_dir, export_dir=export_dir)


@pytest.fixture(scope="module")
def fresh_process(tmp_path_factory, exported, images_float, images_uint8) -> dict:
    """What a process that imports only TensorFlow serves from the export (run once)."""
    folder = tmp_path_factory.mktemp("fresh")
    requests = {
        "rest": {
            "instances": client.rest_request_body(images_float),
            "columnar": client.rest_request_body(images_float, columnar=True),
            "instances_uint8": client.rest_request_body(images_uint8),
            "columnar_uint8": client.rest_request_body(images_uint8, columnar=True),
        },
        "grpc": None,
    }
    try:
        request = client.grpc_request(images_float, NAME)
        requests["grpc"] = str(folder / "request.pb")
        (folder / "request.pb").write_bytes(request.SerializeToString())
    except ImportError:
        pass
    (folder / "requests.json").write_text(json.dumps(requests))
    (folder / "serve.py").write_text(SERVER_SCRIPT)
    env = _env()
    env.pop("PYTHONPATH", None)
    completed = subprocess.run(
        [sys.executable, "serve.py", exported, "requests.json", "out.json"],
        cwd=folder,  # not the repository: fbat_tf is not importable from here
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads((folder / "out.json").read_text())


# The export itself.


def test_export_run_writes_a_versioned_saved_model(exported, run_dir):
    export_dir = os.path.dirname(os.path.dirname(exported))
    assert exported == os.path.join(export_dir, NAME, "1")
    assert os.listdir(os.path.dirname(exported)) == ["1"]  # no temporary folder left behind
    for path in ("saved_model.pb", "variables", "assets.extra/model_card.json"):
        assert os.path.exists(os.path.join(exported, path)), path


def test_the_card_names_its_run_relative_to_itself(exported, run_dir):
    """No absolute local path in a card that travels with its export: the run directory is
    given from the card's own folder, and leads there from the card."""
    card_file = os.path.join(exported, "assets.extra", "model_card.json")
    with open(card_file) as f:
        source = json.load(f)["source"]
    assert not os.path.isabs(source["workdir"]), source["workdir"]
    from_card = os.path.join(os.path.dirname(card_file), source["workdir"])
    assert os.path.samefile(from_card, run_dir)
    assert os.path.realpath(run_dir) not in json.dumps(source)


def _parse_saved_model_cli(text: str) -> dict:
    signatures = {}
    for block in text.split("signature_def['")[1:]:
        name, body = block.split("']", 1)
        tensors = re.findall(
            r"(inputs|outputs)\['(\w+)'\] tensor_info:\s+dtype: (\w+)\s+shape: (\([^)]*\))", body
        )
        signatures[name] = {
            "method": re.search(r"Method name is: (\S*)", body).group(1),
            "inputs": {k: (d, s) for kind, k, d, s in tensors if kind == "inputs"},
            "outputs": {k: (d, s) for kind, k, d, s in tensors if kind == "outputs"},
        }
    return signatures


def test_saved_model_cli_shows_both_signatures(exported):
    program = shutil.which("saved_model_cli")
    command = (
        [program] if program else [sys.executable, "-m", "tensorflow.python.tools.saved_model_cli"]
    )
    completed = subprocess.run(
        [*command, "show", "--dir", exported, "--all"],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    signatures = _parse_saved_model_cli(completed.stdout)
    outputs = {
        "logits": ("DT_FLOAT", "(-1, 10)"),
        "probabilities": ("DT_FLOAT", "(-1, 10)"),
        "classes": ("DT_INT64", "(-1)"),
        # Fashion-MNIST's names of the predicted classes ("Shirt"), beside their indices.
        "class_names": ("DT_STRING", "(-1)"),
    }
    assert signatures["serving_default"] == {
        "method": "tensorflow/serving/predict",
        "inputs": {"images": ("DT_FLOAT", "(-1, 28, 28, 1)")},
        "outputs": outputs,
    }
    assert signatures["serve_uint8"] == {
        "method": "tensorflow/serving/predict",
        "inputs": {"images": ("DT_UINT8", "(-1, 28, 28, 1)")},
        "outputs": outputs,
    }
    # A plain graph: nothing for TF-Serving's XLA JIT flag to compile.
    assert "Xla" not in completed.stdout.split("contains the following ops:")[1].split("\n")[0]


def test_model_card_records_the_run(exported, classifier):
    with open(os.path.join(exported, "assets.extra", "model_card.json")) as f:
        card = json.load(f)
    results = _results()
    assert (card["name"], card["version"]) == (NAME, 1)
    assert card["dataset"] == DATASET
    assert card["class_names"] == FASHION_MNIST_NAMES
    assert card["serving"]["outputs"]["class_names"] == "string"
    assert card["model"] == {
        "name": "small_cnn",
        "width": 4,
        "activation": "relu",
        "input_shape": [None, 28, 28, 1],
        "num_classes": 10,
        "parameters": classifier.count_params(),
    }
    assert card["method"] == results["method"]
    assert card["eps"]["per_255"] == pytest.approx(8.0)
    assert card["training"]["time_s"] == pytest.approx(2.0 + 3.5)
    assert card["training"]["optimizer"]["lr_max"] == 0.2
    assert card["training"]["optimizer_steps"] == 8
    assert card["selection"]["epoch"] == 1  # the last epoch flagged val_best
    assert card["selection"]["val_robust_accuracy"] == 0.25
    assert card["robustness"]["examples"] == 32
    assert card["robustness"]["clean_accuracy"] == 0.4375
    assert card["robustness"]["pgd"] == {
        "robust_accuracy": 0.1875,
        "steps": 50,
        "restarts": 10,
        "step_size": pytest.approx(EPS / 4),
        "time_s": 1.25,
    }
    assert card["robustness"]["autoattack"] is None  # the run has no AutoAttack number
    assert card["robustness"]["indicators"] is None  # train.py's test computes none
    assert card["software"]["tensorflow"] == tf.__version__
    assert card["software"]["keras"] == keras.__version__
    assert card["software"]["fbat_tf"] not in ("", None)
    assert card["serving"]["signatures"]["serve_uint8"]["dtype"] == "uint8"


def test_model_card_names_the_weights_exported_and_a_recheck_another_source(
    exported, run_dir, tmp_path
):
    """A file re-checked against a retrained run (`--source_model_path=<another run>`) was
    compared as if it were its source: the card now holds the SHA-256 of the weights exported,
    and a source of other weights is flagged, named; the run exported from, or the SavedModel
    beside the file, is not."""
    import hashlib
    import shutil

    from export import recheck

    weights = os.path.join(run_dir, "checkpoints", "best.weights.h5")
    with open(os.path.join(exported, "assets.extra", "model_card.json")) as f:
        card = json.load(f)
    assert (
        card["source"]["weights_sha256"] == hashlib.sha256(open(weights, "rb").read()).hexdigest()
    )
    onnx = os.path.join(exported, "model.onnx")  # read for its card only
    assert recheck.other_source_problem(onnx, run_dir) is None
    assert recheck.other_source_problem(onnx, exported) is None
    retrained = str(tmp_path / "retrained")
    shutil.copytree(run_dir, retrained)
    with open(os.path.join(retrained, "checkpoints", "best.weights.h5"), "ab") as f:
        f.write(b"other weights")
    said = recheck.other_source_problem(onnx, retrained)
    assert said.startswith(f"source: {retrained} is not the model this file was exported from")
    assert "--source_model_path" in said and "\n" not in said


def test_a_recheck_flags_a_drop_of_more_than_a_point_and_low_agreement():
    """The thresholds themselves: 1.5 points below the source is flagged and 0.5 is not;
    agreement on 94 % of the points is flagged and on 96 % not."""
    from export import recheck

    def rows(accuracy: float, agreement: float) -> dict:
        return {
            "clean": {"accuracy": accuracy, "source_accuracy": 0.865, "agreement": agreement},
            "square@8": {"accuracy": 0.1, "replayed": False},
        }

    (drop,) = recheck.flagged_rows(rows(0.85, 1.0))
    assert drop.startswith("clean: more than 1 point lost: 0.8500 against the source's 0.8650")
    assert recheck.flagged_rows(rows(0.86, 1.0)) == []
    (low,) = recheck.flagged_rows(rows(0.865, 0.94))
    assert low.startswith("clean: agrees with the source on 94.0% of the points, below 95%")
    assert recheck.flagged_rows(rows(0.865, 0.96)) == []
    # The file: the accuracy of its source, predictions agreeing on 37.5 %.
    assert len(recheck.flagged_rows(rows(0.865, 0.375))) == 1
    # Exactly one point lost in 100 (0.86 to 0.85) was flagged as more by the floats' rounding.
    exactly = {"clean": {"accuracy": 0.85, "source_accuracy": 0.86, "agreement": 1.0}}
    assert recheck.flagged_rows(exactly) == []
    exactly["clean"]["accuracy"] = 0.849
    assert len(recheck.flagged_rows(exactly)) == 1


def test_a_recheck_table_shows_the_source_and_the_agreement_beside_the_file():
    """The console showed the file's accuracies alone; the source's and the agreement were in
    the JSON and the card only."""
    from export import recheck

    row = {
        "source": "runs/demo",
        "examples": 100,
        "accuracy": {
            "clean": {"accuracy": 0.85, "source_accuracy": 0.86, "agreement": 0.99},
            "pgd@8": {"accuracy": 0.7, "source_accuracy": 0.71, "agreement": 0.98},
            "square@8": {"accuracy": 0.75, "replayed": False},
        },
    }
    assert recheck.table(row).splitlines() == [
        "against the source runs/demo, on the same 100 points:",
        "                                file  source   agree",
        "clean                          85.0%   86.0%   99.0%",
        "pgd@8                          70.0%   71.0%   98.0%",
        "square@8                       75.0%       -       -",
    ]


def test_model_card_never_invents_numbers(tmp_path):
    unfinished = _results(history_times=(2.0, None))
    del unfinished["final"]
    unfinished["status"] = "running"
    with_aa = _results()
    with_aa["final"]["test_aa_robust_accuracy"] = 0.125
    for name, results in {"unfinished": unfinished, "with_aa": with_aa}.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps(results))

    card = savedmodel.model_card(str(tmp_path / "unfinished"))
    assert card["source"]["run_status"] == "running"
    assert card["robustness"]["clean_accuracy"] is None
    assert card["robustness"]["pgd"] is None
    assert card["robustness"]["autoattack"] is None
    assert card["training"]["time_s"] is None  # one epoch has no time: no partial sum
    card = savedmodel.model_card(str(tmp_path / "with_aa"))
    assert card["robustness"]["autoattack"]["robust_accuracy"] == 0.125
    with pytest.raises(FileNotFoundError, match="results.json"):
        savedmodel.model_card(str(tmp_path))


# Serving: what a process with TensorFlow alone computes from the export.


def test_loads_without_fbat_tf(fresh_process):
    assert fresh_process["fbat_tf_modules"] == []


@pytest.mark.parametrize("body", ["instances", "columnar"])
def test_rest_bodies_are_served_like_keras(fresh_process, classifier, images_float, body):
    expected = _keras_outputs(classifier, images_float)
    assert len(set(expected["classes"].tolist())) > 1  # the comparison of classes means something
    _assert_matches_keras(fresh_process["served"][body], expected)


def test_uint8_signature_agrees_with_float(fresh_process, classifier, images_float):
    expected = _keras_outputs(classifier, images_float)
    for body in ("instances_uint8", "columnar_uint8"):
        _assert_matches_keras(fresh_process["served"][body], expected)
    np.testing.assert_allclose(
        fresh_process["served"]["instances_uint8"]["logits"],
        fresh_process["served"]["instances"]["logits"],
        atol=ATOL,
    )


def test_grpc_request_is_served_like_keras(fresh_process, classifier, images_float):
    if "grpc" not in fresh_process["served"]:
        pytest.skip("tensorflow-serving-api is not installed (pip install tensorflow-serving-api)")
    _assert_matches_keras(fresh_process["served"]["grpc"], _keras_outputs(classifier, images_float))


def test_bad_input_is_rejected_in_the_graph(fresh_process):
    rejections = fresh_process["rejections"]
    assert rejections["ends_0_and_1"] == {"rejected": False}
    for case in ("above_one", "below_zero", "nan", "pixels_0_255_as_float"):
        assert rejections[case]["rejected"], case
        assert rejections[case]["error"] == "InvalidArgumentError", case
        assert "images must be float32 pixels in [0, 1]" in rejections[case]["message"], case
    for case in ("wrong_size", "wrong_channels", "no_batch_axis", "uint8_wrong_size"):
        assert rejections[case]["rejected"], case
        # The in-graph check, not only the Python signature: TF-Serving feeds the graph.
        assert "is not compatible with expected shape" in rejections[case]["message"], case
    assert rejections["float64"]["rejected"]


# Versions: never overwritten, never half-written.


def test_export_refuses_an_existing_version(exported, classifier):
    export_dir = os.path.dirname(os.path.dirname(exported))
    before = {
        path: os.path.getmtime(os.path.join(exported, path))
        for path in ("saved_model.pb", "assets.extra/model_card.json")
    }
    with pytest.raises(FileExistsError, match="version 1 .* already exists"):
        savedmodel.export_model(classifier, export_dir, NAME, version=1)
    after = {path: os.path.getmtime(os.path.join(exported, path)) for path in before}
    assert after == before
    assert os.listdir(os.path.dirname(exported)) == ["1"]


def test_versions_default_to_the_next_free_integer(tmp_path, classifier):
    root = tmp_path / "m"
    for entry in ("3", "007", ".partial-9-abc", "notes"):
        (root / entry).mkdir(parents=True)
    assert versions.existing_versions(str(root)) == {3, 7}
    assert versions.next_version(str(root)) == 8
    with pytest.raises(FileExistsError):  # "007" is version 7 to TF-Serving
        versions.free_version_dir(str(tmp_path), "m", 7)
    assert versions.next_version(str(tmp_path / "absent")) == 1
    for bad in ("a/b", "a:predict", "", "-x", ".hidden"):
        with pytest.raises(ValueError, match="model name"):
            versions.check_name(bad)
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="version"):
            versions.check_version(bad)
    path = savedmodel.export_model(classifier, str(tmp_path), "m")
    assert path == str(root / "8")


def test_failed_export_leaves_no_version_directory(tmp_path, classifier, monkeypatch):
    def fail_midway(path, card):
        with open(os.path.join(os.path.dirname(os.path.dirname(path)), "half-written"), "w") as f:
            f.write("{")
        raise OSError("disk full")

    # The SavedModel is written; the failure comes after it, before the rename.
    monkeypatch.setattr(savedmodel, "_write_model_card", fail_midway)
    existing = tmp_path / "served" / "m" / "1"
    existing.mkdir(parents=True)
    with pytest.raises(OSError, match="disk full"):
        savedmodel.export_model(classifier, str(tmp_path / "served"), "m", version=2)
    assert os.listdir(tmp_path / "served" / "m") == ["1"]
    with pytest.raises(OSError, match="disk full"):
        savedmodel.export_model(classifier, str(tmp_path / "new" / "dir"), "m")
    assert os.listdir(tmp_path) == ["served"]  # the folders it created are removed again


def test_export_rejects_a_model_without_a_fixed_image_shape(tmp_path):
    inputs = keras.Input(shape=(None, None, 3))
    model = keras.Model(inputs, keras.layers.GlobalAveragePooling2D()(inputs))
    with pytest.raises(ValueError, match="known"):
        savedmodel.export_model(model, str(tmp_path), "m")
    assert os.listdir(tmp_path) == []


# The command line.


def _export_cli(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "export", *args],
        cwd=ROOT,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture(scope="module")
def cli_exports(tmp_path_factory, run_dir, classifier) -> dict:
    """`python -m export` of the run (as version 3) and of a .keras file (its next version,
    beside an earlier version 1), both at once: each spends most of its time importing
    TensorFlow. One pair of programs for the tests of the command line that exports."""
    folder = tmp_path_factory.mktemp("cli")
    keras_file = str(folder / "tiny.keras")
    classifier.save(keras_file)
    served = str(folder / "served")
    os.makedirs(os.path.join(served, "tiny", "1"))  # an earlier export's version
    processes = {
        "run": _export_cli(f"--workdir={run_dir}", f"--export_dir={served}", "--version=3"),
        "file": _export_cli(f"--model_path={keras_file}", f"--export_dir={served}"),
    }
    done = {}
    for source, process in processes.items():
        stdout, stderr = process.communicate(timeout=300)
        done[source] = (process.returncode, stdout, stderr)
    return {"served": served, "keras_file": keras_file, "done": done}


def test_cli_exports_a_run_and_a_keras_file(cli_exports, run_dir):
    served, keras_file = cli_exports["served"], cli_exports["keras_file"]
    for returncode, _, stderr in cli_exports["done"].values():
        assert returncode == 0, stderr[-3000:]
        # Its own lines only, as train.py: no absl INFO lines ("Assets written to"), no
        # TensorFlow start-up lines.
        assert not re.search(r"^I\d{4} ", stderr, re.M), stderr[-3000:]
        assert "cuInit" not in stderr
    assert os.listdir(os.path.join(served, NAME)) == ["3"]
    assert sorted(os.listdir(os.path.join(served, "tiny"))) == ["1", "2"]
    card_file = os.path.join(served, "tiny", "2", "assets.extra", "model_card.json")
    with open(card_file) as f:
        card = json.load(f)
    # The file it came from, named from the card's folder (no absolute local path).
    assert not os.path.isabs(card["source"]["model_path"])
    named = os.path.join(os.path.dirname(card_file), card["source"]["model_path"])
    assert os.path.samefile(named, keras_file)
    assert card["robustness"] is None and card["method"] is None

    again = _export_cli(f"--workdir={run_dir}", f"--export_dir={served}", "--version=3")
    _, stderr = again.communicate(timeout=300)
    assert again.returncode != 0
    assert "--version=3" in stderr and "already exists" in stderr
    assert os.listdir(os.path.join(served, NAME)) == ["3"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--version=-1"], "--version"),
        (["--name=a/b"], "--name"),
        (["--model_path=nothing.keras", "--workdir=RUN"], "exactly one of --workdir and"),
        (["--workdir=EMPTY"], "--workdir"),
    ],
)
def test_cli_rejects_bad_flags_before_any_work(tmp_path, run_dir, args, message):
    empty = tmp_path / "empty"
    empty.mkdir()
    args = [a.replace("EMPTY", str(empty)).replace("RUN", run_dir) for a in args]
    if not any(a.startswith("--workdir") or a.startswith("--model_path") for a in args):
        args.append(f"--workdir={run_dir}")
    served = tmp_path / "served"
    process = _export_cli(*args, f"--export_dir={served}")
    _, stderr = process.communicate(timeout=120)
    assert process.returncode != 0
    assert message in stderr
    assert not served.exists()


# The client.


def test_rest_request_body_is_tf_serving_json(images_float, images_uint8):
    body = json.loads(json.dumps(client.rest_request_body(images_float)))
    assert set(body) == {"signature_name", "instances"}
    assert body["signature_name"] == "serving_default"
    assert len(body["instances"]) == len(images_float)  # one instance per image
    np.testing.assert_array_equal(np.asarray(body["instances"], np.float32), images_float)

    body = json.loads(json.dumps(client.rest_request_body(images_float, columnar=True)))
    assert set(body) == {"signature_name", "inputs"}
    np.testing.assert_array_equal(np.asarray(body["inputs"]["images"], np.float32), images_float)

    body = json.loads(json.dumps(client.rest_request_body(images_uint8)))
    assert body["signature_name"] == "serve_uint8"
    assert all(isinstance(v, int) for v in np.asarray(body["instances"]).ravel().tolist())
    np.testing.assert_array_equal(np.asarray(body["instances"]), images_uint8)

    for bad in (images_float * 255, images_float[0], images_uint8.astype(np.int32)):
        with pytest.raises(ValueError, match="images|pixels"):
            client.rest_request_body(bad)
    assert client.rest_url("localhost:8501", "m") == "http://localhost:8501/v1/models/m:predict"
    assert (
        client.rest_url("https://host/", "m", version=2)
        == "https://host/v1/models/m/versions/2:predict"
    )


def test_grpc_request_is_a_predict_request(images_float, images_uint8):
    predict_pb2 = pytest.importorskip(
        "tensorflow_serving.apis.predict_pb2",
        reason="tensorflow-serving-api is not installed (pip install tensorflow-serving-api)",
    )
    from tensorflow.core.framework import types_pb2

    request = client.grpc_request(images_float, NAME, version=4)
    assert isinstance(request, predict_pb2.PredictRequest)
    request = predict_pb2.PredictRequest.FromString(request.SerializeToString())
    assert request.model_spec.name == NAME
    assert request.model_spec.signature_name == "serving_default"
    assert request.model_spec.version.value == 4
    assert list(request.inputs) == ["images"]
    tensor = request.inputs["images"]
    assert tensor.dtype == types_pb2.DT_FLOAT
    assert [d.size for d in tensor.tensor_shape.dim] == [6, 28, 28, 1]
    np.testing.assert_array_equal(tf.make_ndarray(tensor), images_float)

    request = client.grpc_request(images_uint8, NAME)
    assert request.model_spec.signature_name == "serve_uint8"
    assert not request.model_spec.HasField("version")
    assert request.inputs["images"].dtype == types_pb2.DT_UINT8
    np.testing.assert_array_equal(tf.make_ndarray(request.inputs["images"]), images_uint8)


def _reply(handler: http.server.BaseHTTPRequestHandler, status: int, encoded: bytes) -> None:
    """Answer a stand-in server's request as TF-Serving's REST API does: JSON, its length."""
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(encoded)))
    handler.end_headers()
    handler.wfile.write(encoded)


@pytest.fixture(scope="module")
def rest_server(exported):
    """A stand-in for TF-Serving's REST API on 127.0.0.1, serving the export."""
    emulation = _emulation()
    model = tf.saved_model.load(exported)
    paths = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (the name http.server calls)
            paths.append(self.path)
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path != f"/v1/models/{NAME}:predict":
                status, reply = 404, {"error": f"Servable not found for request: {self.path}"}
            else:
                try:
                    outputs = emulation["predict"](model, body)
                    status, reply = 200, emulation["respond"](outputs, "inputs" in body)
                except tf.errors.InvalidArgumentError as error:
                    status, reply = 400, {"error": error.message}
            _reply(self, status, json.dumps(reply).encode())

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}", paths
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("columnar", [False, True])
def test_rest_predict_through_a_server(rest_server, classifier, images_float, columnar):
    address, paths = rest_server
    outputs = client.rest_predict(address, NAME, images_float, columnar=columnar)
    assert paths[-1] == f"/v1/models/{NAME}:predict"
    _assert_matches_keras(outputs, _keras_outputs(classifier, images_float))


def test_rest_predict_reports_server_errors(rest_server, images_float):
    address, _ = rest_server
    with pytest.raises(client.ServingError, match="HTTP 404.*Servable not found"):
        client.rest_predict(address, "other", images_float)
    # A float batch of the wrong size gets past the client and is refused by the model's graph.
    with pytest.raises(
        client.ServingError, match="(?s)HTTP 400.*not compatible with expected shape"
    ):
        client.rest_predict(address, NAME, np.zeros([1, 32, 32, 1], np.float32))


def test_client_cli_prints_classes(rest_server, tmp_path, classifier, images_uint8):
    address, _ = rest_server
    np.save(tmp_path / "batch.npy", images_uint8)
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "export.client",
            f"--server={address}",
            f"--model_name={NAME}",
            f"--images={tmp_path / 'batch.npy'}",
        ],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    printed = re.findall(r'class (\d+) "([^"]+)"', completed.stdout)
    expected = _keras_outputs(classifier, images_uint8.astype(np.float32) / 255)["classes"]
    assert printed == [(str(k), FASHION_MNIST_NAMES[k]) for k in expected]


def test_grpc_predict_through_a_server(exported, classifier, images_uint8):
    grpc = pytest.importorskip("grpc", reason="grpcio is not installed")
    pytest.importorskip(
        "tensorflow_serving.apis.prediction_service_pb2_grpc",
        reason="tensorflow-serving-api is not installed (pip install tensorflow-serving-api)",
    )
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    model = tf.saved_model.load(exported)

    class PredictionService(prediction_service_pb2_grpc.PredictionServiceServicer):
        """A stand-in for TF-Serving's gRPC Predict: the named signature on the inputs."""

        def Predict(self, request, context):  # noqa: N802 (the gRPC method name)
            signature = model.signatures[request.model_spec.signature_name]
            inputs = {k: tf.constant(tf.make_ndarray(v)) for k, v in request.inputs.items()}
            try:
                outputs = signature(**inputs)
            except tf.errors.InvalidArgumentError as error:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, error.message)
            response = predict_pb2.PredictResponse(model_spec=request.model_spec)
            for key, value in outputs.items():
                response.outputs[key].CopyFrom(tf.make_tensor_proto(value.numpy()))
            return response

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(PredictionService(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        address = f"127.0.0.1:{port}"
        outputs = client.grpc_predict(address, client.grpc_request(images_uint8, NAME))
        expected = _keras_outputs(classifier, images_uint8.astype(np.float32) / 255)
        _assert_matches_keras(outputs, expected)
        bad = client.grpc_request(np.zeros([1, 32, 32, 1], np.uint8), NAME)
        with pytest.raises(client.ServingError, match="INVALID_ARGUMENT"):
            client.grpc_predict(address, bad)
    finally:
        server.stop(None)


def _logits_and_input_gradient(model, images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x = tf.constant(images)
    with tf.GradientTape() as tape:
        tape.watch(x)
        logits = model(x, training=False)
        chosen = tf.reduce_sum(logits * tf.one_hot(tf.range(len(images)) % 10, 10))
    return logits.numpy(), tape.gradient(chosen, x).numpy()


def test_attacks_see_the_same_function_in_the_export_and_the_folded_graph(
    exported, run_dir, classifier, images_float
):
    """evaluate.py attacks a SavedModel or a Keras model with folded weights instead of the
    Keras model: logits and input gradients agree with it, and APGD runs on both."""
    images = images_float.astype(np.float32)
    expected_logits, expected_gradient = _logits_and_input_gradient(classifier, images)
    served, known = classifiers.load_model(exported)
    assert known["dataset"] == DATASET
    folded = classifiers.InferenceGraph(classifier)
    for candidate in (served, folded):
        logits, gradient = _logits_and_input_gradient(candidate, images)
        np.testing.assert_allclose(logits, expected_logits, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(gradient, expected_gradient, rtol=1e-4, atol=1e-6)
        labels = tf.constant(np.arange(len(images)) % 10, tf.int32)
        x_adv, _ = APGD(8 / 255, "ce", steps=3)(candidate, tf.constant(images), labels, seed=0)
        evaluation.check_in_ball(x_adv, tf.constant(images), 8 / 255)


def test_a_run_in_use_is_not_exported_and_its_evaluation_is_warned_of(tmp_path):
    """Exported while train.py still trains, a run's first epoch's model became version 1, and
    train.py's own export at the end skipped without a word: TF-Serving served the epoch-1
    model. The export is refused, naming the process; an evaluation goes on, warned."""
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "results.json").write_text("{}")
    (run_dir / "checkpoints" / "best.weights.h5").write_bytes(b"")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from fbat_tf.run import Run; held = Run(sys.argv[1]).hold(); "
            "print('held', flush=True); time.sleep(600)",
            str(run_dir),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
        refused = subprocess.run(
            [sys.executable, "-m", "export", f"--workdir={run_dir}"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert refused.returncode != 0
        assert refused.stderr.strip().splitlines() == [
            f"error: {run_dir} is in use: process {holder.pid} on {os.uname().nodename} trains "
            "in it, so its best model may still change; train.py exports the model it selects "
            "when it ends (run this again then if it ran with --noexport)"
        ]
        assert not (run_dir / "export").exists()
        warned = subprocess.run(
            [sys.executable, "evaluate.py", f"--model_path={run_dir}", "--n_examples=8"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert f"warning: {run_dir} is in use: process {holder.pid} on" in warned.stderr
    finally:
        holder.kill()
        holder.wait()
    # The lock ends with its process: the same export is no longer refused as in use.
    after = subprocess.run(
        [sys.executable, "-m", "export", f"--workdir={run_dir}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "is in use" not in after.stderr


def test_python_m_export_says_which_version_it_writes_beside_earlier_ones(cli_exports):
    """An exported model exported again wrote version 2 without a word; TF-Serving then serves
    it. The command says so, naming the versions there (here the .keras file's export, beside
    its version 1: cli_exports)."""
    served = cli_exports["served"]
    returncode, stdout, stderr = cli_exports["done"]["file"]
    assert returncode == 0, stderr[-3000:]
    assert (
        f"tiny has versions 1 in {served}: this writes version 2, which TF-Serving serves "
        "from now on (--version picks another)"
    ) in stdout
    assert os.path.exists(os.path.join(served, "tiny", "2", "saved_model.pb"))


@pytest.mark.parametrize("timeout", ["nan", "inf", "0", "-1"])
def test_the_serving_client_refuses_a_timeout_that_is_no_wait(tmp_path, timeout):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "export.client",
            "--server=localhost:1",
            "--model_name=m",
            f"--images={tmp_path / 'x.npy'}",
            f"--timeout={timeout}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode != 0
    assert "--timeout must be a finite number of seconds above 0" in done.stderr, done.stderr


@pytest.fixture
def odd_server():
    """A server that answers each POST with the next of the `answers` given to it (raw bytes)."""
    answers: list[bytes] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (the name http.server calls)
            self.rfile.read(int(self.headers["Content-Length"]))
            _reply(self, 200, answers.pop(0))

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}", answers
    server.shutdown()
    server.server_close()


def _client(address: str, images: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "export.client",
            f"--server={address}",
            "--model_name=m",
            f"--images={images}",
        ],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_client_says_in_one_line_what_is_wrong_with_an_answer_or_its_images(
    odd_server, tmp_path
):
    """A 0-image .npy and a malformed answer (no classes, too few, not JSON) ended in
    KeyError or IndexError tracebacks, naming nothing."""
    address, answers = odd_server
    empty = tmp_path / "empty.npy"
    np.save(empty, np.zeros([0, 28, 28, 1], np.uint8))
    done = _client(address, str(empty))
    assert done.stderr.strip().splitlines() == [
        f"error: {empty} holds no image (shape (0, 28, 28, 1))"
    ]
    two = tmp_path / "two.npy"
    np.save(two, np.zeros([2, 28, 28, 1], np.uint8))
    cases = {
        b'{"predictions": [{"logits": [0.1]}, {"logits": [0.2]}]}': "answered no classes for 2",
        b'{"predictions": [{"classes": 3}]}': "answered classes of shape (1,) for 2 images",
        b'{"predictions": [{"classes": 3}, {"logits": 1}]}': "rows hold different outputs",
        b"<html>busy</html>": "the answer is not JSON",
    }
    for answer, says in cases.items():
        answers.append(answer)
        done = _client(address, str(two))
        lines = done.stderr.strip().splitlines()
        assert done.returncode != 0 and len(lines) == 1 and "Traceback" not in done.stderr
        assert lines[0].startswith("error: ") and says in lines[0], lines[0]
