"""A sweep's cell: one train.py run, named by its method, ε, other grid values and seed.

cell = Cell("fastbat-eps16-seed0", {"method": "fastbat", "eps": 16, "seed": 0}, keys)
cell.variant()                     # "fastbat": the cells differing only by seed
cell.config.epochs                 # its flags as the run's TrainConfig (typed, pixel units)
cell_name({"method": "fastat", "eps": 8, "seed": 0}, keys)   # "fastat-eps8-seed0"
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import Any

from fbat_tf.methods import configs
from fbat_tf.records import TrainConfig

# Keys a cell is named by, in this order; any other grid key follows, alphabetically.
NAME_FIRST = ("method", "eps")
NAME_LAST = ("seed",)


@dataclasses.dataclass(frozen=True)
class Cell:
    """One training run of a sweep: its name and the train.py flags that define it."""

    name: str
    flags: dict[str, Any]
    grid_keys: tuple[str, ...]
    # "final" (a grid cell, evaluated on the test split) or "tuning" (a tuning run, which is
    # trained and validated only: fbat_tf/sweeps/tuning.py).
    stage: str = "final"
    # The tuning unit (variant and ε) the cell tunes, or whose pick its flags carry; None.
    unit: str | None = None
    # A final cell whose unit has no pick yet: it waits for its tuning runs.
    pending: bool = False

    @functools.cached_property
    def config(self) -> TrainConfig:
        """The cell's flags as its run's TrainConfig, read once (fbat_tf/methods/configs.py:
        units converted, "auto" settled as on a CPU; workdir: the cell's folder in the sweep
        directory). ValueError naming a flag whose value is not of its type."""
        return configs.train_config(self.flags, self.name)

    @property
    def method(self) -> str:
        return str(self.flags["method"])

    @property
    def eps(self) -> float:
        return float(self.flags["eps"])

    @property
    def seed(self) -> int:
        return int(self.flags.get("seed", TrainConfig.seed))

    @property
    def options(self) -> dict[str, Any]:
        """The grid values besides method, ε and seed (a variant of the method)."""
        skip = {*NAME_FIRST, *NAME_LAST}
        return {key: self.flags[key] for key in sorted(self.grid_keys) if key not in skip}

    def variant(self) -> str:
        """The method with its options: "fastbat", "fastbat ig_coef=0.3"."""
        options = " ".join(f"{key}={word(value)}" for key, value in self.options.items())
        return f"{self.method} {options}".strip()


def word(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def flag_word(value: Any) -> str:
    """A value as a command-line word: as `word` gives it (8, 0.5, 1e-05), but a float that
    this would round (1.23456789) written in full, so that train.py gets the value given."""
    shown = word(value)
    if isinstance(value, float) and float(shown) != value:
        return repr(value)
    return shown


def cell_name(values: Mapping[str, Any], keys: Sequence[str]) -> str:
    ordered = [k for k in NAME_FIRST if k in keys]
    ordered += sorted(k for k in keys if k not in NAME_FIRST and k not in NAME_LAST)
    ordered += [k for k in NAME_LAST if k in keys]
    words = []
    for key in ordered:
        words.append(word(values[key]) if key == "method" else f"{key}{word(values[key])}")
    return "-".join(words).replace("/", "_")
