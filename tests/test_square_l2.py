"""Square Attack's L2 form against independent computations: the window pattern eta(s) against
the reference's loop of centred squares, the whole search against a per-example float64 numpy
loop written from the reference's L2 branch and fed the same draws, points in the L2 ball and
[0, 1], a linear model's L2 distances to its decision boundary (broken well inside ε, never
beyond it), and XLA against the plain graph."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from fbat_tf import constraints
from fbat_tf.attacks import square_l2
from fbat_tf.attacks.square import Square


def loop_rectangle(height: int, width: int) -> np.ndarray:
    """The reference's eta_rectangles (L2), as its loop reads: 1/(k + 1)² added on centred
    squares of side 2k + 1, cut to the rectangle, then normalized."""
    delta = np.zeros((height, width))
    top, left = height // 2, width // 2
    for k in range(max(height // 2 + 1, width // 2 + 1)):
        rows = slice(max(top - k, 0), min(top - k + 2 * k + 1, height))
        cols = slice(max(left - k, 0), min(left - k + 2 * k + 1, width))
        delta[rows, cols] += 1.0 / (k + 1) ** 2
    return delta / np.sqrt((delta**2).sum()) if height else delta


def loop_eta(side: int) -> np.ndarray:
    """The reference's eta(s) before its coin: top s // 2 rows +, the others −, normalized."""
    delta = np.concatenate(
        [loop_rectangle(side // 2, side), -loop_rectangle(side - side // 2, side)]
    )
    return delta / np.sqrt((delta**2).sum())


def test_eta_3_written_out():
    top = np.array([[0.25, 1.25, 0.25]])  # K = 2: the centre 1 + 1/4, the ring 1/4
    bottom = np.array([[0.25, 0.25, 0.25], [0.25, 1.25, 0.25]])  # centre (1, 1)
    expected = np.concatenate([top / np.linalg.norm(top), -bottom / np.linalg.norm(bottom)])
    np.testing.assert_allclose(square_l2.eta(3), expected / np.sqrt(2), rtol=1e-12)


@pytest.mark.parametrize("side", [1, 2, 3, 4, 5, 6, 7, 8, 11, 29])
def test_eta_is_the_reference_loop_of_centred_squares(side):
    pattern = square_l2.eta(side)
    assert pattern.shape == (side, side)
    np.testing.assert_allclose(pattern, loop_eta(side), rtol=1e-12, atol=1e-15)
    assert np.sum(pattern**2) == pytest.approx(1.0, rel=1e-12)
    top, bottom = pattern[: side // 2], pattern[side // 2 :]
    assert np.all(top > 0) and np.all(bottom < 0)
    if side > 1:  # two halves of equal norm
        assert np.sum(top**2) == pytest.approx(0.5, rel=1e-12)
    if side % 2 == 0:  # two equal rectangles: antisymmetric
        np.testing.assert_allclose(bottom, -top, rtol=1e-12)


def test_query_side_is_odd_at_least_3_and_capped():
    assert square_l2.query_side(0.8, 32, 32) == 29  # √819.2 = 28.6
    assert square_l2.query_side(0.4, 32, 32) == 21  # √409.6 = 20.2 → 20, made odd
    assert square_l2.query_side(0.8 / 128, 32, 32) == 3  # √6.4 = 2.5 → 2, at least 3
    assert square_l2.query_side(0.0001, 8, 8) == 3
    assert square_l2.query_side(0.8, 2, 50) == 2  # capped at the shorter side, even or not
    square = Square(0.5, norm="l2")
    assert square.norm == "l2" and Square(0.5).norm == "linf"
    assert square._sides(32, 32)[:12] == [29] * 11 + [21]


def logits64(kernel, bias, x):
    return x.reshape(len(x), -1) @ kernel + bias


def margin_and_loss64(kernel, bias, x, y, loss):
    """The reference's margin_and_loss, untargeted, float64, for a batch."""
    logits = logits64(kernel, bias, x)
    rows = np.arange(len(y))
    others = logits.copy()
    others[rows, y] = -np.inf
    margin = logits[rows, y] - others.max(1)
    if loss == "margin":
        return margin, margin
    top = logits.max(1)
    return margin, logits[rows, y] - top - np.log(np.exp(logits - top[:, None]).sum(1))


def numpy_start(x, start_signs, start_flips):
    """The reference's L2 start for one example [H, W, C]: its grid of eta tiles (cut at the
    border where the reference's would not fit), on the sphere, clipped."""
    height, width, _ = x.shape
    tile = height // 5
    offset = (height - 5 * tile) // 2
    delta = np.zeros(x.shape)
    for i in range(height // tile):
        for j in range(width // tile):
            pattern = loop_eta(tile).T if start_flips[i, j] else loop_eta(tile)
            top, left = offset + i * tile, offset + j * tile
            cut = delta[top : top + tile, left : left + tile]  # a view, cut at the border
            cut += pattern[: cut.shape[0], : cut.shape[1], None] * start_signs[i, j]
    return delta


def numpy_query(x, best, eps, side, corners, flip, signs):
    """One query's candidate of the reference's L2 branch for one example [H, W, C]."""
    height, width, channels = x.shape
    (vh, vw), (vh2, vw2) = corners
    delta = best - x
    window = delta[vh : vh + side, vw : vw + side]
    window_norms = np.sqrt((window**2).sum((0, 1)))
    both = np.zeros((height, width, 1))
    both[vh : vh + side, vw : vw + side] = 1
    both[vh2 : vh2 + side, vw2 : vw2 + side] = 1
    both_norms = np.sqrt(((delta * both) ** 2).sum((0, 1)))
    image_norm = np.sqrt((delta**2).sum())
    pattern = loop_eta(side).T if flip else loop_eta(side)
    new = pattern[:, :, None] * signs + window / (1e-12 + window_norms)
    length = np.sqrt(max(eps**2 - image_norm**2, 0) / channels + both_norms**2)
    new = new / (1e-12 + np.sqrt((new**2).sum((0, 1)))) * length
    delta[vh2 : vh2 + side, vw2 : vw2 + side] = 0
    delta[vh : vh + side, vw : vw + side] = new
    return on_sphere(x, delta, eps)


def on_sphere(x, delta, eps):
    return np.clip(x + delta / (np.sqrt((delta**2).sum()) + 1e-12) * eps, 0, 1)


def numpy_square_l2(kernel, bias, x, y, eps, sides, draws, loss):
    """The reference's L2 attack_single_run for a linear model, one example at a time, in
    float64 from the given draws; the kept points after the start and each query [Q + 1, n,
    H, W, C] (an example stays put once misclassified)."""
    start_signs, start_flips, signs, corners, flips = (np.asarray(v) for v in draws)
    x = x.astype(np.float64)
    frames = np.repeat(x[None], len(sides) + 1, axis=0)
    for e in range(len(x)):

        def score(point, e=e):
            margin, value = margin_and_loss64(kernel, bias, point[None], y[e : e + 1], loss)
            return margin[0], value[0]

        best = on_sphere(x[e], numpy_start(x[e], start_signs[e], start_flips), eps)
        margin, loss_min = score(best)
        frames[0, e] = best
        for q, side in enumerate(sides):
            if margin > 0:
                x_new = numpy_query(x[e], best, eps, side, corners[q], flips[q], signs[e, q])
                new_margin, new_loss = score(x_new)
                improved = new_loss < loss_min
                loss_min = new_loss if improved else loss_min
                if improved or new_margin <= 0:
                    best, margin = x_new, new_margin
            frames[q + 1, e] = best
    return frames


def dense(shape, classes: int) -> keras.Model:
    layers = [keras.Input(shape), keras.layers.Flatten(), keras.layers.Dense(classes)]
    return keras.Sequential(layers)


def linear_model(shape, classes: int, seed: int) -> tuple[keras.Model, np.ndarray, np.ndarray]:
    keras.utils.set_random_seed(seed)
    model = dense(shape, classes)
    kernel, bias = (w.astype(np.float64) for w in model.layers[-1].get_weights())
    return model, kernel, bias


@pytest.mark.parametrize("shape, loss, eps", [((8, 8, 2), "margin", 0.5), ((12, 12, 3), "ce", 0.4)])
def test_the_search_is_the_reference_loop_on_the_same_draws(shape, loss, eps):
    """The kept points after the start and after every query, and the final margins, against
    the numpy loop: on 8×8 the start tiles are single pixels (s = 1, the last row and column of
    tiles off the image), on 12×12 2×2 tiles (the last ones cut at the border)."""
    model, kernel, bias = linear_model(shape, 4, seed=1)
    rng = np.random.default_rng(2)
    x = rng.uniform(0.0, 1.0, (10, *shape)).astype(np.float32)  # pixels near 0 and 1: clips
    y = model(x).numpy().argmax(1).astype(np.int32)  # all clean-correct: the batch searched
    attack = Square(eps, n_queries=250, loss=loss, norm="l2", jit_compile=False)
    _, history = attack.attack_with_history(model, x, y, seed=3)
    sides = attack._sides(shape[0], shape[1])
    draws = square_l2.draws(constraints.as_seed(3), tf.TensorShape(x.shape), sides)
    expected = numpy_square_l2(kernel, bias, x, y, eps, sides, draws, loss)
    assert len(set(sides)) >= 3  # the schedule's sides, from 7 or 11 down to 3
    # The search runs until every example is broken or the queries are spent.
    np.testing.assert_allclose(history, expected[: len(history)], rtol=0, atol=2e-6)
    np.testing.assert_allclose(history[-1], expected[-1], rtol=0, atol=2e-6)
    margin = margin_and_loss64(kernel, bias, expected[-1], y, "margin")[0]
    np.testing.assert_allclose(
        margin_and_loss64(kernel, bias, history[-1].astype(np.float64), y, "margin")[0],
        margin,
        atol=1e-5,
    )
    assert 0 < np.sum(margin <= 0) < len(x), margin  # some broken, some not
    for frame in history:
        constraints.check_in_ball(frame, x, eps, norm="l2")
    lengths = np.linalg.norm((history[1:] - x).reshape(len(history) - 1, len(x), -1), axis=-1)
    assert np.max(lengths) > eps * 0.99  # on the sphere where the box does not cut


def linear_distances(kernel, bias, x, y) -> np.ndarray:
    """Each example's L2 distance to its linear model's decision boundary, the box ignored:
    min over j ≠ y of (z_y − z_j) / ‖w_y − w_j‖ (the box only lengthens it)."""
    logits = logits64(kernel, bias, x.astype(np.float64))
    rows = np.arange(len(y))
    gaps = logits[rows, y][:, None] - logits
    lengths = np.linalg.norm(kernel[:, y].T[:, :, None] - kernel[None], axis=1)
    gaps[rows, y], lengths[rows, y] = np.inf, 1.0
    return (gaps / lengths).min(1)


def test_on_a_linear_model_square_l2_breaks_what_lies_well_inside_eps_and_nothing_beyond():
    """A linear model's weights constant on 2×2 blocks: low-frequency, as the gradients of
    natural-image models, which Square's windows (patches of pixels moved together) are made
    for. In 600 queries every example within 0.45ε of the boundary is broken (here the nearest
    unbroken one lies at 0.48ε), none beyond ε (the box only lengthens the distance), and every
    point lies in the L2 ball and [0, 1]."""
    model = dense((8, 8, 2), 3)
    rng = np.random.default_rng(4)
    coarse = rng.normal(0.0, 1.0, (4, 4, 2, 3))
    kernel = np.repeat(np.repeat(coarse, 2, 0), 2, 1).reshape(-1, 3) / 8
    bias = np.zeros(3)
    model.layers[-1].set_weights([kernel.astype(np.float32), bias.astype(np.float32)])
    x = rng.uniform(0.25, 0.75, (48, 8, 8, 2)).astype(np.float32)
    y = model(x).numpy().argmax(1).astype(np.int32)
    distances = linear_distances(kernel, bias, x, y)
    eps = float(np.median(distances))
    near, far = distances < 0.45 * eps, distances > 1.05 * eps
    assert near.sum() >= 5 and far.sum() >= 5
    x_adv, _ = Square(eps, n_queries=600, norm="l2", jit_compile=False)(model, x, y, seed=6)
    constraints.check_in_ball(x_adv, x, eps, norm="l2")
    x_adv = x_adv.numpy()
    assert x_adv.min() >= 0.0 and x_adv.max() <= 1.0
    broken = model(x_adv).numpy().argmax(1) != y
    assert np.all(broken[near]), distances[near & ~broken] / eps
    assert not np.any(broken[far])
    np.testing.assert_array_equal(x_adv[~broken], x[~broken])  # unbroken: the clean input


def test_restarts_break_at_least_what_one_search_breaks():
    """As for L∞: the first search of R restarts is the single search, so R restarts break
    what it breaks, at the same points, and here more; every point lies in the L2 ball."""
    model, _, _ = linear_model((10, 10, 1), 3, seed=7)
    x = np.random.default_rng(8).uniform(0.0, 1.0, (16, 10, 10, 1)).astype(np.float32)
    y = model(x).numpy().argmax(1).astype(np.int32)
    y[0] = (y[0] + 1) % 3  # clean-misclassified: returned as it is
    eps = 0.6
    once, again = (
        Square(eps, n_queries=20, norm="l2", restarts=restarts, jit_compile=False)(
            model, x, y, seed=9
        )[0].numpy()
        for restarts in (1, 4)
    )
    for points in (once, again):
        constraints.check_in_ball(points, x, eps, norm="l2")
    np.testing.assert_array_equal(once[0], x[0])
    broken_once = model(once).numpy().argmax(1) != y
    broken_again = model(again).numpy().argmax(1) != y
    broken_once[0] = broken_again[0] = False
    assert np.all(broken_again[broken_once])
    assert broken_again.sum() > broken_once.sum() > 0, (broken_once, broken_again)
    np.testing.assert_array_equal(again[broken_once], once[broken_once])
    np.testing.assert_array_equal(again[~broken_again], x[~broken_again])


def test_square_l2_under_xla_gives_the_plain_graph_points():
    model, _, _ = linear_model((8, 8, 2), 4, seed=10)
    x = np.random.default_rng(11).uniform(0.0, 1.0, (12, 8, 8, 2)).astype(np.float32)
    y = model(x).numpy().argmax(1).astype(np.int32)
    y[1] = (y[1] + 1) % 4  # not searched: the batch XLA gets is padded
    points = {}
    for jit_compile in (False, True):
        attack = Square(0.5, n_queries=200, norm="l2", jit_compile=jit_compile)
        points[jit_compile] = attack(model, x, y, seed=12)[0].numpy()
        assert attack._run.jit_compile == jit_compile
    np.testing.assert_allclose(points[True], points[False], rtol=0, atol=1e-6)
    broken = model(points[True]).numpy().argmax(1) != y
    assert 0 < broken.sum() < len(y) - 1


def test_square_l2_on_a_single_point_runs_where_xla_fails_to_compile_it(caplog):
    """One clean-correct point of one channel: XLA 2.21's dynamic padder fails one of its own
    checks compiling the search (an internal error, not a missing op). The attack says so and
    runs that search as a plain graph, with the plain graph's points."""
    model, _, _ = linear_model((8, 8, 1), 4, seed=10)
    x = np.random.default_rng(11).uniform(0.0, 1.0, (6, 8, 8, 1)).astype(np.float32)
    y = (model(x).numpy().argmax(1).astype(np.int32) + 1) % 4
    y[2] = model(x[2:3]).numpy().argmax(1)[0]  # the only point searched
    compiled = Square(0.5, n_queries=30, norm="l2", jit_compile=True)
    with caplog.at_level("WARNING"):
        x_adv = compiled(model, x, y, seed=12)[0].numpy()
    assert "XLA cannot compile" in caplog.text and "dynamic_padder" in caplog.text
    assert not compiled._run.jit_compile
    plain = Square(0.5, n_queries=30, norm="l2", jit_compile=False)(model, x, y, seed=12)[0]
    np.testing.assert_array_equal(x_adv, plain.numpy())


def test_an_internal_error_that_is_not_xla_s_compiler_s_is_raised():
    from fbat_tf.attacks.base import Loop

    def fails(model, x):
        raise tf.errors.InternalError(None, None, "a kernel's own failure")

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2)])
    loop = Loop(fails, True, batched=1)
    with pytest.raises(tf.errors.InternalError, match="a kernel's own failure"):
        loop(model, tf.zeros([3, 2]))
    assert loop.jit_compile  # not taken for XLA's failure: no fallback to a plain graph


def test_the_windows_corners_are_the_reference_draws():
    """random_int(0, H − s): in {0, ..., H − s − 1}, 0 where the square fills the image."""
    sides = [8, 7, 5, 3] * 50
    draws = square_l2.draws(tf.constant([1, 2]), tf.TensorShape([3, 8, 8, 2]), sides)
    corners = draws.corners.numpy()
    room = 8 - np.asarray(sides)[:, None, None]
    assert np.all(corners >= 0) and np.all(corners <= np.maximum(room - 1, 0))
    assert set(corners[np.asarray(sides) == 3].ravel()) == set(range(5))
    assert draws.signs.shape == (3, 200, 2) and draws.start_signs.shape == (3, 8, 8, 2)
    assert 0 < draws.flips.numpy().mean() < 1


def test_square_l2_checks_its_norm_and_image_size():
    with pytest.raises(ValueError, match="'l1'"):
        Square(0.5, norm="l1")
    model = dense((4, 4, 1), 2)
    x = np.full((2, 4, 4, 1), 0.5, np.float32)
    y = model(x).numpy().argmax(1)
    with pytest.raises(ValueError, match="at least 5"):
        Square(0.5, n_queries=2, norm="l2")(model, x, y, seed=0)
