"""The sweep's report, sweep.py, the classifiers, the upgrade of older records and the
exporters hold a sweep's cells, run records and model cards as the types of fbat_tf/records/
(CellResult, RunRecord, ModelCard...), the report itself as study/cells.py's Report, with the
definition's evaluations and masking check as fbat_tf/sweeps/'s (Evaluation, MaskingCheck), the
paired comparisons as study/paired.py's, and the tuning stage's picks, candidates and runs
(tuning.json) and the report's tuning section as fbat_tf/sweeps/tuning_file.py's and
tuning.py's (Pick, Candidate, TuningRun, Section...); and they read them by attribute: a
misspelt field fails at once (AttributeError), where a misspelt key read with `.get` gave None
and the report went on without the number. The modules that parse those files into their
records (fbat_tf/records/, tuning_file.py) read them by key, and are no readers here.

The rule, read from the source with `ast`, for every string-constant read by key in the modules
of READERS, `x["key"]` (read, not written) or `x.get("key", ...)`:

1. its receiver `x`, as written, is one that ALLOWED names for that module: a dict that is no
   cell, record or card, each with what it holds (a paper-numbers row, a bench timing file, a
   block of the definition as written, a TF-Serving response...); and
2. its key is no field of the record types (RECORD_TYPES), but for the SHARED keys, which an
   allowed dict has too, each with the dict that has it.

A record read by key through an allowed name still fails the second rule where its key is its
own (a `found["robust_accuracy"]` of claims.py, whose `found` is a claim file).
"""

from __future__ import annotations

import ast
import dataclasses
import os

from fbat_tf import records
from fbat_tf.sweeps import evaluations, masking, tuning, tuning_file
from study import cells, costs, paired, paper

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SWEEPS = "fbat_tf/sweeps"
STUDY = "study"
READERS = [
    *(
        f"{STUDY}/{name}.py"
        for name in (
            "readings",
            "comparisons",
            "costs",
            "paper",
            "plots",
            "report",
            "paired",
            "tuning_report",
            "cells",
        )
    ),
    *(
        f"{SWEEPS}/{name}.py"
        for name in ("masking", "tuning", "tuning_groups", "claims", "results")
    ),
    "fbat_cli/sweep.py",
    "fbat_tf/classifiers.py",
    "fbat_tf/upgrade.py",
    *sorted(
        f"export/{name}"
        for name in os.listdir(os.path.join(ROOT, "export"))
        if name.endswith(".py")
    ),
]

# Per module, each receiver a string key may be read from, and what it holds.
ALLOWED: dict[str, dict[str, str]] = {
    f"{STUDY}/costs.py": {
        "setting": "the setting the cost bench measured in (its bench/step_time.py file)",
        "setting.get('machine') or {}": "the machine the cost bench ran on (its file)",
    },
    f"{STUDY}/paper.py": {
        "report.paper": "the paper-numbers file (study/papers/*.json)",
        "paper": "the paper-numbers file",
        "entry": "a row of the paper-numbers file",
    },
    f"{SWEEPS}/masking.py": {
        "given": "the definition's masking_check block, as written in its JSON",
        "spec": "the masking check's attack, as written in the definition's JSON",
    },
    f"{STUDY}/tuning_report.py": {
        "flags": "a cell's train.py flags by name (CellResult.flags), as its definition sets them",
    },
    f"{SWEEPS}/tuning_groups.py": {"spec": "the definition's tuning block, as written"},
    f"{SWEEPS}/claims.py": {"found": "a claim file"},
    f"{STUDY}/cells.py": {
        "bench": "a bench/step_time.py result (the definition's cost)",
        "m": "a method's entry of a bench/step_time.py result",
    },
    "fbat_cli/sweep.py": {
        "absl_flags.FLAGS": "absl's flags, by name",
        "kept": "the sweep's revision.json (revision.recorded)",
        "paths": "the paths write_report wrote, by kind",
    },
    "fbat_tf/classifiers.py": {
        "self.signature(images=tf.cast(x, tf.float32))": "a SavedModel signature's outputs",
    },
    "fbat_tf/upgrade.py": {
        "given": "a sweep definition's evaluation block, as written in its JSON",
        "config": "a run's method config as it recorded it (MethodRecord.config)",
        "declared": "a method's declared defaults (methods.defaults)",
    },
    "export/artifacts.py": {"ARTIFACTS": "the artifact files' names, by format"},
    "export/cli.py": {
        "flags.FLAGS": "absl's flags, by name",
        "values": "the command line's flag values",
    },
    "export/client.py": {
        "payload": "a TF-Serving REST response",
        "json.loads(text)": "a TF-Serving REST error response",
        "outputs": "a TF-Serving response's outputs",
    },
    "export/recheck.py": {
        "row": "a row of the re-check this module builds",
        "r": "a row of the re-check this module builds",
    },
    "export/robustbench.py": {
        "attacks.entry('autoattack').defaults()": "an attack's declared defaults",
        "result": "EvaluationResult.get(attack, eps, norm): a result by its attack's name",
        "found": "a RobustBench entry this module builds (entry), RobustBench's own format",
        "old": "the RobustBench entry already beside the model, RobustBench's own format",
        "new": "the RobustBench entry this module builds (entry), RobustBench's own format",
    },
    "export/savedmodel.py": {
        "SERVING_CONTRACT": "the serving contract this module declares",
        "card": "the card export_model assembles and writes (the caller's model object, "
        "extended): a writer's merge, not a read of a card's figures",
        "found": "a leftover folder's name matched by _PARTIAL (its host and process id)",
    },
    "export/modelcard.py": {
        "final": "EvaluationResult.get(attack): the final test's result by its attack's name",
    },
}

# The types whose fields are read by attribute, never by key.
RECORD_TYPES = (
    records.CellResult,
    records.TrainSummary,
    records.EvaluationSummary,
    records.MaskingEntry,
    records.Outcomes,
    records.CellCode,
    records.CellTuning,
    records.RunRecord,
    records.MethodRecord,
    records.ModelCard,
    records.CardModel,
    records.CardBudget,
    records.CodeIdentity,
    paired.Comparison,
    paired.Analysis,
    tuning_file.TuningFile,
    tuning_file.Pick,
    tuning_file.Candidate,
    tuning_file.TuningRun,
    tuning.Section,
    tuning.UnitSection,
    masking.MaskingCheck,
    evaluations.Evaluation,
    cells.Report,
    cells.CodeSummary,
    paper.PaperRow,
    cells.CostBench,
    costs.MeasuredTime,
)

# Field names of RECORD_TYPES that an allowed dict has too, and which one.
SHARED = {
    "attack": "the definition's masking_check block's attack, as written (masking)",
    "attacked_eps": "the paper-numbers file's rows (paper)",
    "autoattack": "EvaluationResult.get's attack name (robustbench, modelcard)",
    "batch_size": "the cost bench's setting (costs), the definition's evaluation block (upgrade)",
    "class_names": "a TF-Serving response's outputs (client)",
    "command": "a bench/step_time.py result, as written (cells.load_cost)",
    "device": "the cost bench's setting (costs)",
    "candidates": "the definition's tuning block (a group's)",
    "eps": "the paper-numbers file's rows, the definition's tuning block, RobustBench entries",
    "examples": "the masking check's attack as the definition writes it, the re-check's rows",
    "flags": "the paper-numbers file's rows (paper)",
    "machine": "the cost bench's setting (costs)",
    "match": "the definition's tuning block (a group's)",
    "method": "the paper-numbers file's rows and the definition's tuning groups",
    "model": "the cost bench's setting, the card export_model writes",
    "of": "the definition's masking_check block, as written (masking)",
    "on": "the definition's masking_check block, as written (masking)",
    "revision": "the sweep's revision.json (sweep.py)",
    "round_step_seconds": "a method's entry of a bench/step_time.py result (cells.load_cost)",
    "seeds": "the definition's tuning block",
    "setting": "a bench/step_time.py result, as written (cells.load_cost)",
    "source": "the paper numbers, the definition's tuning block and re-check rows",
    "step_seconds": "a method's entry of a bench/step_time.py result (cells.load_cost)",
    "table": "the paper-numbers file's rows (paper)",
    "threshold": "the definition's masking_check block, as written (masking)",
    "version": "an attack's declared defaults: AutoAttack's version (robustbench)",
    "width": "the cost bench's setting (costs)",
}


def record_keys() -> set[str]:
    return {field.name for kind in RECORD_TYPES for field in dataclasses.fields(kind)}


def string_reads(source: str) -> list[tuple[int, str, str, str]]:
    """(line, receiver as written, key, the read) of each string-constant read by key in
    `source`: `x["key"]` (not assigned to) and `x.get("key", ...)`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Subscript)
            and isinstance(node.ctx, ast.Load)
            and isinstance(node.slice, ast.Constant)
            and isinstance(node.slice.value, str)
        ):
            receiver, key = ast.unparse(node.value), node.slice.value
            found.append((node.lineno, receiver, key, f"{receiver}[{key!r}]"))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            receiver, key = ast.unparse(node.func.value), node.args[0].value
            found.append((node.lineno, receiver, key, f"{receiver}.get({key!r})"))
    return found


def broken_rules(path: str, source: str) -> list[str]:
    """Each read of `source` (the module at `path`) that breaks a rule, saying which."""
    allowed = ALLOWED.get(path, {})
    forbidden = record_keys() - set(SHARED)
    broken = []
    for line, receiver, key, read in string_reads(source):
        if receiver not in allowed:
            broken.append(f"{path}:{line}: {read}: {receiver} is not allowed here")
        if key in forbidden:
            broken.append(f"{path}:{line}: {read}: {key!r} is a field of a record's type")
    return broken


def _source(path: str) -> str:
    with open(os.path.join(ROOT, path)) as f:
        return f.read()


def test_cells_records_and_cards_are_read_by_attribute_never_by_a_string_key():
    broken = [line for path in READERS for line in broken_rules(path, _source(path))]
    assert not broken, "\n".join(broken)


def test_each_allowance_is_used_and_each_shared_key_is_a_record_s():
    """An allowance no read needs any more, or a shared key no record has, is dropped."""
    reads = {path: string_reads(_source(path)) for path in READERS}
    used = {(path, receiver) for path, found in reads.items() for _, receiver, _, _ in found}
    unused = [(p, r) for p, receivers in ALLOWED.items() for r in receivers if (p, r) not in used]
    assert not unused, unused
    assert set(SHARED) <= record_keys(), set(SHARED) - record_keys()
    keys = {key for found in reads.values() for _, _, key, _ in found}
    assert set(SHARED) <= keys, set(SHARED) - keys
    assert set(ALLOWED) <= set(READERS)


def test_the_rule_catches_a_cell_read_by_key_again():
    """readings.groups reading its cells' variant by key, as it did before cells were typed:
    each way of writing it breaks a rule, and both where the key is a record's own and no
    allowed dict's (variant, since no tuning unit is read by key; ε is a shared key). The
    report read by key breaks both too, as the cell it reads."""
    path = f"{STUDY}/readings.py"
    source = _source(path)
    typed = "        groups.setdefault((cell.variant, cell.eps), []).append(cell)\n"
    assert typed in source and not broken_rules(path, source)
    for read, rules in (
        ('cell["train"]', 2),
        ('cell.get("train", {}).get("selected_epoch")', 4),
        ('report.cells[0]["train"]', 2),
        ('report["cells"][0]["train"]', 4),
        ('cell["variant"]', 2),
        ('cell["eps"]', 1),
    ):
        again = source.replace(typed, f"{typed}        {read}\n")
        found = broken_rules(path, again)
        assert len(found) == rules, (read, found)
