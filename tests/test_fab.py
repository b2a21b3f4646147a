"""FAB-T against independent computations: its L∞ hyperplane ∩ box projection against a bisection
on ‖δ‖∞, and the attack on a linear multi-class model f(x) = Wx + c against the exact minimal L∞
distance to misclassification, min_t min{‖δ‖∞ : (w_t − w_y)·δ ≥ f_y − f_t, x + δ ∈ [0, 1]}."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from fbat_tf.attacks.fab import FAB, project_linf_hyperplane_box
from fbat_tf.evaluation import check_in_ball
from tests.helpers import linear_model


def reachable_range(v: np.ndarray, low: np.ndarray, high: np.ndarray) -> tuple[float, float]:
    """min and max of v·δ over the box low ≤ δ ≤ high."""
    a, b = v * low, v * high
    return float(np.minimum(a, b).sum()), float(np.maximum(a, b).sum())


def bisection_linf_distance(
    point: np.ndarray, w: np.ndarray, target: float, feasible_value, lower=0.0, upper=1.0
) -> float:
    """Smallest t with some δ ∈ [−t, t]^d, lower ≤ point+δ ≤ upper, whose value w·δ satisfies
    `feasible_value(min, max)` (given the interval of w·δ reachable there); ∞ if none."""
    widest = float(np.max(np.maximum(point - lower, upper - point)))

    def ok(t: float) -> bool:
        low = np.maximum(-t, lower - point)
        high = np.minimum(t, upper - point)
        return feasible_value(*reachable_range(w, low, high), target)

    if not ok(widest):
        return np.inf
    lo, hi = 0.0, widest
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return hi


def on_hyperplane(low: float, high: float, target: float) -> bool:
    return low <= target <= high


def past_hyperplane(low: float, high: float, target: float) -> bool:
    return high >= target


def test_projection_matches_bisection_on_tiny_problems():
    rng = np.random.default_rng(0)
    feasible = infeasible = 0
    for d in (1, 2, 3, 4):
        for _ in range(60):
            point = rng.uniform(0, 1, d)
            point[rng.uniform(size=d) < 0.15] = rng.choice([0.0, 1.0])  # points on the box faces
            w = rng.normal(size=d)
            w[rng.uniform(size=d) < 0.15] = 0.0
            b = w @ point + rng.normal() * 0.6  # the box binds or the plane misses it, at times
            delta = project_linf_hyperplane_box(point[None], w[None], np.array([b])).numpy()[0]
            assert np.all(point + delta >= -1e-12) and np.all(point + delta <= 1 + 1e-12)
            optimum = bisection_linf_distance(point, w, b - w @ point, on_hyperplane)
            if np.isfinite(optimum):
                feasible += 1
                assert w @ (point + delta) == pytest.approx(b, abs=1e-9)
                assert np.abs(delta).max() == pytest.approx(optimum, abs=1e-9)
            else:
                # The plane misses the box: the box point whose w·z is nearest b.
                infeasible += 1
                low, high = reachable_range(w, -point, 1 - point)
                nearest = high if w @ point < b else low
                assert w @ delta == pytest.approx(nearest, abs=1e-9)
    assert feasible > 100 and infeasible > 20


def test_projection_matches_bisection_at_image_sizes():
    # Image-sized rows, as FAB projects them: many pixels on a box face (room 0, ties), zero
    # weights, planes that the box meets only far out, and some it misses.
    rng = np.random.default_rng(4)
    n, d = 40, 784
    point = rng.uniform(0, 1, (n, d))
    point[rng.uniform(size=(n, d)) < 0.4] = 0.0
    point[rng.uniform(size=(n, d)) < 0.05] = 1.0
    w = rng.normal(size=(n, d)) * rng.uniform(0.01, 1.0, (n, 1))
    w[rng.uniform(size=(n, d)) < 0.1] = 0.0
    reach = np.sum(np.abs(w) * np.where(w < 0, 1 - point, point), 1)  # G(∞) towards smaller w·p
    shift = reach * np.linspace(0.001, 1.2, n)  # from nearly on the plane to beyond the box
    b = np.sum(w * point, 1) - shift * rng.choice([-1.0, 1.0], n) * (shift <= reach)
    b = np.where(shift > reach, np.sum(w * point, 1) - shift, b)
    delta = project_linf_hyperplane_box(point, w, b).numpy()
    feasible = 0
    for i in range(n):
        target = b[i] - w[i] @ point[i]
        optimum = bisection_linf_distance(point[i], w[i], target, on_hyperplane)
        assert np.all(point[i] + delta[i] >= -1e-12) and np.all(point[i] + delta[i] <= 1 + 1e-12)
        if np.isfinite(optimum):
            feasible += 1
            assert w[i] @ (point[i] + delta[i]) == pytest.approx(b[i], abs=1e-9 * reach[i])
            assert np.abs(delta[i]).max() == pytest.approx(optimum, abs=1e-9)
        else:
            # The plane misses the box: the box point whose w·z is nearest b.
            low, high = reachable_range(w[i], -point[i], 1 - point[i])
            assert w[i] @ delta[i] == pytest.approx(low if target < 0 else high, rel=1e-9)
    assert 25 <= feasible < n


def test_projection_with_a_general_box_and_float32():
    rng = np.random.default_rng(1)
    point = rng.uniform(-0.5, 0.5, (16, 3)).astype(np.float32)
    w = rng.normal(size=(16, 3)).astype(np.float32)
    b = (np.sum(w * point, 1) + rng.normal(size=16) * 0.3).astype(np.float32)
    delta = project_linf_hyperplane_box(point, w, b, -1.0, 1.0).numpy()
    assert delta.dtype == np.float32
    for i in range(16):
        p, v = point[i].astype(np.float64), w[i].astype(np.float64)
        target = float(b[i]) - v @ p
        optimum = bisection_linf_distance(p, v, target, on_hyperplane, -1.0, 1.0)
        assert np.isfinite(optimum)
        assert np.abs(delta[i]).max() == pytest.approx(optimum, abs=1e-5)
        assert v @ (p + delta[i]) == pytest.approx(float(b[i]), abs=1e-5)


def boundary_distances(model: keras.Model, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """[n, classes]: exact L∞ distance (within [0,1]) to the halfspace {f_t ≥ f_y}; ∞ at t = y."""
    kernel, bias = (v.astype(np.float64) for v in model.layers[-1].get_weights())
    flat = x.reshape(len(x), -1).astype(np.float64)
    distances = np.full((len(x), kernel.shape[1]), np.inf)
    for i, (point, label) in enumerate(zip(flat, y, strict=True)):
        logits = point @ kernel + bias
        for t in range(kernel.shape[1]):
            if t != label:
                distances[i, t] = bisection_linf_distance(
                    point,
                    kernel[:, t] - kernel[:, label],
                    logits[label] - logits[t],
                    past_hyperplane,
                )
    return distances


def linear_problem(n: int = 48, classes: int = 4):
    rng = np.random.default_rng(2)
    shape = (3, 3, 2)  # NHWC images, flattened by the model
    model = linear_model(shape, classes, seed=3, random_bias=True)
    x = rng.uniform(0, 1, (n, *shape)).astype(np.float32)
    x[:, 0, 0, :] = rng.choice([0.0, 1.0], (n, 2))  # pixels on the box faces
    y = model(x).numpy().argmax(1).astype(np.int32)  # all clean-correct
    # Misclassified ⇔ some f_t ≥ f_y: the minimal distance is the smallest over targets.
    return model, x, y, boundary_distances(model, x, y).min(1)


def test_fab_breaks_exactly_the_examples_within_eps_of_a_linear_boundary():
    model, x, y, distance = linear_problem()
    eps = float(np.median(distance))
    # Leave out the band where 100 steps of a minimum-norm search may end just above ε.
    clear = np.abs(distance - eps) > 0.1 * eps
    x, y, distance = x[clear], y[clear], distance[clear]
    near, far = distance < eps, distance > eps
    assert near.sum() >= 10 and far.sum() >= 10

    x_adv, _ = FAB(eps, n_target_classes=3, steps=100)(model, tf.constant(x), tf.constant(y), 0)
    check_in_ball(x_adv, x, eps)
    x_adv = x_adv.numpy()
    broken = model(x_adv).numpy().argmax(1) != y
    np.testing.assert_array_equal(broken, near)
    np.testing.assert_array_equal(x_adv[far], x[far])  # nothing within ε: the clean input


def test_fab_norms_approach_the_distance_to_the_first_target_from_above():
    model, x, y, distance = linear_problem(n=24)
    # With ε = 1 the first target (second-largest clean logit) always succeeds, so FAB-T's point
    # is its minimum-norm search towards that boundary.
    first_target = np.argsort(-model(x).numpy(), axis=1, kind="stable")[:, 1]
    to_first = boundary_distances(model, x, y)[np.arange(len(x)), first_target]
    x_adv = FAB(1.0, n_target_classes=3, steps=100)(model, tf.constant(x), tf.constant(y), 0)[0]
    x_adv = x_adv.numpy()
    assert np.all(model(x_adv).numpy().argmax(1) != y)
    norm = np.abs(x_adv - x).reshape(len(x), -1).max(1)
    # No adversarial is closer than the exact minimum; FAB ends within a few percent of the
    # distance to its target's boundary (at most the overshoot η = 1.05).
    assert np.all(norm >= distance * (1 - 1e-4))
    assert np.all(norm <= to_first * 1.05 + 1e-6)
    assert np.median(norm / to_first) < 1.01


def test_fab_restarts_and_misclassified_inputs():
    model, x, y, distance = linear_problem(n=16)
    y = y.copy()
    y[:4] = (y[:4] + 1) % 4  # clean-misclassified: returned as they are
    eps = float(np.max(distance)) * 2
    x_adv = FAB(eps, n_target_classes=3, steps=20, restarts=2)(model, x, y, seed=5)[0].numpy()
    check_in_ball(x_adv, x, eps)
    np.testing.assert_array_equal(x_adv[:4], x[:4])
    assert np.all(model(x_adv[4:]).numpy().argmax(1) != y[4:])


def test_fab_checks_its_arguments():
    model, x, y, _ = linear_problem(n=4)
    with pytest.raises(ValueError, match="n_target_classes=9"):
        FAB(0.1)(model, x, y, 0)  # 4 classes leave 3 targets
    with pytest.raises(ValueError, match="eps"):
        FAB(-1.0)
    with pytest.raises(ValueError, match="alpha_max"):
        FAB(0.1, alpha_max=2.0)


@pytest.mark.slow
@pytest.mark.parametrize("restarts", [1, 2])
def test_fab_under_xla_finds_the_plain_graph_s_points_up_to_rounding(restarts):
    # FAB-T compiles with XLA by default; its restarts' random starts are drawn outside the
    # compiled run, so both graphs start alike and differ by rounding only.
    keras.utils.set_random_seed(2)
    model = keras.Sequential(
        [
            keras.Input((6, 6, 3)),
            keras.layers.Conv2D(4, 3, activation="relu"),
            keras.layers.Flatten(),
            keras.layers.Dense(3),
        ]
    )
    x = np.random.default_rng(3).uniform(0, 1, (12, 6, 6, 3)).astype(np.float32)
    y = model(x).numpy().argmax(1).astype(np.int32)
    points = {
        jit: FAB(0.1, n_target_classes=2, steps=20, restarts=restarts, jit_compile=jit)(
            model, x, y, seed=4
        )[0].numpy()
        for jit in (False, True)
    }
    broken = {jit: model(p).numpy().argmax(1) != y for jit, p in points.items()}
    np.testing.assert_array_equal(broken[True], broken[False])
    assert broken[True].sum() >= 6
    difference = np.abs(points[True] - points[False]).reshape(12, -1).max(1)
    # Most examples agree to a few float32 ulps; a near tie may send one down another path.
    assert np.median(difference) < 1e-6
    norms = {jit: np.abs(p - x).reshape(12, -1).max(1) for jit, p in points.items()}
    np.testing.assert_allclose(norms[True], norms[False], atol=0.01)
