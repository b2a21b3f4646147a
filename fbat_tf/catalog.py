"""The names a user can choose, importable without TensorFlow.

The entry points define their flags from these tuples, so that a bad flag or a bad sweep
definition is refused in a fraction of a second, before TensorFlow loads. Each registry that
builds the named things (`data`, `models`, `methods`, `attacks`, `distribute`,
`methods.fast_bat`) holds
exactly these names in this order; tests/test_catalog.py checks that they agree. Attacks are
named in their own registry, `fbat_tf.attacks`, which loads no TensorFlow either.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

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
METHODS = ("standard", "fastat", "fastat_ga", "nfgsm", "pgd", "free", "fastbat")
STRATEGIES = ("default", "mirrored", "multi_worker", "tpu")

# Fast-BAT's choices (DESIGN.md §3).
IMPLICIT_GRADIENTS = ("hessian_free", "hessian_aware", "none")
LINEARIZATIONS = ("pgd_nosign", "pgd_sign", "uniform", "corner")
# How Fast-BAT differentiates its implicit term; "auto" is resolved by device.py.
IMPLICIT_AUTODIFF = ("auto", "backward_over_backward", "forward_over_backward")

# The options that change what a method's step costs, each with the value the method's plain
# name stands for. A variant is named as bench/step_time.py names it: the method, then each such
# option that differs ("fastbat ig=none", "pgd steps=10"); a sweep report prices a run by it.
COST_OPTIONS: dict[str, dict[str, Any]] = {"fastbat": {"ig": "hessian_free"}, "pgd": {"steps": 2}}


def cost_variant(method: str, config: Mapping[str, Any]) -> str:
    """The cost variant of `method` with hyper-parameters `config` (a run's recorded method
    config: options it lacks count as their plain values)."""
    plain = COST_OPTIONS.get(method, {})
    differing = [f"{k}={config[k]}" for k, value in plain.items() if config.get(k, value) != value]
    return " ".join([method, *differing])
