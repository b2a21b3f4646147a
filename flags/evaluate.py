"""Flags of evaluate.py; each attack's options come from the attack registry
(`fbat_tf.attacks.REGISTRY`) as `--<prefix>_<option>`, e.g. --pgd_steps, --aa_version."""

from __future__ import annotations

import os
from typing import Any

from absl import flags

from fbat_tf import attacks
from flags import common

MODEL_PATH = flags.DEFINE_list(
    "model_path",
    None,
    "A training run directory (its best checkpoint), a .keras file, an exported SavedModel "
    "version directory, or an exported .onnx or .tflite file; several exported files of one "
    "source, comma-separated, are re-checked with the source's attacks crafted once.",
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
EPS = flags.DEFINE_list(
    "eps",
    None,
    "Budgets in 1/255 units, e.g. 2,4,8; with --norm=l2 in pixel units, e.g. 0.25,0.5 "
    "(default: the run's).",
)
ATTACKS = flags.DEFINE_list(
    "attacks",
    ["pgd", "autoattack"],
    f"Attacks, any of {', '.join(attacks.names())} (transfer: PGD on --source_model_path).",
)


def _define_option_flags() -> dict[str, flags.FlagHolder]:
    """One flag per registered attack option (attacks that share an option share its flag)."""
    holders: dict[str, flags.FlagHolder] = {}
    for entry in attacks.REGISTRY.values():
        for option in entry.options:
            name = entry.flag_name(option)
            if name not in holders:
                holders[name] = common.option_flag(
                    name, option.default, option.help, option.choices, option.lower_bound
                )
    return holders


OPTION_FLAGS = _define_option_flags()


def attack_options(name: str) -> dict[str, Any]:
    """The options of attack `name` as its flags set them."""
    entry = attacks.entry(name)
    return {option.name: OPTION_FLAGS[entry.flag_name(option)].value for option in entry.options}


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
INDICATOR_POINTS = flags.DEFINE_integer(
    "indicator_points",
    32,
    "Clean-correct points (the first ones) the indicators of attack failure are computed on, "
    "per attack and ε, after the attacks (DESIGN.md §4.5); 0: none.",
    lower_bound=0,
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
common.refuse_pixel_units("eps", parse=lambda values: [float(v) for v in values])
flags.register_validator(
    "attacks",
    lambda names: bool(names) and set(names) <= set(attacks.names()),
    message=f"--attacks takes names from {', '.join(attacks.names())}",
)


def _all_exist(paths: list[str] | None) -> bool:
    if not paths:
        raise flags.ValidationError("--model_path names no model")
    for path in paths:
        if not os.path.exists(path):
            raise flags.ValidationError(f"--model_path={path} does not exist")
    return True


flags.register_validator("model_path", _all_exist)
flags.register_validator(
    "source_model_path",
    lambda value: value is None or os.path.exists(value),
    message="--source_model_path must exist",
)
flags.register_validator(
    "strategy",
    lambda name: name != "tpu",
    message="--strategy=tpu: the attacks run Python and NumPy between graph calls, which a TPU "
    "replica cannot; evaluate with --strategy=default (or mirrored on GPUs)",
)


def _needs_source(names: list[str]) -> list[str]:
    """The attacks asked for that craft on another model (the registry's `uses`)."""
    return [n for n in names if n in attacks.names() and "source" in attacks.entry(n).uses]


flags.register_multi_flags_validator(
    ["attacks", "source_model_path"],
    lambda f: not _needs_source(f["attacks"]) or f["source_model_path"] is not None,
    message="--attacks: a transfer attack crafts on --source_model_path, which is not given",
)

common.refuse_unsafe_values(__name__)

# Shared with train.py, where they have defaults of their own; here the model's own decide.
for _name, _said in (
    ("dataset", "Dataset name (default: the training run's; --eval_dataset means the same)."),
    ("validation_from", "Where the model's validation examples came from (default: the run's)."),
    (
        "norm",
        "Threat model of the attacks (default: the model's own, from its run or model card; "
        "else linf). linf: --eps in 1/255 units; l2: --eps in [0, 1]-pixel units, the L2 norm "
        "over the image (0.5 is RobustBench's CIFAR-10 budget).",
    ),
):
    flags.FLAGS.set_default(_name, None)
    _choices = flags.FLAGS[_name].help.partition(">: ")[0] + ">: "  # the enum's "<a|b>: "
    flags.FLAGS[_name].help = _choices + _said
