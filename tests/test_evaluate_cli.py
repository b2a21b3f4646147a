"""evaluate.py as a user types it: train.py's spelling --dataset names the data of a model that
does not say it, a model whose outputs are probabilities is refused before any attack, with what
to do instead, a .keras file that holds code is refused before TensorFlow loads unless the user
says they trust it, and AutoAttack shows its progress over all the batches at once. What it does
after TensorFlow loads runs its main() in the test's process (tests/in_process.py); what it does
before, and its output as a program, start the program."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

from fbat_tf.classifiers import check_logits
from tests import in_process
from tests.commands import NO_TENSORFLOW, python_command

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def small_model(activation: str | None) -> keras.Model:
    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [
            keras.Input((28, 28, 1)),
            keras.layers.Flatten(),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(10, activation=activation),
        ]
    )


def run_evaluate(*args: str, prelude: str = "") -> subprocess.CompletedProcess:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    command = python_command(os.path.join(ROOT, "evaluate.py"), *args, prelude=prelude)
    return subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)


ATTACK = ["--attacks=pgd", "--pgd_steps=2", "--pgd_restarts=1", "--n_examples=32", "--eps=8"]


def test_dataset_flag_names_the_data_of_a_keras_file(tmp_path, monkeypatch):
    path = str(tmp_path / "model.keras")
    small_model(None).save(path)
    results = tmp_path / "eval.json"
    result = in_process.evaluate(
        f"--model_path={path}",
        "--dataset=fashion_mnist",
        *ATTACK,
        f"--results={results}",
        monkeypatch=monkeypatch,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    evaluated = json.loads(results.read_text())
    assert evaluated["dataset"] == "fashion_mnist" and evaluated["examples"] == 32


def test_a_model_with_probability_outputs_is_refused_before_any_attack(tmp_path, monkeypatch):
    path = str(tmp_path / "softmax.keras")
    small_model("softmax").save(path)
    results = tmp_path / "eval.json"
    result = in_process.evaluate(
        f"--model_path={path}",
        "--dataset=fashion_mnist",
        *ATTACK,
        f"--results={results}",
        monkeypatch=monkeypatch,
    )
    assert result.returncode != 0
    message = result.stderr.strip().splitlines()[-1]
    assert "probabilities" in message and "logits" in message and "softmax" in message
    assert not results.exists()


def test_a_keras_file_that_holds_code_is_refused_unless_trusted(tmp_path, monkeypatch):
    """Refused before TensorFlow loads (the programs here cannot load it), as --model_path and
    as --source_model_path; evaluated (in this process) with --trust_model_code."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((28, 28, 1)),
            keras.layers.Lambda(lambda x: 2.0 * x - 1.0, name="rescale"),
            keras.layers.Flatten(),
            keras.layers.Dense(10),
        ]
    )
    path = str(tmp_path / "lambda.keras")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Keras warns that a lambda is being saved
        model.save(path)
    results = tmp_path / "eval.json"
    args = [f"--model_path={path}", "--dataset=fashion_mnist", *ATTACK, f"--results={results}"]

    refused = run_evaluate(*args, prelude=NO_TENSORFLOW)
    assert refused.returncode != 0
    message = refused.stderr.strip().splitlines()[-1]
    assert message.startswith(f"error: --model_path: refusing to load {path}: it holds code")
    assert "Lambda 'rescale': a Python lambda" in message and "--trust_model_code" in message
    assert refused.stdout == "" and not results.exists()  # no attack ran, nothing written

    plain = str(tmp_path / "plain.keras")
    small_model(None).save(plain)
    as_source = run_evaluate(
        f"--model_path={plain}",
        "--dataset=fashion_mnist",
        "--attacks=transfer",
        f"--source_model_path={path}",
        f"--results={results}",
        prelude=NO_TENSORFLOW,
    )
    assert as_source.returncode != 0
    assert (
        as_source.stderr.strip()
        .splitlines()[-1]
        .startswith(f"error: --source_model_path: refusing to load {path}")
    )

    trusted = in_process.evaluate(*args, "--trust_model_code", monkeypatch=monkeypatch)
    assert trusted.returncode == 0, trusted.stderr[-3000:]
    evaluated = json.loads(results.read_text())
    assert evaluated["examples"] == 32 and set(evaluated["robust_accuracy"]) == {"pgd@8"}


@pytest.mark.parametrize("activation", [None, "relu", "sigmoid"])
def test_check_logits_accepts_outputs_that_are_not_a_distribution(activation):
    x = tf.constant(np.random.default_rng(0).uniform(0, 1, (8, 28, 28, 1)).astype(np.float32))
    check_logits(small_model(activation), x)


def test_check_logits_refuses_softmax_outputs():
    x = tf.constant(np.random.default_rng(0).uniform(0, 1, (8, 28, 28, 1)).astype(np.float32))
    with pytest.raises(ValueError, match="probabilities"):
        check_logits(small_model("softmax"), x)


def test_autoattack_reports_its_progress_over_all_batches_at_once(tmp_path, monkeypatch):
    # Batches of 16 and 14: AutoAttack is given both at once, and says so as each part runs.
    from fbat_tf import data

    model = small_model(None)
    path = str(tmp_path / "model.keras")
    model.save(path)
    results = tmp_path / "eval.json"
    result = in_process.evaluate(
        f"--model_path={path}",
        "--dataset=fashion_mnist",
        "--attacks=autoattack",
        "--n_examples=30",
        "--batch_size=16",
        "--eps=8",
        f"--results={results}",
        monkeypatch=monkeypatch,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    evaluated = json.loads(results.read_text())
    after = evaluated["autoattack_per_attack"]["autoattack@8"]
    clean = round(after["clean"] * 30)
    assert clean > 0  # something to attack
    # Each test image's outcome, in file order: clean as the model classifies them here, and
    # after each part of the ensemble (named as its parts are), a subset of what came before.
    assert (evaluated["split"], evaluated["first_point"], evaluated["examples"]) == ("test", 0, 30)
    assert "held_out_seed" not in evaluated
    outcomes = {
        key: np.array([c == "1" for c in held]) for key, held in evaluated["outcomes"].items()
    }
    parts = [part for part in after if part != "clean"]
    assert parts == ["apgd-ce", "apgd-t", "fab-t", "square"]
    assert list(outcomes) == ["clean", "autoattack@8", *(f"autoattack@8/{p}" for p in parts)]
    x, y = next(iter(data.load("fashion_mnist", "test", batch_size=30, max_examples=30)))
    np.testing.assert_array_equal(outcomes["clean"], np.argmax(model(x), -1) == y.numpy())
    before = outcomes["clean"]
    for part in parts:
        now = outcomes[f"autoattack@8/{part}"]
        assert now.mean() == after[part] and not np.any(now & ~before), part
        before = now
    np.testing.assert_array_equal(outcomes["autoattack@8"], before)
    header = f"AutoAttack (standard) at ε = 8/255, 30 examples: clean {100 * after['clean']:.2f}%"
    assert header in result.stdout
    assert f"apgd-ce on the {clean} examples still robust" in result.stdout
    assert f"after apgd-ce: {100 * after['apgd-ce']:.2f}% robust" in result.stdout
    # The table reads on a terminal as in Markdown: no HTML entities.
    assert f"| ↳ after apgd-ce | 8 | {after['apgd-ce']:.4f} |" in result.stdout
    assert "&nbsp;" not in result.stdout
    # Its output is no terminal, as a log file is not: one line a bar, no carriage-return
    # redraws.
    assert "\r" not in result.stdout and "\x1b[" not in result.stdout


CENTRE = 14 * 28 + 14  # the pixel the model below reads


def nan_above(threshold_pixel: float = 0.5, shape=(28, 28, 1), pixel: int = CENTRE):
    """Logits exp(a·x_p) − exp(a·x_p), with a such that exp overflows float32 when the pixel
    x_p exceeds `threshold_pixel`: 0 below it, ∞ − ∞ = NaN above."""
    scale = 88.8 / threshold_pixel  # float32 exp overflows past 88.72
    inputs = keras.Input(shape)
    flat = keras.layers.Flatten()(inputs)
    pair = keras.layers.Dense(2, activation="exponential")(flat)
    model = keras.Model(inputs, keras.layers.Dense(10)(pair))
    size = int(np.prod(shape))
    kernel = np.zeros((size, 2), np.float32)
    kernel[pixel] = scale
    model.layers[2].set_weights([kernel, np.zeros(2, np.float32)])
    out = np.zeros((2, 10), np.float32)
    out[0], out[1] = 1.0, -1.0
    model.layers[3].set_weights([out, np.zeros(10, np.float32)])
    return model, scale


def test_evaluate_py_refuses_a_model_with_non_finite_logits_and_says_how_many(
    tmp_path, monkeypatch
):
    from fbat_tf import data

    model, scale = nan_above()
    path = str(tmp_path / "nan.keras")
    model.save(path)
    x, _ = next(iter(data.load("fashion_mnist", "test", batch_size=32, max_examples=32)))
    # Independently: the examples whose pixel overflows exp in float32.
    with np.errstate(over="ignore"):
        expected = int(np.sum(~np.isfinite(np.exp(np.float32(scale) * x.numpy()[:, 14, 14, 0]))))
    assert 0 < expected < 32
    results = tmp_path / "eval.json"
    result = in_process.evaluate(
        f"--model_path={path}",
        "--dataset=fashion_mnist",
        *ATTACK,
        f"--results={results}",
        monkeypatch=monkeypatch,
    )
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    message = result.stderr.strip().splitlines()[-1]
    assert message.startswith(f"error: {path}: {expected} of the 32 examples give non-finite")
    assert "nothing was attacked" in message
    assert not results.exists()


class NudgeAttack:
    """Moves every pixel up by ε (within the box): an attack whose effect is known."""

    def __init__(self, eps):
        self.eps = eps

    def __call__(self, model, x, y, seed):
        return tf.clip_by_value(x + self.eps, 0.0, 1.0), {}


class NaNAttack(NudgeAttack):
    def __call__(self, model, x, y, seed):
        return x + np.float32(np.nan), {}


def test_evaluate_counts_no_non_finite_input_or_output():
    """In-process: non-finite clean logits stop the evaluation before any attack; so do
    non-finite adversarial points and non-finite adversarial logits, each named."""
    from fbat_tf.evaluation import NonFiniteError, evaluate

    model, _ = nan_above(0.5, shape=(4,), pixel=0)
    x = np.array([[0.2, 0, 0, 0], [0.45, 0, 0, 0], [0.9, 0, 0, 0], [0.3, 0, 0, 0]], np.float32)
    y = np.zeros(4, np.int32)
    finite = tf.data.Dataset.from_tensor_slices((x[[0, 1, 3]], y[:3])).batch(3)
    assert evaluate(model, finite, {("none", 0.01): NudgeAttack(0.0)}).examples == 3
    with pytest.raises(NonFiniteError, match="1 of 4 examples give non-finite logits") as error:
        evaluate(model, tf.data.Dataset.from_tensor_slices((x, y)).batch(4), {})
    assert error.value.examples == 1
    with pytest.raises(NonFiniteError, match="1 adversarial examples give non-finite logits"):
        evaluate(model, finite, {("nudge", 0.1): NudgeAttack(0.1)})  # 0.45 + 0.1 > 0.5
    with pytest.raises(NonFiniteError, match="the attack's points are not finite for 3"):
        evaluate(model, finite, {("nan", 0.1): NaNAttack(0.1)})


def test_a_transfer_attack_without_a_source_model_is_refused_before_tensorflow(tmp_path):
    result = run_evaluate(f"--model_path={tmp_path}", "--attacks=pgd,transfer")
    assert result.returncode != 0
    assert "transfer attack crafts on --source_model_path" in result.stderr


def test_a_results_file_that_cannot_be_written_is_refused_before_any_work(tmp_path):
    """A --results folder that does not exist, or a file where its folder should be, is told at
    once, before TensorFlow loads, with nothing created."""
    path = str(tmp_path / "model.keras")
    small_model(None).save(path)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for results, says in (
        (tmp_path / "missing" / "eval.json", "does not exist"),
        (blocker / "eval.json", "is not a folder"),
    ):
        done = run_evaluate(
            f"--model_path={path}", "--dataset=fashion_mnist", *ATTACK, f"--results={results}"
        )
        assert done.returncode != 0
        line = done.stderr.strip().splitlines()[-1]
        assert line.startswith(f"error: --results={results}: the folder") and says in line
        assert "Traceback" not in done.stderr and "tensorflow" not in done.stderr.lower()
    assert sorted(os.listdir(tmp_path)) == ["a-file", "model.keras"]


def test_a_finished_evaluation_that_cannot_be_written_is_kept_elsewhere(tmp_path):
    """The folder of --results went away during the attacks: the results go to a file in the
    temporary folder, which evaluate.py names, and nothing half-written stays behind."""
    from fbat_tf.records import write_json_atomic
    from fbat_tf.run import save_results

    results = {"clean_accuracy": 0.5, "robust_accuracy": {"pgd@8": 0.25}}
    gone = tmp_path / "gone"
    saved = save_results(results, str(gone / "eval.json"), write_json_atomic)
    try:
        assert saved != str(gone / "eval.json") and json.loads(open(saved).read()) == results
    finally:
        os.remove(saved)
    assert save_results(results, str(tmp_path / "e.json"), write_json_atomic) == str(
        tmp_path / "e.json"
    )
    assert sorted(os.listdir(tmp_path)) == ["e.json"]


def test_long_work_is_announced_with_an_estimate_before_it_starts(tmp_path, monkeypatch):
    """AutoAttack on 1,000 images: before the first attack evaluate.py says how long it may
    take, from the attacks' passes and a pass timed here (the run is stopped there: the attacks
    it would build next stop it)."""
    evaluate = in_process.evaluate_program()

    def stop(*args, **kwargs):
        raise SystemExit("stopped where the attacks are built")

    path = str(tmp_path / "model.keras")
    small_model(None).save(path)
    monkeypatch.setattr(evaluate, "build_attacks", stop)
    done = in_process.evaluate(
        f"--model_path={path}",
        "--dataset=fashion_mnist",
        "--attacks=autoattack",
        "--n_examples=1000",
        "--eps=8",
        f"--results={tmp_path / 'eval.json'}",
        monkeypatch=monkeypatch,
    )
    assert done.one_line() == "stopped where the attacks are built"
    said = done.stdout.strip().splitlines()[-1]
    assert said.startswith("estimate: up to ") and "for 1000 examples at 1 ε" in said
    assert "AutoAttack (standard) 3880" in said and "measured here" in said


def test_a_model_path_that_is_no_model_suggests_the_one_that_would_work(tmp_path):
    """A folder of runs, a run's weights file and an export folder without its version got a
    generic message: each now names the path that would work, before TensorFlow loads."""
    run_dir = tmp_path / "runs" / "fmnist"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "results.json").write_text("{}")
    (run_dir / "checkpoints" / "best.weights.h5").write_bytes(b"")
    for version in ("1", "2"):
        (run_dir / "export" / "m" / version).mkdir(parents=True)
        (run_dir / "export" / "m" / version / "saved_model.pb").write_bytes(b"")
    cases = {
        str(tmp_path / "runs"): f"--model_path={run_dir} (a training run in it)",
        str(run_dir / "checkpoints" / "best.weights.h5"): f"--model_path={run_dir}",
        str(run_dir / "export"): f"--model_path={run_dir / 'export' / 'm' / '2'}",
        str(run_dir / "export" / "m"): f"--model_path={run_dir / 'export' / 'm' / '2'}",
    }
    for given, meant in cases.items():
        done = run_evaluate(f"--model_path={given}")
        lines = done.stderr.strip().splitlines()
        assert done.returncode != 0 and len(lines) == 1, done.stderr[-2000:]
        assert lines[0].startswith(f"error: --model_path={given} is neither")
        assert f"did you mean {meant}" in lines[0], lines[0]


@pytest.mark.slow
def test_tensorflow_s_later_info_lines_stay_out_of_a_plain_evaluation(tmp_path):
    """Without TF_CPP_MIN_LOG_LEVEL in the environment, as a user types it: TensorFlow's INFO
    lines after start-up (a graph optimizer's "Starting new session", the GPUs it counted)
    printed before the table; only --verbosity asks for them."""
    run = os.path.join(ROOT, "study", "results", "fashion_mnist_fast", "fastat-eps16-seed0")
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    command = [
        sys.executable,
        os.path.join(ROOT, "evaluate.py"),
        f"--model_path={run}",
        *ATTACK[:3],
        "--n_examples=8",
        f"--results={tmp_path / 'eval.json'}",
    ]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert not re.search(r"^I\d{4} ", done.stderr, re.MULTILINE), done.stderr[-2000:]
    # Nor TensorFlow's start-up lines (fbat_tf/startup.py).
    assert "cuInit" not in done.stderr and "InitializeLog" not in done.stderr


@pytest.mark.slow
def test_a_plot_that_cannot_be_written_leaves_the_saved_results_and_says_so(tmp_path, monkeypatch):
    """The plot is written after the results: where it fails (a full disk, here a folder in its
    place) the message said to run the same command again, which the saved results refuse."""
    run = os.path.join(ROOT, "study", "results", "fashion_mnist_fast", "fastat-eps16-seed0")
    results = tmp_path / "eval.json"
    (tmp_path / "eval.png").mkdir()
    done = in_process.evaluate(
        f"--model_path={run}",
        "--attacks=pgd",
        "--pgd_steps=1",
        "--pgd_restarts=1",
        "--n_examples=8",
        "--eps=8,16",
        f"--results={results}",
        monkeypatch=monkeypatch,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "warning: the plot could not be written (" in done.stderr
    assert f"the results are saved whole in {results}" in done.stderr
    assert json.loads(results.read_text())["examples"] == 8


def test_progress_written_to_a_file_shows_every_ten_seconds_before_the_end(monkeypatch, capsys):
    """To a file or a pipe Keras' bar writes one line when the work ends: an evaluation of a
    thousand images showed nothing after its estimate for over a minute. Lines now come every
    ten seconds, with how far it got, and Keras' line at the end."""
    from fbat_tf.attacks import base

    clock = iter([0.0, 4.0, 11.0, 15.0, 25.0, 40.0])
    monkeypatch.setattr(base.time, "monotonic", lambda: next(clock))
    bar = base.progress_bar(5, unit_name="batch")
    assert isinstance(bar, base.LoggedProgress)  # pytest's captured stdout is no terminal
    for k in range(5):
        bar.add(1, values=[("clean", 0.5), ("pgd@8", 0.1 * k)])
    lines = capsys.readouterr().out.splitlines()
    # At 4 s nothing yet; 11 s and 25 s a line each (15 s is within ten of 11); 40 s: the end.
    assert lines[:2] == [
        "batch 2/5 - 11s - clean: 0.5000 - pgd@8: 0.1000",
        "batch 4/5 - 25s - clean: 0.5000 - pgd@8: 0.3000",
    ]
    assert len(lines) == 3 and lines[2].startswith("5/5 - ") and "pgd@8: 0.4000" in lines[2]
