"""The L2 perturbation set {‖δ‖₂ ≤ ε} ∩ [-x, 1 - x] against independent computations: Dykstra's
alternating projections for the nearest point, the ball's volume law for the random start."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from fbat_tf import constraints


def dykstra(v: np.ndarray, x: np.ndarray, eps: float, rounds: int = 5000) -> np.ndarray:
    """The nearest point of the ball ∩ box to v (one example, float64): Dykstra's algorithm
    alternates the two sets' own projections with correction terms and converges to the
    projection onto their intersection."""
    point, p, q = v.astype(np.float64), np.zeros(v.shape), np.zeros(v.shape)
    for _ in range(rounds):
        moved = point + p
        y = moved * min(1.0, eps / max(np.linalg.norm(moved), 1e-300))  # the ball's projection
        p = moved - y
        moved = y + q
        point = np.clip(moved, -x, 1.0 - x)  # the box's
        q = moved - point
    return point


def cases(rng: np.random.Generator) -> dict[str, tuple[np.ndarray, np.ndarray, float]]:
    shape = (3, 3, 2)
    x = rng.uniform(0.0, 1.0, shape)
    small = rng.normal(0.0, 0.02, shape)
    return {
        # Inside both: left where it is.
        "inside": (small, x, 1.0),
        # Outside the ball, inside the box at every scale (x = 0.5, small steps).
        "ball_only": (np.full(shape, 0.1) * rng.choice([-1, 1], shape), np.full(shape, 0.5), 0.2),
        # Outside the box, inside the ball once clipped.
        "box_only": (np.where(x > 0.5, 0.9, -0.9) * np.ones(shape), x, 100.0),
        # Outside both: near the box's lower face (x = 0.02) the box binds, the ball elsewhere.
        "both": (
            -rng.uniform(0.5, 1.5, shape),
            np.where(rng.uniform(size=shape) < 0.5, 0.02, 0.5),
            0.7,
        ),
    }


@pytest.mark.parametrize("case", ["inside", "ball_only", "box_only", "both"])
def test_l2_projection_is_the_nearest_point_of_ball_and_box(case):
    rng = np.random.default_rng(["inside", "ball_only", "box_only", "both"].index(case))
    v, x, eps = cases(rng)[case]
    got = constraints.project(
        tf.constant(v[None], tf.float64), tf.constant(x[None], tf.float64), eps, norm="l2"
    ).numpy()[0]
    expected = dykstra(v, x, eps)
    np.testing.assert_allclose(got, expected, atol=1e-7)
    assert np.linalg.norm(got) <= eps + 1e-9
    assert np.all(x + got >= -1e-12) and np.all(x + got <= 1 + 1e-12)
    if case == "inside":
        np.testing.assert_array_equal(got, v)
    if case == "ball_only":  # the box never binds: the ball's own projection, a rescaling
        np.testing.assert_allclose(got, v * eps / np.linalg.norm(v), atol=1e-9)
    if case == "box_only":  # the ball never binds: the box's own projection, a clip
        np.testing.assert_allclose(got, np.clip(v, -x, 1 - x), atol=1e-12)
    if case == "both":  # clipping the ball's projection to the box is not the nearest point
        clipped = np.clip(v * eps / np.linalg.norm(v), -x, 1 - x)
        assert np.linalg.norm(got - v) < np.linalg.norm(clipped - v) - 1e-6


def test_l2_projection_works_per_example_of_a_batch_in_float32():
    rng = np.random.default_rng(7)
    x = rng.uniform(size=(6, 4, 4, 1)).astype(np.float32)
    v = rng.normal(0.0, rng.uniform(0.01, 2.0, (6, 1, 1, 1)), x.shape).astype(np.float32)
    got = constraints.project(tf.constant(v), tf.constant(x), 0.5, norm="l2").numpy()
    for i in range(6):
        np.testing.assert_allclose(got[i], dykstra(v[i], x[i], 0.5), atol=2e-6)
    constraints.check_in_ball(tf.constant(x + got), tf.constant(x), 0.5, norm="l2")


def test_the_l2_random_start_is_uniform_in_the_ball_and_inside_the_box():
    # d = 2 coordinates at x = 0.5 with ε = 0.1: the box never binds, and a uniform point of the
    # disc has P(‖δ‖ ≤ r) = (r / ε)², mean radius 2ε/3.
    x = tf.fill([20000, 2], 0.5)
    delta = constraints.random_init(x, 0.1, constraints.as_seed(3), norm="l2").numpy()
    radius = np.linalg.norm(delta, axis=1) / 0.1
    assert radius.max() <= 1 + 1e-6
    for r in (0.25, 0.5, 0.75):
        assert abs(np.mean(radius <= r) - r**2) < 0.015, r
    angles = np.arctan2(delta[:, 1], delta[:, 0])
    counts = np.histogram(angles, bins=8, range=(-np.pi, np.pi))[0]
    assert counts.min() > 0.9 * counts.mean()  # every direction alike
    # Near the box's faces it is clipped into the box, staying in the ball.
    x = tf.constant(np.random.default_rng(0).choice([0.0, 1.0], (50, 8, 8, 1)), tf.float32)
    delta = constraints.random_init(x, 3.0, constraints.as_seed(4), norm="l2")
    constraints.check_in_ball(x + delta, x, 3.0, norm="l2")


def test_the_l2_step_direction_has_unit_norm_and_the_gradient_s_direction():
    grad = tf.constant(np.random.default_rng(2).normal(size=(4, 3, 3, 1)), tf.float32)
    grad = tf.concat([grad, tf.zeros([1, 3, 3, 1])], 0)
    step = constraints.normalized(grad, "l2").numpy()
    np.testing.assert_allclose(np.linalg.norm(step[:4].reshape(4, -1), axis=1), 1.0, rtol=1e-6)
    cosine = np.sum(step[:4] * grad[:4].numpy(), axis=(1, 2, 3)) / np.linalg.norm(
        grad[:4].numpy().reshape(4, -1), axis=1
    )
    np.testing.assert_allclose(cosine, 1.0, rtol=1e-6)
    np.testing.assert_array_equal(step[4], 0.0)  # no gradient, no step
    np.testing.assert_array_equal(constraints.normalized(grad, "linf"), tf.sign(grad))


def test_check_in_ball_measures_the_l2_norm_per_example():
    x = tf.fill([2, 10], 0.5)
    inside = x + tf.fill([2, 10], float(0.3 / np.sqrt(10)))  # ‖δ‖₂ = 0.3, ‖δ‖∞ ≈ 0.095
    constraints.check_in_ball(inside, x, 0.3, norm="l2")
    with pytest.raises(AssertionError, match="‖δ‖₂ = 0.3"):
        constraints.check_in_ball(inside, x, 0.25, norm="l2")
    with pytest.raises(ValueError, match="unknown norm 'l1'"):
        constraints.check_in_ball(inside, x, 0.3, norm="l1")


def test_l2_pgd_reaches_the_closed_form_optimum_of_a_linear_model():
    """Two classes, logits W·x: cross-entropy grows with the margin's decrease, so the
    strongest δ in the L2 ball is −ε·(w_y − w_o)/‖w_y − w_o‖ (the box does not bind at
    x = 0.5 with ε = 0.2), and the loss there is log(1 + exp(−(m − ε‖w_y − w_o‖)))."""
    import keras

    from fbat_tf.attacks.pgd import PGD

    rng = np.random.default_rng(5)
    weights = rng.normal(size=(16, 2)).astype(np.float32)
    model = keras.Sequential([keras.Input((4, 4, 1)), keras.layers.Flatten()])
    dense = keras.layers.Dense(2, use_bias=False)
    model.add(dense)
    dense.set_weights([weights])
    x = tf.fill([3, 4, 4, 1], 0.5)
    y = tf.constant([0, 1, 0])
    x_adv = PGD(0.2, steps=40, restarts=1, step_size=0.05, norm="l2")(model, x, y, seed=0)[0]
    delta = (x_adv - x).numpy().reshape(3, -1)
    # Where the optimum still classifies right, PGD's last iterate is the optimum; where some
    # iterate is wrong (the label the model gets wrong at x, from its random start), PGD keeps
    # that point.
    optimum_right = 0
    for i, label in enumerate(y.numpy()):
        w = weights[:, label] - weights[:, 1 - label]
        optimum = -0.2 * w / np.linalg.norm(w)
        if (x.numpy()[i].ravel() + optimum) @ w > 0:
            np.testing.assert_allclose(delta[i], optimum, atol=2e-3)
            optimum_right += 1
        else:
            assert np.argmax(model(x_adv[i : i + 1]).numpy()) != label
    assert optimum_right == 1  # the example of label 1; the two of label 0 are broken
    constraints.check_in_ball(x_adv, x, 0.2, norm="l2")
    # The L∞ attack of the same budget (its random start, up to ε on every pixel, breaks every
    # example here) returns points outside the L2 ball, twice its radius away.
    linf = PGD(0.2, steps=40, restarts=1, step_size=0.05)(model, x, y, seed=0)[0]
    assert np.linalg.norm((linf - x).numpy().reshape(3, -1), axis=1).min() > 0.2 * 2
