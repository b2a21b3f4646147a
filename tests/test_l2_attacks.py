"""The L2 form of APGD against independent computations: the reference's radial step against
numpy, and the attack on linear models f(x) = Wx + c against the closed-form L2 distance to
misclassification, min_j (f_y − f_j)/‖w_y − w_j‖ (the nearest point of a half-space, inside the
box where the points are chosen far from its faces)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from fbat_tf import constraints
from fbat_tf.attacks.apgd import APGD
from fbat_tf.attacks.losses import correct
from fbat_tf.evaluation import check_in_ball
from tests.helpers import linear_model

# --- The reference's radial L2 step ------------------------------------------------------------


def test_radial_l2_step_is_the_reference_formula_and_stays_in_C():
    rng = np.random.default_rng(3)
    x = rng.uniform(0, 1, (8, 4, 4, 3))
    x[:, 0] = 0.0  # pixels on the box's faces
    x[:, 1] = 1.0
    scale = np.array([0.01, 0.1, 0.3, 0.6, 1.0, 2.0, 5.0, 0.0])[:, None, None, None]
    point = x + scale * rng.normal(size=x.shape)
    eps = 0.5
    got = constraints.project_radial_l2(tf.constant(point), tf.constant(x), eps).numpy()
    delta = (point - x).reshape(8, -1)
    length = np.sqrt(np.sum(delta**2, 1))[:, None]
    expected = np.clip(x.reshape(8, -1) + delta / (length + 1e-12) * np.minimum(eps, length), 0, 1)
    np.testing.assert_allclose(got.reshape(8, -1), expected, atol=1e-15)
    check_in_ball(tf.constant(got), tf.constant(x), eps, norm="l2")
    # Inside the ball and the box: kept (up to the reference's 1e-12 in the denominator).
    inside = np.clip(x + 0.001 * rng.normal(size=x.shape), 0, 1)
    kept = constraints.project_radial_l2(tf.constant(inside), tf.constant(x), eps).numpy()
    np.testing.assert_allclose(kept, inside, atol=1e-12)
    # Where the box binds it is no nearer to the point than the exact P_C.
    exact = x + constraints.project(tf.constant(point - x), tf.constant(x), eps, "l2").numpy()
    to_radial = np.sqrt(np.sum((got - point).reshape(8, -1) ** 2, 1))
    to_exact = np.sqrt(np.sum((exact - point).reshape(8, -1) ** 2, 1))
    assert np.all(to_exact <= to_radial + 1e-9)
    assert np.any(to_exact < to_radial - 1e-3)


# --- Attacks on linear models ------------------------------------------------------------------


def l2_boundary_distances(model, x, y):
    """[n, classes]: (f_y − f_j)/‖w_y − w_j‖, the L2 distance from x to the half-space where
    class j's logit reaches y's (∞ for j = y)."""
    kernel = model.layers[-1].get_weights()[0]  # [d, classes]
    logits = model(x).numpy()
    rows = np.arange(len(x))
    gaps = logits[rows, y][:, None] - logits
    lengths = np.linalg.norm(kernel[:, y].T[:, :, None] - kernel[None], axis=1)
    distances = gaps / np.where(lengths > 0, lengths, 1.0)
    distances[rows, y] = np.inf
    return distances


def linear_l2_problem(n=96, d=48, classes=4, seed=0):
    """Points in [0.3, 0.7]^d, labelled as the model classifies them; the nearest point of the
    nearest boundary half-space stays inside [0, 1]^d (checked), so the box does not lengthen
    the closed-form distance to misclassification."""
    model = linear_model(d, classes, seed=seed, random_bias=True)
    x = np.random.default_rng(seed + 10).uniform(0.3, 0.7, (n, d)).astype(np.float32)
    y = model(x).numpy().argmax(1).astype(np.int32)
    distances = l2_boundary_distances(model, x, y)
    kernel = model.layers[-1].get_weights()[0]
    nearest_class = distances.argmin(1)
    towards = (kernel[:, nearest_class] - kernel[:, y]).T
    towards /= np.linalg.norm(towards, axis=1, keepdims=True)
    nearest = x + distances.min(1)[:, None] * towards
    assert np.all(nearest >= 0) and np.all(nearest <= 1)
    return model, x, y, distances


@pytest.mark.parametrize("loss", ["ce", "dlr_targeted"])
def test_apgd_l2_breaks_the_examples_within_eps_of_a_linear_boundary(loss):
    model, x, y, distances = linear_l2_problem()
    distance = distances.min(1)
    eps = float(np.median(distance))
    clear = np.abs(distance - eps) > 0.15 * eps  # leave out the band a finite search may miss
    x, y, distance = x[clear], y[clear], distance[clear]
    near, far = distance < eps, distance > eps
    assert near.sum() >= 15 and far.sum() >= 15
    attack = APGD(eps, loss=loss, steps=100, n_target_classes=3, norm="l2")
    x_adv, _ = attack(model, tf.constant(x), tf.constant(y), seed=0)
    check_in_ball(x_adv, x, eps, norm="l2")
    assert np.sqrt(np.sum((x_adv.numpy() - x) ** 2, 1)).max() <= eps * (1 + 1e-6)
    broken = correct(model(x_adv), y).numpy() < 0.5
    np.testing.assert_array_equal(broken, near)
    np.testing.assert_array_equal(x_adv.numpy()[far], x[far])  # not broken: the clean input


@pytest.mark.parametrize("loss", ["ce", "dlr", "dlr_targeted"])
def test_every_apgd_l2_point_lies_in_C_where_the_box_binds(loss):
    model = linear_model((6, 6, 3), classes=4, seed=1, random_bias=True)
    rng = np.random.default_rng(4)
    x = rng.uniform(0, 1, (24, 6, 6, 3)).astype(np.float32)
    x[:, 0], x[:, 1] = 0.0, 1.0  # whole rows of pixels on the box's faces
    y = model(x).numpy().argmax(1).astype(np.int32)
    eps = 2.0  # large enough that most steps leave the box
    attack = APGD(eps, loss=loss, steps=10, n_target_classes=3, norm="l2")
    x_adv = attack(model, x, y, 0)[0]
    check_in_ball(x_adv, x, eps, norm="l2")


@pytest.mark.parametrize("build", [lambda: APGD(0.5, norm="L2")])
def test_an_unknown_norm_is_a_value_error_naming_it(build):
    with pytest.raises(ValueError, match=r"unknown norm '(L2|l1|l3)'"):
        build()
