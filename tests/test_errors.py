"""Failures a user meets end in one line naming the file and what to do, exit non-zero, and
leave nothing half-written; Python's traceback only with --traceback."""

from __future__ import annotations

import json
import os
import pickle
import subprocess

import pytest

from tests import in_process
from tests.commands import NO_TENSORFLOW, python_command
from tests.in_process import one_line
from tests.test_train_cli import TINY_RUN

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FASHION_MNIST = "/usr/share/datasets/fashion-mnist"
# A tiny run of real Fashion-MNIST that exports nothing.
TINY = [*TINY_RUN, "--method=standard", "--width=2", "--epochs=1", "--noexport"]


def run(program: str, *args: str, prelude: str = "") -> subprocess.CompletedProcess:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    command = python_command(os.path.join(ROOT, program), *args, prelude=prelude)
    return subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir(FASHION_MNIST), reason="needs dataset-fashion-mnist")
def test_a_truncated_results_file_on_resume_is_one_line_and_traceback_on_demand(
    tmp_path, monkeypatch
):
    workdir = tmp_path / "run"

    def train(*args: str) -> in_process.Ran:
        common = ("--dataset=fashion_mnist", *TINY, f"--workdir={workdir}")
        return in_process.train(*common, *args, monkeypatch=monkeypatch)

    first = train("--verbose=2")
    assert first.returncode == 0, first.stderr[-3000:]
    # The epoch line as a user reads it: the numbers that matter; the rest are in results.json.
    (line,) = [x for x in first.stdout.splitlines() if "val_robust_accuracy" in x]
    assert "loss:" in line and "val_fgsm_accuracy" in line and "train_seconds: " in line
    for hidden in ("images_per_second", "learning_rate", "val_best", "nonfinite_batches"):
        assert hidden not in line, hidden
    assert "images_per_second" in json.loads((workdir / "results.json").read_text())["history"][0]
    results = workdir / "results.json"
    results.write_text(results.read_text()[:100])  # a disk that filled up, a killed copy
    line = train().one_line()
    assert line.startswith(f"error: {results} is not readable JSON") and "--workdir" in line
    assert results.read_text().__len__() == 100  # nothing rewritten
    loud = train("--traceback")
    assert loud.returncode != 0 and "Traceback" in loud.stderr


def test_a_workdir_that_is_a_file_is_refused_before_any_work(tmp_path):
    path = tmp_path / "a-file"
    path.write_text("")
    line = one_line(run("train.py", "--dataset=fashion_mnist", f"--workdir={path}"))
    assert line == f"error: --workdir={path} is a file, not a folder; name a folder"


def test_a_refused_cifar_batch_through_train_py_is_one_line_and_leaves_no_run(tmp_path):
    """A CIFAR batch naming a global it must not run is refused while training starts: the new
    run directory is removed again."""
    folder = tmp_path / "data" / "cifar-10-batches-py"
    folder.mkdir(parents=True)

    class Payload:
        def __reduce__(self):
            return (os.system, ("touch " + str(tmp_path / "RAN"),))

    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        with open(folder / name, "wb") as f:
            pickle.dump({b"data": Payload(), b"labels": [0]}, f, protocol=2)
    workdir = tmp_path / "run"
    line = one_line(
        run(
            "train.py",
            *TINY,
            "--dataset=cifar10",
            f"--data_dir={tmp_path / 'data'}",
            "--nodownload",
            f"--workdir={workdir}",
        )
    )
    assert "refusing to load" in line and str(folder) in line and "system" in line
    assert not workdir.exists() and not (tmp_path / "RAN").exists()


def test_evaluate_py_on_a_truncated_weights_file_is_one_line(tmp_path, monkeypatch):
    source = os.path.join(
        ROOT, "study", "results", "fashion_mnist_ig", "fastbat-eps76-ig_coef1-lambda_inv2500-seed0"
    )
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    for name in ("results.json", "flags.txt"):
        (run_dir / name).write_bytes(open(os.path.join(source, name), "rb").read())
    weights = open(os.path.join(source, "checkpoints", "best.weights.h5"), "rb").read()
    (run_dir / "checkpoints" / "best.weights.h5").write_bytes(weights[: len(weights) // 2])
    words = (f"--model_path={run_dir}", "--attacks=pgd", "--n_examples=8")
    line = in_process.evaluate(*words, monkeypatch=monkeypatch).one_line()
    assert line.startswith("error: ") and "best.weights.h5" in line
    assert sorted(os.listdir(run_dir)) == ["checkpoints", "flags.txt", "results.json"]


def test_the_serving_client_names_files_it_cannot_read(tmp_path):
    """An .npz archive or a file that is no image is refused naming it; an .NPY spelt in
    capitals is read as the .npy it is (it was handed to the image decoder)."""
    import numpy as np

    from export import client

    upper = tmp_path / "IMAGE.NPY"
    with open(upper, "wb") as f:
        np.save(f, np.zeros((28, 28, 1), np.uint8))
    batch, labels = client.load_images([str(upper)])
    assert batch.shape == (1, 28, 28, 1) and labels == [str(upper)]
    archive = tmp_path / "images.npz"
    np.savez(archive, x=np.zeros((1, 28, 28, 1), np.uint8))
    text = tmp_path / "notes.txt"
    text.write_text("not an image")
    for path, says in ((archive, "an .npz archive"), (text, "not an image TensorFlow decodes")):
        with pytest.raises(ValueError, match=f"{path}: {says}"):
            client.load_images([str(path)])


def test_a_keras_file_nested_past_reason_is_refused_in_one_line(tmp_path):
    """A .keras file whose config nests tens of thousands of levels deep (no model does): one
    line naming the file, before TensorFlow loads."""
    import zipfile

    path = tmp_path / "deep.keras"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("config.json", "[" * 100_000 + "]" * 100_000)
        archive.writestr("metadata.json", "{}")
    line = one_line(
        run("evaluate.py", f"--model_path={path}", "--dataset=fashion_mnist", "--eps=8")
    )
    assert line.startswith(f"error: --model_path: {path} is not a readable .keras model file")
    assert "nests" in line


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir(FASHION_MNIST), reason="needs dataset-fashion-mnist")
def test_a_truncated_checkpoint_on_resume_is_one_line(tmp_path, monkeypatch):
    """A run killed mid-epoch whose last checkpoint was cut short (a full disk): the resume
    says which checkpoint cannot be read, in one line, and rewrites nothing."""
    import glob
    import json

    workdir = tmp_path / "run"
    words = (*TINY, "--dataset=fashion_mnist", f"--workdir={workdir}")
    first = in_process.train(*words, monkeypatch=monkeypatch)
    assert first.returncode == 0, first.stderr[-3000:]
    results = workdir / "results.json"
    record = json.loads(results.read_text())
    record["status"] = "running"  # as a run killed before its end leaves it
    results.write_text(json.dumps(record))
    (data,) = glob.glob(str(workdir / "checkpoints" / "last" / "*.data-*"))
    with open(data, "r+b") as f:
        f.truncate(os.path.getsize(data) // 2)
    line = in_process.train(*words, monkeypatch=monkeypatch).one_line()
    assert line.startswith("error: ") and "checkpoint" in line.lower()
    assert json.loads(results.read_text()) == record


@pytest.mark.skipif(not os.path.isdir(FASHION_MNIST), reason="needs dataset-fashion-mnist")
def test_idx_files_of_another_image_size_are_one_line_and_leave_no_run(tmp_path, monkeypatch):
    import gzip
    import struct

    import numpy as np

    def write(name: str, array: np.ndarray) -> None:
        header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim)
        header += b"".join(struct.pack(">I", size) for size in array.shape)
        with gzip.open(tmp_path / "data" / f"{name}.gz", "wb") as f:
            f.write(header + array.tobytes())

    (tmp_path / "data").mkdir()
    for part in ("train", "t10k"):
        write(f"{part}-images-idx3-ubyte", np.zeros((10, 20, 20), np.uint8))
        write(f"{part}-labels-idx1-ubyte", np.zeros(10, np.uint8))
    workdir = tmp_path / "run"
    words = (*TINY, "--dataset=fashion_mnist", f"--data_dir={tmp_path / 'data'}")
    line = in_process.train(*words, f"--workdir={workdir}", monkeypatch=monkeypatch).one_line()
    assert "images of shape (20, 20, 1), but fashion_mnist images are (28, 28, 1)" in line
    assert not workdir.exists()


def test_a_keras_file_naming_a_function_keras_will_not_rebuild_is_one_line(tmp_path, monkeypatch):
    """A Dense layer whose activation names os.system: Keras refuses to rebuild it; evaluate.py
    says so in one line naming the file, and nothing runs."""
    import json
    import zipfile

    import keras

    path, edited = tmp_path / "model.keras", tmp_path / "edited.keras"
    keras.Sequential(
        [keras.Input((28, 28, 1)), keras.layers.Flatten(), keras.layers.Dense(10, "relu")]
    ).save(path)
    with zipfile.ZipFile(path) as archive:
        files = {name: archive.read(name) for name in archive.namelist()}
    marker = tmp_path / "RAN"
    function = {"module": "os", "class_name": "function", "config": "system"}
    config = json.dumps(json.loads(files["config.json"])).replace(
        '"activation": "relu"', f'"activation": {json.dumps({**function, "registered_name": None})}'
    )
    assert "os" in config
    files["config.json"] = config.encode()
    with zipfile.ZipFile(edited, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    line = in_process.evaluate(
        f"--model_path={edited}",
        "--dataset=fashion_mnist",
        "--eps=8",
        f"--results={tmp_path / 'eval.json'}",
        "--attacks=pgd",
        "--n_examples=8",
        monkeypatch=monkeypatch,
    ).one_line()
    assert line.startswith(f"error: {edited}: Keras cannot rebuild the model it holds")
    assert not marker.exists() and not (tmp_path / "eval.json").exists()


def test_a_full_disk_is_told_as_such_naming_the_file():
    import errno

    from flags import errors

    full = OSError(errno.ENOSPC, "No space left on device", "/runs/a/results.json.tmp")
    said = errors.describe(full)
    assert said.startswith("no space left on the device writing /runs/a/results.json.tmp")
    assert "run the same command again" in said


def _committed_run_copy(run_dir) -> None:
    source = os.path.join(
        ROOT, "study", "results", "fashion_mnist_ig", "fastbat-eps76-ig_coef1-lambda_inv2500-seed0"
    )
    (run_dir / "checkpoints").mkdir(parents=True)
    for name in ("results.json", "flags.txt", os.path.join("checkpoints", "best.weights.h5")):
        (run_dir / name).write_bytes(open(os.path.join(source, name), "rb").read())


def test_a_mistyped_record_is_one_line_naming_it_in_evaluate_and_export(tmp_path):
    """ε written as text in results.json: evaluate.py said `TypeError: '>=' not supported`,
    naming nothing, and `python -m export` exported the model with ε = 8 pixels. Both now say
    so before TensorFlow loads (here it cannot)."""
    run_dir = tmp_path / "run"
    _committed_run_copy(run_dir)
    results = run_dir / "results.json"
    record = json.loads(results.read_text())
    record["config"]["eps"] = "76"
    results.write_text(json.dumps(record))
    said = f"error: {results}: config.eps is '76', not a float; restore the file train.py wrote"
    words = (f"--model_path={run_dir}", "--attacks=pgd")
    line = one_line(run("evaluate.py", *words, prelude=NO_TENSORFLOW))
    assert line.startswith(said), line
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    command = python_command("-m", "export", f"--workdir={run_dir}", prelude=NO_TENSORFLOW)
    exported = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env)
    assert one_line(exported).startswith(said), exported.stderr[-2000:]
    assert not (run_dir / "export").exists()


def test_a_damaged_model_card_is_one_line_naming_it(tmp_path, monkeypatch):
    """Evaluating an export whose model card is cut short or holds a number for the dataset's
    name: JSON's message, or "unknown dataset 5", naming no file."""
    import tensorflow as tf

    export = tmp_path / "export" / "1"
    (export / "assets.extra").mkdir(parents=True)
    tf.saved_model.save(tf.Module(), str(export))
    card = export / "assets.extra" / "model_card.json"
    for text, says in (
        ('{"dataset": "fashion_mnist", "mod', "is not readable JSON"),
        ('{"dataset": 5, "model": {}}', "dataset is 5, not a name"),
        ('{"dataset": "fashion_mnist", "model": {}, "eps": {"pixels": "8"}}', "eps.pixels is '8'"),
        # Hand-edited numbers and names: they failed after TensorFlow loaded, naming no card
        # (1e308 as a graph assertion about [-nan] pixels).
        ('{"model": {}, "eps": {"pixels": NaN}}', "eps.pixels is nan, not a budget in (0, 1]"),
        ('{"model": {}, "eps": {"pixels": -0.5}}', "eps.pixels is -0.5, not a budget in (0, 1]"),
        ('{"model": {}, "eps": {"pixels": 1e308}}', "eps.pixels is 1e+308, not a budget"),
        ('{"model": {}, "validation_from": "bogus"}', "validation_from is 'bogus', not one of"),
    ):
        card.write_text(text)
        # Read before TensorFlow loads: here it cannot.
        words = (f"--model_path={export}", "--attacks=pgd")
        line = one_line(run("evaluate.py", *words, prelude=NO_TENSORFLOW))
        assert line.startswith(f"error: {card}") and says in line, line
        assert "restore the card" in line or "JSON" in line, line
    # A SavedModel fbat-tf did not write (no signature for images): named, with what to pass
    # (once TensorFlow has loaded it: in this process).
    card.write_text('{"dataset": "fashion_mnist", "model": {}}')
    words = (f"--model_path={export}", "--attacks=pgd")
    line = in_process.evaluate(*words, monkeypatch=monkeypatch).one_line()
    assert line.startswith(f"error: {export} is a SavedModel without the serving_default"), line


def test_a_full_disk_inside_tensorflow_or_h5py_is_told_as_such_naming_the_file():
    import tensorflow as tf

    from flags import errors

    events = "/runs/a/tensorboard/train/events.out.tfevents.1.vm.2.v2"
    writer = tf.errors.ResourceExhaustedError(
        None, None, f"{{{{function_node WriteSummary}}}} {events}; No space left on device\n\t"
    )
    h5 = RuntimeError(
        "Can't decrement id ref count (file write failed: time = Sat Nov 28 20:47:57 2026\n, "
        "filename = '/runs/a/checkpoints/best.weights.h5.tmp.weights.h5', file descriptor = 6, "
        "errno = 28, error message = 'No space left on device', buf = 0x55eb38291058)"
    )
    for error, path in ((writer, events), (h5, "/runs/a/checkpoints/best.weights.h5.tmp")):
        said = errors.describe(error)
        assert said.startswith(f"no space left on the device writing {path}"), said
        assert "run the same command again" in said


def test_the_best_weights_are_not_begun_on_a_disk_without_room_for_them(tmp_path, monkeypatch):
    import collections

    import keras

    from fbat_tf import callbacks

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1000)])  # 20 kB of weights
    path = str(tmp_path / "best.weights.h5")
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(callbacks.shutil, "disk_usage", lambda _: usage(1 << 30, 0, 20_000))
    with pytest.raises(OSError) as refused:
        callbacks.save_weights(model, path)
    assert refused.value.errno == 28 and refused.value.filename.startswith(path)
    assert os.listdir(tmp_path) == []  # nothing begun: h5py never met the full disk
    monkeypatch.undo()
    callbacks.save_weights(model, path)
    assert os.listdir(tmp_path) == ["best.weights.h5"]


def test_evaluate_py_checks_eps_units_against_the_model_s_own_norm(tmp_path):
    """README's L2 command (`--model_path=<an L2 run> --eps=0.5,1,1.5`) was refused as "ε is in
    1/255 units … did you mean --eps=128": the units check ran before the model's norm was
    read. An L2 run's budgets pass it (here TensorFlow, unimportable, is then what stops the
    program); an L∞ run's small budgets are still refused before TensorFlow loads."""
    linf, l2 = tmp_path / "linf", tmp_path / "l2"
    _committed_run_copy(linf)
    _committed_run_copy(l2)
    results = l2 / "results.json"
    record = json.loads(results.read_text())
    record["config"].update(norm="l2", eps=1.5, method="pgd", method_options={})
    results.write_text(json.dumps(record))
    words = ("--eps=0.5,1,1.5", "--attacks=pgd")
    line = one_line(run("evaluate.py", f"--model_path={l2}", *words, prelude=NO_TENSORFLOW))
    assert "import of tensorflow halted" in line and "1/255" not in line, line
    line = one_line(run("evaluate.py", f"--model_path={linf}", *words, prelude=NO_TENSORFLOW))
    assert line.startswith("error: --eps=0.5: ε is in 1/255 units"), line
    assert "did you mean --eps=128" in line and "--allow_small_units" in line
    # --norm on the command line decides, whatever the model's own.
    done = run("evaluate.py", f"--model_path={l2}", "--norm=linf", *words, prelude=NO_TENSORFLOW)
    assert done.returncode != 0 and "did you mean --eps=128" in done.stderr


def _onnx_classifier(path, classes: int) -> None:
    """An ONNX file taking 28×28×1 images and giving `classes` scores: a linear map."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weights = np.random.default_rng(0).normal(size=(784, classes)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Reshape", ["x", "flat_shape"], ["flat"]),
            helper.make_node("MatMul", ["flat", "w"], ["logits"]),
        ],
        "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 28, 28, 1])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", classes])],
        [numpy_helper.from_array(weights, "w"), numpy_helper.from_array(np.array([-1, 784]))],
    )
    graph.initializer[1].name = "flat_shape"
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))


@pytest.mark.parametrize("classes", [5, 1000])
def test_an_onnx_file_with_another_number_of_classes_is_refused_before_any_work(tmp_path, classes):
    """5 class scores for Fashion-MNIST's 10 classes failed inside TensorFlow
    (SparseSoftmaxCrossEntropyWithLogits); 1,000 were evaluated and written into the card."""
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    source = tmp_path / "run"
    _committed_run_copy(source)
    path = tmp_path / f"model{classes}.onnx"
    _onnx_classifier(path, classes)
    words = (f"--model_path={path}", f"--source_model_path={source}", "--attacks=pgd")
    line = one_line(run("evaluate.py", *words, prelude=NO_TENSORFLOW))
    assert line.startswith(f"error: {path}: the file gives {classes} class scores per image"), line
    assert "the 10 classes of fashion_mnist" in line
    assert sorted(os.listdir(tmp_path)) == sorted(["run", path.name])


@pytest.mark.parametrize(
    "edit, said",
    [
        (
            lambda record: record["history"][0].update(val_robust_accuracy="high"),
            "history's epoch 1 val_robust_accuracy is 'high', not a number",
        ),
        (
            lambda record: record["config"].update(seed=-7),
            "config.seed is -7, outside [0, 2147483647], what train.py takes",
        ),
        (
            lambda record: record["config"].update(eps=-0.5),
            "config.eps is -0.5, not a budget in (0, 1]",
        ),
    ],
)
def test_a_wrong_valued_record_is_not_exported_into_a_model_card(tmp_path, edit, said):
    """`val_robust_accuracy: "high"` and `config.seed: -7` went into the model card, `python -m
    export` exiting 0; now refused in one line naming results.json, before TensorFlow loads."""
    run_dir = tmp_path / "run"
    _committed_run_copy(run_dir)
    results = run_dir / "results.json"
    record = json.loads(results.read_text())
    edit(record)
    results.write_text(json.dumps(record))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    command = python_command("-m", "export", f"--workdir={run_dir}", prelude=NO_TENSORFLOW)
    exported = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env)
    line = one_line(exported)
    assert line.startswith(f"error: {results}: {said}"), line
    assert "restore the file train.py wrote" in line
    assert not (run_dir / "export").exists()
