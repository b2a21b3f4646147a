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


# What one optimizer step costs in passes through the model (DESIGN.md §3.6), by kind:
# "forward", "backward" (a vector-Jacobian product through the model: the gradient of a loss of
# its outputs), "second_order" (a backward pass through a recorded backward pass, as double
# backpropagation makes one) and "tangent" (a forward-mode tangent carried through a forward or
# a backward pass). Double backpropagation is one second-order pass plus one more backward pass
# through the forward it started from. A machine's load cannot move these counts;
# tests/test_passes.py counts them on the model for every method.
PASS_KINDS = ("forward", "backward", "second_order", "tangent")


def passes(method: str, config: Mapping[str, Any]) -> dict[str, int]:
    """Passes through the model of one optimizer step of `method` with hyper-parameters
    `config` (a method's config, or a run's recorded one: missing options count as their
    defaults; Fast-BAT's implicit autodiff as on a CPU, where every committed run was made)."""
    counts = dict.fromkeys(PASS_KINDS, 0)

    def add(forward=0, backward=0, second_order=0, tangent=0):
        for kind, n in zip(PASS_KINDS, (forward, backward, second_order, tangent), strict=True):
            counts[kind] += n

    if method in ("standard", "free"):
        add(1, 1)  # Free-AT: one backward pass gives the weight and the δ gradient
    elif method in ("fastat", "nfgsm"):
        add(2, 2)  # the signed step's input gradient, then the weight gradient
    elif method == "pgd":
        steps = int(config.get("steps", COST_OPTIONS["pgd"]["steps"]))
        add(steps + 1, steps + 1)
    elif method == "fastat_ga":
        # FGSM, the clean input gradient, the noisy one recorded over θ, the weight pass; the
        # weight pass also runs back through the noisy gradient (second order) and its forward.
        add(4, 5, 1)
    elif method == "fastbat":
        linearization = config.get("linearization", "pgd_nosign")
        ig = config.get("ig", "hessian_free")
        if float(config.get("ig_coef", 0.1)) == 0:
            ig = "none"
        if linearization in ("pgd_nosign", "pgd_sign"):
            add(1, 1)  # step 1: the gradient at the random start
        add(2, 2)  # step 2's lower-level gradient at z, step 3's upper level at δ*
        forward_mode = config.get("implicit_autodiff") == "forward_over_backward"
        hvps = int(config.get("cg_steps", 3)) if ig == "hessian_aware" else 0
        if ig != "none":
            # Step 5: the mixed derivative along H ⊙ v.
            if forward_mode:
                add(1, 1, tangent=2)  # a forward and a weight pass at z, with tangents
            else:
                add(backward=1, second_order=1)  # back through step 2's recorded pass
        for _ in range(hvps):  # conjugate gradient: one Hessian-vector product a step
            if forward_mode:
                add(1, 1, tangent=2)
            else:
                add(1, 2, 1)
    else:
        raise ValueError(f"unknown method {method!r}; choose one of {METHODS}")
    return counts


def total_passes(counts: Mapping[str, int]) -> int:
    """The passes of a `passes` count, each kind counted as one pass through the model."""
    return sum(counts.get(kind, 0) for kind in PASS_KINDS)
