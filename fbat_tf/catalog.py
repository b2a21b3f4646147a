"""The names a user can choose, importable without TensorFlow.

The entry points define their flags from these tuples, so that a bad flag or a bad sweep
definition is refused in a fraction of a second, before TensorFlow loads. Each registry that
builds the named things (`data`, `models`, `methods`, `attacks`, `distribute`,
`methods.fast_bat`) holds
exactly these names in this order; tests/test_catalog.py checks that they agree. Attacks are
named in their own registry, `fbat_tf.attacks`, which loads no TensorFlow either.
"""

from __future__ import annotations

DATASETS = ("cifar10", "cifar100", "svhn", "tiny_imagenet", "imagenet", "mnist", "fashion_mnist")
MODELS = (
    "preact_resnet18",
    "preact_resnet34",
    "preact_resnet50",
    "wide_resnet16_8",
    "wide_resnet28_10",
    "wide_resnet34_10",
    "wide_resnet",
    "resnet50",
    "small_cnn",
)
ACTIVATIONS = ("relu", "softplus", "swish")
METHODS = ("standard", "fastat", "fastat_ga", "pgd", "free", "fastbat")
STRATEGIES = ("default", "mirrored", "multi_worker", "tpu")

# Fast-BAT's choices (DESIGN.md §3).
IMPLICIT_GRADIENTS = ("hessian_free", "hessian_aware", "none")
LINEARIZATIONS = ("pgd_nosign", "pgd_sign", "uniform", "corner")
# How Fast-BAT differentiates its implicit term; "auto" is resolved by device.py.
IMPLICIT_AUTODIFF = ("auto", "backward_over_backward", "forward_over_backward")
