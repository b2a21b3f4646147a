"""A sweep's definition: its JSON format, its cells and the commands each cell runs.

    definition = load_definition("configs/sweeps/fashion_mnist.json")
    for cell in expand(definition):           # method × ε × seed × any other train.py flag
        cell.name, cell.flags                 # "fastbat-eps16-seed0", {"method": "fastbat", ...}
    commands(definition, cell, "results/fashion_mnist")   # {"train": [...], "pgd": [...], ...}

A definition is a JSON object:

    {"description": "...",
     "flags": {"dataset": "fashion_mnist", "model": "small_cnn", "epochs": 8},  # every cell
     "grid": [{"method": ["fastat", "fastbat"], "eps": [8, 16], "seed": [0]},  # products,
              {"method": ["fastbat"], "eps": [16], "ig_coef": [0, 0.3]}],       # their union
     "evaluation": {"pgd_steps": 50, "pgd_restarts": 10, "pgd_examples": 1000,
                    "autoattack_examples": 1000, "batch_size": 500},
     "paper": "paper_numbers.json"}          # optional, beside the definition

Values are train.py's flag values in its units (ε in 1/255); `true`/`false` set a boolean flag.
A cell's value beats the shared one. Each cell is a train.py run directory `<sweep_dir>/<name>`
holding, besides what train.py writes, `eval-pgd.json` (PGD at every ε of the grid),
`eval-autoattack.json` (AutoAttack at the cell's ε) and, for budgets added to the grid after
the cell was evaluated, `eval-pgd-eps<ε>_<ε>.json`, all written by evaluate.py.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from fbat_tf import run

EVAL_PGD = run.eval_file("pgd")
EVAL_AUTOATTACK = run.eval_file("autoattack")
RESULTS = run.RESULTS
FLAGS_FILE = run.FLAGS

EVALUATION_DEFAULTS = {
    "pgd_steps": 50,
    "pgd_restarts": 10,
    "pgd_examples": 1000,
    "autoattack_examples": 1000,
    "batch_size": 500,
}
# Keys a cell is named by, in this order; any other grid key follows, alphabetically.
_NAME_FIRST = ("method", "eps")
_NAME_LAST = ("seed",)
_KEYS = ("description", "flags", "grid", "evaluation", "paper")


class DefinitionError(ValueError):
    """A sweep definition that cannot run, with what is wrong in it."""


@dataclasses.dataclass(frozen=True)
class Cell:
    """One training run of a sweep: its name and the train.py flags that define it."""

    name: str
    flags: dict[str, Any]
    grid_keys: tuple[str, ...]

    @property
    def method(self) -> str:
        return str(self.flags["method"])

    @property
    def eps(self) -> float:
        return float(self.flags["eps"])

    @property
    def seed(self) -> int:
        return int(self.flags.get("seed", 0))

    @property
    def options(self) -> dict[str, Any]:
        """The grid values besides method, ε and seed (a variant of the method)."""
        skip = {*_NAME_FIRST, *_NAME_LAST}
        return {key: self.flags[key] for key in sorted(self.grid_keys) if key not in skip}

    def variant(self) -> str:
        """The method with its options: "fastbat", "fastbat ig_coef=0.3"."""
        options = " ".join(f"{key}={_word(value)}" for key, value in self.options.items())
        return f"{self.method} {options}".strip()


@dataclasses.dataclass
class Definition:
    name: str
    path: str
    description: str
    flags: dict[str, Any]
    grid: list[dict[str, list[Any]]]
    evaluation: dict[str, int]
    paper: str | None = None

    def eps_values(self) -> list[float]:
        """Every ε of the grid (1/255 units), ascending."""
        return sorted({cell.eps for cell in expand(self)})


def load_definition(path: str) -> Definition:
    """Read and check the structure of a definition (flag names and values: sweep.py)."""
    name = os.path.splitext(os.path.basename(path))[0]
    try:
        with open(path) as f:
            raw = json.load(f)
    except json.JSONDecodeError as error:
        raise DefinitionError(f"{path} is not valid JSON: {error}") from None
    if not isinstance(raw, dict):
        raise DefinitionError(f"{path}: a sweep definition is a JSON object")
    unknown = sorted(set(raw) - set(_KEYS))
    if unknown:
        raise DefinitionError(f"{path}: unknown keys {unknown}; a definition has {list(_KEYS)}")
    shared = raw.get("flags", {})
    if not isinstance(shared, dict):
        raise DefinitionError(f"{path}: 'flags' must map flag names to values")
    grid = raw.get("grid")
    if isinstance(grid, dict):
        grid = [grid]
    if not isinstance(grid, list) or not grid:
        raise DefinitionError(f"{path}: 'grid' is empty; give at least one {{flag: [values]}}")
    for i, part in enumerate(grid):
        if not isinstance(part, dict) or not part:
            raise DefinitionError(f"{path}: grid part {i} must be a non-empty {{flag: [values]}}")
        for key, values in part.items():
            if not isinstance(values, list) or not values:
                raise DefinitionError(
                    f"{path}: grid part {i}: {key!r} must be a non-empty list, got {values!r}"
                )
        if "method" not in part and "method" not in shared:
            raise DefinitionError(f"{path}: grid part {i} names no method")
    evaluation = dict(EVALUATION_DEFAULTS)
    given = raw.get("evaluation", {})
    unknown = sorted(set(given) - set(EVALUATION_DEFAULTS))
    if unknown:
        raise DefinitionError(
            f"{path}: unknown evaluation keys {unknown}; known: {list(EVALUATION_DEFAULTS)}"
        )
    for key, value in given.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise DefinitionError(f"{path}: evaluation {key!r} must be an integer >= 1")
        evaluation[key] = value
    definition = Definition(
        name=name,
        path=path,
        description=str(raw.get("description", "")),
        flags=dict(shared),
        grid=[dict(part) for part in grid],
        evaluation=evaluation,
        paper=raw.get("paper"),
    )
    for cell in expand(definition):
        eps = cell.flags.get("eps")
        if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not 0 < eps <= 255:
            raise DefinitionError(
                f"{path}: cell {cell.name}: eps must be a number in (0, 255] (1/255 units), "
                f"got {eps!r}"
            )
    return definition


def _word(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _cell_name(values: Mapping[str, Any], keys: Sequence[str]) -> str:
    ordered = [k for k in _NAME_FIRST if k in keys]
    ordered += sorted(k for k in keys if k not in _NAME_FIRST and k not in _NAME_LAST)
    ordered += [k for k in _NAME_LAST if k in keys]
    words = []
    for key in ordered:
        words.append(_word(values[key]) if key == "method" else f"{key}{_word(values[key])}")
    return "-".join(words).replace("/", "_")


def expand(definition: Definition) -> list[Cell]:
    """The cells of the grid: the union of each part's product, in order, without repeats."""
    cells: dict[str, Cell] = {}
    for part in definition.grid:
        keys = list(part)
        for combination in itertools.product(*(part[k] for k in keys)):
            values = dict(zip(keys, combination, strict=True))
            flags = {**definition.flags, **values}
            named = tuple(dict.fromkeys([*_NAME_FIRST, *keys, *_NAME_LAST]))
            named = tuple(k for k in named if k in flags)
            cell = Cell(_cell_name(flags, named), flags, named)
            if cell.name in cells and cells[cell.name].flags != cell.flags:
                raise DefinitionError(f"two cells named {cell.name} with different flags")
            cells.setdefault(cell.name, cell)
    return list(cells.values())


def flag_words(values: Mapping[str, Any]) -> list[str]:
    """train.py's command-line words for flag values: --name=value, --name / --noname."""
    words = []
    for name, value in values.items():
        if isinstance(value, bool):
            words.append(f"--{name}" if value else f"--no{name}")
        elif isinstance(value, (list, tuple)):
            words.append(f"--{name}={','.join(_word(v) for v in value)}")
        else:
            words.append(f"--{name}={_word(value)}")
    return words


def pgd_file(eps_values: Sequence[float] | None) -> str:
    """eval-pgd.json for the grid's budgets; eval-pgd-eps64_76.json for budgets added later."""
    if eps_values is None:
        return EVAL_PGD
    return run.eval_file(f"pgd-eps{'_'.join(f'{eps:g}' for eps in eps_values)}")


def commands(
    definition: Definition, cell: Cell, sweep_dir: str, pgd_eps: Sequence[float] | None = None
) -> dict[str, list[str]]:
    """The programs a cell runs, as argument lists after `python`: train, then evaluate.
    `pgd_eps`: evaluate PGD at these budgets only, into a file of their own (default: every
    budget of the grid, into eval-pgd.json)."""
    cell_dir = os.path.join(sweep_dir, cell.name)
    evaluation = definition.evaluation
    evaluate = [
        "evaluate.py",
        f"--model_path={cell_dir}",
        f"--batch_size={evaluation['batch_size']}",
    ]
    all_eps = ",".join(f"{eps:g}" for eps in pgd_eps or definition.eps_values())
    return {
        "train": [
            "train.py",
            *flag_words(cell.flags),
            f"--workdir={cell_dir}",
            "--noexport",
            "--verbose=2",
        ],
        "pgd": [
            *evaluate,
            "--attacks=pgd",
            f"--eps={all_eps}",
            f"--pgd_steps={evaluation['pgd_steps']}",
            f"--pgd_restarts={evaluation['pgd_restarts']}",
            f"--n_examples={evaluation['pgd_examples']}",
            f"--results={os.path.join(cell_dir, pgd_file(pgd_eps))}",
        ],
        "autoattack": [
            *evaluate,
            "--attacks=autoattack",
            f"--eps={cell.eps:g}",
            f"--n_examples={evaluation['autoattack_examples']}",
            f"--results={os.path.join(cell_dir, EVAL_AUTOATTACK)}",
        ],
    }
