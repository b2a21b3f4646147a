"""Run records and evaluation results are read by string key in fbat_tf/records/ alone: every
other module holds them as types.

Two checks. Where JSON is parsed outside fbat_tf/records/, it is a file of another kind, each
site named below with what it reads. And the readers of committed results (the sweep report,
the model card, a run's config and status, the FAB-T share) run on them with results.json and
eval-*.json parsed into dicts that refuse every key read not made from fbat_tf/records/.
"""

from __future__ import annotations

import ast
import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECORDS = os.path.join(ROOT, "fbat_tf", "records") + os.sep

# Where JSON is parsed outside fbat_tf/records/, and what each site reads: none is a record.
OTHER_JSON = {
    "fbat_tf/trust.py": "a .keras archive's config.json",
    "fbat_tf/sweeps/definition.py": "a sweep definition",
    "study/cells.py": "a paper's numbers and a step-time bench result",
    "fbat_tf/sweeps/claims.py": "a cell's claim file",
    "fbat_tf/sweeps/revision.py": "a sweep's revision.json",
    "fbat_tf/sweeps/tuning_file.py": "a sweep's tuning.json (its picks)",
    "export/client.py": "TF-Serving's HTTP responses",
    "export/robustbench.py": "the RobustBench entry already beside a model (RobustBench's format)",
    "fbat_tf/rescore.py": "an older evaluation's file, re-scored as JSON to keep what it holds",
    "fbat_tf/indicate.py": "an older evaluation's file, given indicators as JSON to keep the rest",
    "fbat_cli/sweep.py": "a --override value and the overrides a sweep first ran with",
    "bench/harness.py": "a child's RESULT line",
    "bench/records/deploy_demo.py": "its own deploy_demo.json, to rewrite its table",
}


def _sources() -> list[str]:
    found = [f"fbat_cli/{name}.py" for name in ("train", "evaluate", "sweep")]
    for folder in ("fbat_tf", "export", "flags", "bench", "study"):
        for top, _, files in os.walk(os.path.join(ROOT, folder)):
            found += [
                os.path.relpath(os.path.join(top, name), ROOT)
                for name in files
                if name.endswith(".py")
            ]
    return sorted(p for p in found if not os.path.join(ROOT, p).startswith(RECORDS))


def _parses_json(path: str) -> bool:
    for node in ast.walk(ast.parse(open(os.path.join(ROOT, path)).read())):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("load", "loads")
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "json"
        ):
            return True
    return False


def test_json_is_parsed_outside_the_records_only_for_files_of_other_kinds():
    parsing = {path for path in _sources() if _parses_json(path)}
    assert parsing == set(OTHER_JSON)


class _Guarded(dict):
    """A record's top level as parsed: any key read from outside fbat_tf/records/ fails."""

    path = ""

    def _check(self) -> None:
        caller = sys._getframe(2).f_code.co_filename
        if not os.path.abspath(caller).startswith(RECORDS):
            raise AssertionError(f"{caller} reads {self.path} by key")

    def __getitem__(self, key):
        self._check()
        return super().__getitem__(key)

    def get(self, key, default=None):
        self._check()
        return super().get(key, default)

    def __contains__(self, key):
        self._check()
        return super().__contains__(key)

    def keys(self):
        self._check()
        return super().keys()

    def items(self):
        self._check()
        return super().items()

    def values(self):
        self._check()
        return super().values()


@pytest.fixture
def guarded_records(monkeypatch):
    """json.load gives results.json and eval-*.json as _Guarded; counts how many it gave."""
    parse = json.load
    given = []

    def load(f, *args, **kwargs):
        payload = parse(f, *args, **kwargs)
        name = os.path.basename(getattr(f, "name", ""))
        if isinstance(payload, dict) and (
            name == "results.json" or (name.startswith("eval-") and name.endswith(".json"))
        ):
            guarded = _Guarded(payload)
            guarded.path = f.name
            given.append(f.name)
            return guarded
        return payload

    monkeypatch.setattr(json, "load", load)
    return given


def test_the_guard_catches_a_read_by_key_outside_the_records(guarded_records, tmp_path):
    from fbat_tf.records import EvaluationResult

    path = os.path.join(
        ROOT, "study", "results", "fashion_mnist", "fastat-eps8-seed0", "eval-pgd.json"
    )
    assert EvaluationResult.load(path).examples > 0  # the records read it
    with open(path) as f, pytest.raises(AssertionError, match="by key"):
        json.load(f)["robust_accuracy"]
    assert len(guarded_records) == 2


def test_the_readers_of_committed_results_hold_them_as_types(guarded_records):
    from export import savedmodel
    from fbat_tf.run import Run
    from fbat_tf.sweeps.definition import load_definition
    from study import cells

    sys.path.insert(0, os.path.join(ROOT, "bench", "records"))
    try:
        import fab_share
    finally:
        sys.path.pop(0)
    definition = load_definition(os.path.join(ROOT, "study", "definitions", "fashion_mnist.json"))
    sweep_dir = os.path.join(ROOT, "study", "results", "fashion_mnist")
    collected = cells.collect(definition, sweep_dir)
    assert sum(cell.state == "done" for cell in collected.cells) >= 40
    run_dir = os.path.join(sweep_dir, "fastbat-eps8-seed0")
    card = savedmodel.model_card(run_dir)
    assert card["robustness"]["clean_accuracy"] > 0
    assert Run(run_dir).config().method == "fastbat" and Run(run_dir).status() == "complete"
    assert len(fab_share.shares()) > 0
    read = {os.path.basename(path) for path in guarded_records}
    assert {"results.json", "eval-pgd.json", "eval-autoattack.json"} <= read
