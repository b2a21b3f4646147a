"""ONNX and LiteRT beside the SavedModel: exported by train.py, run by their own runtimes in a
fresh process, evaluated by evaluate.py against the model they came from, and the RobustBench
entry of an evaluated model.

    python -m pytest -q tests/test_deploy.py -p no:xdist

One tiny run (real Fashion-MNIST, small_cnn at width 4, one epoch on 256 images) is trained by
train.py with every format. Each file's logits are read in a process that imports its runtime
and NumPy only, and compared with the Keras model's; each evaluation's numbers are compared
with the same quantities computed here, independently, through the runtimes and the Keras
model.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from tests.commands import BLOCK, NO_TENSORFLOW, python_command
from tests.test_train_cli import TINY_RUN

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAME = "fashion_mnist-small_cnn-fastat"
FILES = ("model.onnx", "model.tflite", "model_int8.tflite")
EXAMPLES = 64
EPS = 8 / 255
EXTRA_HINT = 'pip install -e ".[export]"'


def _env() -> dict[str, str]:
    return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")


def _run(*args: str, prelude: str = "", env: dict | None = None) -> subprocess.CompletedProcess:
    """A command as a user types it; `prelude` (Python) runs first in the same process, e.g.
    to make a package unimportable."""
    return subprocess.run(
        python_command(*args, prelude=prelude),
        cwd=ROOT,
        env=env or _env(),
        capture_output=True,
        text=True,
        timeout=900,
    )


def _one_line_error(done: subprocess.CompletedProcess, *said: str) -> str:
    """The command failed with one line on stderr saying all of `said`, and no traceback."""
    assert done.returncode == 1, (done.returncode, done.stderr[-3000:])
    lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    last = lines[-1]
    assert last.startswith("error: "), done.stderr[-3000:]
    for text in said:
        assert text in last, (text, last)
    return last


# The module's fixtures are built once for all its tests: pytest-xdist runs them on one worker
# (--dist loadgroup, pyproject.toml).
pytestmark = [pytest.mark.xdist_group("deploy"), pytest.mark.slow]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict[str, str]:
    workdir = str(tmp_path_factory.mktemp("deploy") / "run")
    done = _run(
        "train.py",
        "--method=fastat",
        f"--workdir={workdir}",
        # One epoch and no final test: the claims concern the exported files.
        *[f for f in TINY_RUN if not f.startswith(("--epochs", "--eval_", "--noeval_"))],
        "--epochs=1",
        "--nofinal_test",
        "--export_formats=saved_model,onnx,litert",
        f"--int8_examples={EXAMPLES}",
        # As a user runs it, TensorFlow's log level unset: the LiteRT converter's lines
        # ("Ignored output_format", "fully_quantize: 0, ...") are held back.
        env={k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for line in ("Ignored output_format", "fully_quantize", "Skipping runtime version metadata"):
        assert line not in done.stderr, done.stderr[-3000:]
    version = os.path.join(workdir, "export", NAME, "1")
    assert "beside it: model.onnx, model.tflite, model_int8.tflite" in done.stdout, done.stdout
    return {"workdir": workdir, "version": version}


@pytest.fixture(scope="module")
def test_points():
    from fbat_tf import data

    split = data.load("fashion_mnist", "test", max_examples=EXAMPLES, batch_size=EXAMPLES)
    x, y = next(iter(split))
    return x.numpy(), y.numpy()


@pytest.fixture(scope="module")
def keras_model(trained):
    from fbat_tf.run import Run

    return Run(trained["workdir"]).build_classifier()


@pytest.fixture(scope="module")
def keras_logits(keras_model, test_points):
    return np.asarray(keras_model(test_points[0], training=False))


# Fresh process: the runtimes alone, as a deployment would run the files.
RUNTIME_SCRIPT = r"""
import json, sys
import numpy as np
sys.modules["fbat_tf"] = None
sys.modules["tensorflow"] = None
folder, images_path, out_path = sys.argv[1:]
x = np.load(images_path)
import onnxruntime
session = onnxruntime.InferenceSession(folder + "/model.onnx", providers=["CPUExecutionProvider"])
found = {"model.onnx": session.run(None, {session.get_inputs()[0].name: x})[0].tolist()}
from ai_edge_litert.interpreter import Interpreter
for name in ("model.tflite", "model_int8.tflite"):
    interpreter = Interpreter(model_path=folder + "/" + name)
    index = interpreter.get_input_details()[0]["index"]
    interpreter.resize_tensor_input(index, list(x.shape))
    interpreter.allocate_tensors()
    interpreter.set_tensor(index, x)
    interpreter.invoke()
    found[name] = interpreter.get_tensor(interpreter.get_output_details()[0]["index"]).tolist()
json.dump(found, open(out_path, "w"))
"""


def test_each_file_runs_in_its_runtime_alone_and_computes_the_model(
    trained, test_points, keras_logits, tmp_path
):
    version = trained["version"]
    assert set(FILES) <= set(os.listdir(version))
    np.save(tmp_path / "x.npy", test_points[0])
    (tmp_path / "run.py").write_text(RUNTIME_SCRIPT)
    done = subprocess.run(
        [sys.executable, "run.py", version, "x.npy", "out.json"],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = {k: np.asarray(v) for k, v in json.loads((tmp_path / "out.json").read_text()).items()}
    for name in ("model.onnx", "model.tflite"):  # float32: the same function
        np.testing.assert_allclose(found[name], keras_logits, atol=1e-4)
    # int8: close, not equal; it must still classify almost all of them as the model does.
    int8 = found["model_int8.tflite"]
    assert not np.allclose(int8, keras_logits, atol=1e-6)  # it is quantized
    assert np.mean(int8.argmax(1) == keras_logits.argmax(1)) >= 0.9
    assert np.abs(int8 - keras_logits).max() < 0.25 * np.abs(keras_logits).max()


def test_the_model_card_lists_each_file_with_its_converter(trained):
    with open(os.path.join(trained["version"], "assets.extra", "model_card.json")) as f:
        card = json.load(f)
    listed = card["artifacts"]
    assert set(listed) == set(FILES)
    for name in FILES:
        assert listed[name]["bytes"] == os.path.getsize(os.path.join(trained["version"], name))
    assert listed["model.onnx"]["converter"].startswith("tf2onnx ")
    assert listed["model.onnx"]["runtime"].startswith("onnxruntime ")
    assert listed["model_int8.tflite"]["precision"] == "int8"
    assert listed["model_int8.tflite"]["calibration_examples"] == EXAMPLES
    assert listed["model.tflite"]["runtime"].startswith("ai-edge-litert ")


# Counts the examples PGD crafts on in the program it runs before (its prelude).
COUNT_CRAFTING = """
import atexit
from fbat_tf.attacks import pgd
crafted = []
original = pgd.PGD.__call__
def counted(self, model, x, *args, **kwargs):
    crafted.append(int(x.shape[0]))
    return original(self, model, x, *args, **kwargs)
pgd.PGD.__call__ = counted
atexit.register(lambda: print(f"PGD crafted batches of {crafted} examples"))
"""


@pytest.fixture(scope="module")
def rechecked(trained) -> tuple[subprocess.CompletedProcess, dict]:
    """One evaluate.py command over the three files, and each file's results."""
    paths = [os.path.join(trained["version"], name) for name in FILES]
    done = _run(
        "evaluate.py",
        "--model_path=" + ",".join(paths),
        f"--n_examples={EXAMPLES}",
        "--attacks=pgd,square",
        "--pgd_steps=3",
        "--pgd_restarts=1",
        "--square_n_queries=20",
        prelude=COUNT_CRAFTING,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = {}
    for path in paths:
        stem = os.path.basename(path).replace(".", "_")
        with open(os.path.join(os.path.dirname(path), f"eval-test-{stem}.json")) as f:
            results[os.path.basename(path)] = json.load(f)
    return done, results


def _runtime_logits(path: str, x: np.ndarray) -> np.ndarray:
    from fbat_tf.artifacts import load_artifact

    return load_artifact(path).predict(x)


def test_several_files_are_checked_with_the_sources_points_crafted_once(trained, rechecked):
    """The three files in one command: PGD crafts on the source's one batch once, not once a
    file, and each file's table is printed under its path. The indicators' sample (at most 32
    clean-correct points) is crafted on once too, and the unconstrained PGD runs on it once a
    file."""
    done, results = rechecked
    said = re.search(r"PGD crafted batches of \[([\d, ]*)\] examples", done.stdout)
    sizes = [int(n) for n in said.group(1).split(",")]
    assert sizes[0] == EXAMPLES and sizes.count(EXAMPLES) == 1, sizes
    assert len(sizes) == 2 + len(FILES) and max(sizes[1:]) <= 32, sizes
    assert set(results) == set(FILES)
    for name in FILES:
        assert results[name]["model_path"].endswith(name)
    at = [done.stdout.index(os.sep + name + "\n") for name in FILES]
    assert at == sorted(at)
    assert done.stdout.count("(the source's, replayed)") == len(FILES)
    # Under each file's table, the source's figures and the agreement beside the file's.
    assert done.stdout.count(f"against the source {trained['version']}, on the same") == len(
        FILES
    ), done.stdout


@pytest.fixture(scope="module")
def keras_pgd_points(keras_model, test_points) -> np.ndarray:
    """PGD-3 crafted here on the Keras model with the evaluation's seed for batch 0 (once for
    the three files)."""
    from fbat_tf.attacks.pgd import PGD

    x, y = test_points
    x_adv, _ = PGD(EPS, steps=3, restarts=1)(keras_model, x, y, [0, 0])
    return np.asarray(x_adv)


@pytest.mark.parametrize("name", FILES)
def test_evaluate_checks_each_file_against_its_source(
    trained, rechecked, test_points, keras_logits, keras_pgd_points, name
):
    """Clean accuracy and agreement as computed here through the runtime and the Keras model;
    the source's PGD points replayed (crafted for the first file, kept for the others); Square
    run on the file; the row in the model card."""
    path = os.path.join(trained["version"], name)
    done, results = rechecked
    result = results[name]
    x, y = test_points
    here = _runtime_logits(path, x).argmax(1)
    source = keras_logits.argmax(1)
    assert result["clean_accuracy"] == np.mean(here == y)
    row = result["deployment"]
    assert row["accuracy"]["clean"]["agreement"] == np.mean(here == source)
    assert row["accuracy"]["clean"]["source_accuracy"] == np.mean(source == y)
    assert row["agreement_outcomes"]["clean"] == "".join("1" if a else "0" for a in here == source)
    # PGD-3 crafted here on the Keras model with the evaluation's seed for batch 0.
    replayed = _runtime_logits(path, keras_pgd_points).argmax(1)
    pgd = row["accuracy"]["pgd@8"]
    assert pgd["replayed"] is True
    assert abs(pgd["accuracy"] - np.mean(replayed == y)) <= 1 / EXAMPLES
    assert result["robust_accuracy"]["pgd@8"] == pgd["accuracy"]
    assert row["accuracy"]["square@8"]["replayed"] is False
    # The file's indicators of attack failure (the source's gradients, the file's outputs), in
    # its results and its row of the model card.
    assert set(result["indicators"]["attacks"]) == {"pgd@8", "square@8"}
    assert result["robust_accuracy"]["square@8"] <= result["clean_accuracy"]
    # The runtimes' own notices (LiteRT's "INFO: Created ... XNNPACK delegate", once per batch
    # shape) are not the user's to read.
    assert "INFO:" not in done.stderr, done.stderr[-2000:]
    # The row in the card of the export.
    with open(os.path.join(trained["version"], "assets.extra", "model_card.json")) as f:
        card = json.load(f)
    assert card["deployment"][name]["accuracy"] == row["accuracy"]
    assert card["deployment"][name]["source"] == trained["version"]
    assert set(card["deployment"][name]["indicators"]) == {"pgd@8", "square@8"}


def test_several_paths_are_refused_unless_exported_files_of_one_source(trained, tmp_path):
    """Before TensorFlow loads (here it cannot), naming the path at fault; nothing is written."""
    import shutil

    version = trained["version"]
    onnx, tflite = (os.path.join(version, name) for name in FILES[:2])
    copy = str(tmp_path / "copy")
    shutil.copytree(version, copy, ignore=shutil.ignore_patterns("eval-*"))
    elsewhere = os.path.join(copy, "model.tflite")
    taken = tmp_path / "taken.json"
    taken.write_text("{}")
    cases = [
        ([version, onnx], [], f"--model_path={version}: several paths are exported"),
        ([onnx, tflite, onnx], [], f"--model_path names {onnx} twice"),
        ([onnx, elsewhere], [], f"{elsewhere} is checked against {copy}, {onnx} against"),
        ([onnx, tflite], [f"--results={taken}"], "--results names one file"),
    ]
    for paths, more, said in cases:
        args = ("--model_path=" + ",".join(paths), "--n_examples=8", *more)
        _one_line_error(_run("evaluate.py", *args, prelude=NO_TENSORFLOW), said)
    # One file's results there already: refused before any work, the other files' not written.
    written = os.path.join(copy, "eval-test-model_tflite.json")
    with open(written, "w") as f:
        f.write("{}")
    args = ("--model_path=" + ",".join(os.path.join(copy, n) for n in FILES), "--n_examples=8")
    _one_line_error(_run("evaluate.py", *args, prelude=NO_TENSORFLOW), f"{written} exists")
    assert sorted(n for n in os.listdir(copy) if n.startswith("eval-")) == [
        "eval-test-model_tflite.json"
    ]


def test_autoattack_replayed_on_onnx_and_the_robustbench_entry(trained, tmp_path, monkeypatch):
    """The source's AutoAttack, evaluated on the SavedModel itself, gives the source accuracy
    the replay on the ONNX file reports; the SavedModel's evaluation writes its RobustBench
    entry. The evaluations run evaluate.py's main in this process (tests/in_process.py), all
    three under one oneDNN choice."""
    from tests import in_process

    def evaluate(*args: str) -> in_process.Ran:
        return in_process.evaluate(*args, monkeypatch=monkeypatch)

    version = trained["version"]
    # The indicators of attack failure left out (--indicator_points=0): nothing here reads
    # them, and tests/test_deploy.py's other evaluations compute them on the files.
    few = ("--n_examples=16", "--batch_size=16", "--attacks=autoattack", "--indicator_points=0")
    source_results = str(tmp_path / "source.json")
    done = evaluate(f"--model_path={version}", *few, f"--results={source_results}")
    assert done.returncode == 0, done.stderr[-3000:]
    with open(source_results) as f:
        source = json.load(f)
    replay_results = str(tmp_path / "onnx.json")
    onnx = os.path.join(version, "model.onnx")
    done = evaluate(f"--model_path={onnx}", *few, f"--results={replay_results}")
    assert done.returncode == 0, done.stderr[-3000:]
    with open(replay_results) as f:
        replay = json.load(f)["deployment"]["accuracy"]["autoattack@8"]
    assert replay["source_accuracy"] == source["robust_accuracy"]["autoattack@8"]
    assert replay["agreement"] >= 0.9
    with open(os.path.join(version, "robustbench.json")) as f:
        entry = json.load(f)
    assert entry["autoattack_acc"] == f"{100 * source['robust_accuracy']['autoattack@8']:.2f}"
    assert entry["clean_acc"] == f"{100 * source['clean_accuracy']:.2f}"
    assert entry["eps"] == "8/255" and entry["dataset"] == "fashion_mnist"
    assert entry["architecture"] == "small_cnn width 4"
    assert entry["additional_data"] is False and entry["number_forward_passes"] == 1
    for unknown in ("link", "name", "authors", "venue", "reported", "unreliable"):
        assert entry[unknown] == ""
    assert "first 16 points" in entry["footnote"]
    # A later evaluation on fewer points keeps the entry there and says so, naming it.
    with open(os.path.join(version, "robustbench.json"), "rb") as f:
        written = f.read()
    fewer = ("--n_examples=4", "--batch_size=4", "--attacks=autoattack", "--indicator_points=0")
    done = evaluate(f"--model_path={version}", *fewer, f"--results={tmp_path / 'b'}")
    assert done.returncode == 0, done.stderr[-3000:]
    kept = os.path.join(version, "robustbench.json")
    said = f"RobustBench entry: {kept}: a RobustBench entry over more points is there already, kept"
    assert said in done.stdout
    with open(kept, "rb") as f:
        assert f.read() == written


def _foreign_files(folder) -> dict[str, str]:
    """Files of the right suffix that are no model for 28x28x1 images: bytes that are no model,
    a truncated real file, and real models of 32x32x3 images."""
    import keras
    import tensorflow as tf

    inputs = keras.Input((32, 32, 3))
    foreign = keras.Model(inputs, keras.layers.Dense(10)(keras.layers.Flatten()(inputs)))
    spec = [tf.TensorSpec([None, 32, 32, 3], tf.float32, name="images")]
    paths = {}
    for suffix, format_ in ((".onnx", "onnx"), (".tflite", "litert")):
        path = str(folder / f"foreign{suffix}")
        foreign.export(path, format=format_, input_signature=spec, verbose=False)
        paths[f"foreign{suffix}"] = path
        junk = folder / f"junk{suffix}"
        junk.write_bytes(b"not a model at all" * 10)
        paths[f"junk{suffix}"] = str(junk)
        truncated = folder / f"truncated{suffix}"
        truncated.write_bytes(open(path, "rb").read()[:200])
        paths[f"truncated{suffix}"] = str(truncated)
    return paths


def test_a_corrupted_or_foreign_file_is_a_one_line_error(trained, tmp_path):
    """A file its runtime cannot read, and a model of other images than its source's dataset's,
    are refused before TensorFlow loads (here it cannot load)."""
    for label, path in _foreign_files(tmp_path).items():
        done = _run(
            "evaluate.py",
            f"--model_path={path}",
            f"--source_model_path={trained['version']}",
            "--n_examples=8",
            "--attacks=square",
            prelude=NO_TENSORFLOW,
        )
        last = _one_line_error(done, os.path.basename(path))
        if label.startswith("foreign"):
            assert "takes 32x32x3 images, not the 28x28x1 images of fashion_mnist" in last, last
        else:
            runtime = "onnxruntime" if path.endswith(".onnx") else "the interpreter"
            assert f"model {runtime} can run" in last, last
        assert not os.path.exists(os.path.join(tmp_path, "eval-test-" + label.replace(".", "_")))


def test_a_file_without_its_source_is_refused_at_once(trained, tmp_path):
    alone = tmp_path / "model.onnx"
    alone.write_bytes(open(os.path.join(trained["version"], "model.onnx"), "rb").read())
    done = _run("evaluate.py", f"--model_path={alone}", "--n_examples=8")
    _one_line_error(done, "--source_model_path")


def test_a_missing_extra_is_a_one_line_error(trained, tmp_path):
    onnx = os.path.join(trained["version"], "model.onnx")
    done = _run("evaluate.py", f"--model_path={onnx}", prelude=BLOCK.format("onnxruntime"))
    _one_line_error(done, "onnxruntime", EXTRA_HINT)
    tflite = os.path.join(trained["version"], "model.tflite")
    done = _run("evaluate.py", f"--model_path={tflite}", prelude=BLOCK.format("ai_edge_litert"))
    _one_line_error(done, "ai-edge-litert", EXTRA_HINT)
    done = _run(
        "-m",
        "export",
        f"--workdir={trained['workdir']}",
        "--export_formats=saved_model,onnx",
        prelude=BLOCK.format("tf2onnx"),
    )
    _one_line_error(done, "tf2onnx", EXTRA_HINT)
    workdir = str(tmp_path / "never")
    done = _run(
        "train.py",
        f"--workdir={workdir}",
        *TINY_RUN,
        "--export_formats=saved_model,onnx",
        prelude=BLOCK.format("tf2onnx"),
    )
    _one_line_error(done, "tf2onnx", EXTRA_HINT)
    assert not os.path.exists(workdir)  # refused before any training


def test_export_formats_must_name_known_formats_and_the_saved_model(trained):
    for given in ("--export_formats=onnx", "--export_formats=saved_model,tensorrt"):
        done = _run("-m", "export", f"--workdir={trained['workdir']}", given)
        assert done.returncode != 0
        assert "saved_model" in done.stderr
        assert not os.path.exists(os.path.join(trained["workdir"], "export", NAME, "2"))
