"""Square Attack: the p-schedule against the reference's table, the search's invariants (stripe
start, one square window per query, points in C, a margin that never rises) recomputed from the
kept points, query accounting, no gradient use, and a clear robust-accuracy drop on a small
standard-trained model."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from fbat_tf.attacks.square import Square, p_selection, square_side
from fbat_tf.evaluation import check_in_ball

EPS = 8 / 255

# The reference's table, written out: p_init / 2^k after the k-th of the breakpoints
# 10, 50, 200, 500, 1000, 2000, 4000, 6000, 8000 (a breakpoint itself still has the larger p).
ABSOLUTE_SCHEDULE = [
    (0, 0.8),
    (10, 0.8),
    (11, 0.4),
    (50, 0.4),
    (51, 0.2),
    (200, 0.2),
    (201, 0.1),
    (500, 0.1),
    (501, 0.05),
    (1000, 0.05),
    (1001, 0.025),
    (2000, 0.025),
    (2001, 0.0125),
    (4000, 0.0125),
    (4001, 0.00625),
    (4999, 0.00625),  # AutoAttack's last query with n_queries = 5000: p_init / 128
    (6000, 0.00625),
    (6001, 0.003125),
    (8000, 0.003125),
    (8001, 0.0015625),
    (20000, 0.0015625),
]


@pytest.mark.parametrize("it, p", ABSOLUTE_SCHEDULE)
def test_p_selection_on_the_absolute_query_count(it, p):
    # AutoAttack's SquareAttack(resc_schedule=False): n_queries does not enter.
    assert p_selection(0.8, it, 5000) == pytest.approx(p, rel=1e-12)
    assert p_selection(0.8, it, 100) == pytest.approx(p, rel=1e-12)


@pytest.mark.parametrize(
    "it, n_queries, p",
    [
        (5, 5000, 0.8),  # int(5 / 5000 · 10000) = 10
        (6, 5000, 0.4),  # 12
        (25, 5000, 0.4),  # 50
        (26, 5000, 0.2),  # 52
        (4000, 5000, 0.003125),  # 8000
        (4001, 5000, 0.0015625),  # 8002
        (100, 1000, 0.05),  # 1000: still p_init / 16
        (101, 1000, 0.025),  # 1010: p_init / 32
        (501, 10000, 0.05),  # with a 10,000-query budget the table is unscaled
    ],
)
def test_p_selection_rescaled_to_the_budget(it, n_queries, p):
    # The reference's SquareAttack(resc_schedule=True): it <- int(it / n_queries · 10000).
    assert p_selection(0.8, it, n_queries, rescale=True) == pytest.approx(p, rel=1e-12)
    assert p_selection(0.5, it, n_queries, rescale=True) == pytest.approx(p / 0.8 * 0.5)


def test_square_side():
    assert square_side(0.8, 32, 32) == 29  # √819.2 = 28.62
    assert square_side(0.05, 32, 32) == 7  # √51.2 = 7.16
    assert square_side(0.8 / 512, 32, 32) == 1  # √1.6 = 1.26
    assert square_side(0.25, 5, 5) == 2  # √6.25 = 2.5: Python's round, halves to even
    assert square_side(0.0001, 8, 8) == 1  # never below one pixel
    assert square_side(0.8, 2, 50) == 2  # capped at the shorter side


def small_cnn(classes: int = 3, seed: int = 0) -> keras.Model:
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [
            keras.Input((6, 6, 3)),
            keras.layers.Conv2D(4, 3, activation="relu"),
            keras.layers.Flatten(),
            keras.layers.Dense(classes),
        ]
    )


def margins(model: keras.Model, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    logits = model(x).numpy().astype(np.float64)
    label = logits[np.arange(len(y)), y]
    logits[np.arange(len(y)), y] = -np.inf
    return label - logits.max(1)


def test_square_search_invariants_recomputed_from_the_kept_points():
    model = small_cnn()
    rng = np.random.default_rng(0)
    x = rng.uniform(0.1, 0.9, (10, 6, 6, 3)).astype(np.float32)  # no clipping at 0 or 1
    y = model(x).numpy().argmax(1).astype(np.int32)
    y[0] = (y[0] + 1) % 3  # clean-misclassified: never attacked, returned as is
    queries = 60
    eps = 0.1  # large enough that some, not all, of this untrained model's examples break
    attack = Square(eps, n_queries=queries, p_init=0.8)
    x_adv, history = attack.attack_with_history(model, x, y, seed=1)
    check_in_ball(x_adv, x, eps)
    assert 2 <= len(history) <= queries + 1
    np.testing.assert_array_equal(history[:, 0], np.broadcast_to(x[0], history[:, 0].shape))

    for frame in history:
        check_in_ball(frame, x, eps)
    # Stripe start: each example's column and channel moved by the same ±ε down the column.
    start = history[0, 1:] - x[1:]
    np.testing.assert_allclose(np.abs(start), eps, atol=1e-6)
    assert np.all(np.sign(start) == np.sign(start[:, :1]))

    # The margin, recomputed from the kept points, never rises; it stops where it turns ≤ 0.
    margin = np.stack([margins(model, frame, y) for frame in history])
    assert np.all(np.diff(margin[:, 1:], axis=0) <= 1e-5)
    for q in range(1, len(history)):
        changed = np.any(history[q] != history[q - 1], axis=-1)  # [n, H, W]
        # Every example's change at query q lies in one s×s window, the same for all examples.
        side = square_side(p_selection(0.8, q - 1, queries), 6, 6)
        rows, cols = np.nonzero(changed.any(0))
        if len(rows):
            assert rows.max() - rows.min() < side and cols.max() - cols.min() < side
        # Examples already broken are left alone.
        assert not np.any(changed[margin[q - 1] <= 0])

    # x_adv: the kept point where it breaks the example, else the clean input.
    x_adv = x_adv.numpy()
    broken = margin[-1] <= 0
    broken[0] = False
    assert 0 < broken.sum() < len(x) - 1
    np.testing.assert_array_equal(x_adv[broken], history[-1][broken])
    np.testing.assert_array_equal(x_adv[~broken], x[~broken])


class CountingNoGradient(keras.layers.Layer):
    """Identity that counts the examples it sees and fails if a gradient flows through it."""

    def build(self, input_shape):
        self.examples = self.add_weight(
            shape=(), initializer="zeros", trainable=False, dtype="int32", name="examples"
        )

    def call(self, x):
        self.examples.assign_add(tf.shape(x)[0])
        return _identity_without_gradient(x)


@tf.custom_gradient
def _identity_without_gradient(x):
    def gradient(upstream):
        raise AssertionError("a gradient was taken through the model")

    return tf.identity(x), gradient


def counted_cnn():
    """small_cnn behind a CountingNoGradient, and 12 inputs it classifies as labelled."""
    inner = small_cnn(seed=2)
    counter = CountingNoGradient()
    model = keras.Sequential([keras.Input((6, 6, 3)), counter, inner])
    x = np.random.default_rng(3).uniform(0, 1, (12, 6, 6, 3)).astype(np.float32)
    return inner, counter, model, x, inner(x).numpy().argmax(1).astype(np.int32)


def test_square_never_takes_a_gradient_and_stops_querying_broken_examples():
    inner, counter, model, x, y = counted_cnn()
    probe = tf.constant(x[:2])
    with pytest.raises(AssertionError, match="gradient was taken"):  # the guard works
        with tf.GradientTape() as tape:
            tape.watch(probe)
            out = tf.reduce_sum(model(probe))
        tape.gradient(out, probe)

    counter.examples.assign(0)
    queries = 200
    _, history = Square(0.1, n_queries=queries).attack_with_history(model, x, y, seed=4)
    margin = np.stack([margins(inner, frame, y) for frame in history])
    assert np.any(margin[-1] <= 0) and np.any(margin[-1] > 0)
    # Queries per example: one per search step while its margin is still positive.
    searched = (margin[:-1] > 0).sum(0)
    # clean check + stripe start + searched steps + final check (all 12 are clean-correct)
    assert int(counter.examples.numpy()) == 12 + 12 + searched.sum() + 12


def test_square_under_xla_draws_and_queries_as_the_plain_graph():
    # Every draw is made before the search, so the XLA-compiled search walks the same path as
    # the plain one (its points an ulp apart at most: XLA fuses the arithmetic), and it too
    # queries only the examples still not broken.
    inner, counter, model, x, y = counted_cnn()
    points, queried = {}, {}
    for jit_compile in (False, True):
        counter.examples.assign(0)
        attack = Square(0.1, n_queries=200, jit_compile=jit_compile)
        points[jit_compile] = attack(model, x, y, seed=4)[0].numpy()
        queried[jit_compile] = int(counter.examples.numpy())
        assert attack._run.jit_compile == jit_compile
    np.testing.assert_allclose(points[True], points[False], rtol=0, atol=1.2e-7)
    assert queried[True] == queried[False]
    broken = margins(inner, points[True], y) <= 0
    assert 0 < broken.sum() < len(y)
    # Recording a history (a plain graph) walks the same path.
    _, history = Square(0.1, n_queries=200).attack_with_history(model, x, y, seed=4)
    np.testing.assert_array_equal(history[-1][broken], points[False][broken])
    # Fewer queries than 12 examples × 200 queries: the broken ones stopped being queried.
    assert queried[True] < 12 + 12 + 12 * 200 + 12


def test_square_restarts_break_at_least_what_one_search_breaks_and_stay_in_c():
    """Restarts search again from new stripe starts on the examples still robust: from the same
    seed the first search is the single one, so R restarts break every example it breaks, and
    here more; every point lies in the ε-ball and [0, 1], and the unbroken keep x."""
    inner, _, model, x, y = counted_cnn()
    x[:, 0, :, :] = 0.99  # a row at the image bound: the box clips, not just the ball
    y = inner(x).numpy().argmax(1).astype(np.int32)
    y[0] = (y[0] + 1) % 3  # clean-misclassified: returned as it is
    eps, queries = 0.1, 10
    once = Square(eps, n_queries=queries)(model, x, y, seed=5)[0].numpy()
    again = Square(eps, n_queries=queries, restarts=6)(model, x, y, seed=5)[0].numpy()
    for points in (once, again):
        check_in_ball(points, x, eps)
        assert points.min() >= 0.0 and points.max() <= 1.0
    broken_once = margins(inner, once, y) <= 0
    broken_again = margins(inner, again, y) <= 0
    broken_once[0] = broken_again[0] = False
    assert np.all(broken_again[broken_once])  # never fewer
    assert broken_again.sum() > broken_once.sum() > 0, (broken_once, broken_again)
    assert not broken_again.all()
    # What the first search broke, the restarts leave at the same points.
    np.testing.assert_array_equal(again[broken_once], once[broken_once])
    np.testing.assert_array_equal(again[~broken_again], x[~broken_again])
    # One restart is the search AutoAttack runs.
    single = Square(eps, n_queries=queries, restarts=1)(model, x, y, seed=5)[0].numpy()
    np.testing.assert_array_equal(single, once)


def test_the_registry_square_takes_queries_and_restarts_and_autoattack_keeps_its_own():
    from fbat_tf import attacks
    from fbat_tf.attacks.autoattack import AutoAttack

    strong = attacks.create("square", EPS, n_queries=20000, restarts=5)
    assert (strong.n_queries, strong.restarts, strong.p_init) == (20000, 5, 0.8)
    assert strong.rescale_schedule is False
    assert attacks.label("square", {"n_queries": 20000, "restarts": 5}) == "Square-20000×5"
    assert attacks.label("square") == "Square-5000×1"
    # At most every restart's queries on every example, a forward pass a third of a pass.
    assert attacks.passes("square", {"n_queries": 20000, "restarts": 5}) == pytest.approx(
        100000 / 3
    )
    own = AutoAttack(EPS).attacks["square"]
    assert (own.n_queries, own.restarts, own.p_init) == (5000, 1, 0.8)
    with pytest.raises(ValueError, match="restarts"):
        Square(EPS, restarts=0)


def separable_data(n: int, seed: int, templates: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, len(templates), n).astype(np.int32)
    x = 0.5 + templates[y] + rng.normal(0, 0.015, (n, *templates.shape[1:]))
    return np.clip(x, 0, 1).astype(np.float32), y


def test_square_lowers_the_robust_accuracy_of_a_standard_trained_model():
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    # Four classes, each a ±0.02 pattern around gray plus noise of std 0.015: separable (clean
    # accuracy 1), while the class patterns differ by 0.04 per pixel, so a linear-like classifier
    # is within L∞ reach of ε = 8/255 ≈ 0.031 of another class for most examples.
    templates = 0.02 * rng.choice([-1.0, 1.0], (4, 8, 8, 3))
    x_train, y_train = separable_data(512, 1, templates)
    x_test, y_test = separable_data(64, 2, templates)
    model = keras.Sequential(
        [
            keras.Input((8, 8, 3)),
            keras.layers.Conv2D(8, 3, activation="relu"),
            keras.layers.Flatten(),
            keras.layers.Dense(4),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    model.fit(x_train, y_train, epochs=5, batch_size=64, verbose=0)
    clean = float(np.mean(model(x_test).numpy().argmax(1) == y_test))
    assert clean >= 0.9

    x_adv, _ = Square(EPS, n_queries=300)(model, x_test, y_test, seed=0)
    check_in_ball(x_adv, x_test, EPS)
    robust = float(np.mean(model(x_adv).numpy().argmax(1) == y_test))
    assert robust <= clean - 0.5, (clean, robust)


def test_square_checks_its_arguments():
    with pytest.raises(ValueError, match="loss"):
        Square(EPS, loss="dlr")
    with pytest.raises(ValueError, match="p_init"):
        Square(EPS, p_init=0.0)
    with pytest.raises(ValueError, match="NHWC"):
        Square(EPS)(small_cnn(), np.zeros((2, 6), np.float32), np.zeros(2, np.int32), 0)


def test_autoattack_runs_square_as_the_reference_configures_it():
    """fra31/auto-attack's standard Square: 5,000 queries, p_init 0.8, the margin loss, the
    p-schedule on the absolute query count; a changed default would move every AutoAttack
    number of a kit unseen."""
    from fbat_tf.attacks.autoattack import AutoAttack

    square = AutoAttack(EPS).attacks["square"]
    assert (square.n_queries, square.p_init, square.loss) == (5000, 0.8, "margin")
    assert square.rescale_schedule is False
    schedule = [p_selection(square.p_init, it, square.n_queries) for it in (10, 11, 4999)]
    assert schedule == [0.8, 0.4, 0.8 / 128]


def reference_p(p_init: float, it: int) -> float:
    """The reference's p_selection with resc_schedule=False, as its if/elif chain reads."""
    for low, high, divisor in (
        (10, 50, 2),
        (50, 200, 4),
        (200, 500, 8),
        (500, 1000, 16),
        (1000, 2000, 32),
        (2000, 4000, 64),
        (4000, 6000, 128),
        (6000, 8000, 256),
    ):
        if low < it <= high:
            return p_init / divisor
    return p_init / 512 if it > 8000 else p_init


def test_autoattack_runs_the_reference_square_schedule_over_its_5000_queries():
    """AutoAttack standard's Square: 5000 queries, p_init 0.8, the margin loss, the absolute
    schedule, and at every query the side the reference computes,
    max(int(round(sqrt(p · H · W))), 1), for CIFAR's and Tiny-ImageNet's sizes."""
    from fbat_tf import attacks

    ensemble = attacks.create("autoattack", EPS, version="standard")
    square = dict(ensemble.attacks)["square"]
    assert isinstance(square, Square)
    assert (square.n_queries, square.p_init, square.loss) == (5000, 0.8, "margin")
    assert square.rescale_schedule is False
    for size in (32, 64):
        expected = [
            max(int(round(np.sqrt(reference_p(0.8, it) * size * size))), 1) for it in range(5000)
        ]
        assert square._sides(size, size) == expected
    # The halvings land where the reference's do: after queries 10, 50, 200, ..., 4000.
    sides = square._sides(32, 32)
    changes = [it for it in range(1, 5000) if sides[it] != sides[it - 1]]
    assert changes == [11, 51, 201, 501, 1001, 2001, 4001]
    assert sides[0] == 29 and sides[-1] == 3  # √(0.8 · 1024) and √(0.8 / 128 · 1024)


def margin_and_loss(model, x, y, loss):
    """The reference's margin_and_loss, untargeted, in float64 numpy."""
    logits = model(x).numpy().astype(np.float64)
    rows = np.arange(len(y))
    label = logits[rows, y].copy()
    others = logits.copy()
    others[rows, y] = -np.inf
    margin = label - others.max(1)
    if loss == "margin":
        return margin, margin
    top = logits.max(1)
    log_z = np.log(np.exp(logits - top[:, None]).sum(1)) + top
    return margin, label - log_z  # −CE


def reference_query(model, x, y, x_best, margin_min, loss_min, eps, side, top, left, sign, loss):
    """One query of the reference's L∞ attack_single_run, in numpy on [n, H, W, C] arrays:
    only examples whose margin is still positive are queried."""
    change = np.zeros_like(x)
    change[:, top : top + side, left : left + side, :] = 2.0 * eps * sign
    x_new = np.clip(np.minimum(np.maximum(x_best + change, x - eps), x + eps), 0.0, 1.0)
    margin, new_loss = margin_and_loss(model, x_new, y, loss)
    queried = margin_min > 0
    improved = queried & (new_loss < loss_min)
    accepted = improved | (queried & (margin <= 0))
    return (
        np.where(accepted[:, None, None, None], x_new, x_best),
        np.where(accepted, margin, margin_min),
        np.where(improved, new_loss, loss_min),
    )


@pytest.mark.parametrize("loss", ["margin", "ce"])
def test_one_square_query_is_the_reference_step(loss):
    """From a given stripe start, one query with a given window and signs: the candidate
    (±2ε per channel in the window, back into the ε-ball and [0, 1]) and which examples keep
    it, recomputed as the reference writes them."""
    model = small_cnn(classes=3, seed=2)
    rng = np.random.default_rng(3)
    x = rng.uniform(0.0, 1.0, (12, 6, 6, 3)).astype(np.float32)
    x[:, 0, 0, :] = 0.98  # some pixels at the image bound
    y = model(x).numpy().argmax(1).astype(np.int32)  # clean-correct, as the search needs
    eps = 0.15
    stripes = rng.choice([-1.0, 1.0], (12, 1, 6, 3)).astype(np.float32)
    side, top, left = 3, 1, 2
    sign = np.asarray([1.0, -1.0, 1.0], np.float32)
    attack = Square(eps, n_queries=1, p_init=0.8, loss=loss, jit_compile=False)
    _, frames = attack._search(
        model,
        tf.constant(x),
        tf.constant(y),
        tf.constant(stripes),
        tf.constant([side]),
        tf.constant([[top, left]]),
        tf.constant(sign[None]),
        True,
    )
    start = np.clip(x + eps * stripes, 0.0, 1.0)
    np.testing.assert_allclose(frames[0].numpy(), start, atol=1e-7)
    margin, start_loss = margin_and_loss(model, start, y, loss)
    expected, _, _ = reference_query(
        model, x, y, start, margin, start_loss, eps, side, top, left, sign, loss
    )
    np.testing.assert_allclose(frames[1].numpy(), expected, atol=1e-6)
    kept = np.any(frames[1].numpy() != start, axis=(1, 2, 3))
    assert 0 < kept.sum() < len(x)  # some examples take the candidate, some keep the start


def test_square_windows_start_where_the_reference_draws_them():
    """The reference's random_int(0, H − s): a corner in {0, ..., H − s − 1}, and 0 where the
    square fills the image."""
    sides = [6, 5, 3, 1] * 50
    _, corners, signs = Square._draws(
        tf.constant([1, 2], tf.int64), tf.TensorShape([4, 6, 6, 3]), sides
    )
    corners = corners.numpy()
    limit = np.asarray(sides) - 1
    assert np.all(corners >= 0) and np.all(corners.max(1) <= 6 - 1 - limit)
    assert np.all(corners[np.asarray(sides) == 6] == 0)
    assert set(np.unique(signs.numpy())) == {-1.0, 1.0}
    # Over 50 draws each corner value that the reference can draw appears.
    assert set(corners[np.asarray(sides) == 1, 0]) == set(range(5))
