"""Training methods by name: one module each, one registry line each, importable without
TensorFlow (each module names TensorFlow through fbat_tf/lazy.py; it loads at first use).

    from fbat_tf import methods
    method = methods.create("fastbat", eps=8 / 255, lambda_inv=5000 / 255, ig_coef=0.1)
    grads, logs = method.gradients(model, x, y, seed)
    methods.entry("nfgsm").options       # what train.py makes flags of: name, type, default, ...
    methods.passes("pgd", {"steps": 10}) # passes through the model of one optimizer step
    methods.check("fastbat", {"lambda_inv": -1.0})  # ValueError, as create() says, no TensorFlow

A method's module declares all of it: its class, with its rules (the option values, threat
models and strategies it refuses, rules.Rules, which `check` asks without TensorFlow), and its
`ENTRY` (declarations.Entry): the options a user sets (train.py's flags, TrainConfig's
`method_options`, a sweep definition's flags all follow from them), what one of its steps costs
in passes through the model (DESIGN.md §3.6) and the options that change that cost. Its
constructor takes the declared defaults (`defaults(name)`).
Library APIs take ε and λ⁻¹ in pixel units; the command line's 1/255 units are converted by the
options' `from_flag`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fbat_tf import catalog
from fbat_tf.methods import (
    elle,
    fast_at,
    fast_at_ga,
    fast_bat,
    fgsm_pgi,
    free_at,
    n_fgsm,
    pgd_at,
    standard,
)
from fbat_tf.methods.declarations import Entry, Option
from fbat_tf.methods.rules import check_strategy

# Each method, declared in its own module; the flags keep the spellings runs were started with.
REGISTRY: dict[str, Entry] = {
    entry.name: entry
    for entry in (
        standard.ENTRY,
        fast_at.ENTRY,
        fast_at_ga.ENTRY,
        n_fgsm.ENTRY,
        pgd_at.ENTRY,
        free_at.ENTRY,
        fast_bat.ENTRY,
        elle.ENTRY,
        fgsm_pgi.ENTRY,
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
    cls = entry(name).target
    given = _given(name, options)
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
    method cannot run under: asked of the method's class, without TensorFlow."""
    found = entry(name)
    given = _given(name, options)
    found.rules.check(eps, norm, {**found.defaults(), **given})
    check_strategy(found.rules, strategy)


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
    return entry(name).cost_variant(config)


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
    "option_names",
    "passes",
    "register",
]
