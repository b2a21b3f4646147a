"""Records as types: every committed results.json and evaluation loads and is written back as
it was (a run's final evaluation in the one evaluation schema), the selected epoch is worked out
one way, and keys a version does not know survive it. A run's method and what is read of a
model card are types too."""

from __future__ import annotations

import dataclasses
import errno
import glob
import json
import os

import pytest

from fbat_tf.records import (
    CardModel,
    DivergenceOutcome,
    Epoch,
    EvaluationResult,
    MethodRecord,
    ModelCard,
    RunRecord,
    TrainConfig,
)
from tests.committed import by_folder, check_each
from tests.test_upgrade import OLDER_FINAL

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMITTED = sorted(glob.glob(os.path.join(ROOT, "study", "results", "*", "*", "results.json")))
EVALUATIONS = sorted(glob.glob(os.path.join(ROOT, "study", "results", "*", "*", "eval-*.json")))


def test_the_committed_records_are_many():
    assert len(COMMITTED) >= 100  # every study's cells
    assert len(EVALUATIONS) >= 200


def _legacy_final_as_evaluation(final: dict, eps_255: float) -> dict:
    """A final block from before it was an evaluation's result, in that schema, by hand."""
    key = f"{eps_255:g}"
    robust = {f"pgd@{key}": final["test_pgd_robust_accuracy"]}
    aa_time = final.get("aa_time_s") or 0.0
    time_s = {f"pgd@{key}": final["eval_time_s"] - aa_time}
    parts = {}
    if final.get("test_aa_robust_accuracy") is not None:
        robust[f"autoattack@{key}"] = final["test_aa_robust_accuracy"]
        time_s[f"autoattack@{key}"] = final.get("aa_time_s")
        parts[f"autoattack@{key}"] = final["test_aa_per_attack"]
    kept = {k: final[k] for k in ("pgd_steps", "pgd_restarts", "aa_version") if k in final}
    return {
        "examples": final["test_examples"],
        "clean_accuracy": final["test_clean_accuracy"],
        "loss": None,
        "robust_accuracy": robust,
        "time_s": time_s,
        "replicas": None,
        **kept,
        "autoattack_per_attack": parts,
        "autoattack_seconds": {},
    }


@pytest.mark.parametrize("folder", sorted(by_folder(COMMITTED)))
def test_every_committed_record_loads_and_is_written_back_as_it_was(folder, tmp_path):
    check_each(by_folder(COMMITTED)[folder], lambda path: _record_written_back(path, tmp_path))


def _record_written_back(path: str, tmp_path) -> None:
    with open(path) as f:
        saved = json.load(f)
    record = RunRecord.load(path)
    assert record.config.dataset == saved["config"]["dataset"]
    if saved.get("method") is not None:  # as a type, written back in its order
        assert record.method.name == saved["method"]["name"]
        assert list(record.method.to_dict().items()) == list(saved["method"].items())
    assert [e.epoch for e in record.history] == [h["epoch"] for h in saved["history"]]
    copy = tmp_path / "results.json"
    record.save(str(copy))
    written = json.loads(copy.read_text())
    # A part a run did not record (null) is left out; every other value is as it was, and the
    # config gains the fields added since at the defaults it ran with.
    defaults = dataclasses.asdict(TrainConfig(workdir=saved["config"]["workdir"]))
    expected = {
        **{k: v for k, v in saved.items() if v is not None},
        "config": {**defaults, **saved["config"]},
    }
    if "final" in saved and "robust_accuracy" not in saved["final"]:
        # The final evaluation is written in the evaluation schema, with the same numbers.
        eps = round(saved["config"]["eps"] * 255, 4)
        final = _legacy_final_as_evaluation(saved["final"], eps)
        expected["final"] = {**final, "dataset": saved["config"]["dataset"]}
    assert written == expected


@pytest.mark.parametrize("folder", sorted(by_folder(EVALUATIONS)))
def test_every_committed_evaluation_loads_and_is_written_back_as_it_was(folder, tmp_path):
    files = by_folder(EVALUATIONS)[folder]
    check_each(files, lambda path: _evaluation_written_back(path, tmp_path))


def _evaluation_written_back(path: str, tmp_path) -> None:
    with open(path) as f:
        saved = json.load(f)
    result = EvaluationResult.load(path)
    assert [r.key for r in result.robust] == list(saved["robust_accuracy"])
    for attacked in result.robust:
        attack, eps = attacked.key.split("@")
        assert result.robust_accuracy(attack, float(eps)) == saved["robust_accuracy"][attacked.key]
    copy = tmp_path / "eval.json"
    result.save(str(copy))
    assert json.loads(copy.read_text()) == saved


def test_a_final_evaluation_in_the_evaluation_schema_round_trips(tmp_path):
    config = TrainConfig(workdir="w", eps=16 / 255, dataset="fashion_mnist")
    legacy = OLDER_FINAL
    record = RunRecord.from_dict({"config": dataclasses.asdict(config), "final": legacy})
    final = record.final
    assert (final.examples, final.clean_accuracy) == (500, 0.836)
    assert final.robust_accuracy("pgd", 16) == 0.738
    assert final.attacked("pgd").seconds == pytest.approx(1.5)  # 5.0 in all, AutoAttack 3.5
    assert final.robust_accuracy("autoattack") == 0.714
    assert final.attacked("autoattack").parts["apgd-ce"] == 0.72
    with pytest.raises(KeyError, match="pgd@8"):
        final.attacked("pgd", 8)
    record.save(str(tmp_path / "results.json"))
    again = RunRecord.load(str(tmp_path / "results.json"))
    assert again.final == final
    assert again.to_dict() == record.to_dict()


def epochs(*logs: dict) -> list[Epoch]:
    return [Epoch(i + 1, dict(values)) for i, values in enumerate(logs)]


def test_the_selected_epoch_is_the_last_marked_best_else_the_most_robust():
    config = TrainConfig(workdir="w")
    marked = RunRecord(
        config,
        history=epochs(
            {"val_best": 1.0, "val_robust_accuracy": 0.3},
            {"val_best": 1.0, "val_robust_accuracy": 0.4},
            {"val_best": 0.0, "val_robust_accuracy": 0.5},  # not saved: e.g. overfitting
        ),
    )
    assert marked.selected_epoch().epoch == 2
    never = RunRecord(config, history=epochs({"val_best": 0.0, "val_robust_accuracy": None}))
    assert never.selected_epoch() is None  # diverged before validation gave a number
    # Runs from before validation marked it, as records read them (records/upgrade.py): the
    # highest finite robust accuracy, first of ties.
    older = RunRecord.from_dict(
        {
            "config": dataclasses.asdict(config),
            "history": [
                {"epoch": 1, "val_robust_accuracy": 0.2},
                {"epoch": 2, "val_robust_accuracy": float("nan")},
                {"epoch": 3, "val_robust_accuracy": 0.35},
                {"epoch": 4, "val_robust_accuracy": 0.35},
            ],
        }
    )
    assert older.selected_epoch().epoch == 3
    assert RunRecord(config).selected_epoch() is None


def test_unknown_keys_and_retired_config_fields_survive_and_missing_fields_default(tmp_path):
    path = tmp_path / "results.json"
    path.write_text(
        json.dumps(
            {
                "config": {"workdir": "w", "method": "fastat", "old_flag": 3},
                "status": "complete",
                "history": [{"epoch": 1, "loss": 1.5, "new_log": 2.0}],
                "later_block": {"x": 1},
                "divergence": None,
            }
        )
    )
    record = RunRecord.load(str(path))
    assert record.config.method == "fastat"
    assert record.config.validation_from == "train"  # as runs before the field ran
    assert record.history[0].get("new_log") == 2.0
    record.save(str(path))
    written = json.loads(path.read_text())
    assert written["later_block"] == {"x": 1}
    assert written["config"]["old_flag"] == 3
    assert written["history"] == [{"epoch": 1, "loss": 1.5, "new_log": 2.0}]


def test_a_run_s_method_is_typed_and_older_records_lack_its_passes_and_cost_variant(tmp_path):
    older = {"name": "fastbat", "eps": 0.03, "lambda_inv": 19.6, "ig_coef": 0.1}
    method = MethodRecord.from_dict(older)
    assert (method.name, method.title, method.passes, method.cost_variant) == (
        "fastbat",
        None,
        None,
        None,
    )
    assert method.config == {"eps": 0.03, "lambda_inv": 19.6, "ig_coef": 0.1}
    assert method.to_dict() == older
    record = RunRecord(TrainConfig(workdir="w"), method=method)
    path = str(tmp_path / "results.json")
    record.save(path)
    assert json.loads(open(path).read())["method"] == older
    assert RunRecord.load(path).method == method
    newer = {**older, "title": "Fast-BAT", "cost_variant": "fastbat", "passes": {"forward": 3}}
    assert list(MethodRecord.from_dict(newer).to_dict()) == [
        "name",
        "title",
        "cost_variant",
        "eps",
        "lambda_inv",
        "ig_coef",
        "passes",
    ]
    with pytest.raises(ValueError, match="method.passes is 8, not an object"):
        MethodRecord.from_dict({**older, "passes": 8})


def test_a_diverged_record_round_trips_with_its_outcome(tmp_path):
    outcome = DivergenceOutcome(3, "skipped_batches", 40, 100, 0.25, 0, None)
    record = RunRecord(TrainConfig(workdir="w"), status="diverged", divergence=outcome)
    path = str(tmp_path / "results.json")
    record.save(path)
    again = RunRecord.load(path)
    assert again.is_diverged and again.divergence == outcome


def test_a_file_that_is_not_a_record_is_refused_naming_it(tmp_path):
    path = tmp_path / "results.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match="results.json is not readable JSON"):
        RunRecord.load(str(path))
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match="not a training run's record"):
        RunRecord.load(str(path))
    assert RunRecord.read(str(path)) is None
    assert RunRecord.read(str(tmp_path / "absent.json")) is None


@pytest.mark.parametrize(
    "edit, says",
    [
        # A field of another type than the run wrote: ε as text (which export took as 8
        # pixels), a seed as a list, a flag as text, a width as true.
        (lambda r: r["config"].update(eps="8"), "config.eps is '8', not a float"),
        (lambda r: r["config"].update(seed=[1]), "config.seed is [1], not an int"),
        (lambda r: r["config"].update(final_test="yes"), "config.final_test is 'yes', not a bool"),
        (lambda r: r["config"].update(width=True), "config.width is True, not an int or null"),
        (lambda r: r["config"].update(method_options=[]), "config.method_options is []"),
        (lambda r: r["config"].pop("workdir"), "config has no workdir"),
        (lambda r: r.update(history=5), "history is 5, not a list"),
        (lambda r: r.update(history=[{"loss": 1.0}]), "history holds {'loss': 1.0}"),
        (lambda r: r.update(history=[{"epoch": "1"}]), "not an epoch's object with its number"),
        (lambda r: r.update(method=[1]), "method is [1], not an object"),
        (lambda r: r.update(status="done"), "status is 'done', not one of running, complete"),
        # Diverged, but not why: the message about it would fail on the missing outcome.
        (lambda r: r.update(status="diverged"), "status is diverged, but the record says nothing"),
        (lambda r: r.update(divergence={"epoch": 1}), "is not a training run's record as fbat"),
    ],
)
def test_a_record_of_another_shape_is_refused_naming_the_file_and_what_to_do(tmp_path, edit, says):
    written = RunRecord(TrainConfig(workdir="w"), status="complete").to_dict()
    edit(written)
    path = tmp_path / "results.json"
    path.write_text(json.dumps(written))
    with pytest.raises(ValueError) as refused:
        RunRecord.load(str(path))
    message = str(refused.value)
    assert message.startswith(str(path)) and says in message, message
    assert message.endswith("restore the file train.py wrote, or train again in a new --workdir")
    assert RunRecord.read(str(path)) is None


def test_a_model_card_reads_as_a_type_and_a_part_of_another_type_is_named(tmp_path):
    card = {
        "dataset": "fashion_mnist",
        "validation_from": "train",
        "model": {"name": "small_cnn", "width": 16, "activation": "relu"},
        "method": {"name": "fastbat", "title": "Fast-BAT", "eps": 0.03, "passes": {"forward": 3}},
        "eps": {"pixels": 1.5, "per_255": None, "norm": "L2", "units": "pixels"},
        "class_names": ["a", "b"],
        "robustness": {"clean_accuracy": 0.8},
    }
    path = tmp_path / "model_card.json"
    path.write_text(json.dumps(card))
    read = ModelCard.load(str(path))
    assert (read.dataset, read.validation_from) == ("fashion_mnist", "train")
    assert (read.model.name, read.model.width) == ("small_cnn", 16)
    assert (read.eps.pixels, read.eps.norm) == (1.5, "l2")
    assert read.method.name == "fastbat" and read.method.passes == {"forward": 3}
    assert read.class_names == ("a", "b")
    keras_file = {"model": {"name": "net"}, "dataset": None, "method": None, "eps": None}
    assert ModelCard.from_dict(keras_file) == ModelCard(model=CardModel("net"))
    for part, says in (
        ({"dataset": 5}, "dataset is 5, not a name"),
        ({"eps": {"pixels": "8"}}, "eps.pixels is '8', not a number"),
        ({"eps": {"pixels": 8, "norm": "L1"}}, "eps.norm is 'L1', not Linf or L2"),
        ({"class_names": "ab"}, "class_names is 'ab', not a list of names"),
    ):
        path.write_text(json.dumps({**card, **part}))
        with pytest.raises(ValueError) as refused:
            ModelCard.load(str(path))
        restore = "; restore the card the export wrote (or export the run again)"
        assert str(refused.value) == f"{path}: {says}{restore}"


def test_a_file_written_without_replace_is_never_replaced(tmp_path):
    """write_json_atomic(replace=False) links the finished file into place: one already there
    (by whichever process) stays as it was, and no temporary file is left beside it."""
    from fbat_tf.records import write_json_atomic

    path = str(tmp_path / "entry.json")
    write_json_atomic(path, {"first": 1}, replace=False)
    with pytest.raises(FileExistsError):
        write_json_atomic(path, {"second": 2}, replace=False)
    assert json.loads((tmp_path / "entry.json").read_text()) == {"first": 1}
    assert os.listdir(tmp_path) == ["entry.json"]
    write_json_atomic(path, {"third": 3})  # the default replaces
    assert json.loads((tmp_path / "entry.json").read_text()) == {"third": 3}
    assert os.listdir(tmp_path) == ["entry.json"]


@pytest.mark.parametrize("behind", ["a file", "nothing"])
def test_no_file_is_written_replaced_or_removed_through_a_link(tmp_path, behind):
    """The one rule for every path the project writes, replaces or removes (records/files.py):
    a symbolic link there, or on a folder between the folder the user named and it, is refused
    in one line naming it; what the link points at is left as it was, and nothing is made
    behind it."""
    from fbat_tf.records import files

    outside = tmp_path / "outside"
    outside.mkdir()
    if behind == "a file":
        (outside / "kept").write_text("a user's file\n")
    home = tmp_path / "home"
    home.mkdir()
    os.symlink(outside / "kept", home / "file")
    os.symlink(outside, home / "folder")
    attempts = [
        lambda: files.write_json_atomic(str(home / "file"), {"a": 1}),
        lambda: files.write_json_atomic(str(home / "file"), {"a": 1}, replace=False),
        lambda: files.write_atomic(str(home / "file"), b"bytes"),
        lambda: files.open_own(str(home / "file"), "a"),
        lambda: files.open_own(str(home / "file"), "r+"),
        lambda: files.open_own(str(home / "folder" / "new"), "w", inside=str(home)),
        lambda: files.make_dirs(str(home / "folder" / "new"), inside=str(home)),
        lambda: files.remove_tree(str(home / "folder")),
        lambda: files.remove_tree(str(home / "folder" / "kept"), inside=str(home)),
    ]
    for attempt in attempts:
        with pytest.raises(files.LinkRefused) as refused:
            attempt()
        said = str(refused.value)
        assert said.startswith(f"{home}/") and ": a symbolic link" in said and "\n" not in said
    assert sorted(os.listdir(outside)) == (["kept"] if behind == "a file" else [])
    if behind == "a file":
        assert (outside / "kept").read_text() == "a user's file\n"
    assert sorted(os.listdir(home)) == ["file", "folder"]  # no temporary file left
    # The folder the user named may itself be a link: what is inside it is written.
    files.write_json_atomic(
        str(home / "folder" / "made.json"), {"a": 1}, inside=str(home / "folder")
    )
    assert json.loads((outside / "made.json").read_text()) == {"a": 1}


@pytest.mark.parametrize("code", [errno.EPERM, errno.EOPNOTSUPP])
def test_without_hard_links_a_file_is_still_written_once_and_never_replaced(
    tmp_path, monkeypatch, code
):
    """On a filesystem that refuses hard links (link() fails with EPERM on FAT, EOPNOTSUPP on
    some network mounts) the file is created where none is, whole, and never replaced."""
    from fbat_tf.records import write_json_atomic

    def refused(source, target):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "link", refused)
    path = str(tmp_path / "entry.json")
    write_json_atomic(path, {"first": 1}, replace=False)
    assert json.loads((tmp_path / "entry.json").read_text()) == {"first": 1}
    with pytest.raises(FileExistsError):
        write_json_atomic(path, {"second": 2}, replace=False)
    assert json.loads((tmp_path / "entry.json").read_text()) == {"first": 1}
    assert os.listdir(tmp_path) == ["entry.json"]


def test_a_record_s_config_ranges_are_train_py_s_flag_bounds():
    """records.config.RANGES, which a record's numbers are read against, says what the flags
    of train.py take (each bound the flag's, or none where the flag has none)."""
    from absl import flags as absl_flags

    import flags.train  # noqa: F401  (defines train.py's flags)
    from fbat_tf.records.config import RANGES

    for name, (low, high) in RANGES.items():
        parser = absl_flags.FLAGS[name].parser
        assert (getattr(parser, "lower_bound", None), getattr(parser, "upper_bound", None)) == (
            low,
            high,
        ), name
