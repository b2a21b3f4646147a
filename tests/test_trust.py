"""Files from elsewhere never run code: a .keras file that holds code is refused unless the caller
says it trusts the file, the serving client never unpickles a .npy file, and the README says what
fbat-tf loads and refuses. (CIFAR batches and tarballs: tests/test_data.py; evaluate.py on such a
.keras file: tests/test_evaluate_cli.py.)

    python -m pytest tests/test_trust.py -q
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import warnings
import zipfile

import keras
import numpy as np
import pytest

from export import client, savedmodel
from fbat_tf import classifiers, trust

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def lambda_model() -> keras.Model:
    """A classifier of 28x28x1 images whose first layer is a Python lambda."""
    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [
            keras.Input((28, 28, 1)),
            keras.layers.Lambda(lambda x: 2.0 * x - 1.0, name="rescale"),
            keras.layers.Flatten(),
            keras.layers.Dense(10),
        ]
    )


def save_quietly(model: keras.Model, path: str) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Keras warns that a lambda is being saved
        model.save(path)
    return path


# The module's fixtures are built once for all its tests: pytest-xdist runs them on one worker
# (--dist loadgroup, pyproject.toml).
pytestmark = pytest.mark.xdist_group("trust")


@pytest.fixture(scope="module")
def lambda_file(tmp_path_factory) -> str:
    return save_quietly(lambda_model(), str(tmp_path_factory.mktemp("m") / "lambda.keras"))


def write_keras_config(path: str, config: dict) -> str:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("config.json", json.dumps(config))
    return path


def test_keras_file_code_names_lambdas_and_tfsm_layers(tmp_path, lambda_file):
    assert trust.keras_file_code(lambda_file) == [
        "Lambda 'rescale': a Python lambda, stored as bytecode"
    ]
    plain = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, name="out")])
    assert trust.keras_file_code(save_quietly(plain, str(tmp_path / "plain.keras"))) == []
    served = {"class_name": "TFSMLayer", "config": {"name": "served", "filepath": "/srv/m/1"}}
    config = {"class_name": "Sequential", "config": {"name": "s", "layers": [served]}}
    assert trust.keras_file_code(write_keras_config(str(tmp_path / "tfsm.keras"), config)) == [
        "TFSMLayer 'served': loads the SavedModel '/srv/m/1', a program"
    ]
    (tmp_path / "not-a-zip.keras").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="not a readable .keras model file"):
        trust.keras_file_code(str(tmp_path / "not-a-zip.keras"))


def test_load_model_refuses_a_lambda_unless_trusted(lambda_file):
    with pytest.raises(trust.UntrustedCodeError) as refused:
        classifiers.load_model(lambda_file)
    message = str(refused.value)
    assert message.startswith(f"refusing to load {lambda_file}: it holds code")
    assert "Lambda 'rescale': a Python lambda" in message
    assert "--trust_model_code" in message and "trust_code=True" in message
    assert isinstance(refused.value, ValueError)  # what the command lines report as errors

    model, known = classifiers.load_model(lambda_file, trust_code=True)
    x = np.random.default_rng(0).uniform(0, 1, (4, 28, 28, 1)).astype(np.float32)
    np.testing.assert_allclose(model(x), lambda_model()(x), atol=1e-6)
    assert known == {}


def test_the_refusal_holds_when_keras_safe_mode_is_off_globally(lambda_file):
    # keras.config.enable_unsafe_deserialization() overrides an explicit safe_mode=True in Keras.
    from keras.src.saving import serialization_lib

    before = serialization_lib.in_safe_mode()
    keras.config.enable_unsafe_deserialization()
    try:
        with pytest.raises(trust.UntrustedCodeError, match="Lambda 'rescale'"):
            classifiers.load_model(lambda_file)
    finally:
        serialization_lib.global_state.set_global_attribute("safe_mode_saving", before)


def test_keras_files_are_loaded_with_safe_mode_stated(tmp_path, monkeypatch):
    plain = keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Flatten()])
    path = save_quietly(plain, str(tmp_path / "plain.keras"))
    calls = []

    def keras_refuses(filepath, **kwargs):
        calls.append(kwargs)
        raise ValueError("Requested the loading of a file ... passing `safe_mode=False` ...")

    monkeypatch.setattr(keras.saving, "load_model", keras_refuses)
    # Whatever Keras' safe mode refuses gets fbat-tf's advice too.
    with pytest.raises(trust.UntrustedCodeError, match="--trust_model_code") as refused:
        classifiers.load_model(path)
    assert "Requested the loading of a file" in str(refused.value)
    with pytest.raises(trust.UntrustedCodeError):
        savedmodel.export_keras_file(path, str(tmp_path / "served"))
    assert [call["safe_mode"] for call in calls] == [True, True]
    assert not (tmp_path / "served").exists()
    with pytest.raises(ValueError, match="safe_mode") as raised:
        classifiers.load_model(path, trust_code=True)
    assert not isinstance(raised.value, trust.UntrustedCodeError)
    assert calls[-1]["safe_mode"] is False


def test_export_refuses_a_lambda_unless_trusted(tmp_path, lambda_file):
    served = tmp_path / "served"
    with pytest.raises(trust.UntrustedCodeError, match="Lambda 'rescale'"):
        savedmodel.export_keras_file(lambda_file, str(served))
    assert not served.exists()
    path = savedmodel.export_keras_file(lambda_file, str(served), trust_code=True)
    assert path == str(served / "lambda" / "1")


def test_export_cli_refuses_a_lambda_before_tensorflow_loads(tmp_path, lambda_file):
    served = tmp_path / "served"
    completed = subprocess.run(
        [sys.executable, "-m", "export", f"--model_path={lambda_file}", f"--export_dir={served}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode != 0
    message = completed.stderr.strip().splitlines()[-1]
    assert message.startswith(f"error: --model_path: refusing to load {lambda_file}")
    assert "--trust_model_code" in message
    assert not served.exists()


class RunsACommand:
    """Unpickling it runs a shell command that creates `marker`."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {shlex.quote(self.marker)}",)


def test_client_never_unpickles_a_npy_file(tmp_path):
    marker = tmp_path / "marker"
    path = str(tmp_path / "objects.npy")
    np.save(path, np.array([RunsACommand(str(marker))], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="objects.npy: Object arrays cannot be loaded") as refused:
        client.load_images([path])
    assert "numeric .npy arrays only" in str(refused.value)
    assert not marker.exists()
    # The file does what it says when unpickled.
    np.load(path, allow_pickle=True)
    assert marker.exists()


def test_readme_says_what_is_loaded_and_refused():
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    assert "\n## Security\n" in readme
    section = readme.split("\n## Security\n", 1)[1].split("\n## ", 1)[0]
    for words in ("CIFAR", ".keras", "--trust_model_code", "SavedModel", "trust", ".npy"):
        assert words in section, words
