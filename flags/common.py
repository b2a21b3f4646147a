"""Flags shared by train.py and evaluate.py, with validators that fail before any work.

On the command line an L∞ ε is in 1/255 units (`--eps=8` means 8/255) for every dataset, and an
L2 ε (`--norm=l2`) in [0, 1]-pixel units over the whole image (`--eps=0.5`: RobustBench's
CIFAR-10 budget); fbat_tf/records/units.py converts them.
"""

from __future__ import annotations

import dataclasses
import math
import os

from absl import flags

from fbat_tf import catalog
from fbat_tf.records import TrainConfig

# The run's defaults, written once, in TrainConfig: every flag that sets a field of it takes the
# field's default (ε's flag converts it to 1/255 units; the precision, XLA and verbosity aside:
# their flags add "auto").
RUN = {
    field.name: field.default
    for field in dataclasses.fields(TrainConfig)
    if field.default is not dataclasses.MISSING
}

DATASET = flags.DEFINE_enum("dataset", RUN["dataset"], list(catalog.DATASETS), "Dataset name.")
DATA_DIR = flags.DEFINE_string(
    "data_dir",
    RUN["data_dir"],
    "Directory with local dataset files (CIFAR python tarball or folder, MNIST-style IDX .gz "
    "files, tiny-imagenet-200/) or prepared TFDS data. Default: the standard places.",
)
DOWNLOAD = flags.DEFINE_bool(
    "download", RUN["download"], "Let TFDS download a dataset that is neither local nor prepared."
)
VALIDATION_FROM = flags.DEFINE_enum(
    "validation_from",
    RUN["validation_from"],
    ["train", "test"],
    "Where model selection's validation examples come from. train: the training split's last "
    "10%. test: half of each class of the test split, drawn by a fixed seed, with training on "
    "the whole training split and testing on the other half (how the paper's released code "
    "splits Tiny-ImageNet). evaluate.py defaults to the run's.",
)
flags.register_multi_flags_validator(
    ["validation_from", "dataset"],
    lambda f: f["validation_from"] != "test" or f["dataset"] not in catalog.STREAMED_DATASETS,
    message="--validation_from=test needs a dataset held in memory; "
    f"{', '.join(catalog.STREAMED_DATASETS)} take validation from the training split",
)
BATCH_SIZE = flags.DEFINE_integer(
    "batch_size", RUN["batch_size"], "Global batch size.", lower_bound=1
)
SEED = flags.DEFINE_integer(
    "seed",
    RUN["seed"],
    "Seed of weights, data order and every random draw.",
    lower_bound=0,
    upper_bound=2**31 - 1,  # what TensorFlow's and NumPy's seeds take
)
PRECISION = flags.DEFINE_enum(
    "precision",
    "auto",
    ["auto", "float32", "mixed_float16", "mixed_bfloat16"],
    "Keras dtype policy. auto: mixed_bfloat16 on GPUs of compute capability >= 8.0, "
    "mixed_float16 on older GPUs, float32 on CPU.",
)
JIT_COMPILE = flags.DEFINE_enum(
    "jit_compile",
    "auto",
    ["auto", "true", "false"],
    "XLA compilation of the training step and the attacks. auto: on GPU, and for evaluate.py's "
    "FAB-T and Square on CPU too when the model has no convolutions.",
)
NORM = flags.DEFINE_enum(
    "norm",
    RUN["norm"],
    list(catalog.NORMS),
    "Threat model: the norm of the perturbation ball. linf: --eps in 1/255 units (8 means "
    "8/255). l2: --eps in [0, 1]-pixel units, the L2 norm over all of an image's pixels (0.5 is "
    "RobustBench's CIFAR-10 budget). Training (PGD-AT, Fast-AT and standard training have an "
    "L2 form), its validation and its final test all use it.",
)
STRATEGY = flags.DEFINE_enum(
    "strategy",
    RUN["strategy"],
    list(catalog.STRATEGIES),
    "tf.distribute strategy; --batch_size is the global batch, split over the replicas "
    "(see BUILD.md).",
)


def option_flag(
    name: str,
    default,
    help_text: str,
    choices=None,
    lower_bound: float | None = None,
    kind: type | None = None,
) -> flags.FlagHolder:
    """The flag of a declared option (a method's or an attack's): an enum where it has
    choices, else by its type (`kind`, or its default's)."""
    kind = kind or type(default)
    if choices:
        holder = flags.DEFINE_enum(name, default, list(choices), help_text)
    elif kind is bool:
        holder = flags.DEFINE_bool(name, default, help_text)
    elif kind in (int, float):
        define = flags.DEFINE_integer if kind is int else flags.DEFINE_float
        holder = define(name, default, help_text, lower_bound=lower_bound)
    else:
        holder = flags.DEFINE_string(name, default, help_text)
    _guard(flags.FLAGS[name])  # defined after this module's own flags were guarded
    return holder


ALLOW_SMALL_UNITS = flags.DEFINE_bool(
    "allow_small_units",
    False,
    "Take --eps below 1 and --lambda_inv below 255 as given: both are in 1/255 units (an L∞ "
    "--eps), so such values are usually [0, 1]-pixel numbers typed by mistake (--eps=0.03 "
    "trains at 0.03/255). An L2 --eps is in pixel units and is never refused so.",
)
# Below these, a value in 1/255 units is most likely a [0, 1]-pixel number: ε = 0.03 means
# 8/255 in most libraries, λ⁻¹ = 9.8 means 2500/255.
SMALL_UNITS = {"eps": 1.0, "lambda_inv": 255.0}


def units_problem(name: str, values: list[float], allowed: bool) -> str | None:
    """The one-line refusal of a 1/255-unit flag given what looks like pixel units, or None."""
    floor = SMALL_UNITS[name]
    small = [v for v in values if v is not None and v < floor]
    if allowed or not small:
        return None
    pixels = small[0]
    meant = float(f"{pixels * 255:.3g}")
    l2 = " (or --norm=l2, whose ε is in pixel units)" if name == "eps" else ""
    return (
        f"--{name}={pixels:g}: {'ε' if name == 'eps' else 'λ⁻¹'} is in 1/255 units, so this is "
        f"{pixels:g}/255 ≈ {pixels / 255:.2g}: did you mean --{name}={meant:g} "
        f"({meant:g}/255 ≈ {pixels:.3g}){l2}? Pass --allow_small_units to keep {pixels:g}/255"
    )


# An L2 ε of this share or more of the largest L2 distance in an image's [0, 1] box, √(H·W·C),
# is most likely an L∞ number in 1/255 units typed under --norm=l2 (ε = 8 on 28×28 images is
# 29 % of it; L2 budgets are a few percent: 1.5 on Fashion-MNIST 5.4 %, 0.5 on CIFAR-10 0.9 %).
# At 100 % or more the ball holds the whole box, and no flag keeps it.
LARGE_L2_SHARE = 0.10


def l2_budget_problem(eps: float, dataset: str, allowed: bool) -> str | None:
    """The one-line refusal of an L2 ε that holds the whole [0, 1] box of `dataset`'s images,
    or (unless `allowed`) is LARGE_L2_SHARE of its diameter or more; else None."""
    from fbat_tf import data

    if dataset not in data.names():
        return None
    height, width, channels = data.info(dataset).image_shape
    largest = math.sqrt(height * width * channels)
    share = eps / largest
    where = (
        f"{share:.1%} of the largest L2 distance between {height}×{width}×{channels} images "
        f"in [0, 1] (√{height * width * channels} ≈ {largest:.3g})"
    )
    if share >= 1:
        return (
            f"--eps={eps:g} under --norm=l2 is {where}: the ball holds every image, so nothing "
            "is robust to it; give an L2 budget in [0, 1]-pixel units, a few percent of that "
            "(e.g. 1.5 for Fashion-MNIST, 0.5 for CIFAR-10)"
        )
    if share >= LARGE_L2_SHARE and not allowed:
        return (
            f"--eps={eps:g} under --norm=l2 is {where}, {LARGE_L2_SHARE:.0%} or more: an L∞ "
            f"number in 1/255 units? L2 budgets are a few percent of it (1.5 for Fashion-MNIST, "
            f"0.5 for CIFAR-10); did you mean --norm=linf --eps={eps:g}? Pass "
            f"--allow_large_l2_eps to keep --eps={eps:g} (L2)"
        )
    return None


def refuse_pixel_units(name: str, parse=lambda value: [value]) -> None:
    """A validator refusing `name` below its floor in SMALL_UNITS unless --allow_small_units;
    an ε under --norm=l2, in pixel units, is not refused, nor one without a --norm (evaluate.py,
    whose attacks take the model's own norm: it checks ε once it has read the model's)."""

    def check(values: dict) -> bool:
        given = values[name]
        if name == "eps" and values[NORM.name] != "linf":
            return True
        found = units_problem(
            name, [] if given is None else parse(given), values[ALLOW_SMALL_UNITS.name]
        )
        if found:
            raise flags.ValidationError(found)
        return True

    flags.register_multi_flags_validator([name, ALLOW_SMALL_UNITS.name, NORM.name], check)


def eps_flag(name: str, default: float, help_text: str) -> flags.FlagHolder:
    """A perturbation budget in (0, 255]: 1/255 units under L∞, pixel units under L2."""
    holder = flags.DEFINE_float(
        name,
        default,
        help_text + " In 1/255 units (8 means 8/255); with --norm=l2 in [0, 1]-pixel units, the "
        "L2 norm over the image (0.5 means ‖δ‖₂ ≤ 0.5).",
    )
    flags.register_validator(
        name,
        lambda value: value is None or 0 < value <= 255,
        message=f"--{name} must be in (0, 255] (1/255 units; pixel units with --norm=l2)",
    )
    _guard(flags.FLAGS[name])
    return holder


def _existing_dir(value: str | None) -> bool:
    return value is None or os.path.isdir(value)


flags.register_validator(
    "data_dir", _existing_dir, message="--data_dir must name an existing directory"
)


def _finite(value) -> bool:
    return value is None or math.isfinite(value)


def _one_line(value) -> bool:
    values = value if isinstance(value, list) else [value]
    return all(not isinstance(v, str) or not ({"\n", "\r", "\0"} & set(v)) for v in values)


def refuse_unsafe_values(module_name: str) -> None:
    """Validators for every flag the module defines: a float must be a finite number (NaN
    passes any bound), and a text value must hold no line break or NUL, which would write
    extra lines into flags.txt and the recorded commands."""
    for flag in flags.FLAGS.get_flags_for_module(module_name):
        _guard(flag)


_GUARDED: set[str] = set()


def _guard(flag: flags.Flag) -> None:
    if flag.name in _GUARDED:
        return
    _GUARDED.add(flag.name)
    if flag.flag_type() == "float":
        flags.register_validator(
            flag.name, _finite, message=f"--{flag.name} must be a finite number"
        )
    elif flag.flag_type() in ("string", "multi_string") or "list" in flag.flag_type():
        flags.register_validator(
            flag.name, _one_line, message=f"--{flag.name} must not hold a line break"
        )


refuse_unsafe_values(__name__)
