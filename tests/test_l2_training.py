"""L2 training: PGD-AT's and Fast-AT's L2 forms against a NumPy computation on a linear model,
the methods without one refused in one line, and `train.py --norm=l2` end to end as a user
types it, its results, export card and evaluate.py's default of the run's norm."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from fbat_tf import constraints, methods
from tests import in_process
from tests.helpers import linear_model
from tests.test_l2 import dykstra
from tests.test_train_cli import FASHION_MNIST, TINY_RUN, run_train


def ce_gradient(kernel: np.ndarray, bias: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """∇x Σ CE(W·x + b, y) of a linear model, per example, in closed form: Wᵀ(softmax − onehot)."""
    logits = x.reshape(len(x), -1) @ kernel + bias
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    p[np.arange(len(y)), y] -= 1.0
    return (p @ kernel.T).reshape(x.shape)


@pytest.mark.parametrize("name", ["fastat", "pgd"])
def test_l2_training_steps_are_normalized_gradient_steps_projected_on_the_ball_and_box(name):
    """Each step δ ← P(δ + α·g/‖g‖₂) from a start uniform in the ball, with g the closed-form
    input gradient and P the nearest point of the L2 ball ∩ box (Dykstra's algorithm)."""
    rng = np.random.default_rng(5)
    shape = (4, 4, 1)
    model = linear_model(shape, classes=3, seed=1, random_bias=True)
    kernel, bias = (w.astype(np.float64) for w in model.layers[-1].get_weights())
    # Pixels near the box's faces too, so that the box binds for some coordinates.
    x = rng.choice([0.02, 0.5, 0.97], (6, *shape)).astype(np.float32)
    y = rng.integers(0, 3, 6).astype(np.int32)
    eps = 0.8
    options = {"steps": 3} if name == "pgd" else {}
    method = methods.create(name, eps=eps, norm="l2", **options)
    seed = constraints.as_seed(11)
    got = method.perturb(model, tf.constant(x), tf.constant(y), seed).numpy() - x

    delta = constraints.random_init(tf.constant(x), eps, seed, "l2").numpy().astype(np.float64)
    for _ in range(options.get("steps", 1)):
        g = ce_gradient(kernel, bias, x.astype(np.float64) + delta, y)
        step = g / np.linalg.norm(g.reshape(len(g), -1), axis=1).reshape(-1, 1, 1, 1)
        delta = np.stack(
            [
                dykstra(d + method.alpha * s, xi, eps)
                for d, s, xi in zip(delta, step, x, strict=True)
            ]
        )
    np.testing.assert_allclose(got, delta, atol=2e-5)
    assert np.linalg.norm(got.reshape(6, -1), axis=1).max() <= eps + 1e-5
    # Some coordinate of the points lies on a face of the box: the box bound was in play.
    assert np.any(np.isclose(x + got, 0.0, atol=1e-6) | np.isclose(x + got, 1.0, atol=1e-6))
    # α: Fast-AT's 1.25ε; PGD-K-AT's 2.5ε/K for K > 2 under L2.
    assert method.alpha == pytest.approx(1.25 * eps if name == "fastat" else 2.5 * eps / 3)


@pytest.mark.parametrize("name", ["fastbat", "nfgsm", "fastat_ga", "elle", "free"])
def test_methods_without_an_l2_form_refuse_it_in_one_line(name):
    with pytest.raises(ValueError) as raised:
        methods.create(name, eps=0.5, norm="l2")
    message = str(raised.value)
    assert "\n" not in message and f"--method={name} has no L2 form" in message
    assert "--norm=linf" in message
    if name == "fastbat":
        assert "derived for the L∞ ball ∩ box" in message


L2_RUN = [arg for arg in TINY_RUN if not arg.startswith("--eval_pgd_steps")] + [
    "--eval_pgd_steps=5",
    f"--data_dir={FASHION_MNIST}",
]


# The final test with its AutoAttack, on 16 points.
L2_TESTED = [a for a in L2_RUN if a not in ("--noeval_autoattack", "--eval_examples=64")] + [
    "--eval_examples=16"
]


@pytest.mark.slow
def test_train_py_trains_and_tests_under_l2_and_evaluate_py_keeps_the_run_s_norm(
    tmp_path, monkeypatch
):
    workdir = tmp_path / "l2"
    done = run_train("--method=pgd", "--norm=l2", "--eps=1.5", *L2_TESTED, f"--workdir={workdir}")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "at ε = 1.5 (L2) on fashion_mnist" in done.stdout  # once, not "(L2) (1.5)"
    with open(workdir / "results.json") as f:
        record = json.load(f)
    assert record["config"]["norm"] == "l2" and record["config"]["eps"] == 1.5
    assert record["method"]["norm"] == "l2"
    final = record["final"]
    # Every attack of the final test in the run's threat model: AutoAttack too (it was once
    # built for L∞ at 1.5 pixels, "autoattack@382.5").
    assert set(final["robust_accuracy"]) == {"pgd@l2:1.5", "autoattack@l2:1.5"}
    assert final["norm"] == "l2" and "pixels" in final["eps_units"]
    assert len(final["outcomes"]["pgd@l2:1.5"]) == 16
    aa = final["robust_accuracy"]["autoattack@l2:1.5"]
    entry = json.loads((workdir / "robustbench.json").read_text())
    assert entry["eps"] == "1.5" and "at L2 1.5" in entry["footnote"]
    assert entry["autoattack_acc"] == f"{100 * aa:.2f}"
    assert f"RobustBench entry: {workdir / 'robustbench.json'}" in done.stdout

    # evaluate.py, given neither a norm nor an ε, takes the run's; its AutoAttack under L2 on
    # the same points gives the final test's number (both programs, which make the same oneDNN
    # choice before TensorFlow loads). One program for both claims.
    again = tmp_path / "aa.json"
    evaluated = run_train(
        f"--model_path={workdir}",
        "--attacks=pgd,autoattack",
        "--pgd_steps=3",
        "--pgd_restarts=1",
        "--n_examples=16",
        f"--data_dir={FASHION_MNIST}",
        f"--results={again}",
        program="evaluate.py",
    )
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert "ε (L2, pixels)" in evaluated.stdout
    payload = json.loads(again.read_text())
    assert set(payload["robust_accuracy"]) == {"pgd@l2:1.5", "autoattack@l2:1.5"}
    assert payload["norm"] == "l2"
    assert payload["robust_accuracy"]["autoattack@l2:1.5"] == aa
    assert payload["outcomes"]["autoattack@l2:1.5"] == final["outcomes"]["autoattack@l2:1.5"]

    # The model card names the norm as RobustBench does, in pixel units.
    card_path = next(
        os.path.join(top, name)
        for top, _, names in os.walk(workdir / "export")
        for name in names
        if name == "model_card.json"
    )
    with open(card_path) as f:
        card = json.load(f)
    assert card["eps"]["norm"] == "L2" and card["eps"]["pixels"] == 1.5
    assert card["eps"]["per_255"] is None
    assert card["robustness"]["norm"] == "L2" and card["robustness"]["eps"] == 1.5
    assert card["robustness"]["autoattack"]["robust_accuracy"] == aa

    # An L∞ budget on the L2 model: named as such, with the units asked for.
    evaluated = in_process.evaluate(
        f"--model_path={workdir}",
        "--norm=linf",
        "--attacks=pgd",
        "--n_examples=32",
        f"--data_dir={FASHION_MNIST}",
        f"--results={tmp_path / 'linf.json'}",
        monkeypatch=monkeypatch,
    )
    assert evaluated.returncode != 0
    assert "trained at ε = 1.5 (L2)" in evaluated.stderr
    assert not (tmp_path / "linf.json").exists()


def test_fastbat_under_l2_and_l2_without_its_own_eps_are_refused_before_any_work(tmp_path):
    cases = {
        "fastbat": (["--method=fastbat", "--norm=l2", "--eps=0.5"], "no L2 form"),
        "no_eps": (["--method=pgd", "--norm=l2"], "--norm=l2 needs its own --eps"),
    }
    for case, (args, said) in cases.items():
        workdir = tmp_path / case
        done = run_train(*args, *L2_RUN, f"--workdir={workdir}")
        assert done.returncode != 0, case
        errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and said in errors[0], (case, done.stderr[-2000:])
        assert not workdir.exists(), case
    # A small L2 ε is in pixel units, not a mistyped 1/255 one: flags pass, and it is refused
    # for the method alone; the same number under L∞ is refused for its units.
    small = tmp_path / "small"
    done = run_train("--method=fastbat", "--norm=l2", "--eps=0.03", f"--workdir={small}")
    assert "no L2 form" in done.stderr and "did you mean" not in done.stderr
    done = run_train("--method=fastbat", "--eps=0.03", f"--workdir={small}")
    assert "did you mean --eps=7.65" in done.stderr and not small.exists()


def test_an_l2_robustbench_entry_gives_the_budget_as_robustbench_s_l2_entries_do():
    from export import robustbench
    from fbat_tf.records import AttackResult, EvaluationResult

    result = EvaluationResult(
        500,
        0.8,
        robust=[
            AttackResult("pgd", 1.5, 0.61, norm="l2"),
            AttackResult("autoattack", 1.5, 0.5934, norm="l2"),
            AttackResult("autoattack", 1.5, 0.1, norm="linf"),  # 1.5/255: another budget
        ],
    )
    entry = robustbench.entry(result, "fashion_mnist", 1.5, "small_cnn", norm="l2")
    assert entry["eps"] == "1.5" and entry["autoattack_acc"] == "59.34"
    assert "at L2 1.5" in entry["footnote"]
    linf = robustbench.entry(result, "fashion_mnist", 1.5 / 255, "small_cnn")
    assert linf["eps"] == "1.5/255" and linf["autoattack_acc"] == "10.00"
    assert robustbench.entry(result, "fashion_mnist", 0.5, "small_cnn", norm="l2") is None


def test_a_robustbench_entry_over_more_points_is_kept_and_a_wrong_one_replaced(tmp_path):
    """A later evaluation on fewer points (say 16 after 10,000) never replaces the entry: the
    file stays as it was, and the error names it and says what to do. One over at least as many
    points replaces it, and so does any evaluation where the entry there is for another threat
    model than the model's (an L2 model's entry written at L∞, as the final test once did)."""
    from export import robustbench
    from fbat_tf.records import AttackResult, EvaluationResult

    def result(examples: int, robust: float, eps=8.0, norm="linf") -> EvaluationResult:
        return EvaluationResult(
            examples, 0.8, robust=[AttackResult("autoattack", eps, robust, norm=norm)]
        )

    home = str(tmp_path)
    path, replaced = robustbench.write(home, result(16, 0.5), "fashion_mnist", 8 / 255, "cnn")
    before = open(path, "rb").read()
    assert json.loads(before)["autoattack_acc"] == "50.00" and replaced is None
    with pytest.raises(FileExistsError) as raised:
        robustbench.write(home, result(8, 0.25), "fashion_mnist", 8 / 255, "cnn")
    assert raised.value.filename == path and "delete it" in robustbench.KEPT
    assert open(path, "rb").read() == before
    _, replaced = robustbench.write(home, result(16, 0.375), "fashion_mnist", 8 / 255, "cnn")
    assert replaced == "an entry over 16 points"
    assert json.loads(open(path).read())["autoattack_acc"] == "37.50"
    # An L∞ entry at 382.5/255 beside a model trained at L2 1.5: replaced by the L2 one,
    # though over fewer points.
    wrong = result(100, 0.0, eps=382.5)
    (tmp_path / "l2").mkdir()
    robustbench.write(str(tmp_path / "l2"), wrong, "fashion_mnist", 1.5, "cnn")
    right = result(10, 0.3, eps=1.5, norm="l2")
    path, replaced = robustbench.write(
        str(tmp_path / "l2"), right, "fashion_mnist", 1.5, "cnn", norm="l2"
    )
    assert replaced == "an entry for Linf 382.5/255, not this model's threat model"
    entry = json.loads(open(path).read())
    assert entry["eps"] == "1.5" and entry["autoattack_acc"] == "30.00"
    assert "at L2 1.5" in entry["footnote"]


def test_train_py_and_evaluate_py_say_where_the_entry_is_or_why_it_is_not(tmp_path, capsys):
    """What both programs print of the entry (export/robustbench.write_and_say): its path, the
    kept one named, and a folder it cannot be written into as a warning that stops nothing."""
    from export import robustbench
    from fbat_tf.records import AttackResult, EvaluationResult

    result = EvaluationResult(16, 0.8, robust=[AttackResult("autoattack", 8.0, 0.5)])
    fewer = EvaluationResult(8, 0.8, robust=[AttackResult("autoattack", 8.0, 0.5)])
    home = tmp_path / "run"
    home.mkdir()
    for evaluated in (result, result, fewer):
        robustbench.write_and_say(str(home), evaluated, "fashion_mnist", 8 / 255, "small_cnn")
    said = capsys.readouterr()
    path = home / "robustbench.json"
    assert said.out.splitlines() == [
        f"RobustBench entry: {path}",
        f"RobustBench entry: {path} (replaces an entry over 16 points)",
        f"RobustBench entry: {path}: {robustbench.KEPT}",
    ]
    assert not said.err
    # A file in the folder's place: nothing can be written under it.
    blocked = tmp_path / "blocked"
    blocked.write_text("")
    robustbench.write_and_say(str(blocked), result, "fashion_mnist", 8 / 255, "small_cnn")
    said = capsys.readouterr()
    assert not said.out
    assert said.err.startswith(f"warning: {blocked}: RobustBench entry not written: ")
    assert "Not a directory" in said.err and said.err.count("\n") == 1
