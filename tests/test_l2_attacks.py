"""The L2 forms of APGD, FAB-T and AutoAttack against independent computations: FAB's hyperplane ∩
box projection against an exact enumeration of active sets and against Dykstra's alternating
projections, the reference's radial step against numpy, and the attacks on linear models
f(x) = Wx + c against the closed-form L2 distance to misclassification,
min_j (f_y − f_j)/‖w_y − w_j‖ (the nearest point of a half-space, inside the box where the
points are chosen far from its faces)."""

from __future__ import annotations

import inspect
import itertools

import numpy as np
import pytest
import tensorflow as tf

from fbat_tf import attacks, constraints
from fbat_tf.attacks.apgd import APGD
from fbat_tf.attacks.autoattack import AutoAttack, fab_t
from fbat_tf.attacks.fab import FAB, project_l2_hyperplane_box
from fbat_tf.attacks.losses import correct
from fbat_tf.attacks.square import Square
from fbat_tf.evaluation import check_in_ball
from tests.helpers import linear_model

# --- FAB's L2 projection -----------------------------------------------------------------------


def enumerate_active_sets(p, w, b, lower, upper):
    """argmin ‖z − p‖₂ over {w·z = b, lower ≤ z ≤ upper}, exactly, for a tiny d (float64): for
    each choice of coordinates held at a lower or upper face, the rest move freely, and the
    equality-constrained problem there is solved in closed form (z_F = p_F + t·w_F); the nearest
    candidate that is feasible is the answer (the optimum's own active set is among the choices).
    None where no point of the box lies on the plane."""
    best = None
    for states in itertools.product(("lower", "upper", "free"), repeat=p.size):
        z = np.where([s == "lower" for s in states], lower, p)
        z = np.where([s == "upper" for s in states], upper, z)
        free = np.array([s == "free" for s in states])
        rest = b - w[~free] @ z[~free]
        if free.any() and w[free] @ w[free] > 0:
            z[free] = p[free] + (rest - w[free] @ p[free]) / (w[free] @ w[free]) * w[free]
        if abs(w @ z - b) > 1e-9 or np.any(z < lower - 1e-12) or np.any(z > upper + 1e-12):
            continue
        if best is None or np.sum((z - p) ** 2) < np.sum((best - p) ** 2):
            best = z
    return best


def dykstra_plane_box(p, w, b, lower, upper, rounds=3000):
    """The nearest point to p of {w·z = b} ∩ [lower, upper] (float64): Dykstra's algorithm
    alternates the two sets' own projections with correction terms."""
    z, plane_correction, box_correction = p.copy(), np.zeros_like(p), np.zeros_like(p)
    for _ in range(rounds):
        moved = z + plane_correction
        on_plane = moved - (w @ moved - b) / (w @ w) * w
        plane_correction = moved - on_plane
        moved = on_plane + box_correction
        z = np.clip(moved, lower, upper)
        box_correction = moved - z
    return z


def nearest_corner_value(w, lower, upper, b):
    """The value of w·z at the point of the box nearest the plane when the plane misses it:
    the box's minimum of w·z if the whole box lies above b, else its maximum."""
    low = np.sum(np.minimum(w * lower, w * upper))
    high = np.sum(np.maximum(w * lower, w * upper))
    return low if low > b else high


def l2_project(p, w, b, lower=0.0, upper=1.0, dtype=tf.float64):
    return project_l2_hyperplane_box(
        tf.constant(p, dtype),
        tf.constant(w, dtype),
        tf.constant(b, dtype),
        tf.constant(lower, dtype),
        tf.constant(upper, dtype),
    ).numpy()


def test_l2_projection_is_the_exact_nearest_point_on_tiny_problems():
    rng = np.random.default_rng(0)
    counts = {"feasible, box binds": 0, "feasible, box free": 0, "infeasible": 0}
    for d in (1, 2, 3, 4, 5):
        for _ in range(60):
            p = rng.uniform(0, 1, d)
            p[rng.uniform(size=d) < 0.15] = rng.choice([0.0, 1.0])  # points on the box faces
            w = rng.normal(size=d)
            w[rng.uniform(size=d) < 0.15] = 0.0
            b = w @ p + rng.normal() * rng.choice([0.05, 0.5, 3.0])
            delta = l2_project(p[None], w[None], [b])[0]
            expected = enumerate_active_sets(p, w, b, np.zeros(d), np.ones(d))
            if expected is None:
                counts["infeasible"] += 1
                z = p + delta
                assert np.all(z >= -1e-12) and np.all(z <= 1 + 1e-12)
                assert w @ z == pytest.approx(nearest_corner_value(w, 0.0, 1.0, b), abs=1e-9)
                # The reference's corner: coordinates with w_i = 0 stay where they are.
                np.testing.assert_array_equal(delta[w == 0], 0.0)
                continue
            np.testing.assert_allclose(p + delta, expected, atol=1e-9)
            closed_form = p - (w @ p - b) * w / (w @ w)
            if np.all((closed_form >= 0) & (closed_form <= 1)):
                counts["feasible, box free"] += 1
                np.testing.assert_allclose(delta, closed_form - p, atol=1e-12)
            else:
                counts["feasible, box binds"] += 1
    assert min(counts.values()) >= 20, counts


def test_l2_projection_at_image_sizes_against_dykstra():
    rng = np.random.default_rng(1)
    d, rows = 3072, []
    # From the box never binding (inside it, a short way) to most of it binding.
    for shift in (0.3, 3.0, 30.0, 300.0):
        p = rng.uniform(0.2, 0.8, d)
        if shift > 1:
            p[:300], p[300:600] = 0.0, 1.0  # on the faces
        w = rng.normal(size=d)
        w[600:700] = 0.0
        rows.append((p, w, w @ p - shift * rng.choice([-1.0, 1.0])))
    p, w, b = (np.stack(column) for column in zip(*rows, strict=True))
    got = l2_project(p, w, b)
    bound = 0
    for i in range(len(rows)):
        expected = dykstra_plane_box(p[i], w[i], b[i], 0.0, 1.0)
        np.testing.assert_allclose(p[i] + got[i], expected, atol=1e-9)
        closed_form = p[i] - (w[i] @ p[i] - b[i]) * w[i] / (w[i] @ w[i])
        if np.all((closed_form >= 0) & (closed_form <= 1)):
            np.testing.assert_allclose(got[i], closed_form - p[i], atol=1e-12)
        else:
            bound += 1
    assert bound == 3
    # float32 at the same sizes: the same points up to float32 rounding.
    got32 = l2_project(p, w, b, dtype=tf.float32)
    np.testing.assert_allclose(got32, got, atol=2e-4)


def test_l2_projection_with_a_general_box():
    rng = np.random.default_rng(2)
    checked = 0
    for _ in range(150):
        d = int(rng.integers(1, 5))
        lower, upper = -rng.uniform(0, 1, d), rng.uniform(0, 1, d)
        p = rng.uniform(lower, upper)
        w = rng.normal(size=d)
        b = w @ p + rng.normal()
        delta = l2_project(p[None], w[None], [b], lower[None], upper[None])[0]
        expected = enumerate_active_sets(p, w, b, lower, upper)
        if expected is None:
            z = p + delta
            assert np.all(z >= lower - 1e-12) and np.all(z <= upper + 1e-12)
            assert w @ z == pytest.approx(nearest_corner_value(w, lower, upper, b), abs=1e-9)
        else:
            np.testing.assert_allclose(p + delta, expected, atol=1e-9)
            checked += 1
    assert checked >= 50


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


def test_fab_l2_finds_the_minimum_l2_adversarial_of_a_two_class_linear_model():
    model, x, y, distances = linear_l2_problem(n=32, classes=2, seed=2)
    distance = distances.min(1)
    eps = 10.0 * float(distance.max())  # every example breakable: the search's own minimum
    x_adv = FAB(eps, n_target_classes=1, steps=100, norm="l2")(model, x, y, 0)[0].numpy()
    assert np.all(model(x_adv).numpy().argmax(1) != y)
    norm = np.sqrt(np.sum((x_adv - x) ** 2, 1))
    # No adversarial is closer than the exact minimum; FAB ends within a small tolerance of it.
    assert np.all(norm >= distance * (1 - 1e-4))
    assert np.all(norm <= distance * 1.05 + 1e-6)
    assert np.median(norm / distance) < 1.01


def test_fab_t_l2_counts_only_adversarials_within_eps():
    model, x, y, distances = linear_l2_problem(n=64, seed=3)
    distance = distances.min(1)
    eps = float(np.median(distance))
    clear = np.abs(distance - eps) > 0.1 * eps
    x, y, distance = x[clear], y[clear], distance[clear]
    near, far = distance < eps, distance > eps
    assert near.sum() >= 10 and far.sum() >= 10
    attack = FAB(eps, n_target_classes=3, steps=100, restarts=2, norm="l2")
    x_adv = attack(model, tf.constant(x), tf.constant(y), 1)[0]
    check_in_ball(x_adv, x, eps, norm="l2")
    broken = model(x_adv).numpy().argmax(1) != y
    np.testing.assert_array_equal(broken, near)
    np.testing.assert_array_equal(x_adv.numpy()[far], x[far])


def test_fab_l2_restart_starts_at_half_eps_in_the_l2_ball():
    # A restart's run is given its random start: ‖δ‖₂ = ε/2 before the box's clip.
    model, x, y, _ = linear_l2_problem(n=8, classes=2, seed=4)
    eps = 0.4
    attack = FAB(eps, n_target_classes=1, steps=0, restarts=2, jit_compile=False, norm="l2")
    starts = []

    class Recording:
        def __init__(self, loop):
            self.loop = loop

        def padded(self, *args):
            return self.loop.padded(*args)

        def __call__(self, model, x0, y, target, start):
            starts.append(start.numpy())
            return start, tf.zeros([tf.shape(x0)[0]], tf.bool)  # nothing broken: restart again

    attack._run = Recording(attack._run)
    attack(model, x, y, 0)
    assert len(starts) == 2
    np.testing.assert_array_equal(starts[0], x)
    lengths = np.sqrt(np.sum((starts[1] - x) ** 2, 1))
    np.testing.assert_allclose(lengths, eps / 2, rtol=1e-5)  # x in [0.3, 0.7]: no clipping
    assert not np.allclose(starts[1] - x, 0.0)


# --- AutoAttack ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_autoattack_l2_custom_parts_stay_in_the_l2_ball_and_break_down_as_for_linf(capsys):
    model, x, y, distances = linear_l2_problem(n=48, seed=5)
    y = y.copy()
    y[:3] = (y[:3] + 1) % 4  # clean-misclassified
    eps = float(np.median(distances.min(1)))
    parts = {
        "apgd-ce": APGD(eps, "ce", steps=20, norm="l2"),
        "apgd-t": APGD(eps, "dlr_targeted", steps=20, n_target_classes=3, norm="l2"),
        "fab-t": FAB(eps, n_target_classes=3, steps=20, norm="l2"),
    }
    attack = AutoAttack(eps, "custom", parts, batch_size=20, progress=True, norm="l2")
    assert attack.norm == "l2"
    x_adv, breakdown = attack(model, x, y, seed=0)
    assert f"ε = {eps:g} (L2)" in capsys.readouterr().out
    check_in_ball(x_adv, x, eps, norm="l2")
    masks = breakdown["robust"]
    assert list(masks) == ["clean", "apgd-ce", "apgd-t", "fab-t"]
    assert not masks["clean"][:3].any()
    order = list(masks.values())
    for before, after in zip(order[:-1], order[1:], strict=True):
        assert np.all(after <= before)  # robust only shrinks
    robust = correct(model(x_adv), y).numpy() > 0.5
    np.testing.assert_array_equal(robust, masks["fab-t"])
    np.testing.assert_array_equal(x_adv.numpy()[robust], x[robust])
    assert 0 < robust.sum() < masks["clean"].sum()
    # Nothing within ε of no boundary is broken.
    assert np.all(robust[3:][distances[3:].min(1) > eps * (1 + 1e-4)])


def test_autoattack_refuses_parts_for_another_norm_and_names_them():
    with pytest.raises(ValueError, match="'apgd-ce': 'linf'"):
        AutoAttack(0.5, "custom", {"apgd-ce": APGD(0.5)}, norm="l2")


def test_autoattack_l2_versions_give_every_part_the_norm():
    rand = AutoAttack(0.5, "rand", norm="l2")
    assert {part.norm for part in rand.attacks.values()} == {"l2"}
    assert fab_t(0.5, norm="l2").norm == "l2"
    if "norm" not in inspect.signature(Square.__init__).parameters:
        pytest.skip("Square has no L2 form yet")
    standard = AutoAttack(0.5, "standard", norm="l2")
    assert list(standard.attacks) == ["apgd-ce", "apgd-t", "fab-t", "square"]
    assert {part.norm for part in standard.attacks.values()} == {"l2"}


# --- Registry and arguments --------------------------------------------------------------------


@pytest.mark.parametrize("name", ["pgd", "apgd-ce", "apgd-t", "fab-t", "transfer"])
def test_the_registry_passes_the_norm_from_the_context(name):
    context = {"norm": "l2", "source": linear_model(4)}
    assert attacks.create(name, 0.5, context=context).norm == "l2"
    assert attacks.create(name, 8 / 255, context={"source": context["source"]}).norm == "linf"


def test_the_registry_passes_the_norm_to_autoattack_and_square():
    ensemble = attacks.create("autoattack", 0.5, context={"norm": "l2"}, version="rand")
    assert ensemble.norm == "l2"
    if "norm" not in inspect.signature(Square.__init__).parameters:
        pytest.skip("Square has no L2 form yet")
    assert attacks.create("square", 0.5, context={"norm": "l2"}).norm == "l2"


@pytest.mark.parametrize(
    "build",
    [
        lambda: APGD(0.5, norm="L2"),
        lambda: FAB(0.5, norm="l1"),
        lambda: AutoAttack(0.5, "rand", norm="l1"),
        lambda: attacks.create("apgd-ce", 0.5, context={"norm": "l3"}),
    ],
)
def test_an_unknown_norm_is_a_value_error_naming_it(build):
    with pytest.raises(ValueError, match=r"unknown norm '(L2|l1|l3)'"):
        build()
