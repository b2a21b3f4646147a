"""Flags of evaluate.py."""

from __future__ import annotations

import os

from absl import flags

MODEL_PATH = flags.DEFINE_string(
    "model_path",
    None,
    "A training run directory (its best checkpoint is evaluated).",
    required=True,
)
SPLIT = flags.DEFINE_enum("split", "test", ["test", "validation"], "Split to evaluate on.")
N_EXAMPLES = flags.DEFINE_integer(
    "n_examples", 0, "Evaluate the first N examples in file order (0: all).", lower_bound=0
)
EPS = flags.DEFINE_list("eps", None, "Budgets in 1/255 units, e.g. 2,4,8 (default: the run's).")
PGD_STEPS = flags.DEFINE_integer("pgd_steps", 50, "PGD steps K.", lower_bound=1)
PGD_RESTARTS = flags.DEFINE_integer("pgd_restarts", 10, "PGD random restarts R.", lower_bound=1)
RESULTS = flags.DEFINE_string(
    "results", None, "JSON output (default <model_path>/eval-<split>.json); never overwritten."
)


def _eps_values_ok(values: list[str] | None) -> bool:
    try:
        return values is None or all(0 < float(v) <= 255 for v in values)
    except ValueError:
        return False


flags.register_validator("eps", _eps_values_ok, message="--eps values must be numbers in (0, 255]")
flags.register_validator(
    "model_path",
    lambda value: value is None or os.path.exists(value),
    message="--model_path must exist",
)
