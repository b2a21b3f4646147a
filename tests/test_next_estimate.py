"""train.py's closing `next:` line says roughly how long the evaluation it suggests may take,
from what the run measured: checked against the passes and throughput computed by hand."""

from __future__ import annotations

import runpy

import pytest

from fbat_tf.records import Epoch, MethodRecord, RunRecord, TrainConfig
from tests.conftest import ROOT

TRAIN = runpy.run_path(f"{ROOT}/fbat_cli/train.py", run_name="train")


def _record(per_second, backward, val_robust):
    history = [
        Epoch(1, {"images_per_second": 10.0, "val_robust_accuracy": 0.1, "val_best": 1}),
        Epoch(
            2,
            {"images_per_second": per_second, "val_robust_accuracy": val_robust, "val_best": 1},
        ),
    ]
    method = MethodRecord(
        name="fastat",
        title="Fast-AT",
        cost_variant="fastat",
        config={},
        passes=None if backward is None else {"forward": backward, "backward": backward},
    )
    return RunRecord(config=TrainConfig(workdir="w"), history=history, method=method)


def test_the_estimate_is_the_attacks_passes_at_the_selected_epochs_robust_share():
    record = _record(per_second=500.0, backward=2, val_robust=0.25)
    # PGD-50-10: 50 steps × 10 restarts on every example; AutoAttack's later parts attack only
    # the share still robust (the registry's count).
    from fbat_tf import attacks

    assert attacks.passes("pgd") == 500
    full, quarter = attacks.passes("autoattack"), attacks.passes("autoattack", robust=0.25)
    assert quarter < full
    expected = 1000 * (500 + quarter) / (500.0 * 2) / 60
    assert TRAIN["evaluation_minutes"](record) == pytest.approx(expected)
    assert TRAIN["_duration_words"](expected) == f": up to about {expected:.0f} min here"


@pytest.mark.parametrize(("per_second", "backward"), [(None, 2), (500.0, None), (0.0, 2)])
def test_no_estimate_where_the_run_recorded_no_throughput_or_passes(per_second, backward):
    record = _record(per_second=per_second, backward=backward, val_robust=0.25)
    assert TRAIN["evaluation_minutes"](record) is None
    assert TRAIN["_duration_words"](None) == ""


def test_the_words_of_short_and_long_estimates():
    assert TRAIN["_duration_words"](0.4) == ": under a minute here"
    assert TRAIN["_duration_words"](150) == ": up to about 2.5 h here"


def test_a_second_order_pass_counts_as_a_pass_of_the_step():
    record = _record(per_second=400.0, backward=4, val_robust=0.5)
    record.method.passes["second_order"] = 1
    from fbat_tf import attacks

    passes = 500 + attacks.passes("autoattack", robust=0.5)
    assert TRAIN["evaluation_minutes"](record) == pytest.approx(1000 * passes / (400.0 * 5) / 60)


def test_readme_s_transcript_states_the_committed_demo_run_s_estimate():
    from fbat_tf.records import RunRecord

    record = RunRecord.load(f"{ROOT}/study/results/demo/fmnist-fastbat/results.json")
    words = TRAIN["_duration_words"](TRAIN["evaluation_minutes"](record))
    with open(f"{ROOT}/README.md") as f:
        assert f"--n_examples=1000   # PGD-50-10, AutoAttack{words}\n" in f.read()
