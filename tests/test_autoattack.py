"""AutoAttack's bookkeeping against stand-in attacks whose effect is known in advance, its
strength on a standard-trained tiny CIFAR-like model, the transfer helper against a direct
count, and the gradient-alignment score against per-example gradients taken one at a time."""

from __future__ import annotations

import importlib.util

import keras
import numpy as np
import pytest
import tensorflow as tf

from fbat_tf import constraints, evaluation
from fbat_tf.attacks.apgd import APGD
from fbat_tf.attacks.autoattack import AutoAttack
from fbat_tf.attacks.base import Attack
from fbat_tf.attacks.losses import correct, cross_entropy
from fbat_tf.attacks.metrics import gradient_alignment
from fbat_tf.evaluation import check_in_ball, evaluate, transfer_robust_accuracy
from tests.helpers import linear_model

EPS = 8 / 255

# --- Composition -------------------------------------------------------------------------------
# Inputs (id, v): id = index / N identifies an example inside any subset an attack is given; the
# model predicts class 0 when v > 0.5. Every label is 0; v = 0.9 is robust, v = 0.1 is
# clean-misclassified. A stand-in moves v to 0.45 (fooled) on its own set of ids and to 0.8
# (not fooled) elsewhere, and marks id with its own offset, so the origin of a point is visible.
N = 12
COMPOSITION_EPS = 0.5
CLEAN_WRONG = {0, 5}
FIRST_BREAKS = {1, 2, 3, 5}
SECOND_BREAKS = {3, 4, 6, 7}


def threshold_model() -> keras.Model:
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2)])
    # logits = (v − 0.5, 0.5 − v)
    model.layers[0].set_weights(
        [np.array([[0.0, 0.0], [1.0, -1.0]], np.float32), np.array([-0.5, 0.5], np.float32)]
    )
    return model


class StandIn:
    def __init__(self, breaks: set[int], offset: float):
        self.breaks, self.offset, self.seen, self.inputs = breaks, offset, [], []
        self.seeds = []

    def __call__(self, model, x, y, seed):
        x = np.asarray(x).copy()
        ids = np.rint(x[:, 0] * N).astype(int)
        self.seen.append(sorted(ids.tolist()))
        self.seeds.append(np.asarray(seed).tolist())
        self.inputs.append(x.copy())
        hit = np.isin(ids, sorted(self.breaks))
        x[:, 1] = np.where(hit, 0.45, 0.8)
        x[:, 0] += self.offset
        return tf.constant(x), {}


def composition_inputs() -> tuple[np.ndarray, np.ndarray]:
    ids = np.arange(N) / N
    v = np.array([0.1 if i in CLEAN_WRONG else 0.9 for i in range(N)])
    return np.stack([ids, v], 1).astype(np.float32), np.zeros(N, np.int32)


def test_each_attack_sees_only_still_robust_examples_and_keeps_its_own_points():
    x, y = composition_inputs()
    first, second = StandIn(FIRST_BREAKS, 0.01), StandIn(SECOND_BREAKS, 0.02)
    attack = AutoAttack(COMPOSITION_EPS, "custom", {"first": first, "second": second})
    x_adv, breakdown = attack(threshold_model(), x, y, seed=0)
    x_adv, robust = x_adv.numpy(), breakdown["robust"]

    everyone = set(range(N))
    clean_robust = everyone - CLEAN_WRONG
    after_first = clean_robust - FIRST_BREAKS
    after_second = after_first - SECOND_BREAKS
    assert first.seen == [sorted(clean_robust)]
    assert second.seen == [sorted(after_first)]
    # Each attack starts from the clean inputs, not from an earlier attack's points.
    np.testing.assert_array_equal(second.inputs[0], x[sorted(after_first)])
    for name, expected in [
        ("clean", clean_robust),
        ("first", after_first),
        ("second", after_second),
    ]:
        assert set(np.flatnonzero(robust[name])) == expected, name

    broken_by_first = sorted(clean_robust & FIRST_BREAKS)  # 1, 2, 3 (5 was clean-wrong)
    broken_by_second = sorted(after_first & SECOND_BREAKS)  # 4, 6, 7 (3 already broken)
    np.testing.assert_allclose(x_adv[broken_by_first, 0], x[broken_by_first, 0] + 0.01)
    np.testing.assert_allclose(x_adv[broken_by_second, 0], x[broken_by_second, 0] + 0.02)
    np.testing.assert_allclose(x_adv[broken_by_first + broken_by_second, 1], 0.45)
    untouched = sorted(CLEAN_WRONG | after_second)  # clean-wrong and never broken: clean input
    np.testing.assert_array_equal(x_adv[untouched], x[untouched])

    assert {name: mask.mean() for name, mask in robust.items()} == {
        "clean": len(clean_robust) / N,
        "first": len(after_first) / N,
        "second": len(after_second) / N,
    }
    assert set(breakdown["seconds"]) == {"first", "second"}
    assert all(seconds >= 0 for seconds in breakdown["seconds"].values())


def test_each_part_attacks_the_survivors_in_slices_of_the_batch_size():
    # As the reference re-batches what is still robust before each attack: the slices hold
    # survivors only, in order, at most batch_size each, and all of one length (the last
    # padded with repeats of its first row); the result is the unsliced one.
    x, y = composition_inputs()
    whole = {"first": StandIn(FIRST_BREAKS, 0.01), "second": StandIn(SECOND_BREAKS, 0.02)}
    expected, expected_breakdown = AutoAttack(COMPOSITION_EPS, "custom", whole)(
        threshold_model(), x, y, seed=[7, 3]
    )
    first, second = StandIn(FIRST_BREAKS, 0.01), StandIn(SECOND_BREAKS, 0.02)
    attack = AutoAttack(COMPOSITION_EPS, "custom", {"first": first, "second": second})
    x_adv, breakdown = attack.in_slices(3)(threshold_model(), x, y, seed=[7, 3])

    # 0 and 5 are clean-wrong; 1, 2, 3 broken by the first.
    assert first.seen == [[1, 2, 3], [4, 6, 7], [8, 9, 10], [11, 11, 11]]
    assert second.seen == [[4, 6, 7], [8, 9, 10], [11, 11, 11]]
    # Seven survivors in slices of at most 4: two of 4, not 4 and 3.
    third = StandIn(set(), 0.0)
    parts = {"first": StandIn(FIRST_BREAKS, 0.01), "third": third}
    AutoAttack(COMPOSITION_EPS, "custom", parts).in_slices(4)(threshold_model(), x, y, seed=0)
    assert third.seen == [[4, 6, 7, 8], [9, 9, 10, 11]]  # sorted: 9 pads [9, 10, 11]
    np.testing.assert_array_equal(x_adv, expected)
    for name, mask in expected_breakdown["robust"].items():
        np.testing.assert_array_equal(breakdown["robust"][name], mask)
    # Slice 0 gets the call's seed (one slice is the unsliced call); slice k its fold-in.
    fold = [tf.random.experimental.stateless_fold_in([7, 3], k).numpy().tolist() for k in (1, 2, 3)]
    assert first.seeds == [[7, 3], *fold] and whole["first"].seeds == [[7, 3]]
    assert len(set(map(tuple, first.seeds))) == 4


def test_progress_names_each_part_its_examples_and_what_it_left(capsys):
    x, y = composition_inputs()
    first, second = StandIn(FIRST_BREAKS, 0.01), StandIn(SECOND_BREAKS, 0.02)
    attack = AutoAttack(COMPOSITION_EPS, "custom", {"first": first, "second": second})
    attack.in_slices(3, progress=True)(threshold_model(), x, y, seed=0)
    out = capsys.readouterr().out
    assert "AutoAttack (custom) at ε = 127.5/255, 12 examples: clean 83.33%" in out
    assert "first on the 10 examples still robust" in out
    assert "4/4" in out and "3/3" in out  # the bars over each part's calls of 3
    assert "after first: 58.33% robust" in out  # 7 of 12
    assert "second on the 7 examples still robust" in out
    assert "after second: 33.33% robust" in out  # 4 of 12


def test_evaluate_gives_autoattack_the_survivors_of_all_batches(monkeypatch):
    # Batches of 4: each part is called on the survivors of the whole set in calls of at most 4
    # (not on each batch's few survivors); the counts, per batch too, are those of direct calls.
    x, y = composition_inputs()
    first, second = StandIn(FIRST_BREAKS, 0.01), StandIn(SECOND_BREAKS, 0.02)
    attack = AutoAttack(COMPOSITION_EPS, "custom", {"first": first, "second": second})
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(4)
    result = evaluate(threshold_model(), dataset, {("aa", COMPOSITION_EPS): attack}, seed=5)

    assert first.seen == [[1, 2, 3, 4], [6, 7, 8, 9], [10, 10, 10, 11]]  # padded with 10
    assert second.seen == [[4, 6, 7, 8], [9, 9, 10, 11]]
    assert first.seeds[0] == [5, 0]  # the pool starts at batch 0
    after_second = set(range(N)) - CLEAN_WRONG - FIRST_BREAKS - SECOND_BREAKS  # 8, 9, 10, 11
    assert result.robust_accuracy("aa") == len(after_second) / N
    assert result.attacked("aa").parts == {"clean": 10 / N, "first": 7 / N, "second": 4 / N}
    per_batch = [b.robust_accuracy("aa") for b in result.per_batch]
    assert per_batch == [0.0, 0.0, 1.0]  # ids 0–3, 4–7, 8–11
    assert set(result.attacked("aa").part_seconds) == {"first", "second"}

    # A pool too small for two batches: the ensemble runs batch by batch, with the same counts.
    monkeypatch.setattr(evaluation, "POOL_BYTES", 1)
    first, second = StandIn(FIRST_BREAKS, 0.01), StandIn(SECOND_BREAKS, 0.02)
    attack = AutoAttack(COMPOSITION_EPS, "custom", {"first": first, "second": second})
    by_batch = evaluate(threshold_model(), dataset, {("aa", COMPOSITION_EPS): attack}, seed=5)
    assert first.seen == [[1, 2, 3], [4, 6, 7], [8, 9, 10, 11]]
    assert [s[1] for s in first.seeds] == [0, 1, 2]  # batch b's seed [seed, b]
    for key in ("robust_accuracy", "autoattack_per_attack", "per_batch"):
        assert by_batch.to_dict()[key] == result.to_dict()[key], key


def test_attacks_after_everything_is_broken_are_not_called():
    x, y = composition_inputs()
    first, second = StandIn(set(range(N)), 0.01), StandIn(set(), 0.02)
    attack = AutoAttack(COMPOSITION_EPS, "custom", {"first": first, "second": second})
    _, breakdown = attack(threshold_model(), x, y, seed=0)
    robust = breakdown["robust"]
    assert second.seen == [] and not robust["second"].any()


def test_an_attack_leaving_C_is_named():
    x, y = composition_inputs()
    attack = AutoAttack(0.1, "custom", {"too-far": StandIn(FIRST_BREAKS, 0.0)})  # moves v by 0.45
    with pytest.raises(AssertionError, match="'too-far' returned points outside C"):
        attack(threshold_model(), x, y, seed=0)


def test_version_arguments_are_checked():
    with pytest.raises(ValueError, match="only for version='custom'"):
        AutoAttack(EPS, "rand", attacks={"a": StandIn(set(), 0.0)})
    with pytest.raises(ValueError, match="needs a non-empty"):
        AutoAttack(EPS, "custom")
    with pytest.raises(ValueError, match="version must be one of"):
        AutoAttack(EPS, "plus")
    rand = AutoAttack(EPS, "rand")
    assert list(rand.attacks) == ["apgd-ce", "apgd-dlr"]
    assert all(
        a.eot_iter == 20 and a.restarts == 1 and a.steps == 100 for a in rand.attacks.values()
    )


# --- Strength on a standard-trained model ------------------------------------------------------


def cifar_like(n: int, seed: int, classes: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """32x32x3 images: a fixed ±1 pattern per class at ±0.03 around grey, plus pixel noise."""
    patterns = np.random.default_rng(0).choice([-1.0, 1.0], size=(classes, 32, 32, 3))
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    x = 0.5 + 0.03 * patterns[y] + 0.1 * rng.normal(size=(n, 32, 32, 3))
    return np.clip(x, 0, 1).astype(np.float32), y.astype(np.int32)


# The module's fixtures are built once for all its tests: pytest-xdist runs them on one worker
# (--dist loadgroup, pyproject.toml).
pytestmark = pytest.mark.xdist_group("autoattack")


@pytest.fixture(scope="module")
def standard_model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((32, 32, 3)),
            keras.layers.Conv2D(8, 3, 2, activation="relu"),
            keras.layers.Conv2D(16, 3, 2, activation="relu"),
            keras.layers.Flatten(),
            keras.layers.Dense(10),
        ]
    )
    model.compile(
        keras.optimizers.Adam(3e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    x_train, y_train = cifar_like(3000, seed=1)
    model.fit(x_train, y_train, batch_size=64, epochs=4, verbose=0)
    x, y = cifar_like(64, seed=2)
    assert np.mean(correct(model(x), y).numpy()) >= 0.95
    return model, x, y


def test_standard_training_has_no_robustness_under_autoattack(standard_model):
    model, x, y = standard_model
    attack = AutoAttack(
        EPS,
        "custom",
        {"apgd-ce": APGD(EPS, "ce"), "apgd-t": APGD(EPS, "dlr_targeted", n_target_classes=9)},
    )
    x_adv, breakdown = attack(model, x, y, seed=0)
    robust = breakdown["robust"]
    check_in_ball(x_adv, x, EPS)
    # Robust accuracy counted independently of AutoAttack's own masks.
    robust_accuracy = np.mean(correct(model(x_adv), y).numpy())
    assert robust_accuracy <= 0.05
    assert robust_accuracy == pytest.approx(robust["apgd-t"].mean())


def test_apgd_targeted_alone_breaks_a_standard_trained_model(standard_model):
    model, x, y = standard_model
    x_adv, _ = APGD(EPS, "dlr_targeted", n_target_classes=9)(model, x, y, seed=0)
    check_in_ball(x_adv, x, EPS)
    assert np.mean(correct(model(x_adv), y).numpy()) <= 0.05


def test_evaluate_runs_autoattack_like_any_attack(standard_model):
    model, x, y = standard_model
    attack = AutoAttack(EPS, "custom", {"apgd-ce": APGD(EPS, "ce", steps=20)})
    dataset = tf.data.Dataset.from_tensor_slices((x[:32], y[:32])).batch(16)
    result = evaluate(model, dataset, {("aa", EPS): attack})
    assert result.robust_accuracy("aa") == pytest.approx(result.attacked("aa").parts["apgd-ce"])
    assert result.examples == 32


@pytest.mark.skipif(
    importlib.util.find_spec("fbat_tf.attacks.fab") is None
    or importlib.util.find_spec("fbat_tf.attacks.square") is None,
    reason="FAB and Square are not in the tree yet",
)
def test_standard_version_runs_the_reference_order(standard_model):
    model, x, y = standard_model
    attack = AutoAttack(EPS, "standard")
    assert list(attack.attacks) == ["apgd-ce", "apgd-t", "fab-t", "square"]
    x_adv, breakdown = attack(model, x[:16], y[:16], seed=0)
    robust = breakdown["robust"]
    check_in_ball(x_adv, x[:16], EPS)
    assert robust["square"].mean() <= 0.05


@pytest.mark.slow
def test_standard_version_runs_each_attack_on_what_the_previous_ones_left(standard_model):
    # A budget small enough that every attack leaves survivors for the next one; each attack is
    # watched: it must be called, in the reference order, on exactly the examples still robust.
    model, x, y = standard_model
    eps = 0.5 / 255
    attack = AutoAttack(eps, "standard")
    seen = []
    for name, real in list(attack.attacks.items()):

        def watched(model, x_sub, y_sub, seed, name=name, real=real):
            seen.append((name, np.array(x_sub)))
            return real(model, x_sub, y_sub, seed)

        attack.attacks[name] = watched
    x16, y16 = x[:16], y[:16]
    x_adv, breakdown = attack(model, x16, y16, seed=0)
    robust = breakdown["robust"]
    check_in_ball(x_adv, x16, eps)
    assert [name for name, _ in seen] == ["apgd-ce", "apgd-t", "fab-t", "square"]
    previous = "clean"
    for name, attacked in seen:
        np.testing.assert_array_equal(attacked, np.asarray(x16)[robust[previous]])
        assert robust[previous].any()  # survivors reached this attack
        previous = name
    assert robust["square"].sum() <= robust["clean"].sum()


# --- Transfer and gradient alignment -----------------------------------------------------------


def test_transfer_counts_target_accuracy_on_points_crafted_on_the_source():
    d, n, eps = 10, 40, 0.2
    source, target = (
        linear_model(d, seed=0, random_bias=True),
        linear_model(d, seed=1, random_bias=True),
    )
    rng = np.random.default_rng(5)
    x = rng.uniform(0, 1, (n, d)).astype(np.float32)
    y = rng.integers(0, 2, n).astype(np.int32)

    class CornerAttack(Attack):  # the attacked model's closed-form worst case
        def perturb(self, model, x, y, seed):
            kernel = model.layers[0].get_weights()[0]
            y = np.asarray(y)
            towards = kernel[:, 1 - y].T - kernel[:, y].T
            return tf.constant(np.clip(np.asarray(x) + eps * np.sign(towards), 0, 1), tf.float32)

    corner_attack = CornerAttack()
    corner_attack.eps = eps
    expected = np.mean(target(corner_attack(source, x, y, 0)[0]).numpy().argmax(1) == y)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    result = transfer_robust_accuracy(source, target, corner_attack, dataset, eps=eps)
    assert result == pytest.approx(expected)


def test_gradient_alignment_is_one_for_a_two_class_linear_model():
    # ∇x CE = (p_1 − 1[y = 1])(w_1 − w_0): the same direction at every input.
    x = np.random.default_rng(0).uniform(0, 1, (8, 6)).astype(np.float32)
    y = np.array([0, 1] * 4, np.int32)
    assert float(
        gradient_alignment(linear_model(6, seed=2, random_bias=True), x, y, EPS, seed=3)
    ) == pytest.approx(1.0, abs=1e-5)


def test_gradient_alignment_matches_per_example_gradients():
    keras.utils.set_random_seed(1)
    model = keras.Sequential(
        [
            keras.Input((5,)),
            # Large weights: tanh saturates, so gradients turn inside the ball.
            keras.layers.Dense(
                16, "tanh", kernel_initializer=keras.initializers.RandomNormal(0, 3)
            ),
            keras.layers.Dense(3),
        ]
    )
    rng = np.random.default_rng(1)
    x = rng.uniform(0, 1, (6, 5)).astype(np.float32)
    y = rng.integers(0, 3, 6).astype(np.int32)
    eps, seed = 0.3, tf.constant([4, 0], tf.int32)
    eta = constraints.random_init(tf.constant(x), eps, seed).numpy()

    def gradient_of_one(point, label):
        point = tf.constant(point[None])
        with tf.GradientTape() as tape:
            tape.watch(point)
            loss = cross_entropy(model(point), [label])[0]
        return tape.gradient(loss, point).numpy()[0]

    cosines = []
    for i in range(len(x)):
        a, b = gradient_of_one(x[i], y[i]), gradient_of_one(x[i] + eta[i], y[i])
        cosines.append(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
    expected = float(np.mean(cosines))
    assert expected < 0.95  # the model is not linear inside this ball
    assert float(gradient_alignment(model, x, y, eps, seed)) == pytest.approx(expected, abs=1e-5)


def test_masking_gap_is_what_square_broke_beyond_the_gradient_parts():
    from fbat_tf.attacks.autoattack import masking_gap

    after = {"clean": 0.9, "apgd-ce": 0.5, "apgd-t": 0.45, "fab-t": 0.44, "square": 0.4}
    assert masking_gap(after) == pytest.approx(0.04)
    assert masking_gap({**after, "square": 0.44}) == pytest.approx(0.0)
    assert masking_gap({"clean": 0.9, "apgd-ce": 0.5, "apgd-dlr": 0.48}) is None  # no Square
