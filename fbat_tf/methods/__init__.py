"""Training methods by name: one module each, one registry line each, importable without
TensorFlow (each method's module loads on first use).

    from fbat_tf import methods
    method = methods.create("fastbat", eps=8 / 255, lambda_inv=5000 / 255, ig_coef=0.1)
    grads, logs = method.gradients(model, x, y, seed)
    methods.entry("nfgsm").options       # what train.py makes flags of: name, type, default, ...
    methods.passes("pgd", {"steps": 10}) # passes through the model of one optimizer step
    methods.check("fastbat", {"lambda_inv": -1.0})  # ValueError, as create() says, no TensorFlow

A method declares here the options a user sets (train.py's flags, TrainConfig's
`method_options`, a sweep definition's flags all follow from them), what one of its steps costs
in passes through the model (DESIGN.md §3.6), the options that change that cost, and its rules
(rules.py: the option values, threat models and strategies it refuses, which `check` asks
without importing its module). Its constructor takes the declared defaults (`defaults(name)`).
Library APIs take ε and λ⁻¹ in pixel units; the command line's 1/255 units are converted by the
options' `from_flag`.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from fbat_tf import catalog
from fbat_tf.catalog import (
    ELLE_ATTACKS,
    ELLE_SCHEDULES,
    IMPLICIT_AUTODIFF,
    IMPLICIT_GRADIENTS,
    LINEARIZATIONS,
    counts,
)
from fbat_tf.methods import rules
from fbat_tf.methods.declarations import Entry, Option
from fbat_tf.methods.rules import check_strategy
from fbat_tf.records import units


def _settle_implicit_autodiff(value: str, on_cpu: bool) -> str:
    from fbat_tf import device  # loads TensorFlow where it asks this machine's devices

    return device.resolve_implicit_autodiff(value, ["CPU"] if on_cpu else None)


def _pgd_passes(config: Mapping[str, Any]) -> dict[str, int]:
    steps = int(config.get("steps", defaults("pgd")["steps"]))
    return counts(steps + 1, steps + 1)  # K input gradients, then the weight gradient


def _fastbat_passes(config: Mapping[str, Any]) -> dict[str, int]:
    config = {**defaults("fastbat"), "implicit_autodiff": IMPLICIT_AUTODIFF[1], **config}
    ig = catalog.implicit_gradient(config["ig"], config["ig_coef"])
    # Step 1's gradient at the random start (none for a uniform or corner z); step 2's
    # lower-level gradient at z and step 3's upper level at δ*.
    gradient_start = config["linearization"] in LINEARIZATIONS[:2]
    parts = [counts(1, 1) if gradient_start else counts(), counts(2, 2)]
    forward_mode = config["implicit_autodiff"] == IMPLICIT_AUTODIFF[2]
    # Step 5's mixed derivative along H ⊙ v, and each conjugate-gradient step's Hessian-vector
    # product: forward and weight passes at z carrying tangents, or back through a recorded
    # backward pass (and, for a product, the forward and backward pass it records).
    implicit = counts(1, 1, tangent=2) if forward_mode else counts(backward=1, second_order=1)
    product = counts(1, 1, tangent=2) if forward_mode else counts(1, 2, 1)
    products = int(config["cg_steps"]) if ig == IMPLICIT_GRADIENTS[1] else 0
    if ig != IMPLICIT_GRADIENTS[2]:
        parts += [implicit, *[product] * products]
    return catalog.added(*parts)


def _elle_passes(config: Mapping[str, Any]) -> dict[str, int]:
    attack = config.get("attack", defaults("elle")["attack"])
    return counts(4, 4) if attack == ELLE_ATTACKS[2] else counts(5, 5)


_FASTBAT = (
    Option(
        "lambda_inv",
        float,
        None,
        "Fast-BAT lower-level step 1/λ in 1/255 units (default 5000 for eps <= 8, 2500 above).",
        "lambda_inv",
        lower_bound=0.0,
        from_flag=lambda value: None if value is None else units.from_per_255(value),
    ),
    Option(
        "ig_coef",
        float,
        0.1,
        "Fast-BAT implicit-gradient coefficient c = α2/(λ·α1).",
        "ig_coef",
        lower_bound=0.0,
    ),
    Option("ig", str, "hessian_free", "Fast-BAT implicit gradient.", "ig", IMPLICIT_GRADIENTS),
    Option(
        "linearization",
        str,
        "pgd_nosign",
        "Fast-BAT linearization point z.",
        "linearization",
        LINEARIZATIONS,
    ),
    Option(
        "cg_steps", int, 3, "Conjugate-gradient steps of --ig=hessian_aware.", "cg_steps", None, 1
    ),
    Option(
        "tau",
        float,
        None,
        "Fast-BAT margin of the inactive-constraint mask in pixel units (default: 1e-7 in "
        "float32).",
        "tau",
        lower_bound=0.0,
    ),
    Option(
        "implicit_autodiff",
        str,
        "auto",
        "How Fast-BAT differentiates its implicit term (both exact). auto: "
        "forward_over_backward on GPU/TPU, backward_over_backward on CPU.",
        "implicit_autodiff",
        IMPLICIT_AUTODIFF,
        on_device=_settle_implicit_autodiff,
    ),
)

# Each method; the flags keep the spellings runs were started with.
REGISTRY: dict[str, Entry] = {
    entry.name: entry
    for entry in (
        Entry("standard", "fbat_tf.methods.standard:Standard", rules=rules.Standard),
        Entry(
            "fastat",
            "fbat_tf.methods.fast_at:FastAT",
            (
                Option(
                    "step",
                    float,
                    1.25,
                    "Fast-AT FGSM step alpha as a multiple of eps (the paper's 1.25).",
                    lower_bound=0.0,
                ),
            ),
            passes=lambda c: counts(2, 2),
            rules=rules.FastAT,
        ),
        Entry(
            "fastat_ga",
            "fbat_tf.methods.fast_at_ga:FastATGradAlign",
            (
                Option(
                    "ga_coef",
                    float,
                    None,
                    "GradAlign coefficient (default 0.2 at eps <= 8, 2.0 at eps >= 16).",
                    "ga_coef",
                    lower_bound=0.0,
                ),
            ),
            # FGSM's, the clean and the noisy (recorded over θ) input gradients and the weight
            # pass, which also runs back through the noisy gradient and its forward.
            passes=lambda c: counts(4, 5, 1),
            rules=rules.FastATGradAlign,
        ),
        Entry(
            "nfgsm",
            "fbat_tf.methods.n_fgsm:NFGSM",
            (
                Option(
                    "noise",
                    float,
                    2.0,
                    "N-FGSM noise: eta ~ U[-k*eps, k*eps] for this k.",
                    lower_bound=0.0,
                ),
                Option(
                    "step",
                    float,
                    1.0,
                    "N-FGSM signed step alpha as a multiple of eps (the paper's 1).",
                    lower_bound=0.0,
                ),
                Option(
                    "clip",
                    float,
                    None,
                    "N-FGSM: clip the perturbation to [-c*eps, c*eps] for this c (default: no "
                    "clip, as the paper trains).",
                    lower_bound=0.0,
                ),
            ),
            passes=lambda c: counts(2, 2),
            rules=rules.NFGSM,
        ),
        Entry(
            "pgd",
            "fbat_tf.methods.pgd_at:PGDAT",
            (
                Option("steps", int, 2, "PGD-AT attack steps K.", "attack_steps", lower_bound=1),
                Option(
                    "step",
                    float,
                    None,
                    "PGD-AT step alpha as a multiple of eps (default 0.5 for K <= 2; 2/255 "
                    "itself for larger K).",
                    lower_bound=0.0,
                ),
            ),
            passes=_pgd_passes,
            cost_options={"steps": 2},
            rules=rules.PGDAT,
        ),
        Entry(
            "free",
            "fbat_tf.methods.free_at:FreeAT",
            (Option("replays", int, 8, "Free-AT replays m.", "free_replays", lower_bound=1),),
            # One backward pass gives the weight and the δ gradient.
            passes=lambda c: counts(1, 1),
            rules=rules.FreeAT,
        ),
        Entry(
            "fastbat",
            "fbat_tf.methods.fast_bat:FastBAT",
            _FASTBAT,
            passes=_fastbat_passes,
            cost_options={"ig": "hessian_free"},
            rules=rules.FastBAT,
        ),
        Entry(
            "elle",
            "fbat_tf.methods.elle:ELLE",
            (
                Option(
                    "weight",
                    float,
                    None,
                    "ELLE penalty weight λ; ELLE-A's λ_max (default: 4000 for ELLE-A; ELLE's "
                    "1000 at eps <= 8, 5000 at eps <= 20, 10000 above).",
                    "elle_lambda",
                    lower_bound=0.0,
                ),
                Option(
                    "schedule",
                    str,
                    "adaptive",
                    "ELLE's λ: adaptive (ELLE-A: 0, raised to λ_max when the linearity error "
                    "jumps, else decayed) or constant (ELLE).",
                    choices=ELLE_SCHEDULES,
                ),
                Option(
                    "decay",
                    float,
                    0.99,
                    "ELLE-A: λ ← decay·λ on a step without a jump.",
                    lower_bound=0.0,
                ),
                Option(
                    "sensitivity",
                    float,
                    2.0,
                    "ELLE-A: a jump is a linearity error above mean + this many std of the "
                    "earlier ones.",
                    lower_bound=0.0,
                ),
                Option(
                    "attack",
                    str,
                    "fgsm",
                    "ELLE's training point: one FGSM step from x, N-FGSM's step (noise 2·eps), "
                    "or none (x itself).",
                    choices=ELLE_ATTACKS,
                ),
                Option(
                    "step",
                    float,
                    1.0,
                    "ELLE's attack step alpha as a multiple of eps (the released 1).",
                    lower_bound=0.0,
                ),
            ),
            # The attack's input gradient (none on clean inputs), then one weight pass through
            # the training point's batch and the triplets' batch of 3B examples (3 passes).
            passes=_elle_passes,
            cost_options={"attack": "fgsm"},
            rules=rules.ELLE,
        ),
        Entry(
            "fgsm_pgi",
            "fbat_tf.methods.fgsm_pgi:FGSMPGI",
            (
                Option(
                    "weight",
                    float,
                    10.0,
                    "FGSM-PGI regularizer weight λ on the squared gap between the logits at the "
                    "adversarial example and at the prior (the released 10).",
                    "fgsm_pgi_lambda",
                    lower_bound=0.0,
                ),
                Option(
                    "decay",
                    float,
                    0.3,
                    "FGSM-PGI momentum decay μ of the per-example prior (the released 0.3).",
                    lower_bound=0.0,
                ),
                Option(
                    "step",
                    float,
                    1.0,
                    "FGSM-PGI signed step alpha as a multiple of eps (the released 1).",
                    lower_bound=0.0,
                ),
                Option(
                    "reset",
                    int,
                    40,
                    "FGSM-PGI: each example's prior restarts from a random corner every this "
                    "many epochs (its visits; the released 40).",
                    lower_bound=1,
                ),
            ),
            # The input gradient at the prior, then one weight pass back through both forward
            # passes (the regularizer reads the logits at the prior as well).
            passes=lambda c: counts(2, 3),
            rules=rules.FGSMPGI,
        ),
    )
}


def register(entry: Entry) -> None:
    """Add a method at run time (a line of REGISTRY does the same in the package)."""
    if entry.name in REGISTRY:
        raise ValueError(f"a method named {entry.name!r} exists already")
    taken = {e.flag_name(o) for e in REGISTRY.values() for o in e.options}
    clashing = sorted(taken & {entry.flag_name(o) for o in entry.options})
    if clashing:
        raise ValueError(f"method {entry.name!r}: flags {clashing} belong to another method")
    REGISTRY[entry.name] = entry


def names() -> list[str]:
    return list(REGISTRY)


def entry(name: str) -> Entry:
    if name not in REGISTRY:
        raise ValueError(f"unknown method {name!r}; choose one of {names()}")
    return REGISTRY[name]


def option_names(name: str) -> list[str]:
    """The options of method `name` a user sets, in order."""
    return [option.name for option in entry(name).options]


def defaults(name: str) -> dict[str, Any]:
    """The declared default of each option of method `name`: its constructor's defaults."""
    return entry(name).defaults()


def create(name: str, eps: float = catalog.EPS, norm: str = "linf", **options: Any):
    """The method `name` with budget ε (pixel units) under the norm `norm` ("linf", or "l2"
    for the methods with an L2 form: ValueError saying why for the others) and its options
    (None = default)."""
    found = entry(name)
    given = _given(name, options)
    module, attribute = found.target.split(":")
    cls = getattr(importlib.import_module(module), attribute)
    # A method with one norm has no `norm` keyword; it is told in one line before it is made.
    if len(cls.norms) > 1:
        given["norm"] = norm
    else:
        cls.check_norm(norm)
    return cls(eps=eps, **given)


def _given(name: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """The options set (not None); ValueError naming those the method does not take."""
    unknown = sorted(set(options) - set(option_names(name)))
    if unknown:
        raise ValueError(
            f"method {name!r} takes no option(s) {unknown}; it takes {option_names(name)}"
        )
    return {key: value for key, value in options.items() if value is not None}


def check(
    name: str,
    options: Mapping[str, Any],
    eps: float = catalog.EPS,
    norm: str = "linf",
    strategy: str = "default",
) -> None:
    """ValueError, with its message, for what `create(name, eps, norm, **options)` refuses (an
    option's value, a norm the method has no form for, ε), or for a distribution strategy the
    method cannot run under: asked of the method's rules, without TensorFlow, unless the method
    was registered without them (`needs_tensorflow`), when it is created for it."""
    found = entry(name)
    given = _given(name, options)
    if found.rules is None:
        check_strategy(create(name, eps, norm, **options), strategy)
        return
    found.rules.check(eps, norm, {**found.defaults(), **given})
    check_strategy(found.rules, strategy)


def needs_tensorflow(name: str) -> bool:
    """Whether `check` creates method `name` (loading TensorFlow): it has no rules."""
    return entry(name).rules is None


def passes(name: str, config: Mapping[str, Any]) -> dict[str, int]:
    """Passes through the model of one optimizer step of method `name` with hyper-parameters
    `config` (a method's config, a run's recorded one as fbat_tf/upgrade.py reads it, or a
    sweep cell's flags: missing options count as their defaults; Fast-BAT's implicit autodiff as
    on a CPU, where every committed run was made)."""
    return entry(name).passes(config)


def cost_variant(name: str, config: Mapping[str, Any]) -> str:
    """The method with the options that change what a step costs, as bench/step_time.py names
    its variants ("fastbat ig=none", "pgd steps=10"): a sweep report prices a run by it.
    `config`: a method's config, or a run's recorded one as fbat_tf/upgrade.py reads it (options
    it lacks count as plain)."""
    plain = entry(name).cost_options
    differing = [f"{k}={config[k]}" for k, value in plain.items() if config.get(k, value) != value]
    return " ".join([name, *differing])


__all__ = [
    "Entry",
    "Option",
    "check",
    "check_strategy",
    "cost_variant",
    "create",
    "defaults",
    "entry",
    "names",
    "needs_tensorflow",
    "option_names",
    "passes",
    "register",
]
