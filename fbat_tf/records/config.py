"""A run's settings: TrainConfig, whose defaults are train.py's flags' defaults."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from fbat_tf import catalog

# What JSON gives for each type a TrainConfig field is annotated with ("X | None": also null).
_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "float": (int, float),
    "bool": (bool,),
    "dict[str, Any]": (dict,),
}

# The fields of train.py's final test on the test split, which `final_test=False` leaves unused.
FINAL_TEST_FIELDS = ("eval_examples", "eval_pgd_steps", "eval_pgd_restarts", "eval_autoattack")


@dataclasses.dataclass
class TrainConfig:
    """Everything that defines a run. ε and λ⁻¹ are in pixel units here, ε under `norm`'s
    norm (the threat model of training, validation and the final test: "linf" or "l2")."""

    workdir: str
    method: str = "fastbat"
    dataset: str = "cifar10"
    model: str = "preact_resnet18"
    width: int | None = None
    activation: str = "relu"
    eps: float = catalog.EPS
    norm: str = "linf"
    method_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    epochs: int = 20
    batch_size: int = 128
    lr_max: float = 0.2
    lr_schedule: str = "cyclic"
    momentum: float = 0.9
    # Momentum at the learning-rate peak, moving with the cyclic rate from `momentum` at lr 0
    # (PyTorch CyclicLR's default: 0.9 -> 0.8 -> 0.9); None keeps the momentum constant.
    momentum_at_peak: float | None = None
    weight_decay: float = 5e-4
    max_train_examples: int | None = None
    steps_per_epoch: int | None = None
    val_attack_steps: int = 10
    val_restarts: int = 1
    # Queries of a Square attack (AutoAttack's, p_init 0.8) run on the points still robust after
    # validation's PGD: a point counts robust only where it survives both, a criterion gradient
    # masking cannot fool as PGD alone can. 0: PGD alone.
    val_square_queries: int = 0
    val_examples: int = 1000
    eval_examples: int = 1000
    eval_pgd_steps: int = catalog.PGD_STEPS
    eval_pgd_restarts: int = catalog.PGD_RESTARTS
    eval_autoattack: bool = True
    # Test the selected model on the test split at the end; False: the test split is never
    # built (a sweep's tuning runs, which select by validation alone).
    final_test: bool = True
    strategy: str = "default"
    stop_on_overfitting: bool = False
    max_skipped_fraction: float = 0.25
    precision: str = "float32"
    jit_compile: bool = True
    seed: int = 0
    data_dir: str | None = None
    download: bool = True
    # "train": validation is the training split's last 10%; "test": half the test split
    # (data.held_out), training on all of the training split.
    validation_from: str = "train"
    tensorboard_every: int = 100
    verbose: int = 1


# The values train.py's flags take for the numeric fields (flags/train.py's bounds, held to
# these by tests/test_records.py), as (lowest, highest), None for no bound; ε is in pixel
# units, up to 255/255 (L∞) or 255 (L2), its flag's (0, 255].
RANGES: dict[str, tuple[float | None, float | None]] = {
    "seed": (0, 2**31 - 1),
    "width": (1, None),
    "epochs": (1, None),
    "batch_size": (1, None),
    "lr_max": (0.0, None),
    "momentum": (0.0, 1.0),
    "momentum_at_peak": (0.0, 1.0),
    "weight_decay": (0.0, None),
    "max_train_examples": (1, None),
    "steps_per_epoch": (1, None),
    "val_attack_steps": (1, None),
    "val_restarts": (1, None),
    "val_square_queries": (0, None),
    "val_examples": (0, None),
    "eval_examples": (0, None),
    "eval_pgd_steps": (1, None),
    "eval_pgd_restarts": (1, None),
    "max_skipped_fraction": (0.0, 1.0),
    "tensorboard_every": (0, None),
}


def _out_of_range(name: str, value: Any, norm: Any) -> str | None:
    """Why a numeric config value is none a run takes (not finite, out of its range), or None."""
    if name == "eps":
        largest = 255.0 if norm == "l2" else 1.0
        if not (math.isfinite(value) and 0 < value <= largest):
            return f"not a budget in (0, {largest:g}] (pixel units)"
        return None
    if name not in RANGES or value is None or isinstance(value, bool):
        return None
    low, high = RANGES[name]
    if not math.isfinite(value):
        return "not a finite number"
    if (low is not None and value < low) or (high is not None and value > high):
        shown = f"{low if low is not None else '-inf'}, {high if high is not None else 'inf'}"
        return f"outside [{shown}], what train.py takes"
    return None


def config_from_dict(saved: dict[str, Any]) -> TrainConfig:
    """The TrainConfig of a record's `config` (fields it does not know left out); ValueError
    naming the field whose value is not of the field's type (`"eps": "8"`, a list for a seed)
    or outside what train.py takes (`"seed": -7`, RANGES), which would otherwise fail later,
    far from the file, or be taken silently."""
    fields = {field.name: field for field in dataclasses.fields(TrainConfig)}
    if "workdir" not in saved:
        raise ValueError("config has no workdir")
    for name, value in saved.items():
        if name not in fields:
            continue
        annotation = str(fields[name].type)
        optional = annotation.endswith(" | None")
        types = _JSON_TYPES[annotation.removesuffix(" | None")]
        # JSON's true and false are no numbers here; a whole number is a float's value.
        wrong_bool = isinstance(value, bool) and bool not in types
        if (value is None and optional) or (isinstance(value, types) and not wrong_bool):
            problem = _out_of_range(name, value, saved.get("norm"))
            if problem:
                raise ValueError(f"config.{name} is {value!r}, {problem}")
            continue
        kind = annotation.replace(" | None", " or null")
        article = "an" if kind[0] in "aeiou" else "a"
        raise ValueError(f"config.{name} is {value!r}, not {article} {kind}")
    return TrainConfig(**{k: v for k, v in saved.items() if k in fields})
