"""APGD and the DLR losses against independent computations: hand-computed DLR values, the
reference's checkpoint rule worked out by hand, the closed-form worst case of a linear model,
and PGD with the same iteration budget on a small trained conv net."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from fbat_tf.attacks.apgd import APGD, checkpoints, halve_step, target_class
from fbat_tf.attacks.losses import correct, dlr, dlr_targeted
from fbat_tf.attacks.pgd import PGD
from fbat_tf.evaluation import check_in_ball
from tests.helpers import linear_model

EPS = 8 / 255

# Two examples, four classes.
LOGITS = np.array([[3.0, 1.0, 2.0, 0.5], [1.0, 4.0, 0.0, 2.0]], np.float32)
LABELS = np.array([0, 0], np.int32)


def test_dlr_matches_hand_computed_values():
    # Row 0: z_y = 3, max_{i≠y} z_i = 2, sorted 3 > 2 > 1 > 0.5: −(3 − 2) / (3 − 1) = −0.5.
    # Row 1: z_y = 1, max_{i≠y} z_i = 4, sorted 4 > 2 > 1 > 0:   −(1 − 4) / (4 − 1) = 1.0.
    expected = np.array([-0.5, 1.0])
    np.testing.assert_allclose(dlr(LOGITS, LABELS).numpy(), expected, rtol=1e-6)


def test_targeted_dlr_matches_hand_computed_values():
    targets = np.array([2, 3], np.int32)
    # Row 0: −(z_0 − z_2) / (z_π1 − (z_π3 + z_π4)/2) = −(3 − 2) / (3 − (1 + 0.5)/2) = −1/2.25.
    # Row 1: −(z_0 − z_3) / (4 − (1 + 0)/2) = −(1 − 2) / 3.5 = 1/3.5.
    expected = np.array([-1 / 2.25, 1 / 3.5])
    np.testing.assert_allclose(dlr_targeted(LOGITS, LABELS, targets).numpy(), expected, rtol=1e-6)


def test_dlr_losses_are_float32_under_16_bit_logits():
    half = tf.constant(LOGITS, tf.float16)
    assert dlr(half, LABELS).dtype == tf.float32
    assert dlr_targeted(half, LABELS, np.array([2, 3])).dtype == tf.float32


def test_dlr_losses_name_the_class_count_when_too_few_classes():
    with pytest.raises(ValueError, match="at least 3 classes.* have 2"):
        dlr(tf.zeros([1, 2]), [0])
    with pytest.raises(ValueError, match="at least 4 classes.* have 3"):
        dlr_targeted(tf.zeros([1, 3]), [0], [1])


def test_checkpoints_follow_the_reference_rule():
    # p_0 = 0, p_1 = 0.22, p_{j+1} = p_j + max(p_j − p_{j−1} − 0.03, 0.06), times 100:
    # windows 22, 19, 16, 13, 10, 7, 6, 6 -> 22, 41, 57, 70, 80, 87, 93, 99 (next, 105 > 100).
    assert checkpoints(100) == [22, 41, 57, 70, 80, 87, 93, 99]
    # N = 10: windows ⌊2.2⌋ = 2, then 2 − max(⌊0.3⌋, 1) = 1, at least max(⌊0.6⌋, 1) = 1.
    assert checkpoints(10) == [2, 3, 4, 5, 6, 7, 8, 9, 10]
    assert checkpoints(0) == []


def test_step_size_halves_under_either_condition():
    window, rho = 22, 0.75  # ρ·22 = 16.5 increases
    increases = tf.constant([16, 17, 17, 17])
    reduced_last_check = tf.constant([False, False, True, False])
    best_last_check = tf.constant([1.0, 1.0, 1.0, 1.0])
    best_now = tf.constant([2.0, 1.0, 1.0, 2.0])
    halve = halve_step(increases, window, rho, reduced_last_check, best_last_check, best_now)
    # 0: oscillating (16 ≤ 16.5). 1: not halved last time and no improvement. 2: halved last
    # time, so condition 2 does not apply, and 17 > 16.5. 3: improved and 17 > 16.5.
    assert halve.numpy().tolist() == [True, True, False, False]


def _reference_apgd_ce(weights, x, y, start, eps, n_iter, rho=0.75):
    """A NumPy transcription of the reference's L∞ APGD-CE single run (autopgd_base.py,
    attack_single_run) on the network x ↦ tanh(xW1 + b1)W2 + b2; returns the step size of every
    example at every iteration and the kept adversarial point (the latest misclassified
    iterate). One deviation, as documented in apgd.py: the first oscillation window compares
    its first loss with the start's."""
    w1, b1, w2, b2 = weights

    def loss_and_grad(point):
        h = np.tanh(point @ w1 + b1)
        logits = h @ w2 + b2
        logits = logits - logits.max(1, keepdims=True)
        p = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
        loss = -np.log(p[np.arange(len(y)), y])
        wrong = p.argmax(1) != y
        p[np.arange(len(y)), y] -= 1.0
        return loss, ((p @ w2.T) * (1 - h**2)) @ w1.T, wrong

    def clip(point):
        return np.clip(np.minimum(np.maximum(point, x - eps), x + eps), 0.0, 1.0)

    n_iter_2 = max(int(0.22 * n_iter), 1)
    n_iter_min = max(int(0.06 * n_iter), 1)
    size_decr = max(int(0.03 * n_iter), 1)
    x_adv = start.copy()
    loss, grad, _ = loss_and_grad(x_adv)
    x_best, loss_best, grad_best = x_adv.copy(), loss.copy(), grad.copy()
    x_best_adv = x_adv.copy()
    step_size = 2.0 * eps * np.ones(len(y))
    x_adv_old = x_adv.copy()
    loss_steps = np.zeros((n_iter + 1, len(y)))
    loss_steps[-1] = loss  # the deviation: index −1 holds the start's loss
    k, counter3 = n_iter_2, 0
    loss_best_last_check = loss_best.copy()
    reduced_last_check = np.ones(len(y))
    sizes = []
    for i in range(n_iter):
        sizes.append(step_size.copy())
        grad2 = x_adv - x_adv_old
        x_adv_old = x_adv.copy()
        a = 0.75 if i > 0 else 1.0
        x_adv_1 = clip(x_adv + step_size[:, None] * np.sign(grad))
        x_adv_1 = clip(x_adv + (x_adv_1 - x_adv) * a + grad2 * (1 - a))
        x_adv = x_adv_1
        loss, grad, wrong = loss_and_grad(x_adv)
        x_best_adv[wrong] = x_adv[wrong]
        loss_steps[i] = loss
        better = loss > loss_best
        x_best[better], grad_best[better], loss_best[better] = (
            x_adv[better],
            grad[better],
            loss[better],
        )
        counter3 += 1
        if counter3 == k:
            t = np.zeros(len(y))
            for c in range(k):
                t += loss_steps[i - c] > loss_steps[i - c - 1]
            oscillation = (t <= k * rho).astype(float)
            no_improvement = (1.0 - reduced_last_check) * (loss_best_last_check >= loss_best)
            oscillation = np.maximum(oscillation, no_improvement)
            reduced_last_check = oscillation.copy()
            loss_best_last_check = loss_best.copy()
            halve = oscillation > 0
            step_size[halve] /= 2.0
            x_adv[halve] = x_best[halve]
            grad[halve] = grad_best[halve]
            counter3 = 0
            k = max(k - size_decr, n_iter_min)
    return np.array(sizes), x_best_adv


def test_apgd_step_sizes_follow_a_numpy_transcription_of_the_reference_loop():
    """Per example and iteration, the step size (halvings, their timing, the restart from the
    best point), and the kept adversarial points, against the transcription, on a float64
    network where the momentum and the box both matter; examples halve a different number of
    times."""
    d, hidden, n, classes, eps, steps = 12, 8, 16, 4, 0.3, 60
    rng = np.random.default_rng(4)
    weights = [
        rng.normal(size=(d, hidden)),
        rng.normal(size=hidden),
        rng.normal(size=(hidden, classes)),
        rng.normal(size=classes),
    ]
    x = rng.uniform(0, 1, (n, d))
    x[:, :3] = 0.0
    y = rng.integers(0, classes, n)
    model = keras.Sequential(
        [
            keras.Input((d,), dtype="float64"),
            keras.layers.Dense(hidden, activation="tanh", dtype="float64"),
            keras.layers.Dense(classes, dtype="float64"),
        ]
    )
    model.set_weights(weights)
    attack = APGD(eps, loss="ce", steps=steps)
    seed = tf.constant([1, 2], tf.int32)
    x_t, y_t = tf.constant(x), tf.constant(y, tf.int32)
    fooled, kept, sizes = attack._run(model, x_t, y_t, y_t, seed)
    u = tf.random.stateless_uniform(x.shape, seed=seed, minval=-1.0, maxval=1.0, dtype=tf.float64)
    u = u.numpy()
    start = np.clip(x + eps * u / (np.abs(u).max(1, keepdims=True) + 1e-12), 0.0, 1.0)
    start = np.clip(start, x - eps, x + eps)
    expected, expected_kept = _reference_apgd_ce(weights, x, y, start, eps, steps)
    np.testing.assert_allclose(sizes.numpy(), expected, rtol=1e-12)
    np.testing.assert_allclose(kept.numpy(), expected_kept, atol=1e-12)
    assert 0 < fooled.numpy().sum() < n
    halvings = np.log2(expected[0] / expected[-1])
    assert halvings.min() >= 1 and len(set(np.round(halvings))) > 1, halvings
    assert expected[0, 0] == 2 * eps


def test_targets_are_the_classes_ranked_second_third_and_on():
    logits = tf.constant([[5.0, 1.0, 4.0, 3.0, 2.0]])
    targets = [int(target_class(logits, k)[0]) for k in range(4)]
    assert targets == [2, 3, 4, 1]


def test_apgd_ce_finds_the_analytic_worst_case_of_a_linear_model():
    d, n, eps = 20, 128, 16 / 255
    rng = np.random.default_rng(2)
    x = rng.uniform(0, 1, (n, d)).astype(np.float32)
    x[:, :3] = rng.choice([0.0, 1.0], size=(n, 3))  # box constraints active on some coordinates
    model = linear_model(d, seed=3)
    y = model(x).numpy().argmax(1).astype(np.int32)  # all clean-correct
    kernel = model.layers[0].get_weights()[0]
    # The margin z_y − z_other is linear, so its minimum over C is the projected corner.
    towards = kernel[:, 1 - y].T - kernel[:, y].T
    worst = np.clip(x + eps * np.sign(towards), 0.0, 1.0)
    worst_logits = model(worst).numpy()
    rows = np.arange(n)
    expected = float(np.mean(worst_logits[rows, y] > worst_logits[rows, 1 - y]))
    assert 0.2 < expected < 0.8
    x_adv, _ = APGD(eps, loss="ce", steps=20)(model, x, y, seed=0)
    check_in_ball(x_adv, x, eps)
    robust = correct(model(x_adv), y).numpy()
    assert robust.mean() == pytest.approx(expected)
    # An example left robust gets its clean input back, as in the reference.
    np.testing.assert_array_equal(x_adv.numpy()[robust > 0.5], x[robust > 0.5])


def tiny_classifier(input_shape: tuple[int, int, int], classes: int = 10) -> keras.Model:
    return keras.Sequential(
        [
            keras.Input(input_shape),
            keras.layers.Conv2D(8, 3, 2, activation="relu"),
            keras.layers.Conv2D(16, 3, 2, activation="relu"),
            keras.layers.Flatten(),
            keras.layers.Dense(classes),
        ]
    )


def prototype_data(n: int, size: int, seed: int, amplitude: float = 0.05, classes: int = 10):
    """Each class a fixed ±1 pattern at low contrast around grey, plus pixel noise."""
    patterns = np.random.default_rng(0).choice([-1.0, 1.0], size=(classes, size, size, 3))
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    x = 0.5 + amplitude * patterns[y] + 0.1 * rng.normal(size=(n, size, size, 3))
    return np.clip(x, 0, 1).astype(np.float32), y.astype(np.int32)


# The module's fixtures are built once for all its tests: pytest-xdist runs them on one worker
# (--dist loadgroup, pyproject.toml).
pytestmark = pytest.mark.xdist_group("apgd")


@pytest.fixture(scope="module")
def trained_net():
    keras.utils.set_random_seed(0)
    x_train, y_train = prototype_data(2000, 16, seed=1)
    model = tiny_classifier((16, 16, 3))
    model.compile(
        keras.optimizers.Adam(1e-2), keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    model.fit(x_train, y_train, batch_size=64, epochs=5, verbose=0)
    x, y = prototype_data(256, 16, seed=2)
    assert np.mean(correct(model(x), y).numpy()) > 0.9
    return model, x, y


@pytest.mark.slow
@pytest.mark.parametrize("loss", ["ce", "dlr", "dlr_targeted"])
def test_every_apgd_point_lies_in_C(trained_net, loss):
    model, x, y = trained_net
    x, y = x[:32].copy(), y[:32]
    x[:, :4] = 0.0  # some pixels on the box's faces
    x[:, -4:] = 1.0
    x_adv = APGD(EPS, loss=loss, steps=10, n_target_classes=3)(model, x, y, 0)[0].numpy()
    assert np.abs(x_adv - x).max() <= EPS + 1e-6
    assert x_adv.min() >= 0.0 and x_adv.max() <= 1.0


@pytest.mark.slow
def test_apgd_is_at_least_as_strong_as_pgd_with_the_same_budget(trained_net):
    model, x, y = trained_net
    eps, steps = 3 / 255, 10
    ra_pgd = np.mean(correct(model(PGD(eps, steps=steps, restarts=1)(model, x, y, 0)[0]), y))
    ra_apgd = np.mean(correct(model(APGD(eps, "ce", steps=steps)(model, x, y, 0)[0]), y))
    assert 0.1 < ra_pgd < 0.9  # the comparison means something
    assert ra_apgd <= ra_pgd


def test_apgd_targeted_rejects_more_targets_than_classes(trained_net):
    model, x, y = trained_net
    with pytest.raises(ValueError, match="needs at least 11 classes, the model has 10"):
        APGD(EPS, loss="dlr_targeted", n_target_classes=10)(model, x[:2], y[:2], 0)


def test_bad_arguments_fail_early():
    with pytest.raises(ValueError, match="loss must be one of"):
        APGD(EPS, loss="hinge")
    with pytest.raises(ValueError, match="restarts >= 1"):
        APGD(EPS, restarts=0)
