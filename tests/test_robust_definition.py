"""Robust means right on the clean point and on the attack's: a point the model gets wrong clean
is not robust, whatever an attack returns for it (δ = 0 lies in every threat model), for every
attack of the registry, a user's own, a transferred one, L∞ and L2. And PGD keeps an adversarial
point found at any iterate of any restart, against closed forms on a one-pixel model whose
ascent steps over a narrow band of the wrong class."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from fbat_tf import attacks, evaluation
from fbat_tf.attacks.base import Attack
from fbat_tf.attacks.pgd import PGD

CLASSES = 10
CENTER = 0.5


SIDE = 5  # 5×5 images of one channel: Square's L2 start needs at least 5 rows
# Budgets that move an image's mean by at most 0.1: L∞ 0.1 per pixel, L2 0.5 over its 25.
EPS = {"linf": 0.1, "l2": 0.5}


def images(values) -> tf.Tensor:
    """Images of one value each."""
    values = tf.constant(values, tf.float32)
    return tf.tile(tf.reshape(values, [-1, 1, 1, 1]), [1, SIDE, SIDE, 1])


def band_model(width: float) -> keras.Model:
    """A 5×5 image in, ten logits out, of its mean m: class 0 scores 0, class 1
    1 − |m − 0.5|/width (above class 0 only within `width` of 0.5), the other classes −10.
    With label 0 an image is wrong exactly where |m − 0.5| < width; the cross-entropy's input
    gradient is the same on every pixel and points towards 0.5 from either side, so the L∞ and
    L2 steps of PGD from an image of one value move every pixel alike, the mean by the step's
    L∞ size, or by its L2 size / 5."""
    inputs = keras.Input((SIDE, SIDE, 1))
    pixel = keras.layers.Lambda(lambda x: keras.ops.mean(x, axis=(1, 2)))(inputs)
    band = keras.layers.Lambda(lambda x: 1.0 - keras.ops.abs(x - CENTER) / width)(pixel)
    zeros = keras.layers.Lambda(lambda x: keras.ops.zeros_like(x))(pixel)
    rest = keras.layers.Lambda(lambda x: keras.ops.zeros_like(x) - 10.0 + 0.0 * x)(pixel)
    logits = keras.layers.Concatenate()([zeros, band, *[rest] * (CLASSES - 2)])
    return keras.Model(inputs, logits)


class Away(Attack):
    """A user's own attack (no registry entry): every pixel moved up as far as the ball allows
    (by ε, or by ε/5 under L2 over 25 pixels), out of the band."""

    def __init__(self, eps: float, norm: str = "linf"):
        self.eps, self.norm = eps, norm

    def perturb(self, model, x, y, seed):
        step = self.eps if self.norm == "linf" else self.eps / SIDE
        return tf.clip_by_value(x + step, 0.0, 1.0)


def registry_attacks(eps: float, norm: str, source: keras.Model) -> dict:
    # AutoAttack's parts count from its clean pass whatever the norm: its whole ensemble (the
    # slowest here, Square's 5000 queries on the robust points) runs under L∞ only.
    names = ["pgd", "apgd-ce", "apgd-t", "fab-t", "square", "transfer"]
    names += ["autoattack"] if norm == "linf" else []
    options = {
        "pgd": {"steps": 5, "restarts": 2},
        "transfer": {"steps": 5, "restarts": 1},
        "square": {"n_queries": 200},
    }
    built = evaluation.registry_attacks(
        names, [eps], norm=norm, options=options, jit_compile=False, source=source
    )
    built[("away", eps)] = Away(eps, norm)
    return built


@pytest.mark.slow
@pytest.mark.parametrize("norm", ["linf", "l2"])
def test_a_point_wrong_clean_counts_as_not_robust_for_every_attack(norm):
    # Width 1e-4 of the band around 0.5: the clean image of 0.5 is wrong, and any point an
    # attack moves it to (a random start, a step) is right again: robust by the attacked point
    # alone, not robust by the definition. The images of 0.2 are right clean and everywhere in
    # their ball: robust by both.
    eps = EPS[norm]
    model = band_model(1e-4)
    x = images([CENTER, CENTER, 0.2, 0.2])
    y = np.zeros(4, np.int32)
    assert np.argmax(model(x), -1).tolist() == [1, 1, 0, 0]
    source = band_model(0.3)  # a surrogate whose ascent runs elsewhere than the target's
    built = registry_attacks(eps, norm, source)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(2)
    result = evaluation.evaluate(model, dataset, built, seed=1)
    assert result.clean_accuracy == 0.5
    assert [attacked.attack for attacked in result.robust] == [name for name, _ in built]
    for attacked in result.robust:
        assert attacked.robust_accuracy == 0.5, attacked.attack
        assert result.outcomes[attacked.key] == "0011", attacked.attack
    # The user's own attack returns points the model classifies right: 4 of 4 by that alone.
    away = Away(eps, norm).perturb(model, tf.constant(x), tf.constant(y), None)
    assert np.argmax(model(away), -1).tolist() == [0, 0, 0, 0]


@pytest.mark.parametrize("norm", ["linf", "l2"])
def test_pgd_keeps_an_adversarial_iterate_its_last_step_leaves(norm):
    # Steps of ε/2 from δ = 0 towards 0.5 (the mean moves 0.05 a step), band half-width 0.015:
    # m = 0.44: iterates 0.44, 0.49 (in the band), 0.54 (out): broken at step 1 only;
    # m = 0.41: iterates 0.41, 0.46, 0.51 (in the band): broken at the last step;
    # m = 0.30: iterates 0.30, 0.35, 0.40: never broken.
    eps = EPS[norm]
    model = band_model(0.015)
    x = images([0.44, 0.41, 0.30])
    y = tf.zeros([3], tf.int32)
    assert np.argmax(model(x), -1).tolist() == [0, 0, 0]
    pgd = PGD(eps, steps=2, restarts=1, step_size=eps / 2, random_start=False, norm=norm)
    x_adv = pgd(model, x, y, seed=0)[0].numpy()
    np.testing.assert_allclose(x_adv, images([0.49, 0.51, 0.40]), atol=1e-6)
    assert np.argmax(model(x_adv), -1).tolist() == [1, 1, 0]
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(3)
    result = evaluation.evaluate(model, dataset, {("pgd", eps): pgd})
    assert result.outcomes[result.robust[0].key] == "001"


def test_pgd_keeps_the_restart_that_found_a_point_at_its_start():
    # Zero steps: the attack's points are its random starts, each kept where it breaks the
    # example. Images of 0.44, a band of half-width 0.05 around 0.5, ε = 0.1: a start breaks
    # the example where its noise's mean over the 25 pixels exceeds 0.01 (about one in five);
    # over 3 restarts some examples are broken and some not, exactly those that some restart's
    # start breaks.
    eps, restarts, n = 0.1, 3, 64
    model = band_model(0.05)
    x = images([0.44] * n)
    y = tf.zeros([n], tf.int32)
    seed = tf.constant([5, 0])
    x_adv = PGD(eps, steps=0, restarts=restarts)(model, x, y, seed=seed)[0]
    # Restart r starts from U[-ε, ε] drawn with the seed folded with r (constraints.random_init).
    means = [
        tf.reduce_mean(
            tf.random.stateless_uniform(
                x.shape, tf.random.experimental.stateless_fold_in(seed, r), -eps, eps
            ),
            axis=(1, 2, 3),
        ).numpy()
        for r in range(restarts)
    ]
    ever = np.any([np.abs(0.44 + m - CENTER) < 0.05 for m in means], axis=0)
    broken = np.argmax(model(x_adv), -1) == 1
    assert 0 < ever.sum() < n
    np.testing.assert_array_equal(broken, ever)


def test_registry_attacks_refuse_options_for_an_attack_not_asked():
    # The final test once gave {"norm": "l2"} as AutoAttack's options, which built it for L∞.
    with pytest.raises(ValueError, match=r"options given for \['norm'\]"):
        evaluation.registry_attacks(["autoattack"], [0.5], norm="l2", options={"norm": "l2"})
    with pytest.raises(TypeError):
        evaluation.registry_attacks(["autoattack"], [0.5])  # the threat model is required
    built = evaluation.registry_attacks(["autoattack", "pgd"], [0.5], norm="l2")
    assert {attack.norm for attack in built.values()} == {"l2"}
    assert {part.norm for part in built[("autoattack", 0.5)].attacks.values()} == {"l2"}
    assert attacks.create("autoattack", 0.5).norm == "linf"


def committed_evaluations():
    """Every committed evaluation that keeps per-point outcomes: eval-*.json files and
    results.json's final tests, (path, payload)."""
    import json
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1] / "study" / "results"
    for path in sorted(root.rglob("*.json")):
        if not (path.name == "results.json" or path.name.startswith("eval-")):
            continue
        payload = json.loads(path.read_text())
        if path.name == "results.json":
            payload = payload.get("final") or {}
        if payload.get("outcomes"):
            yield path, payload


def test_no_committed_evaluation_counts_a_point_wrong_clean_as_robust():
    from fbat_tf.records import STANDARD, EvaluationResult

    seen = 0
    for path, payload in committed_evaluations():
        assert payload.get("robust_definition") == STANDARD, path
        clean = payload["outcomes"]["clean"]
        for key, held in payload["outcomes"].items():
            wrong = sum(c == "0" and h == "1" for c, h in zip(clean, held, strict=True))
            assert wrong == 0, (path, key)
        EvaluationResult.from_dict(payload)  # and its numbers are its outcomes'
        seen += 1
    assert seen >= 200


def test_rescoring_keeps_a_point_robust_only_where_it_was_right_clean():
    from fbat_tf.records import ATTACKED_ONLY, STANDARD, EvaluationResult
    from fbat_tf.rescore import rescored

    old = {
        "examples": 4,
        "clean_accuracy": 0.5,
        "robust_accuracy": {"pgd@8": 0.5, "autoattack@8": 0.25},
        "per_batch": [
            {"examples": 2, "clean_accuracy": 0.5, "robust_accuracy": {"pgd@8": 1.0}},
            {"examples": 2, "clean_accuracy": 0.5, "robust_accuracy": {"pgd@8": 0.0}},
        ],
        "autoattack_per_attack": {"autoattack@8": {"clean": 0.5, "apgd-ce": 0.25}},
        "outcomes": {
            "clean": "1001",
            "pgd@8": "1100",  # the second point: wrong clean, right at PGD's point
            "autoattack@8": "1000",
            "autoattack@8/apgd-ce": "1000",
        },
        "seed": 3,
    }
    assert EvaluationResult.from_dict(old).scored_by == ATTACKED_ONLY
    new, changed = rescored(old)
    assert changed == {"pgd@8": 0.5}
    assert new["robust_accuracy"] == {"pgd@8": 0.25, "autoattack@8": 0.25}
    assert new["outcomes"]["pgd@8"] == "1000" and new["outcomes"]["autoattack@8"] == "1000"
    assert [b["robust_accuracy"]["pgd@8"] for b in new["per_batch"]] == [0.5, 0.0]
    assert new["robust_definition"] == STANDARD and new["rescored"]["before"] == changed
    assert new["seed"] == 3
    assert rescored(new) is None  # says its rule: left as it is
    # A standard-scored record whose outcomes count a point wrong clean as robust is refused.
    with pytest.raises(ValueError, match="robust that the clean pass got wrong"):
        EvaluationResult.from_dict({**old, "robust_definition": STANDARD})
