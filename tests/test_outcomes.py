"""Per-example outcomes of an evaluation: one "0"/"1" string per accuracy, in dataset order,
recomputed here independently (the clean pass, PGD re-run batch by batch with the seeds the
evaluation gives, AutoAttack re-run on all the points at once), and refused on reading where a
string disagrees with the accuracy it sits beside."""

from __future__ import annotations

import hashlib
import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from fbat_tf import data, evaluation
from fbat_tf.attacks.apgd import APGD
from fbat_tf.attacks.autoattack import AutoAttack
from fbat_tf.attacks.losses import correct
from fbat_tf.attacks.pgd import PGD
from fbat_tf.attacks.square import Square
from fbat_tf.records import EvaluationResult, RunRecord, TrainConfig

EPS = 8 / 255
N, BATCH = 37, 8  # five batches, the last of 5
SEED = 3
PARTS = ("apgd-ce", "apgd-t", "square")


def setting():
    """A small classifier, N inputs, labels it gets right but for a few, so that each attack has
    something to attack and breaks some of it."""
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, (N, 6, 6, 2)).astype(np.float32)
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((6, 6, 2)),
            keras.layers.Flatten(),
            keras.layers.Dense(16, activation="softplus"),
            keras.layers.Dense(4),
        ]
    )
    y = np.argmax(model(x), axis=-1).astype(np.int32)
    wrong = [2, 9, 17, 30, 36]
    y[wrong] = (y[wrong] + 1) % 4
    return model, x, y


def attacks():
    ensemble = AutoAttack(
        EPS,
        "custom",
        {
            "apgd-ce": APGD(EPS, "ce", steps=4),
            "apgd-t": APGD(EPS, "dlr_targeted", steps=3, n_target_classes=2),
            "square": Square(EPS, n_queries=20),
        },
    )
    return {("pgd", EPS): PGD(EPS, steps=3, restarts=2), ("aa", EPS): ensemble}


def right(model, x, y) -> np.ndarray:
    return correct(model(x, training=False), y).numpy() > 0.5


# The module's fixtures are built once for all its tests: pytest-xdist runs them on one worker
# (--dist loadgroup, pyproject.toml).
pytestmark = pytest.mark.xdist_group("outcomes")


@pytest.fixture(scope="module")
def evaluated():
    model, x, y = setting()
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
    return model, x, y, evaluation.evaluate(model, dataset, attacks(), seed=SEED)


@pytest.mark.slow
def test_each_point_has_its_own_outcome_in_dataset_order(evaluated):
    model, x, y, result = evaluated
    assert [b.examples for b in result.per_batch] == [8, 8, 8, 8, 5]
    assert set(result.outcomes) == {"clean", "pgd@8", "aa@8", *(f"aa@8/{p}" for p in PARTS)}
    assert all(len(held) == N for held in result.outcomes.values())

    # Clean: the model run here on each input.
    clean = result.outcome("clean")
    np.testing.assert_array_equal(clean, right(model, x, y))
    assert 0 < clean.sum() < N

    # PGD: batch b re-run on its own with the seed the evaluation gives it, [seed, b].
    pgd = np.concatenate(
        [
            right(
                model,
                PGD(EPS, steps=3, restarts=2)(
                    model, x[i : i + BATCH], y[i : i + BATCH], tf.constant([SEED, b])
                )[0],
                y[i : i + BATCH],
            )
            for b, i in enumerate(range(0, N, BATCH))
        ]
    )
    np.testing.assert_array_equal(result.outcome("pgd@8"), pgd)
    assert 0 < pgd.sum() < clean.sum()

    # AutoAttack: every batch in one pool, one call seeded [seed, 0], attacked BATCH at a time.
    ensemble = attacks()[("aa", EPS)].in_slices(BATCH)
    x_adv, breakdown = ensemble(model, tf.constant(x), tf.constant(y), tf.constant([SEED, 0]))
    np.testing.assert_array_equal(breakdown["robust"]["clean"], clean)
    for part in PARTS:
        np.testing.assert_array_equal(result.outcome(f"aa@8/{part}"), breakdown["robust"][part])
    np.testing.assert_array_equal(result.outcome("aa@8"), right(model, x_adv, y))


def test_the_outcomes_agree_with_each_other_and_with_the_accuracies(evaluated):
    _, _, _, result = evaluated
    clean = result.outcome("clean")
    for key in ("pgd@8", "aa@8"):
        assert not np.any(result.outcome(key) & ~clean), key  # robust only where right clean
    # The ensemble's parts are cumulative: each leaves a subset of what the one before left.
    before = clean
    for part in PARTS:
        after = result.outcome(f"aa@8/{part}")
        assert not np.any(after & ~before), part
        before = after
    assert before.sum() < clean.sum()  # something was broken
    np.testing.assert_array_equal(result.outcome("aa@8"), before)  # the final is the last part
    # Each string's share of "1" is its accuracy exactly, over all points and per batch.
    for key, accuracy in result.accuracies().items():
        assert result.outcome(key).mean() == accuracy, key
    starts = np.cumsum([0] + [b.examples for b in result.per_batch])
    for b, batch in enumerate(result.per_batch):
        here = slice(starts[b], starts[b + 1])
        assert clean[here].mean() == batch.clean_accuracy
        assert result.outcome("pgd@8")[here].mean() == batch.robust_accuracy("pgd")


@pytest.mark.slow
def test_the_outcomes_do_not_depend_on_how_the_batches_are_pooled(evaluated, monkeypatch):
    """AutoAttack given each batch on its own (a pool too small for two) attacks other subsets
    with other seeds, but the clean and PGD outcomes are the same strings, and every string is
    the per-batch figures' in order."""
    model, x, y, pooled = evaluated
    monkeypatch.setattr(evaluation, "POOL_BYTES", 1)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
    by_batch = evaluation.evaluate(model, dataset, attacks(), seed=SEED)
    for key in ("clean", "pgd@8"):
        assert by_batch.outcomes[key] == pooled.outcomes[key], key
    by_batch.check_outcomes()


def test_outcomes_round_trip_and_an_older_record_has_none(evaluated, tmp_path):
    _, _, _, result = evaluated
    path = str(tmp_path / "eval-test.json")
    result.save(path)
    payload = json.loads(open(path).read())
    assert payload["outcomes"] == result.outcomes
    assert all(set(held) <= {"0", "1"} for held in payload["outcomes"].values())
    again = EvaluationResult.load(path)
    assert again.outcomes == result.outcomes and again.to_dict() == result.to_dict()
    assert again.outcome("pgd@8").dtype == bool and again.outcome("pgd@8").shape == (N,)
    with pytest.raises(KeyError, match="pgd@16"):
        again.outcome("pgd@16")
    del payload["outcomes"]
    older = EvaluationResult.from_dict(payload)
    assert older.outcomes == {} and "outcomes" not in older.to_dict()


def _edited(result: EvaluationResult, tmp_path, edit) -> str:
    payload = result.to_dict()
    edit(payload["outcomes"])
    path = tmp_path / "eval-edited.json"
    path.write_text(json.dumps(payload))
    return str(path)


def _flip(held: str, i: int) -> str:
    return held[:i] + ("0" if held[i] == "1" else "1") + held[i + 1 :]


@pytest.mark.parametrize(
    "edit, says",
    [
        (lambda o: o.update({"pgd@8": _flip(o["pgd@8"], 0)}), r"outcomes\['pgd@8'\] has \d+ of 37"),
        (lambda o: o.update({"aa@8/square": o["aa@8/square"][:-1]}), "not a string of 37"),
        (lambda o: o.pop("aa@8/apgd-t"), r"lack \['aa@8/apgd-t'\]"),
        (lambda o: o.update({"fgsm@8": o["pgd@8"]}), r"hold \['fgsm@8'\]"),
    ],
    ids=["count", "length", "missing", "unknown"],
)
def test_a_hand_edited_file_is_refused_in_one_line_naming_it(evaluated, tmp_path, edit, says):
    _, _, _, result = evaluated
    path = _edited(result, tmp_path, edit)
    with pytest.raises(ValueError, match=says) as refused:
        EvaluationResult.load(path)
    message = str(refused.value)
    assert message.startswith(f"{path}: ") and "\n" not in message


def test_points_moved_between_batches_are_refused(evaluated, tmp_path):
    """Two points swapped across a batch boundary keep every count but not the batches'."""
    _, _, _, result = evaluated
    held = result.outcomes["clean"]
    i = next(i for i in range(BATCH) if held[i] != held[BATCH + i])

    def swap(outcomes):
        chars = list(outcomes["clean"])
        chars[i], chars[BATCH + i] = chars[BATCH + i], chars[i]
        outcomes["clean"] = "".join(chars)

    path = _edited(result, tmp_path, swap)
    with pytest.raises(ValueError, match=f"^{path}: .*batch 0's 8 examples"):
        EvaluationResult.load(path)


def test_a_run_record_whose_final_test_disagrees_is_refused_naming_it(evaluated, tmp_path):
    _, _, _, result = evaluated
    final = result.to_dict()
    final["outcomes"]["clean"] = _flip(final["outcomes"]["clean"], 5)
    path = tmp_path / "results.json"
    config = TrainConfig(workdir=str(tmp_path))
    path.write_text(json.dumps({"config": config.__dict__, "status": "complete", "final": final}))
    with pytest.raises(ValueError, match=f"^{path}: outcomes\\['clean'\\]"):
        RunRecord.load(str(path))


def test_the_points_are_the_splits_first_and_a_held_out_half_is_fingerprinted():
    assert data.points("cifar10", "test", validation_from="train", download=False) == {
        "first_point": 0
    }
    if not os.path.isdir("/usr/share/datasets/fashion-mnist"):
        pytest.skip("needs dataset-fashion-mnist")
    halves = {
        split: data.points("fashion_mnist", split, validation_from="test")
        for split in ("validation", "test")
    }
    # Independently: the halves' indices from the whole test split's labels, in file order.
    whole = data.load("fashion_mnist", "test", batch_size=10_000)
    labels = np.concatenate([y.numpy() for _, y in whole])
    for split, indices in zip(("validation", "test"), data.held_out(labels), strict=True):
        digest = hashlib.sha256(indices.astype("<i8").tobytes()).hexdigest()[:16]
        assert halves[split] == {
            "first_point": 0,
            "held_out_seed": data.HELD_OUT_SEED,
            "held_out_sha256": digest,
        }
        # The half is evaluated in that order: its labels are the whole split's at its indices.
        half = data.load("fashion_mnist", split, batch_size=10_000, validation_from="test")
        np.testing.assert_array_equal(np.concatenate([y.numpy() for _, y in half]), labels[indices])
    assert halves["validation"] != halves["test"]
