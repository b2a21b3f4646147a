"""What a method declares in its own module: `Option`, a constructor keyword a user sets, and
`Entry`, the method (its class, options and cost), which the registry
(fbat_tf/methods/__init__.py) lists. Importable without TensorFlow."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from fbat_tf.catalog import counts
from fbat_tf.methods import rules


@dataclasses.dataclass(frozen=True)
class Option:
    """A constructor keyword a user may set, as train.py's flag `flag` (default
    `<method>_<name>`); `from_flag` turns the flag's value into the constructor's units, and
    `on_device` settles a value the device decides ("auto"; its second argument: as on a CPU)
    (both applied by fbat_tf/methods/configs.py)."""

    name: str
    type: type  # float, int or str
    default: Any
    help: str
    flag: str | None = None
    choices: tuple[str, ...] | None = None
    lower_bound: float | None = None
    from_flag: Callable[[Any], Any] | None = None
    on_device: Callable[[Any, bool], Any] | None = None


@dataclasses.dataclass(frozen=True)
class Entry:
    """One method: the class that implements it (its name and rules are the class's: a
    `rules.Rules`), its options, the passes through the model of one optimizer step given its
    config (options it lacks at their defaults), and the options that change that cost with the
    value its plain name means."""

    target: type[rules.Rules]
    options: tuple[Option, ...] = ()
    passes: Callable[[Mapping[str, Any]], dict[str, int]] = lambda config: counts(1, 1)
    cost_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        self.target.entry = self  # the class knows its declaration (Method.passes, ...)

    @property
    def name(self) -> str:
        return self.target.name

    @property
    def rules(self) -> type[rules.Rules]:
        """What the method refuses, asked before it is created (without TensorFlow)."""
        return self.target

    def flag_name(self, option: Option) -> str:
        return option.flag or f"{self.name}_{option.name}"

    def defaults(self) -> dict[str, Any]:
        return defaults(self.options)

    def cost_variant(self, config: Mapping[str, Any]) -> str:
        """The method with the options that change what a step costs, as bench/step_time.py
        names its variants ("fastbat ig=none", "pgd steps=10"); options `config` lacks count
        as plain."""
        differing = [
            f"{k}={config[k]}"
            for k, value in self.cost_options.items()
            if config.get(k, value) != value
        ]
        return " ".join([self.name, *differing])


def defaults(options: tuple[Option, ...]) -> dict[str, Any]:
    """Each option's declared default, by name: the constructor's defaults."""
    return {option.name: option.default for option in options}
