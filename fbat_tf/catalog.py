"""The names a user can choose, importable without TensorFlow.

The entry points define their flags from these tuples, so that a bad flag or a bad sweep
definition is refused in a fraction of a second, before TensorFlow loads. Each registry that
builds the named things (`data`, `models`, `distribute`, `methods.fast_bat`) holds exactly
these names in this order; tests/test_catalog.py checks that they agree. Methods and attacks
are named, with their options, in their own registries (`fbat_tf.methods`, `fbat_tf.attacks`),
which load no TensorFlow either.
"""

from __future__ import annotations

from collections.abc import Mapping

DATASETS = ("cifar10", "cifar100", "svhn", "tiny_imagenet", "imagenet", "mnist", "fashion_mnist")
# Datasets decoded per example from TFDS rather than held in memory: their validation split
# comes from the training split only.
STREAMED_DATASETS = ("imagenet",)
MODELS = (
    "preact_resnet18",
    "preact_resnet34",
    "preact_resnet50",
    "wide_resnet16_8",
    "wide_resnet22_8_fastbat",
    "wide_resnet28_10",
    "wide_resnet34_10",
    "wide_resnet",
    "resnet50",
    "small_cnn",
)
ACTIVATIONS = ("relu", "softplus", "swish")
# Threat models: the norm of the perturbation ball (fbat_tf/constraints.py, records/units.py).
NORMS = ("linf", "l2")
# Where a run's validation split comes from: the training split's last tenth, or half the test
# split (data.load's `validation_from`, a model card's).
VALIDATION_SOURCES = ("train", "test")


def check_norm(norm: str) -> str:
    """`norm` if it is one of NORMS, else ValueError naming them."""
    if norm not in NORMS:
        raise ValueError(f"unknown norm {norm!r}; one of {', '.join(NORMS)}")
    return norm


STRATEGIES = ("default", "mirrored", "multi_worker", "tpu")
# The perturbation budget ε unless told otherwise, in pixel units: 8/255 under L∞ (the command
# line's --eps=8). TrainConfig's default, and so train.py's flag's, and `methods.create`'s.
EPS = 8 / 255
# PGD-K-R as evaluations run it unless told otherwise: PGD-50-10 (DESIGN.md §4.2). Every default
# of PGD's steps and restarts (the attack, its registry options, train.py's final test, a sweep
# definition's evaluation) is this one.
PGD_STEPS, PGD_RESTARTS = 50, 10
# PGD's step size unless told otherwise, as a multiple of ε: ε/4 (DESIGN.md §4.2; a signed step
# under L∞, a normalized one under L2). The attack's default, and what a model card states of
# train.py's test.
PGD_STEP_SIZE = 1 / 4

# What train.py and `python -m export` write (DESIGN.md §5.4): the SavedModel always (TF-Serving
# serves its folder, and the other formats are checked against it), ONNX and LiteRT beside it on
# request; "litert" writes a float32 file and, calibrated on training images, an int8 one.
EXPORT_FORMATS = ("saved_model", "onnx", "litert")
# Training images the int8 LiteRT file is calibrated on unless told otherwise: the default of
# train.py's and `python -m export`'s --int8_examples.
INT8_EXAMPLES = 500
# The Python packages each extra format needs, to write it and to run it; `pip install -e
# ".[export]"` installs them all.
EXPORT_WRITERS = {"onnx": ("tf2onnx", "onnx"), "litert": ()}
EXPORT_RUNTIMES = {"onnx": ("onnxruntime",), "litert": ("ai_edge_litert",)}
# The suffix of each format's files: any such file can be evaluated, not only an export's.
ARTIFACT_SUFFIXES = {".onnx": "onnx", ".tflite": "litert"}


def artifact_format(path: str) -> str | None:
    """The format of a model file by its suffix ("onnx", "litert"), else None."""
    suffix = path[path.rfind(".") :].lower() if "." in path else ""
    return ARTIFACT_SUFFIXES.get(suffix)


# Fast-BAT's choices (DESIGN.md §3).
IMPLICIT_GRADIENTS = ("hessian_free", "hessian_aware", "none")
LINEARIZATIONS = ("pgd_nosign", "pgd_sign", "uniform", "corner")
# How Fast-BAT differentiates its implicit term; "auto" is resolved by device.py.
IMPLICIT_AUTODIFF = ("auto", "backward_over_backward", "forward_over_backward")


def implicit_gradient(ig: str, ig_coef: float) -> str:
    """The implicit gradient Fast-BAT computes given its `ig` and `ig_coef`: none with a zero
    coefficient (first-order Fast-BAT), whatever `ig` says."""
    return IMPLICIT_GRADIENTS[2] if float(ig_coef) == 0 else ig


# ELLE's λ (adaptive: ELLE-A) and its training point's attack (DESIGN.md §3.2).
ELLE_SCHEDULES = ("adaptive", "constant")
ELLE_ATTACKS = ("fgsm", "nfgsm", "none")

# What one optimizer step costs in passes through the model (DESIGN.md §3.6), by kind:
# "forward", "backward" (a vector-Jacobian product through the model: the gradient of a loss of
# its outputs), "second_order" (a backward pass through a recorded backward pass, as double
# backpropagation makes one) and "tangent" (a forward-mode tangent carried through a forward or
# a backward pass). Double backpropagation is one second-order pass plus one more backward pass
# through the forward it started from. A machine's load cannot move these counts;
# each method declares its own (fbat_tf.methods); tests/test_passes.py counts them on the model
# for every method.
PASS_KINDS = ("forward", "backward", "second_order", "tangent")


def counts(forward: int = 0, backward: int = 0, second_order: int = 0, tangent: int = 0):
    """A count of passes, by kind."""
    return dict(zip(PASS_KINDS, (forward, backward, second_order, tangent), strict=True))


def added(*found: Mapping[str, int]) -> dict[str, int]:
    """Pass counts summed kind by kind."""
    return {kind: sum(c[kind] for c in found) for kind in PASS_KINDS}


def total_passes(found: Mapping[str, int]) -> int:
    """The passes of a count, each kind counted as one pass through the model."""
    return sum(found.get(kind, 0) for kind in PASS_KINDS)
