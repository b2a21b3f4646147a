"""The indicators of attack failure and the reference AutoAttack's checks (fbat_tf/indicators.py):
each fires on a model (or attack) built to trigger it and stays quiet on an ordinary
adversarially trained one, the committed L2 PGD-AT MLP of tests/data/l2_reference at its ε; and
an evaluation of a model without input gradients reports the gradient attacks not applicable
and runs Square."""

from __future__ import annotations

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from fbat_tf import checks, classifiers, constraints, data, evaluation
from fbat_tf import indicators as ind
from fbat_tf.attacks import losses
from fbat_tf.attacks.base import Attack
from fbat_tf.attacks.pgd import PGD
from fbat_tf.models import layers
from fbat_tf.records import AttackResult, EvaluationResult, Indicators
from tests.test_train_cli import FASHION_MNIST, ROOT

MLP = os.path.join(ROOT, "tests", "data", "l2_reference", "mlp.keras")
EPS = 1.5  # the MLP's training ε (L2, [0, 1] pixels)
POINTS = 16

pytestmark = pytest.mark.xdist_group("indicators")


@pytest.fixture(scope="module")
def mlp():
    return keras.saving.load_model(MLP)


@pytest.fixture(scope="module")
def split():
    return data.load(
        "fashion_mnist", "test", data_dir=FASHION_MNIST, batch_size=32, max_examples=64
    )


@pytest.fixture(scope="module")
def points(mlp, split):
    """The first clean-correct points of the MLP."""
    x, y = next(iter(split))
    right = np.argmax(mlp(x), -1) == y.numpy()
    assert right.sum() >= POINTS
    return tf.boolean_mask(x, right)[:POINTS], tf.cast(tf.boolean_mask(y, right)[:POINTS], tf.int32)


def rounded(model):
    """`model` behind an input-rounding layer without a gradient (to 1/255 steps, as a JPEG or
    bit-depth defence): Keras' Discretization gives integer bins, which do not differentiate."""
    inputs = keras.Input((28, 28, 1))
    bins = keras.layers.Discretization(bin_boundaries=[(i + 0.5) / 255 for i in range(255)])
    return keras.Model(inputs, model(keras.layers.Rescaling(1 / 255)(bins(inputs))))


class Noisy(keras.layers.Layer):
    """Gaussian noise at inference too: a randomized defence."""

    def call(self, x, training=False):
        return x + tf.random.normal(tf.shape(x), stddev=1.0)


class ZeroGradient(keras.layers.Layer):
    """The identity with a zero gradient: a masked model whose gradients exist but say nothing."""

    def call(self, x, training=False):
        @tf.custom_gradient
        def identity(x):
            return tf.identity(x), lambda upstream: tf.zeros_like(upstream)

        return identity(x)


class OneStepAtInference(keras.layers.Layer):
    """A dynamic defence: one gradient step on its input at inference."""

    def __init__(self, model, **kwargs):
        super().__init__(**kwargs)
        self.model = model

    def call(self, x, training=False):
        with tf.GradientTape() as tape:
            tape.watch(x)
            energy = tf.reduce_sum(tf.square(self.model(x)))
        return x - 1e-3 * tape.gradient(energy, x)


def behind(layer, model):
    inputs = keras.Input((28, 28, 1))
    return keras.Model(inputs, model(layer(inputs)))


class Forgetful(Attack):
    """PGD that queries the point it found and returns the clean input instead."""

    needs_gradients = True

    def __init__(self, eps):
        self.eps, self.norm = eps, "l2"
        self.pgd = PGD(eps, 10, 1, norm="l2")

    def __call__(self, model, x, y, seed):
        x_adv, _ = self.pgd(model, x, y, seed)
        model(x_adv, training=False)
        return tf.identity(x), {}


def pgd(steps=50, restarts=1, eps=EPS):
    options = {"pgd": {"steps": steps, "restarts": restarts}}
    return evaluation.registry_attacks(["pgd"], [eps], norm="l2", options=options)


def counts(found: Indicators, name: str) -> dict[str, int | None]:
    (held,) = found.attacks.values()
    return {k: None if v is None else v.points for k, v in held.items()}[name]


# --- the gradient-free model: not applicable, Square runs -------------------------------------


@pytest.mark.slow
def test_a_model_without_input_gradients_is_evaluated_by_square_alone(mlp, split):
    model = rounded(mlp)
    attacks = evaluation.registry_attacks(
        ["pgd", "autoattack"],
        [EPS],
        norm="l2",
        options={"pgd": {"steps": 5, "restarts": 1}},
        jit_compile=False,
    )
    result = evaluation.evaluate(model, split.unbatch().take(8).batch(8), attacks)
    assert result.robust_accuracy("pgd") is None
    assert "input gradient is unavailable" in result.not_applicable["pgd@l2:1.5"]
    aa = result.attacked("autoattack")
    # Square ran, on the points right clean, and is AutoAttack's number; the others did not.
    assert list(aa.parts) == ["clean", "square"]
    assert aa.robust_accuracy == aa.parts["square"] < result.clean_accuracy
    assert {k for k in result.not_applicable if "/" in k} == {
        f"autoattack@l2:1.5/{part}" for part in ("apgd-ce", "apgd-t", "fab-t")
    }
    again = EvaluationResult.from_dict(result.to_dict())
    assert again.robust_accuracy("pgd") is None and again.not_applicable == result.not_applicable
    assert again.robust_accuracy("autoattack") == aa.robust_accuracy
    # And the unavailable-gradients indicator says why, on every sample point.
    x, y = ind.sample(split, result.clean_outcomes, 4)
    found = ind.compute(model, x, y, attacks, result)
    assert found.fired("pgd@l2:1.5")["unavailable_gradients"].points == int(x.shape[0])
    assert found.fired("autoattack@l2:1.5")["unavailable_gradients"].points == int(x.shape[0])
    assert found.attacks["pgd@l2:1.5"]["incomplete_optimization"] is None


def test_a_null_robust_accuracy_needs_its_reason(mlp):
    result = EvaluationResult(4, 1.0, robust=[AttackResult("pgd", 8, None)])
    payload = result.to_dict()
    with pytest.raises(ValueError, match="not_applicable does not say why"):
        EvaluationResult.from_dict(payload)
    payload["not_applicable"] = {"pgd@8": "no gradients"}
    assert EvaluationResult.from_dict(payload).robust_accuracy("pgd") is None


# --- each indicator: fires on the model built for it, quiet on the trained MLP ---------------


def test_unavailable_gradients(mlp, points):
    x, y = points
    seed = tf.constant([0, 0])
    assert ind.unavailable_gradients(rounded(mlp), x, y, EPS, "l2", seed).all()
    assert ind.unavailable_gradients(behind(ZeroGradient(), mlp), x, y, EPS, "l2", seed).all()
    assert not ind.unavailable_gradients(mlp, x, y, EPS, "l2", seed).any()


@pytest.mark.slow
def test_unstable_predictions(mlp, points):
    x, y = points
    noisy = behind(Noisy(), mlp)
    assert counts(ind.compute(noisy, x, y, pgd(5)), "unstable_predictions") > POINTS // 2
    values = ind.unstable_values(noisy, x, y, EPS, "l2", 0)
    assert np.median(values) > ind.UNSTABLE_LOSS_CHANGE, values
    assert checks.randomized(noisy, x, y).all()
    quiet = ind.unstable_values(mlp, x, y, EPS, "l2", 0)
    assert quiet.max() < ind.UNSTABLE_LOSS_CHANGE / 2, quiet.max()
    assert not checks.randomized(mlp, x, y).any()


def test_unstable_values_are_the_mean_over_draws_called_one_by_one(mlp, points, monkeypatch):
    """Pintor et al.'s value computed here draw by draw (each draw's noise from its own
    stateless seed, the model called on each noisy copy alone) is what unstable_values gives,
    bit for bit: for a Keras model, called once per draw as it is, and for its inference graph
    with the weights folded in, whose draws run as one graph loop. Ten draws instead of a
    hundred."""
    monkeypatch.setattr(ind, "UNSTABLE_DRAWS", 10)
    x, y = points
    seed = constraints.as_seed(3)

    def drawn_one_by_one(model):
        reference = losses.cross_entropy(model(x, training=False), y).numpy()
        total = np.zeros_like(reference)
        for draw in range(ind.UNSTABLE_DRAWS):
            drawn = tf.random.experimental.stateless_fold_in(seed, draw)
            u = (tf.random.stateless_uniform(tf.shape(x), drawn) - 0.5) * EPS
            norms = tf.norm(tf.reshape(u, [int(x.shape[0]), -1]), axis=1)
            u = u / (tf.reshape(norms, [-1, 1, 1, 1]) + 1e-12) * (EPS / 2)
            noisy = model(tf.clip_by_value(x + u, 0.0, 1.0), training=False)
            loss = losses.cross_entropy(noisy, y).numpy()
            total += np.abs(reference - loss) / np.where(reference == 0, 1.0, np.abs(reference))
        return np.minimum(total / ind.UNSTABLE_DRAWS, 1.0)

    # A Keras model with the softplus activation's division by β: traced into a graph, Grappler
    # would make it a product with 1/β and move the last bits of the losses.
    softplus = behind(keras.layers.Activation(layers.softplus_beta10), mlp)
    for model in (softplus, classifiers.InferenceGraph(softplus)):
        expected = drawn_one_by_one(model)
        assert 0 < expected.min() and expected.max() < 1  # neither 0 nor the cap everywhere
        found = ind.unstable_values(model, x, y, EPS, "l2", seed)
        assert found.dtype == expected.dtype and found.tobytes() == expected.tobytes()


@pytest.mark.slow
def test_incomplete_optimization(mlp, points):
    x, y = points
    # Three steps leave the loss rising on the points they leave robust; fifty do not.
    assert counts(ind.compute(mlp, x, y, pgd(3)), "incomplete_optimization") > POINTS // 4
    assert counts(ind.compute(mlp, x, y, pgd(50)), "incomplete_optimization") == 0


def test_incomplete_is_pintors_rule():
    rising = np.linspace(0, 1, 20)[:, None]
    flat_end = np.concatenate([np.linspace(0, 1, 10), np.ones(10)])[:, None]
    assert ind.incomplete(rising).tolist() == [True]
    assert ind.incomplete(flat_end).tolist() == [False]
    assert ind.incomplete(np.zeros((5, 1))).tolist() == [False]


@pytest.mark.slow
def test_silent_success(mlp, points):
    x, y = points
    forgetful = {("forgetful", EPS): Forgetful(EPS)}
    assert counts(ind.compute(mlp, x, y, forgetful), "silent_success") > 0
    # PGD returns an adversarial point wherever an iterate was one.
    assert counts(ind.compute(mlp, x, y, pgd(10)), "silent_success") == 0


@pytest.mark.slow
def test_transfer_failure(mlp, points):
    x, y = points
    keras.utils.set_random_seed(0)
    unlike = keras.Sequential(
        [keras.Input((28, 28, 1)), keras.layers.Flatten(), keras.layers.Dense(10)]
    )

    def transfer(source):
        options = {"transfer": {"steps": 10, "restarts": 1}}
        return evaluation.registry_attacks(
            ["transfer"], [EPS], norm="l2", options=options, source=source
        )

    assert counts(ind.compute(mlp, x, y, transfer(unlike)), "transfer_failure") > POINTS // 4
    # Crafted on the model itself, whatever fools the source fools the target.
    assert counts(ind.compute(mlp, x, y, transfer(mlp)), "transfer_failure") == 0


@pytest.mark.slow
def test_unconstrained_attack_failure(mlp, points):
    x, y = points
    # Without a bound PGD breaks every point of the trained MLP; with zero gradients none.
    assert counts(ind.compute(mlp, x, y, pgd(10)), "unconstrained_attack_failure") == 0
    masked = behind(ZeroGradient(), mlp)
    assert counts(ind.compute(masked, x, y, pgd(10)), "unconstrained_attack_failure") == POINTS


# --- the reference AutoAttack's checks ---------------------------------------------------------


def fired(found) -> set[str]:
    return {name for name, check in found.items() if check.fired}


def test_the_reference_checks_stay_quiet_on_the_trained_mlp(mlp, points):
    x, y = points
    attacks = evaluation.registry_attacks(["autoattack"], [EPS], norm="l2")
    found = checks.reference_checks(mlp, x, y, attacks)
    assert fired(found) == set()
    # A check that did not fire says what it saw, not what it looks for (results keep both).
    assert (
        found["softmax_outputs"].detail == "the outputs are logits (not probabilities summing to 1)"
    )
    assert found["dynamic_model"].detail == "the inference graph holds no gradient op"


def test_the_zero_gradient_check_leaves_out_points_the_model_gets_wrong(mlp, points):
    """On a point whose label ranks third among the logits, DLR = −(z_π3 − z_π1)/(z_π1 − z_π3)
    is the constant 1 and its gradient zero: the reference checks only the points APGD
    attacks, those classified right, and so does this check."""
    x, _ = points
    logits = mlp(x).numpy()
    third = np.argsort(logits, -1)[:, -3].astype(np.int32)
    attacks = evaluation.registry_attacks(["autoattack"], [EPS], norm="l2")
    start = checks.apgd_start(x, EPS, "l2", constraints.as_seed(0))
    grad = checks.input_gradients(mlp, start, lambda z: losses.dlr(z, third))
    constant = np.abs(grad).sum(1) == 0
    assert constant.any()  # the case exists at APGD's start: the loss is 1 there
    check = checks.reference_checks(mlp, x, tf.constant(third), attacks)["zero_gradients"]
    assert not check.fired, check.detail
    assert check.detail.startswith("0 of the 0 points the model classifies right")


def test_each_reference_check_fires_on_its_model(mlp, points):
    x, y = points
    attacks = evaluation.registry_attacks(["autoattack"], [EPS], norm="l2")
    assert "randomized" in fired(checks.reference_checks(behind(Noisy(), mlp), x, y, attacks))
    softmax = behind(keras.layers.Identity(), keras.Sequential([mlp, keras.layers.Softmax()]))
    assert "softmax_outputs" in fired(checks.reference_checks(softmax, x, y, attacks))
    masked = behind(ZeroGradient(), mlp)
    assert "zero_gradients" in fired(checks.reference_checks(masked, x, y, attacks))
    dynamic = behind(OneStepAtInference(mlp), mlp)
    assert "dynamic_model" in fired(checks.reference_checks(dynamic, x, y, attacks))
    three = keras.Sequential(
        [keras.Input((28, 28, 1)), keras.layers.Flatten(), keras.layers.Dense(3)]
    )
    assert "class_count" in fired(checks.reference_checks(three, x, y % 3, attacks))


def test_square_beating_the_white_box_parts_is_the_references_margin():
    def result(square):
        parts = {"clean": 0.8, "apgd-ce": 0.5, "apgd-t": 0.45, "fab-t": 0.45, "square": square}
        return EvaluationResult(
            1000, 0.8, robust=[AttackResult("autoattack", 8, square, parts=parts)]
        )

    assert checks.square_beats_white_box(result(0.44)).fired  # 1 point below
    assert checks.square_beats_white_box(result(0.44)).keys == ("autoattack@8",)
    assert not checks.square_beats_white_box(result(0.449)).fired  # within 0.002


@pytest.mark.slow
def test_indicators_read_back_and_say_what_fired(mlp, points):
    x, y = points
    found = ind.compute(mlp, x, y, pgd(3), checks=checks.reference_checks(mlp, x, y, pgd(3)))
    again = Indicators.from_dict(found.to_dict())
    assert again == found
    (line,) = found.lines()
    assert line.startswith("indicators pgd@l2:1.5: incomplete optimization on ")
    assert "may overestimate robustness" in line and found.touched("pgd@l2:1.5")
    quiet = ind.compute(mlp, x, y, pgd(50))
    assert quiet.lines() == [f"indicators pgd@l2:1.5: none fired on {POINTS} points"]
    assert not quiet.touched("pgd@l2:1.5")


@pytest.mark.slow
def test_evaluate_py_finishes_on_a_model_without_input_gradients(mlp, tmp_path, monkeypatch):
    """One run (evaluate.py's main, in this process): PGD and AutoAttack's gradient parts not
    applicable, Square run, the robust accuracy from what ran, and the indicator saying why."""
    from tests import in_process

    path = str(tmp_path / "rounded.keras")
    rounded(mlp).save(path)
    results = tmp_path / "eval.json"
    done = in_process.evaluate(
        f"--model_path={path}",
        "--dataset=fashion_mnist",
        f"--data_dir={FASHION_MNIST}",
        "--attacks=pgd,autoattack",
        "--pgd_steps=2",
        "--pgd_restarts=1",
        "--norm=l2",
        f"--eps={EPS:g}",
        "--n_examples=8",
        "--batch_size=8",
        "--indicator_points=4",
        "--jit_compile=false",
        f"--results={results}",
        monkeypatch=monkeypatch,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "None values not supported" not in done.stderr
    assert "| PGD-2-1 | l2:1.5 | not applicable: no input gradients |" in done.stdout or (
        "| PGD-2-1 | 1.5 | not applicable: no input gradients |" in done.stdout
    ), done.stdout
    assert "indicators pgd@l2:1.5: unavailable gradients on 4 of 4 points" in done.stdout
    assert "indicators autoattack@l2:1.5: unavailable gradients on 4 of 4 points" in done.stdout
    saved = EvaluationResult.load(str(results))
    assert saved.robust_accuracy("pgd") is None and "pgd@l2:1.5" in saved.not_applicable
    assert list(saved.attacked("autoattack").parts) == ["clean", "square"]
    assert saved.robust_accuracy("autoattack") == saved.attacked("autoattack").parts["square"]
    assert saved.indicators.fired("pgd@l2:1.5")["unavailable_gradients"].points == 4
    assert saved.indicators.checks["zero_gradients"].fired


def test_the_model_card_names_the_indicators_that_fired():
    from export import modelcard
    from fbat_tf.records import Count

    result = EvaluationResult(32, 0.9, robust=[AttackResult("pgd", 8, 0.5)])
    assert modelcard.fired_indicators(result) is None
    result.indicators = Indicators(
        32, {"pgd@8": {"incomplete_optimization": Count(3, 32), "silent_success": Count(0, 32)}}
    )
    assert modelcard.fired_indicators(result) == {"pgd@8": {"incomplete_optimization": 3}}
