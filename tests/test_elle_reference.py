"""ELLE and ELLE-A's `gradients` and λ schedule against independent computations (DESIGN.md §3.2).

What it is checked against:

- the step's points: the step seed split in three (stateless_split: the base attack's, the
  triplet points', the t's); x_a, x_b = x + P_C(U[−ε, ε]) of one draw over [x; x], t ~ U[0, 1],
  x_c = (1 − t)·x_a + t·x_b, redrawn here and compared with `method.triplet`;
- the training point of each base attack: FGSM of α from δ = 0 projected onto C, N-FGSM's step
  from noise of 2ε (kept in the box only), or x;
- E_lin = mean_i (CE_i(x_c) − (1 − t_i)·CE_i(x_a) − t_i·CE_i(x_b))², its per-example losses from
  one batch [x_a; x_b; x_c] through the model in train mode, the gaps squared and averaged in
  NumPy; the loss CE(x + δ) + λ·E_lin and its weight gradient from plain `tf.GradientTape`s, on
  a dense softplus model and a conv model with batch norm, in float64 and float32;
- the penalty's θ-gradient against central finite differences (float64, every weight);
- ELLE-A's λ over a crafted sequence of E_lin against a hand computation and a NumPy loop over
  the whole history (a jump only past two values, population std, decay otherwise).

Nothing from `fbat_tf` is used except `methods.create` and the method itself.

    python -m pytest tests/test_elle_reference.py -q
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from fbat_tf import methods
from tests.reference import (
    assert_grads_close,
    case_setup,
    finite_difference,
    global_norm,
    per_example_ce,
    project,
)

RTOL = {"float64": 1e-5, "float32": 1e-4}
SEED = (11, 5)
EPS = 0.3  # wide enough that the loss bends inside the ball


_setup = case_setup


def _balanced_weight(model, x, y, **options) -> float:
    """A λ whose penalty gradient is as large as the CE gradient, so that an error in either
    would show above the tolerance."""
    ref = _reference(model, x, y, _seed(), eps=EPS, weight=1.0, **options)
    assert ref["error"] > 1e-6, ref["error"]
    return global_norm(ref["ce_gradient"]) / global_norm(ref["error_gradient"])


def _seed() -> tf.Tensor:
    return tf.constant(SEED, dtype=tf.int32)


# --------------------------------------------------------------------------- reference


def _seeds(seed):
    parts = tf.random.experimental.stateless_split(seed, num=3)
    return parts[0], parts[1], parts[2]


def _points(x, seed, eps):
    """x_a, x_b, x_c and t of the step."""
    _, point_seed, t_seed = _seeds(seed)
    batch = x.shape[0]
    pair = tf.concat([x, x], axis=0)
    draw = tf.random.stateless_uniform(
        tf.shape(pair), seed=point_seed, minval=-eps, maxval=eps, dtype=x.dtype
    )
    ends = pair + project(draw, pair, eps)
    x_a, x_b = ends[:batch], ends[batch:]
    t = 0.5 + tf.random.stateless_uniform(
        [batch], seed=t_seed, minval=-0.5, maxval=0.5, dtype=x.dtype
    )
    t_b = tf.reshape(t, [batch] + [1] * (len(x.shape) - 1))
    return x_a, x_b, (1 - t_b) * x_a + t_b * x_b, t


def _input_gradient(model, inputs, y):
    with tf.GradientTape() as tape:
        tape.watch(inputs)
        ce, _ = per_example_ce(model, inputs, y)
        total = tf.reduce_sum(ce)
    return tape.gradient(total, inputs)


def _training_point(model, x, y, seed, eps, attack, alpha):
    if attack == "none":
        return x
    if attack == "fgsm":
        return x + project(alpha * tf.sign(_input_gradient(model, x, y)), x, eps)
    attack_seed = _seeds(seed)[0]
    noise = tf.random.stateless_uniform(
        tf.shape(x), seed=attack_seed, minval=-2 * eps, maxval=2 * eps, dtype=x.dtype
    )
    noisy = tf.clip_by_value(x + noise, 0.0, 1.0)
    return tf.clip_by_value(noisy + alpha * tf.sign(_input_gradient(model, noisy, y)), 0.0, 1.0)


def _linearity_error(model, y, x_a, x_b, x_c, t):
    """E_lin as a tensor (recorded on any tape) and its per-example gaps in NumPy."""
    batch = x_a.shape[0]
    ce, _ = per_example_ce(model, tf.concat([x_a, x_b, x_c], axis=0), y=tf.concat([y] * 3, 0))
    ce_a, ce_b, ce_c = ce[:batch], ce[batch : 2 * batch], ce[2 * batch :]
    gaps = ce_c - ((1 - t) * ce_a + t * ce_b)
    return tf.reduce_mean(tf.square(gaps)), np.asarray(gaps, np.float64)


def _reference(model, x, y, seed, *, eps, weight, attack, alpha):
    x_train = _training_point(model, x, y, seed, eps, attack, alpha)
    x_a, x_b, x_c, t = _points(x, seed, eps)
    with tf.GradientTape(persistent=True) as tape:
        ce, logits = per_example_ce(model, x_train, y)
        ce_loss = tf.reduce_mean(ce)
        error, gaps = _linearity_error(model, y, x_a, x_b, x_c, t)
    ce_gradient = tape.gradient(ce_loss, model.trainable_variables)
    error_gradient = tape.gradient(error, model.trainable_variables)
    del tape
    numpy_error = float(np.mean(gaps**2))
    correct = np.argmax(np.asarray(logits), axis=-1) == np.asarray(y)
    return {
        "x_train": x_train,
        "points": (x_a, x_b, x_c, t),
        "error": numpy_error,
        "loss": float(ce_loss) + weight * numpy_error,
        "ce_gradient": ce_gradient,
        "error_gradient": error_gradient,
        "grads": [a + weight * b for a, b in zip(ce_gradient, error_gradient, strict=True)],
        "adv_accuracy": float(np.mean(correct)),
    }


# --------------------------------------------------------------------------- tests


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("case", ["dense", "conv"])
def test_elle_matches_reference(case, dtype):
    model, x, y = _setup(case, dtype)
    weight = _balanced_weight(model, x, y, attack="fgsm", alpha=EPS)
    method = methods.create("elle", eps=EPS, weight=weight, schedule="constant")
    grads, logs = method.gradients(model, x, y, _seed())
    ref = _reference(model, x, y, _seed(), eps=EPS, weight=weight, attack="fgsm", alpha=EPS)

    rtol = RTOL[dtype]
    for got, expected in zip(method.triplet(x, _seed()), ref["points"], strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=0, atol=1e-7)
    train_point = method.perturb(model, x, y, _seed())
    np.testing.assert_allclose(np.asarray(train_point), np.asarray(ref["x_train"]), atol=1e-7)
    assert_grads_close(grads, ref["grads"], rtol)
    np.testing.assert_allclose(float(logs["elle_error"]), ref["error"], rtol=rtol)
    np.testing.assert_allclose(float(logs["loss"]), ref["loss"], rtol=rtol)
    assert float(logs["elle_lambda"]) == pytest.approx(weight)
    assert float(logs["adv_accuracy"]) == pytest.approx(ref["adv_accuracy"], abs=1e-6)


@pytest.mark.parametrize("attack", ["nfgsm", "none"])
def test_each_base_attack_and_elle_a_s_current_lambda_match_reference(attack):
    """ELLE-A with its λ state set by hand (3 of λ_max), on N-FGSM's point or on x."""
    model, x, y = _setup("conv", "float64")
    alpha = 0.75 * EPS
    weight = 3 * _balanced_weight(model, x, y, attack=attack, alpha=alpha)
    method = methods.create("elle", eps=EPS, weight=weight, attack=attack, step=alpha / EPS)
    method.build(tuple(x.shape))
    method.variables()["lambda"].assign(weight / 3)
    grads, logs = method.gradients(model, x, y, _seed())
    ref = _reference(model, x, y, _seed(), eps=EPS, weight=weight / 3, attack=attack, alpha=alpha)
    if attack == "nfgsm":  # the noise reaches past the ε-ball
        assert 1.5 * EPS < float(tf.reduce_max(tf.abs(ref["x_train"] - x)))
    np.testing.assert_allclose(
        np.asarray(method.perturb(model, x, y, _seed())), np.asarray(ref["x_train"]), atol=1e-9
    )
    assert_grads_close(grads, ref["grads"], RTOL["float64"])
    np.testing.assert_allclose(float(logs["loss"]), ref["loss"], rtol=RTOL["float64"])
    assert float(logs["elle_lambda"]) == pytest.approx(weight / 3, rel=1e-6)


def test_the_triplet_points_lie_in_the_eps_ball_and_the_box_and_fill_the_segment():
    model, x, _ = _setup("conv", "float32")
    method = methods.create("elle", eps=EPS)
    x_a, x_b, x_c, t = (np.asarray(v) for v in method.triplet(x, _seed()))
    xn = np.asarray(x)
    for point in (x_a, x_b, x_c):
        assert np.abs(point - xn).max() <= EPS + 1e-6
        assert point.min() >= 0.0 and point.max() <= 1.0
    inside = (xn > EPS) & (xn < 1 - EPS)
    assert np.abs(x_a - xn)[inside].max() > 0.9 * EPS  # drawn across the ball
    assert not np.allclose(x_a, x_b)
    assert t.shape == (x.shape[0],) and 0.0 <= t.min() and t.max() <= 1.0
    assert len(set(np.round(t, 6))) == len(t)  # one t per example
    del model


def test_the_penalty_gradient_matches_finite_differences():
    model, x, y = _setup("dense", "float64")

    def term_gradient(weight):
        method = methods.create("elle", eps=EPS, weight=weight, schedule="constant")
        grads, _ = method.gradients(model, x, y, _seed())
        return [np.asarray(g) for g in grads]

    # The training point and the triplet do not depend on λ: the difference is the term alone.
    term = [b - a for a, b in zip(term_gradient(1.0), term_gradient(2.0), strict=True)]
    points = _points(x, _seed(), EPS)

    def error():
        return float(_linearity_error(model, y, *points)[0])

    numeric = finite_difference(model, error, step=1e-5)
    assert_grads_close(term, numeric, rtol=1e-6)


def test_elle_a_lambda_follows_the_released_rule_on_a_crafted_sequence():
    """λ_max = 100, γ = 0.5 and the default s, the released 2. By hand, with μ, σ over the
    earlier values (population σ): steps 1–3 decay from 0 (fewer than three earlier values: 9 at
    step 3 is no jump); step 4, 12 > μ + 2σ of {1, 1, 9} = 3.667 + 2·3.771 = 11.21 (s = 2.5
    would give 13.10: no jump): λ = 100; step 5: 50; step 6, 14.5 > 4.8 + 2·4.750 = 14.30 (a
    sample σ would give 15.42: no jump): 100; step 7: 50; step 8, 15.5 < 5.643 + 2·5.560 =
    16.76 (s = 1.5 would give 13.98, s = 1 11.20: a jump): 25; step 9: 12.5."""
    sequence = [1.0, 1.0, 9.0, 12.0, 1.0, 14.5, 1.0, 15.5, 1.0]
    by_hand = [0.0, 0.0, 0.0, 100.0, 50.0, 100.0, 50.0, 25.0, 12.5]

    def released(values, sensitivity=2.0):
        lam, history, out = 0.0, [], []
        for value in values:
            if len(history) > 2 and value > np.mean(history) + sensitivity * np.std(history):
                lam = 100.0
            else:
                lam *= 0.5
            history.append(value)
            out.append(lam)
        return out

    # The sequence tells the released s from its neighbours.
    for other in (1.0, 1.5, 2.5):
        assert released(sequence, other) != by_hand, other
    assert released(sequence) == by_hand
    method = methods.create("elle", eps=EPS, weight=100.0, decay=0.5)  # s at its default
    method.build((2, 12))
    state = method.variables()
    got = []
    for value in sequence:
        method.after_gradients({"elle_error": tf.constant(value)})
        got.append(float(state["lambda"].numpy()))
    np.testing.assert_allclose(got, by_hand, rtol=1e-6)
    assert float(state["count"].numpy()) == len(sequence)
    np.testing.assert_allclose(float(state["mean"].numpy()), np.mean(sequence), rtol=1e-6)
    np.testing.assert_allclose(
        float(state["m2"].numpy()), len(sequence) * np.var(sequence), rtol=1e-5
    )


def test_a_step_trains_with_the_lambda_before_its_own_update():
    """The step's loss uses λ as it was; its E_lin then moves λ (here a decay of 0.5)."""
    model, x, y = _setup("dense", "float32")
    method = methods.create("elle", eps=EPS, weight=100.0, decay=0.5)
    method.build(tuple(x.shape))
    method.variables()["lambda"].assign(8.0)
    _, logs = method.gradients(model, x, y, _seed())
    assert float(logs["elle_lambda"]) == 8.0
    method.after_gradients(logs)
    assert float(method.variables()["lambda"].numpy()) == 4.0
    assert float(method.variables()["mean"].numpy()) == pytest.approx(float(logs["elle_error"]))


@pytest.mark.parametrize(
    ("eps_255", "schedule", "expected"),
    [
        (8, "adaptive", 4000.0),
        (26, "adaptive", 4000.0),
        (2, "constant", 1000.0),
        (8, "constant", 1000.0),
        (10, "constant", 5000.0),
        (20, "constant", 5000.0),
        (22, "constant", 10000.0),
    ],
)
def test_default_lambda_follows_the_released_scripts(eps_255, schedule, expected):
    method = methods.create("elle", eps=eps_255 / 255, schedule=schedule)
    assert method.weight == expected
    assert method.title == {"adaptive": "ELLE-A", "constant": "ELLE"}[schedule]
    assert method.alpha == pytest.approx(eps_255 / 255)
    assert (method.decay, method.sensitivity, method.attack) == (0.99, 2.0, "fgsm")
