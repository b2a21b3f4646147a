"""Flags of train.py, grouped by topic. Defaults are the paper's CIFAR settings (DESIGN.md §3)."""

from __future__ import annotations

from absl import flags

from fbat_tf import catalog, methods
from fbat_tf.records import units
from fbat_tf.records.config import FINAL_TEST_FIELDS
from flags import common
from flags.common import RUN, eps_flag

# What to train.
METHOD = flags.DEFINE_enum("method", RUN["method"], methods.names(), "Training method.")
MODEL = flags.DEFINE_enum("model", RUN["model"], list(catalog.MODELS), "Architecture.")
WIDTH = flags.DEFINE_integer(
    "width",
    RUN["width"],
    "Base channel count (default: the architecture's standard).",
    lower_bound=1,
)
ACTIVATION = flags.DEFINE_enum(
    "activation", RUN["activation"], list(catalog.ACTIVATIONS), "Nonlinearity of the model."
)
# TrainConfig's ε, in the command line's units (8 for 8/255 under L∞).
EPS = eps_flag(
    "eps", units.in_flag_units(RUN["eps"], RUN["norm"]), "Training perturbation budget ε."
)

# Optimization.
EPOCHS = flags.DEFINE_integer(
    "epochs", RUN["epochs"], "Epochs (Free-AT divides them by --free_replays).", lower_bound=1
)
LR_MAX = flags.DEFINE_float("lr_max", RUN["lr_max"], "Peak learning rate.", lower_bound=0.0)
LR_SCHEDULE = flags.DEFINE_enum(
    "lr_schedule",
    RUN["lr_schedule"],
    ["cyclic", "piecewise"],
    "cyclic: 0 -> lr_max at mid-training -> 0, per iteration; piecewise: x0.1 at 50% and 75%.",
)
MOMENTUM = flags.DEFINE_float(
    "momentum", RUN["momentum"], "SGD momentum.", lower_bound=0.0, upper_bound=1.0
)
MOMENTUM_AT_PEAK = flags.DEFINE_float(
    "momentum_at_peak",
    RUN["momentum_at_peak"],
    "Momentum at the learning-rate peak of the cyclic schedule, moving linearly with the rate "
    "from --momentum at lr 0 (0.8 with --momentum=0.9 is PyTorch CyclicLR's default, which the "
    "paper's released trainer uses). Default: constant --momentum.",
    lower_bound=0.0,
    upper_bound=1.0,
)
flags.register_multi_flags_validator(
    ["momentum_at_peak", "lr_schedule"],
    lambda f: f["momentum_at_peak"] is None or f["lr_schedule"] == "cyclic",
    message="--momentum_at_peak cycles the momentum with --lr_schedule=cyclic only",
)
WEIGHT_DECAY = flags.DEFINE_float(
    "weight_decay",
    RUN["weight_decay"],
    "Coupled L2 weight decay (added to the gradient).",
    lower_bound=0.0,
)
MAX_TRAIN_EXAMPLES = flags.DEFINE_integer(
    "max_train_examples",
    RUN["max_train_examples"],
    "Train on the first N training examples only.",
    lower_bound=1,
)
STEPS_PER_EPOCH = flags.DEFINE_integer(
    "steps_per_epoch",
    RUN["steps_per_epoch"],
    "Optimizer batches per epoch (default: one pass).",
    lower_bound=1,
)

# Method options: one flag per option a method declares (fbat_tf.methods).


OPTION_FLAGS = {
    entry.flag_name(o): common.option_flag(
        entry.flag_name(o), o.default, o.help, o.choices, o.lower_bound, o.type
    )
    for entry in methods.REGISTRY.values()
    for o in entry.options
}

# Validation, model selection and final evaluation.
VAL_ATTACK_STEPS = flags.DEFINE_integer(
    "val_attack_steps", RUN["val_attack_steps"], "PGD steps of robust validation.", lower_bound=1
)
VAL_RESTARTS = flags.DEFINE_integer(
    "val_restarts", RUN["val_restarts"], "PGD restarts of robust validation.", lower_bound=1
)
VAL_SQUARE_QUERIES = flags.DEFINE_integer(
    "val_square_queries",
    RUN["val_square_queries"],
    "Queries of a Square attack on the points robust after validation's PGD; a point then "
    "counts robust only where it survives both (0: PGD alone).",
    lower_bound=0,
)
VAL_EXAMPLES = flags.DEFINE_integer(
    "val_examples",
    RUN["val_examples"],
    "Validation examples attacked each epoch (0: all).",
    lower_bound=0,
)
EVAL_EXAMPLES = flags.DEFINE_integer(
    "eval_examples",
    RUN["eval_examples"],
    "Test examples of the final evaluation (0: all).",
    lower_bound=0,
)
EVAL_PGD_STEPS = flags.DEFINE_integer(
    "eval_pgd_steps", RUN["eval_pgd_steps"], "PGD steps of the final evaluation.", lower_bound=1
)
EVAL_PGD_RESTARTS = flags.DEFINE_integer(
    "eval_pgd_restarts",
    RUN["eval_pgd_restarts"],
    "PGD restarts of the final evaluation.",
    lower_bound=1,
)
EVAL_AUTOATTACK = flags.DEFINE_bool(
    "eval_autoattack",
    RUN["eval_autoattack"],
    "Also run AutoAttack (standard) in the final evaluation.",
)
FINAL_TEST = flags.DEFINE_bool(
    "final_test",
    RUN["final_test"],
    "Test the selected model on the test split at the end. --nofinal_test: the run trains and "
    "validates only and never builds the test split (a sweep's tuning runs); the --eval_* "
    "flags, which set that test, are then refused.",
)
# The flags of the final test, which --nofinal_test leaves without use.
FINAL_TEST_FLAGS = FINAL_TEST_FIELDS
STOP_ON_OVERFITTING = flags.DEFINE_bool(
    "stop_on_overfitting",
    RUN["stop_on_overfitting"],
    "Stop when the catastrophic-overfitting guard fires (it always warns and logs).",
)

MAX_SKIPPED_FRACTION = flags.DEFINE_float(
    "max_skipped_fraction",
    RUN["max_skipped_fraction"],
    "Stop the run as diverged when more than this fraction of an epoch's steps are skipped "
    "because their loss, gradients or batch-norm statistics are not finite.",
    lower_bound=0.0,
    upper_bound=1.0,
)

STRATEGY = common.STRATEGY  # defined with the flags shared with evaluate.py

# Outputs.
WORKDIR = flags.DEFINE_string(
    "workdir",
    None,
    "Run directory (default runs/<method>-<dataset>-<model>-eps<eps>). Restarting with the same "
    "flags resumes; other flags in an existing run directory are refused.",
)
TENSORBOARD_EVERY = flags.DEFINE_integer(
    "tensorboard_every",
    RUN["tensorboard_every"],
    "Also write training scalars every N batches (0: per epoch only).",
    lower_bound=0,
)
VERBOSE = flags.DEFINE_enum(
    "verbose",
    "1",
    ["0", "1", "2"],
    "Keras progress: 0 off, 1 bar (a line per epoch when the output is not a terminal), 2 line.",
)

EXPORT = flags.DEFINE_bool(
    "export", True, "Export the best model as a SavedModel for TF-Serving at the end."
)
EXPORT_DIR = flags.DEFINE_string(
    "export_dir",
    None,
    "Where the SavedModel goes: <export_dir>/<name>/<version>/ (default <workdir>/export).",
)

EXPORT_FORMATS = flags.DEFINE_list(
    "export_formats",
    ["saved_model"],
    f"What the export writes, of {', '.join(catalog.EXPORT_FORMATS)}: the SavedModel always, "
    "and beside it model.onnx and model.tflite (with model_int8.tflite); onnx and litert need "
    'pip install -e ".[export]".',
)
INT8_EXAMPLES = flags.DEFINE_integer(
    "int8_examples",
    catalog.INT8_EXAMPLES,
    "Training images the int8 LiteRT file is calibrated on (post-training quantization); 0 "
    "writes no int8 file.",
    lower_bound=0,
)
flags.register_validator(
    "export_formats",
    lambda names: set(names) <= set(catalog.EXPORT_FORMATS) and "saved_model" in names,
    message=f"--export_formats takes names from {', '.join(catalog.EXPORT_FORMATS)} and "
    "includes saved_model (TF-Serving serves its folder; the others are checked against it)",
)

# Flags that may differ between a run and its resumption.
NOT_RUN_DEFINING = (
    "verbose",
    "download",
    "data_dir",
    "export",
    "export_dir",
    "export_formats",
    "int8_examples",
)

ALLOW_LARGE_L2_EPS = flags.DEFINE_bool(
    "allow_large_l2_eps",
    False,
    "Take an L2 --eps of 10% or more of the largest L2 distance between the dataset's images "
    "(√(H·W·C): 28 for Fashion-MNIST) as given: such values are usually L∞ numbers in 1/255 "
    "units typed under --norm=l2 (--eps=8 on 28×28 images is 29% of it). A ball around the "
    "whole image box (100% or more) is refused whatever this says.",
)


common.refuse_unsafe_values(__name__)
common.refuse_pixel_units("eps")
common.refuse_pixel_units("lambda_inv")
