"""The parts of a training run's model card (export/savedmodel.py's `model_card` puts them
together): where the model came from, its ε, its training, its selection and its test numbers,
each read from the run's record. A figure the record does not hold is null, never estimated.

    from export import modelcard

    modelcard.source(workdir, run, record)   # {"workdir": ..., "weights": ..., ...}
    modelcard.robustness(record)             # {"split": "test", ..., "autoattack": None}
"""

from __future__ import annotations

import os
from typing import Any

from fbat_tf import catalog, provenance
from fbat_tf.records import RunRecord, TrainConfig, units
from fbat_tf.run import Run, file_sha256


def source(
    workdir: str, run: Run, record: RunRecord, card_file: str | None = None
) -> dict[str, Any]:
    """The run directory, its weights, its status and the code that trained and exported it.
    The run directory is given from the folder of `card_file`, where the card is written (a
    card copied or served elsewhere names no local path, and read beside its export it still
    leads to the run); absolute where no card file is named."""
    return {
        "workdir": relative_to_card(workdir, card_file),
        "weights": os.path.relpath(run.best_weights, workdir),
        # Which weights were exported: a re-check against another source says so.
        "weights_sha256": (
            file_sha256(run.best_weights) if os.path.isfile(run.best_weights) else None
        ),
        "run_status": record.status,
        # The code that trained the model (null for runs older than the record) and the
        # code that exported it.
        "trained_by": record.code,
        "exported_by": provenance.code(),
    }


def relative_to_card(path: str, card_file: str | None) -> str:
    """`path` from the folder of `card_file` (absolute where there is none)."""
    if card_file is None:
        return os.path.abspath(path)
    return os.path.relpath(os.path.abspath(path), os.path.dirname(os.path.abspath(card_file)))


def epsilon(config: TrainConfig) -> dict[str, Any]:
    """L∞: per_255 is the command line's ε; L2: `pixels` is (per_255 null), over the image."""
    pixels = float(config.eps)
    return {
        "pixels": pixels,
        "per_255": pixels * 255 if config.norm == "linf" else None,
        "norm": units.REFERENCE_NAMES[config.norm],
        "units": units.UNIT_NAMES[config.norm],
    }


def training(record: RunRecord) -> dict[str, Any]:
    """How the model was trained; the training time only where every epoch has its time."""
    config = record.config
    epoch_times = [epoch.seconds for epoch in record.history]
    complete_times = bool(epoch_times) and all(t is not None for t in epoch_times)
    return {
        "epochs": record.epochs or config.epochs,
        "epochs_run": len(record.history),
        "optimizer_steps": record.optimizer_steps,
        "batch_size": config.batch_size,
        "optimizer": {
            "name": "SGD",
            "lr_max": config.lr_max,
            "lr_schedule": config.lr_schedule,
            "momentum": config.momentum,
            "weight_decay": config.weight_decay,
        },
        "max_train_examples": config.max_train_examples,
        "precision": config.precision,
        "jit_compile": config.jit_compile,
        "seed": config.seed,
        "device": record.device,
        "time_s": sum(epoch_times) if complete_times else None,
        "epoch_time_s": epoch_times if complete_times else None,
    }


def selection(record: RunRecord) -> dict[str, Any]:
    """How the exported epoch was chosen, and its validation numbers."""
    config = record.config
    best = record.selected_epoch()  # the epoch whose weights were exported
    return {
        "criterion": "best validation robust accuracy under PGD",
        "val_attack_steps": config.val_attack_steps,
        "val_restarts": config.val_restarts,
        "val_examples": config.val_examples,
        "epoch": best.epoch if best else None,
        "val_clean_accuracy": best.val_clean_accuracy if best else None,
        "val_robust_accuracy": best.val_robust_accuracy if best else None,
    }


def robustness(record: RunRecord) -> dict[str, Any]:
    """The final test's numbers at the run's ε and norm: null before the run has finished, and
    AutoAttack's until the run's final evaluation holds them in that threat model."""
    config, final = record.config, record.final
    eps = float(config.eps)
    # The run's own threat model: an attack of the final test at another ε or norm is not it.
    budget = (units.in_flag_units(eps, config.norm), config.norm)
    tested_pgd = final.get("pgd", *budget) if final else None
    tested_aa = final.get("autoattack", *budget) if final else None
    pgd = None
    if tested_pgd is not None:
        pgd = {
            "robust_accuracy": tested_pgd.robust_accuracy,
            "steps": config.eval_pgd_steps,
            "restarts": config.eval_pgd_restarts,
            "step_size": eps * catalog.PGD_STEP_SIZE,  # the attack's default (ε/4)
            "time_s": tested_pgd.seconds,
        }
    autoattack = None
    if tested_aa is not None:
        autoattack = {
            "robust_accuracy": tested_aa.robust_accuracy,
            "version": "standard",  # the only version train.py runs
            "time_s": tested_aa.seconds,
        }
    return {
        "split": "test",
        "examples": final.examples if final else None,
        "eps": eps,
        "norm": units.REFERENCE_NAMES[config.norm],
        "clean_accuracy": final.clean_accuracy if final else None,
        "pgd": pgd,
        "autoattack": autoattack,
        # The indicators of attack failure of the test's attacks (DESIGN.md §4.5), by result key:
        # those that fired and on how many points; null where the test did not compute them.
        "indicators": fired_indicators(final),
    }


def fired_indicators(final) -> dict[str, dict[str, int]] | None:
    """The indicators that fired on an evaluation's attacks and on how many points, by result
    key; None where it computed none."""
    found = final.indicators if final else None
    if found is None:
        return None
    return {
        key: {name: count.points for name, count in found.fired(key).items()}
        for key in found.attacks
    }
