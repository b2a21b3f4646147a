"""Adversarial attacks by name: `attack(model, x, y, seed) -> (x_adv, breakdown)` (DESIGN.md §4,
attacks/base.py).

    from fbat_tf import attacks
    attack = attacks.create("pgd", eps=8 / 255, steps=50, restarts=10)
    x_adv, _ = attack(model, x, y, seed=0)
    attack = attacks.create("autoattack", eps=8 / 255, version="standard")
    x_adv, breakdown = attack(model, x, y, seed=0)    # breakdown["robust"]["apgd-ce"], ...
    attacks.label("pgd", {"steps": 50, "restarts": 10})   # "PGD-50-10"
    attack = attacks.create("autoattack", eps=0.5, context={"norm": "l2"})  # the L2 ball

The registry below is the one place an attack is named. Its line gives a function that imports
the attack's class (or factory) and returns it, called on first use, the options a user may set,
from which evaluate.py makes its flags (`--<flag_prefix>_<option>`) and a sweep definition takes
its values, and the label tables print. This module does not import TensorFlow, so that the
entry points parse their flags at once. APGD-T, FAB-T and Square are AutoAttack standard's own
configurations of them; Square's `n_queries` and `restarts` (defaults: AutoAttack's 5000 and 1)
make a stronger black-box check ("Square-10000×5"); "transfer" is PGD crafted on another model
(`source`).

A new attack is its module plus one line here (or `register(Entry(...))` at run time).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from fbat_tf import catalog


@dataclasses.dataclass(frozen=True)
class Option:
    """A constructor keyword a user may set: `--<flag_prefix>_<name>` on evaluate.py."""

    name: str
    default: Any
    help: str
    choices: tuple[str, ...] | None = None
    lower_bound: float | None = None


@dataclasses.dataclass(frozen=True)
class Entry:
    """One attack: its name, what builds it, its label and its options.

    `target()` imports and returns what builds the attack (its module loads TensorFlow, so not
    before the attack is made), called as target()(eps, **options, **context), where
    `context` holds what the caller knows and the attack asks for (`uses`): "jit_compile"
    (True, False, or None for the attack's own choice), "source" (the model a transfer attack
    crafts on), "norm" (the ball of ε, constraints.NORMS; "linf" where the context has none).
    `label` is formatted with the options."""

    name: str
    target: Callable[[], Callable[..., Any]]
    label: str
    options: tuple[Option, ...] = ()
    flag_prefix: str = ""
    uses: tuple[str, ...] = ()
    # Forward-backward passes per attacked example at most, from the options and the share of
    # examples still robust when an ensemble's later parts run (a forward pass counts 1/3):
    # what a sweep's time estimate multiplies by the seconds of one pass.
    passes: Callable[[Mapping[str, Any], float], float] | None = None
    # Whether it reads only the outputs of the model it attacks, never its gradients: it then
    # runs on an exported ONNX or LiteRT file itself, where the others are crafted on the source
    # model and replayed (DESIGN.md §5.4).
    black_box: bool = False

    def flag_name(self, option: Option) -> str:
        return f"{self.flag_prefix or self.name.replace('-', '_')}_{option.name}"

    def defaults(self) -> dict[str, Any]:
        return {option.name: option.default for option in self.options}


def _pgd_passes(options: Mapping[str, Any], robust: float) -> float:
    """PGD-K-R's (and transfer PGD's): one forward-backward pass per step of each restart."""
    return options["steps"] * options["restarts"]


_PGD_OPTIONS = (
    Option("steps", catalog.PGD_STEPS, "PGD steps K.", lower_bound=1),
    Option("restarts", catalog.PGD_RESTARTS, "PGD random restarts R.", lower_bound=1),
)
# Square as the reference's SquareAttack takes them; the defaults are AutoAttack standard's,
# whose own Square keeps them whatever these say. p_init stays at the reference's 0.8.
_SQUARE_OPTIONS = (
    Option("n_queries", 5000, "Square queries per example and restart.", lower_bound=1),
    Option(
        "restarts",
        1,
        "Square searches from new random starts, each on the examples still robust.",
        lower_bound=1,
    ),
)


# What builds each attack, imported when the attack is made.
def _pgd():
    from fbat_tf.attacks.pgd import PGD

    return PGD


def _autoattack():
    from fbat_tf.attacks.autoattack import AutoAttack

    return AutoAttack


def _apgd_ce():
    from fbat_tf.attacks.autoattack import apgd_ce

    return apgd_ce


def _apgd_t():
    from fbat_tf.attacks.autoattack import apgd_t

    return apgd_t


def _fab_t():
    from fbat_tf.attacks.autoattack import fab_t

    return fab_t


def _square():
    from fbat_tf.attacks.autoattack import square

    return square


def _transfer_pgd():
    from fbat_tf.attacks.transfer import transfer_pgd

    return transfer_pgd


# AutoAttack standard's parts: forward-backward passes per attacked example (a forward counts
# 1/3): APGD-CE 100 iterations and a check, APGD-T 9 × 101, FAB-T 9 × 100 and 910 forward
# checks, Square 5000 queries.
_PART_PASSES = {"apgd-ce": 101, "apgd-t": 909, "fab-t": 900 + 910 / 3, "square": 5000 / 3}

REGISTRY: dict[str, Entry] = {
    entry.name: entry
    for entry in (
        Entry(
            "pgd",
            _pgd,
            "PGD-{steps}-{restarts}",
            _PGD_OPTIONS,
            "pgd",
            ("jit_compile", "norm"),
            passes=_pgd_passes,
        ),
        Entry(
            "autoattack",
            _autoattack,
            "AutoAttack ({version})",
            (Option("version", "standard", "AutoAttack version.", ("standard", "rand")),),
            "aa",
            ("jit_compile", "norm"),
            # standard: APGD-CE on all, the other parts on the survivors. rand: 2 × 100 × 20.
            passes=lambda o, robust: (
                _PART_PASSES["apgd-ce"]
                + robust * sum(v for k, v in _PART_PASSES.items() if k != "apgd-ce")
                if o["version"] == "standard"
                else 4000
            ),
        ),
        *(
            Entry(
                part,
                load,
                label,
                uses=("jit_compile", "norm"),
                passes=lambda o, robust, part=part: _PART_PASSES[part],
            )
            for part, load, label in (
                ("apgd-ce", _apgd_ce, "APGD-CE"),
                ("apgd-t", _apgd_t, "APGD-T"),
                ("fab-t", _fab_t, "FAB-T"),
            )
        ),
        Entry(
            "square",
            _square,
            "Square-{n_queries}×{restarts}",
            _SQUARE_OPTIONS,
            uses=("jit_compile", "norm"),
            # Each restart queries the examples still robust, once per query (a forward pass):
            # at most every restart on every example.
            passes=lambda o, robust: o["n_queries"] * o["restarts"] / 3,
            black_box=True,
        ),
        Entry(
            "transfer",
            _transfer_pgd,
            "transfer PGD-{steps}-{restarts}",
            _PGD_OPTIONS,
            "pgd",
            ("source", "norm"),
            passes=_pgd_passes,
            black_box=True,  # crafted on the source: it needs no gradient of the model attacked
        ),
    )
}


def register(entry: Entry) -> None:
    """Add an attack at run time (a line of REGISTRY does the same in the package)."""
    if entry.name in REGISTRY:
        raise ValueError(f"an attack named {entry.name!r} exists already")
    REGISTRY[entry.name] = entry


def names() -> list[str]:
    return list(REGISTRY)


def entry(name: str) -> Entry:
    if name not in REGISTRY:
        raise ValueError(f"unknown attack {name!r}; choose one of {names()}")
    return REGISTRY[name]


def _options(name: str, options: Mapping[str, Any]) -> dict[str, Any]:
    known = entry(name).defaults()
    unknown = sorted(set(options) - set(known))
    if unknown:
        takes = f"its options are {sorted(known)}" if known else "it takes no options"
        raise ValueError(f"attack {name!r} takes no option(s) {unknown}; {takes}")
    return {**known, **{k: v for k, v in options.items() if v is not None}}


def label(name: str, options: Mapping[str, Any] | None = None) -> str:
    """How tables name the attack with these options ("PGD-50-10")."""
    return entry(name).label.format(**_options(name, options or {}))


def passes(name: str, options: Mapping[str, Any] | None = None, robust: float = 1.0):
    """Forward-backward passes per attacked example at most, with these options and `robust`
    the share of examples still robust when an ensemble's later parts run; None where the
    registry does not say."""
    found = entry(name)
    return None if found.passes is None else found.passes(_options(name, options or {}), robust)


def create(name: str, eps: float, context: Mapping[str, Any] | None = None, **options: Any):
    """The attack `name` at budget ε (pixel units) with its options (None: the default).
    `context` may hold "jit_compile", "source" and "norm"; each attack takes what it uses."""
    found = entry(name)
    values = _options(name, options)
    context = dict(context or {})
    missing = [key for key in found.uses if key == "source" and context.get(key) is None]
    if missing:
        raise ValueError(f"attack {name!r} needs {missing[0]!r} (the model to craft on)")
    build = found.target()
    return build(eps, **values, **{key: context[key] for key in found.uses if key in context})


def __getattr__(name: str):
    # The interface types, imported on first use (they load TensorFlow).
    if name in ("Attack", "Breakdown"):
        from fbat_tf.attacks import base

        return getattr(base, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Attack",
    "Breakdown",
    "Entry",
    "Option",
    "create",
    "label",
    "names",
    "passes",
    "register",
]
