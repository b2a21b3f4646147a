"""A sweep definition's evaluations: one evaluate.py command each per cell, an attack of the
registry by name with its options, budgets and examples (the "evaluation" block of a
definition, fbat_tf/sweeps/definition.py).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

from fbat_tf import attacks, run, upgrade
from fbat_tf.sweeps.errors import DefinitionError

# What an evaluation leaves out: its examples, and the batch size of them all.
EVALUATION_DEFAULTS = {"examples": 1000, "batch_size": 500}
_EVALUATION_KEYS = ("attack", "name", "eps", "examples", "options")


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """One evaluate.py command per cell: an attack of the registry, by name."""

    name: str
    attack: str
    eps: str | tuple[float, ...]  # "grid", "own" or budgets in 1/255 units
    examples: int
    options: dict[str, Any]

    @property
    def label(self) -> str:
        return attacks.label(self.attack, self.options)

    def file(self, budgets: Sequence[float] | None = None) -> str:
        """eval-<name>.json; eval-<name>-eps64_76.json for budgets added later."""
        if budgets is None:
            return run.eval_file(self.name)
        return run.eval_file(f"{self.name}-eps{'_'.join(f'{eps:g}' for eps in budgets)}")

    def files(self, cell_dir: str) -> list[str]:
        """The cell's files of this evaluation: eval-<name>.json first, then the files of
        budgets added later (eval-<name>-eps…json)."""
        main = self.file()
        later = run.eval_file(f"{self.name}-eps").removesuffix(".json")
        names = os.listdir(cell_dir) if os.path.isdir(cell_dir) else []
        extra = sorted(n for n in names if n.startswith(later) and n.endswith(".json"))
        return ([main] if main in names else []) + extra

    def budgets(self, definition: Any, cell: Any) -> list[float]:
        """The budgets (1/255) this evaluation attacks the cell at (a definition.Definition and
        one of its Cells)."""
        if self.eps == "grid":
            return definition.eps_values()
        if self.eps == "own":
            return [cell.eps]
        return sorted(set(self.eps))

    def record(self) -> dict[str, Any]:
        """As the report writes it (sweep.json's evaluations, and its masking check's)."""
        return {
            "name": self.name,
            "attack": self.attack,
            "label": self.label,
            "eps": self.eps if isinstance(self.eps, str) else list(self.eps),
            "examples": self.examples,
            "options": self.options,
        }


def parse_evaluations(path: str, given: Any) -> tuple[int, list[Evaluation]]:
    if not isinstance(given, dict):
        raise DefinitionError(f"{path}: 'evaluation' must be an object")
    try:
        given = upgrade.evaluation_block(given)
    except ValueError as error:
        raise DefinitionError(f"{path}: {error}") from None
    unknown = sorted(set(given) - {"attacks", "batch_size"})
    if unknown:
        raise DefinitionError(
            f"{path}: unknown evaluation keys {unknown}; with 'attacks', give only 'batch_size'"
        )
    batch_size = given.get("batch_size", EVALUATION_DEFAULTS["batch_size"])
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise DefinitionError(f"{path}: evaluation 'batch_size' must be an integer >= 1")
    entries = given["attacks"]
    if not isinstance(entries, list) or not entries:
        raise DefinitionError(f"{path}: evaluation 'attacks' must be a non-empty list")
    found: list[Evaluation] = []
    for i, entry in enumerate(entries):
        evaluation = parse_evaluation(f"{path}: evaluation attack {i}", entry)
        if any(e.name == evaluation.name for e in found):
            raise DefinitionError(
                f"{path}: evaluation attack {i}: a second evaluation named "
                f"{evaluation.name!r}; give 'name'"
            )
        found.append(evaluation)
    return batch_size, found


def parse_evaluation(
    where: str, entry: Any, default_name: str | None = None, keys: Sequence[str] = _EVALUATION_KEYS
) -> Evaluation:
    """One {"attack", "name", "eps", "examples", "options"} object (`keys` of them allowed),
    checked; DefinitionError starting with `where`. Its name is `default_name` or the attack's
    where it gives none."""
    if not isinstance(entry, dict) or "attack" not in entry:
        raise DefinitionError(f"{where}: give an object with 'attack' (a registry name)")
    unknown = sorted(set(entry) - set(keys))
    if unknown:
        raise DefinitionError(f"{where}: unknown keys {unknown}; known {tuple(keys)}")
    attack = entry["attack"]
    if attack not in attacks.names():
        raise DefinitionError(f"{where}: unknown attack {attack!r}; known {attacks.names()}")
    if "source" in attacks.entry(attack).uses:
        raise DefinitionError(f"{where}: {attack!r} needs a source model; a sweep has none")
    options = entry.get("options", {})
    if not isinstance(options, dict):
        raise DefinitionError(f"{where}: 'options' must map option names to values")
    try:
        attacks.label(attack, options)  # refuses unknown options
    except ValueError as error:
        raise DefinitionError(f"{where}: {error}") from None
    name = entry.get("name", default_name or attack)
    if (
        not isinstance(name, str)
        or not name
        or not all(c.isalnum() or c in "_" for c in name.replace("-", "_"))
    ):
        raise DefinitionError(f"{where}: 'name' must be letters, digits, '-' or '_'")
    eps = entry.get("eps", "grid")
    if isinstance(eps, list):
        if not eps or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= 255 for v in eps
        ):
            raise DefinitionError(f"{where}: 'eps' budgets must be numbers in (0, 255]")
        eps = tuple(float(v) for v in eps)
    elif eps not in ("grid", "own"):
        raise DefinitionError(
            f'{where}: \'eps\' is "grid", "own" or a list of budgets, got {eps!r}'
        )
    examples = entry.get("examples", EVALUATION_DEFAULTS["examples"])
    if not isinstance(examples, int) or isinstance(examples, bool) or examples < 1:
        raise DefinitionError(f"{where}: 'examples' must be an integer >= 1")
    return Evaluation(name, attack, eps, examples, dict(options))
