"""What runs and evaluations leave behind, as types: read and written here and nowhere else.

    record = RunRecord.load(path)             # results.json; FileNotFoundError, or ValueError
    record.config.method, record.config.eps   # the TrainConfig the run was started with
    record.status                             # "running", "complete" or "diverged"
    for epoch in record.history:              # one Epoch a finished epoch, in order
        epoch.epoch, epoch.val_robust_accuracy, epoch.get("ig_norm_ratio")
    record.selected_epoch()                   # the Epoch whose weights best.weights.h5 holds
    record.final.robust_accuracy("pgd")       # train.py's test of that model: an EvaluationResult
    record.method.name, record.method.passes  # a MethodRecord: what the run trained with
    record.save(path)                         # atomically; NaN and infinity as null

    result = EvaluationResult.load(path)      # evaluate.py's JSON (eval-*.json)
    result.clean_accuracy, result.robust_accuracy("autoattack", 8)   # ε in 1/255
    for attacked in result.robust:            # one AttackResult an attack and ε
        attacked.attack, attacked.eps, attacked.parts
    CodeIdentity.of(result.code).revision     # the code a run or an evaluation ran

    cell = CellResult.from_dict(saved)        # a sweep's cell, as sweep.json holds it
    cell.train.selected_epoch, cell.evaluation("pgd").robust(8)
    card = ModelCard.load(path)               # what fbat-tf reads of an export's model card

Keys a record does not know (written by a later version, or by an earlier one since retired)
are kept in `extra` and written back as they were; fields a record lacks (written before they
existed) take the defaults they had before they existed. A part older runs wrote in another
shape is read in today's: records/upgrade.py for what needs the records alone (a run's final
test and history, which `RunRecord.from_dict` upgrades), fbat_tf/upgrade.py for the rest (a
run's method record). Every committed results.json and evaluation loads (tests/test_records.py,
tests/test_upgrade.py).
"""

from fbat_tf.records.cards import CardBudget, CardModel, ModelCard
from fbat_tf.records.cells import (
    METHOD_LOGS,
    CellCode,
    CellResult,
    CellTuning,
    EvaluationSummary,
    MaskingEntry,
    Outcomes,
    TrainSummary,
    eps_key,
    report_cells,
)
from fbat_tf.records.code import CodeIdentity
from fbat_tf.records.config import TrainConfig
from fbat_tf.records.evaluations import (
    ATTACKED_ONLY,
    STANDARD,
    AttackResult,
    BatchResult,
    EvaluationResult,
)
from fbat_tf.records.files import finite_or_null, read_json, write_json_atomic
from fbat_tf.records.indicators import Check, Count, Indicators
from fbat_tf.records.runs import DivergenceOutcome, Epoch, MethodRecord, RunRecord

__all__ = [
    "ATTACKED_ONLY",
    "STANDARD",
    "METHOD_LOGS",
    "AttackResult",
    "Check",
    "Count",
    "Indicators",
    "BatchResult",
    "CardBudget",
    "CardModel",
    "CellCode",
    "CellResult",
    "CellTuning",
    "CodeIdentity",
    "DivergenceOutcome",
    "Epoch",
    "EvaluationResult",
    "EvaluationSummary",
    "MaskingEntry",
    "MethodRecord",
    "ModelCard",
    "Outcomes",
    "RunRecord",
    "TrainConfig",
    "TrainSummary",
    "eps_key",
    "finite_or_null",
    "read_json",
    "report_cells",
    "write_json_atomic",
]
