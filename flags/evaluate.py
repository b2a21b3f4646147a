"""Flags of evaluate.py."""

from __future__ import annotations

import os

from absl import flags

from fbat_tf import catalog

# The library's attacks, and a transfer attack: PGD on --source_model_path.
ATTACK_NAMES = (*catalog.ATTACKS, "transfer")

MODEL_PATH = flags.DEFINE_string(
    "model_path",
    None,
    "A training run directory (its best checkpoint), a .keras file, or an exported SavedModel "
    "version directory.",
    required=True,
)
SOURCE_MODEL_PATH = flags.DEFINE_string(
    "source_model_path", None, "The model the transfer attack crafts its examples on."
)
DATASET = flags.DEFINE_string(
    "eval_dataset",
    None,
    "Dataset name (default: the training run's; required otherwise). --dataset, train.py's "
    "spelling, means the same.",
)
SPLIT = flags.DEFINE_enum("split", "test", ["test", "validation"], "Split to evaluate on.")
N_EXAMPLES = flags.DEFINE_integer(
    "n_examples", 0, "Evaluate the first N examples in file order (0: all).", lower_bound=0
)
EPS = flags.DEFINE_list("eps", None, "Budgets in 1/255 units, e.g. 2,4,8 (default: the run's).")
ATTACKS = flags.DEFINE_list(
    "attacks", ["pgd", "autoattack"], f"Attacks, any of {', '.join(ATTACK_NAMES)}."
)
AA_VERSION = flags.DEFINE_enum(
    "aa_version", "standard", ["standard", "rand"], "AutoAttack version."
)
PGD_STEPS = flags.DEFINE_integer("pgd_steps", 50, "PGD steps K.", lower_bound=1)
PGD_RESTARTS = flags.DEFINE_integer("pgd_restarts", 10, "PGD random restarts R.", lower_bound=1)
FOLD_WEIGHTS = flags.DEFINE_bool(
    "fold_weights",
    True,
    "Attack a Keras model's inference graph with its weights folded into constants: the same "
    "function, faster on CPUs. Off: attack the Keras model itself.",
)
TRUST_MODEL_CODE = flags.DEFINE_bool(
    "trust_model_code",
    False,
    "Load a .keras file (--model_path, --source_model_path) that holds code, a Python lambda "
    "(e.g. a Lambda layer's) or a TFSMLayer, with Keras' safe mode off, running that code. Only "
    "for files from a source you trust. A SavedModel is a program whatever this says: evaluate "
    "only SavedModels you trust.",
)
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
    "attacks",
    lambda names: bool(names) and set(names) <= set(ATTACK_NAMES),
    message=f"--attacks takes names from {', '.join(ATTACK_NAMES)}",
)
for _name in ("model_path", "source_model_path"):
    flags.register_validator(
        _name, lambda value: value is None or os.path.exists(value), message=f"--{_name} must exist"
    )
flags.register_validator(
    "strategy",
    lambda name: name != "tpu",
    message="--strategy=tpu: the attacks run Python and NumPy between graph calls, which a TPU "
    "replica cannot; evaluate with --strategy=default (or mirrored on GPUs)",
)
flags.register_multi_flags_validator(
    ["attacks", "source_model_path"],
    lambda f: "transfer" not in f["attacks"] or f["source_model_path"] is not None,
    message="--attacks=transfer needs --source_model_path",
)
