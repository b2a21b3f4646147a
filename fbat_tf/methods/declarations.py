"""What a method's registry entry declares (fbat_tf/methods/__init__.py holds the entries):
`Option`, a constructor keyword a user sets, and `Entry`, one method. Importable without
TensorFlow."""

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
    """One method: its name, the class that implements it ("module:Class"), its options, the
    passes through the model of one optimizer step given its config (options it lacks at their
    defaults), the options that change that cost with the value its plain name means, and its
    rules (a `rules.Rules`, which its class inherits; None: `check` creates the method)."""

    name: str
    target: str
    options: tuple[Option, ...] = ()
    passes: Callable[[Mapping[str, Any]], dict[str, int]] = lambda config: counts(1, 1)
    cost_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    rules: type[rules.Rules] | None = None

    def flag_name(self, option: Option) -> str:
        return option.flag or f"{self.name}_{option.name}"

    def defaults(self) -> dict[str, Any]:
        return {option.name: option.default for option in self.options}
