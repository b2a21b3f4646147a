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
METHODS = ("standard", "fastat", "fastat_ga", "nfgsm", "pgd", "free", "fastbat")
STRATEGIES = ("default", "mirrored", "multi_worker", "tpu")
# PGD-K-R as evaluations run it unless told otherwise: PGD-50-10 (DESIGN.md §4.2). Every default
# of PGD's steps and restarts (the attack, its registry options, train.py's final test, a sweep
# definition's evaluation) is this one.
PGD_STEPS, PGD_RESTARTS = 50, 10

# Fast-BAT's choices (DESIGN.md §3).
IMPLICIT_GRADIENTS = ("hessian_free", "hessian_aware", "none")
LINEARIZATIONS = ("pgd_nosign", "pgd_sign", "uniform", "corner")
# How Fast-BAT differentiates its implicit term; "auto" is resolved by device.py.
IMPLICIT_AUTODIFF = ("auto", "backward_over_backward", "forward_over_backward")

# The options that change what a method's step costs, each with the value the method's plain
# name stands for. A variant is named as bench/step_time.py names it: the method, then each such
# option that differs ("fastbat ig=none", "pgd steps=10"); a sweep report prices a run by it.
COST_OPTIONS: dict[str, dict[str, Any]] = {"fastbat": {"ig": "hessian_free"}, "pgd": {"steps": 2}}


# Runs recorded before a method stated an option in the form it now does: Fast-BAT with a zero
# implicit coefficient is first-order Fast-BAT (ig "none"), which its config said only lately.
_RECORDED_AS_NOW = {
    "fastbat": lambda config: (
        {**config, "ig": "none"} if float(config.get("ig_coef", 0.1)) == 0 else config
    ),
}


def recorded_config(method: str, config: Mapping[str, Any]) -> Mapping[str, Any]:
    """A run's recorded method config in the form the method states it now."""
    return _RECORDED_AS_NOW.get(method, lambda found: found)(config)


def cost_variant(method: str, config: Mapping[str, Any]) -> str:
    """The cost variant of `method` with hyper-parameters `config` (a run's recorded method
    config: options it lacks count as their plain values)."""
    config = recorded_config(method, config)
    plain = COST_OPTIONS.get(method, {})
    differing = [f"{k}={config[k]}" for k, value in plain.items() if config.get(k, value) != value]
    return " ".join([method, *differing])


# What one optimizer step costs in passes through the model (DESIGN.md §3.6), by kind:
# "forward", "backward" (a vector-Jacobian product through the model: the gradient of a loss of
# its outputs), "second_order" (a backward pass through a recorded backward pass, as double
# backpropagation makes one) and "tangent" (a forward-mode tangent carried through a forward or
# a backward pass). Double backpropagation is one second-order pass plus one more backward pass
# through the forward it started from. A machine's load cannot move these counts;
# tests/test_passes.py counts them on the model for every method.
PASS_KINDS = ("forward", "backward", "second_order", "tangent")


def _counts(forward: int = 0, backward: int = 0, second_order: int = 0, tangent: int = 0):
    return dict(zip(PASS_KINDS, (forward, backward, second_order, tangent), strict=True))


def _added(*counts: Mapping[str, int]) -> dict[str, int]:
    return {kind: sum(c[kind] for c in counts) for kind in PASS_KINDS}


def _pgd_passes(config: Mapping[str, Any]) -> dict[str, int]:
    steps = int(config.get("steps", COST_OPTIONS["pgd"]["steps"]))
    return _counts(steps + 1, steps + 1)  # K input gradients, then the weight gradient


def _fastbat_passes(config: Mapping[str, Any]) -> dict[str, int]:
    ig = config.get("ig", "hessian_free")
    # Step 1's gradient at the random start (none for a uniform or corner z); step 2's
    # lower-level gradient at z and step 3's upper level at δ*.
    gradient_start = config.get("linearization", "pgd_nosign") in LINEARIZATIONS[:2]
    parts = [_counts(1, 1) if gradient_start else _counts(), _counts(2, 2)]
    forward_mode = config.get("implicit_autodiff") == IMPLICIT_AUTODIFF[2]
    # Step 5's mixed derivative along H ⊙ v, and each conjugate-gradient step's Hessian-vector
    # product: forward and weight passes at z carrying tangents, or back through a recorded
    # backward pass (and, for a product, the forward and backward pass it records).
    implicit = _counts(1, 1, tangent=2) if forward_mode else _counts(backward=1, second_order=1)
    product = _counts(1, 1, tangent=2) if forward_mode else _counts(1, 2, 1)
    products = int(config.get("cg_steps", 3)) if ig == IMPLICIT_GRADIENTS[1] else 0
    if ig != IMPLICIT_GRADIENTS[2]:
        parts += [implicit, *[product] * products]
    return _added(*parts)


# One optimizer step of each method; Free-AT's one backward pass gives the weight and the δ
# gradient; GradAlign makes FGSM's, the clean and the noisy (recorded over θ) input gradients
# and the weight pass, which also runs back through the noisy gradient and its forward.
_PASSES = {
    "standard": lambda config: _counts(1, 1),
    "fastat": lambda config: _counts(2, 2),
    "fastat_ga": lambda config: _counts(4, 5, 1),
    "nfgsm": lambda config: _counts(2, 2),
    "pgd": _pgd_passes,
    "free": lambda config: _counts(1, 1),
    "fastbat": _fastbat_passes,
}


def passes(method: str, config: Mapping[str, Any]) -> dict[str, int]:
    """Passes through the model of one optimizer step of `method` with hyper-parameters
    `config` (a method's config, or a run's recorded one: missing options count as their
    defaults; Fast-BAT's implicit autodiff as on a CPU, where every committed run was made)."""
    if method not in _PASSES:
        raise ValueError(f"unknown method {method!r}; choose one of {METHODS}")
    return _PASSES[method](recorded_config(method, config))


def total_passes(counts: Mapping[str, int]) -> int:
    """The passes of a `passes` count, each kind counted as one pass through the model."""
    return sum(counts.get(kind, 0) for kind in PASS_KINDS)
