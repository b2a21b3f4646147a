"""A sweep definition's "tuning" block, parsed, and its picks put into the grid's cells.

    tuning = parse(path, raw["tuning"], cells)    # DefinitionError naming the key at fault
    tuning.unit_for("fastbat ig=none", 48.0)      # the unit (variant and ε) a cell belongs to
    with_picks(definition, cells)                 # the final cells with their unit's pick

The tuning stage itself (its runs, the pick, the report's section) is tuning.py's, tuning.json
and its records tuning_file.py's; this module needs the cells and those records only, so that
the definition reads its tuning block through it.

Interior optima: a group may say how its grid extends ("extend": {flag: {"factor", "min",
"max", "why"}}). Once a unit's runs have all finished, where the best candidate's value of such
a flag is the largest (smallest) among the candidates that agree with it on every other flag,
the unit gets one candidate more, that value × factor (÷ factor), unless it would leave
[min, max]; tuning.json keeps it under "extensions", its runs train, and the rule is applied
again, until the best is interior in every such flag or stands at a stated bound. Only then
is the pick written, with, per flag, whether it is interior or at which bound and why. Every
candidate is marked "released" (one the group lists under "released": an author's value) or
"extrapolated".
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

from fbat_tf import methods
from fbat_tf.sweeps.cells import Cell, word
from fbat_tf.sweeps.errors import DefinitionError
from fbat_tf.sweeps.tuning_file import Candidate, Pick

# Flags a candidate may set besides its method's options: the optimizer's.
OPTIMIZER_FLAGS = ("lr_max", "lr_schedule", "momentum", "momentum_at_peak", "weight_decay")
_KEYS = ("seeds", "groups")
_GROUP_KEYS = ("method", "match", "eps", "source", "candidates", "released", "extend")
_EXTEND_KEYS = ("factor", "min", "max", "why")


@dataclasses.dataclass(frozen=True)
class Extension:
    """How a group's grid grows along one flag where the pick sits at its edge: one candidate
    further, the pick's value × `factor` above its largest, ÷ `factor` below its smallest,
    never past [`minimum`, `maximum`], the bounds `why` gives the reason for."""

    flag: str
    factor: float
    minimum: float
    maximum: float
    why: str

    def step(self, value: float, up: bool) -> float:
        """The next value past `value` in that direction, rounded to 4 significant digits
        (whole numbers as int), wherever it lies."""
        moved = value * self.factor if up else value / self.factor
        moved = float(f"{moved:.4g}")
        if moved == int(moved) and abs(moved) < 2**53:
            moved = int(moved)
        return moved

    def beyond(self, value: float, up: bool) -> float | None:
        """The next value past `value` in that direction (`step`); None where it would leave
        the bounds."""
        moved = self.step(value, up)
        return moved if self.minimum <= moved <= self.maximum else None


@dataclasses.dataclass(frozen=True)
class Group:
    """One entry of "groups": the cells it tunes and the candidates it tries."""

    index: int
    method: str
    match: dict[str, Any]
    eps: tuple[float, ...]
    source: str
    candidates: tuple[dict[str, Any], ...]
    # The candidates that are a value an author released (the others, and every candidate the
    # grid's extension adds, are extrapolated), and how the grid extends, by flag.
    released: tuple[dict[str, Any], ...] = ()
    extend: tuple[Extension, ...] = ()

    def origin(self, candidate: Mapping[str, Any]) -> str:
        """ "released" where the candidate is one the group marks so, else "extrapolated"."""
        mine = canonical(candidate)
        return "released" if any(canonical(c) == mine for c in self.released) else "extrapolated"


@dataclasses.dataclass(frozen=True)
class Unit:
    """A variant at an ε that a group tunes: one pick, for its final cells."""

    key: str  # "fastbat-ig_none-eps48": its cells' name without the seed
    group: Group
    variant: str  # as Cell.variant names it: "fastbat ig=none"
    eps: float
    cells: tuple[str, ...]  # the final cells the pick is for


@dataclasses.dataclass(frozen=True)
class Tuning:
    seeds: tuple[int, ...]
    groups: tuple[Group, ...]
    units: tuple[Unit, ...]

    def unit(self, key: str) -> Unit:
        return next(unit for unit in self.units if unit.key == key)

    def unit_for(self, variant: str, eps: float) -> Unit | None:
        return next((u for u in self.units if (u.variant, u.eps) == (variant, eps)), None)

    def flags(self) -> set[str]:
        """Every flag a candidate sets."""
        return {name for g in self.groups for c in g.candidates for name in c}


# ------------------------------------------------------------------------------ the definition


def label(candidate: Mapping[str, Any]) -> str:
    """A candidate's name in its cells' names: "lambda_inv2500", "lr_max0.1-weight_decay0"."""
    return "-".join(f"{name}{word(value)}" for name, value in candidate.items()).replace("/", "_")


def added_words(candidates: Sequence[Mapping[str, Any]]) -> str:
    """Candidates an extension added, by label: "lr_max0.4, lr_max0.8"."""
    return ", ".join(label(c) for c in candidates)


def _unit_key(cell: Cell) -> str:
    words = [cell.method, *(f"{k}{word(v)}" for k, v in cell.options.items())]
    return "-".join([*words, f"eps{cell.eps:g}"]).replace("/", "_")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _same(a: Any, b: Any) -> bool:
    if _number(a) and _number(b):
        return float(a) == float(b)
    return type(a) is type(b) and a == b


def canonical(candidate: Mapping[str, Any]) -> str:
    return json.dumps(
        {k: float(v) if _number(v) else v for k, v in candidate.items()}, sort_keys=True
    )


def method_flags(method: str) -> dict[str, str]:
    """The method's option flags, each with its option's name."""
    entry = methods.entry(method)
    return {entry.flag_name(option): option.name for option in entry.options}


def parse(path: str, spec: Any, cells: Sequence[Cell]) -> Tuning | None:
    """The definition's "tuning" block, checked against its grid's cells: DefinitionError
    naming the key for anything wrong in it."""
    if spec is None:
        return None
    where = f"{path}: tuning"
    if not isinstance(spec, dict):
        raise DefinitionError(f"{where} must be an object with 'seeds' and 'groups'")
    unknown = sorted(set(spec) - set(_KEYS))
    if unknown:
        raise DefinitionError(f"{where}: unknown keys {unknown}; it has {list(_KEYS)}")
    seeds = spec.get("seeds")
    if not isinstance(seeds, list) or not seeds:
        raise DefinitionError(f"{where}.seeds must be a non-empty list of integer seeds")
    if not all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s < 2**31 for s in seeds):
        raise DefinitionError(
            f"{where}.seeds must be whole numbers from 0 to {2**31 - 1}, got {seeds!r}"
        )
    if len(set(seeds)) != len(seeds):
        raise DefinitionError(f"{where}.seeds lists a seed twice: {seeds!r}")
    final = {}
    for cell in cells:
        final.setdefault(cell.seed, cell.name)
    for seed in seeds:
        if seed in final:
            raise DefinitionError(
                f"{where}.seeds: {seed} is also the seed of the grid's cell {final[seed]}; "
                "tuning seeds must differ from the final cells' seeds"
            )
    groups = spec.get("groups")
    if not isinstance(groups, list) or not groups:
        raise DefinitionError(f"{where}.groups must be a non-empty list of groups")
    parsed = tuple(_group(f"{where}.groups[{i}]", i, g, cells) for i, g in enumerate(groups))
    units: dict[tuple[str, float], Unit] = {}
    for group in parsed:
        for eps in group.eps:
            for cell in _matched(group, cells):
                if cell.eps != eps:
                    continue
                found = units.get((cell.variant(), eps))
                if found is None:
                    units[cell.variant(), eps] = Unit(
                        _unit_key(cell), group, cell.variant(), eps, (cell.name,)
                    )
                elif found.group is not group:
                    raise DefinitionError(
                        f"{where}.groups[{found.group.index}] and tuning.groups[{group.index}] "
                        f"both tune {cell.variant()} at eps {eps:g}; one group a variant and ε"
                    )
                elif cell.name not in found.cells:
                    units[cell.variant(), eps] = dataclasses.replace(
                        found, cells=(*found.cells, cell.name)
                    )
    return Tuning(tuple(seeds), parsed, tuple(units.values()))


def _matched(group: Group, cells: Sequence[Cell]) -> list[Cell]:
    return [
        cell
        for cell in cells
        if cell.method == group.method
        and all(k in cell.options and _same(cell.options[k], v) for k, v in group.match.items())
    ]


def _group(where: str, index: int, spec: Any, cells: Sequence[Cell]) -> Group:
    if not isinstance(spec, dict):
        raise DefinitionError(f"{where} must be an object with {list(_GROUP_KEYS)}")
    unknown = sorted(set(spec) - set(_GROUP_KEYS))
    if unknown:
        raise DefinitionError(f"{where}: unknown keys {unknown}; a group has {list(_GROUP_KEYS)}")
    method = spec.get("method")
    if method not in methods.names():
        raise DefinitionError(
            f"{where}.method: unknown method {method!r}; choose one of {methods.names()}"
        )
    of_method = [cell for cell in cells if cell.method == method]
    if not of_method:
        raise DefinitionError(f"{where}.method: no cell of the grid trains {method}")
    match = spec.get("match", {})
    if not isinstance(match, dict):
        raise DefinitionError(f"{where}.match must map grid keys to values")
    keys = sorted({key for cell in of_method for key in cell.options})
    for key, value in match.items():
        if key not in keys:
            raise DefinitionError(
                f"{where}.match: {key!r} is not a grid key of {method}'s cells (theirs: {keys})"
            )
        if not isinstance(value, (str, int, float, bool)):
            raise DefinitionError(f"{where}.match: {key!r} must be one value, got {value!r}")
    eps_values = spec.get("eps")
    if not isinstance(eps_values, list) or not eps_values:
        raise DefinitionError(f"{where}.eps must be a non-empty list of the grid's budgets")
    if not all(_number(e) and 0 < e <= 255 for e in eps_values):
        raise DefinitionError(f"{where}.eps: budgets are numbers in (0, 255], got {eps_values!r}")
    if len({float(e) for e in eps_values}) != len(eps_values):
        raise DefinitionError(f"{where}.eps lists a budget twice: {eps_values!r}")
    group = Group(index, method, dict(match), tuple(float(e) for e in eps_values), "", ())
    matched = _matched(group, cells)
    if not matched:
        raise DefinitionError(f"{where}.match: no cell of {method} has {match}")
    for eps in group.eps:
        if not any(cell.eps == eps for cell in matched):
            found = sorted({cell.eps for cell in matched})
            raise DefinitionError(
                f"{where}.eps: no cell of {method}{f' {match}' if match else ''} at eps {eps:g} "
                f"(they train at {', '.join(f'{e:g}' for e in found)})"
            )
    source = spec.get("source")
    if not isinstance(source, str) or not source.strip():
        raise DefinitionError(
            f"{where}.source: cite where the candidates come from (a paper's section, a released "
            "file)"
        )
    candidates = spec.get("candidates")
    if not isinstance(candidates, list) or not candidates:
        raise DefinitionError(f"{where}.candidates must be a non-empty list of flag settings")
    own = method_flags(method)
    allowed = sorted([*own, *OPTIMIZER_FLAGS])
    others = {
        entry.flag_name(o) for entry in methods.REGISTRY.values() for o in entry.options
    } - set(own)
    grid_keys = {key for cell in matched for key in cell.grid_keys}
    seen: dict[str, int] = {}
    for j, candidate in enumerate(candidates):
        at = f"{where}.candidates[{j}]"
        if not isinstance(candidate, dict) or not candidate:
            raise DefinitionError(f"{at} must set at least one flag ({{flag: value}})")
        for name, value in candidate.items():
            if name in grid_keys or name in ("method", "eps", "seed"):
                raise DefinitionError(
                    f"{at}: {name!r} is a grid key of the cells it tunes; a candidate sets "
                    "other flags"
                )
            if name in others:
                raise DefinitionError(
                    f"{at}: {name!r} is not a flag of {method}; a candidate sets {allowed}"
                )
            if name not in allowed:
                raise DefinitionError(
                    f"{at}: {name!r} is not a train.py flag a candidate of {method} may set "
                    f"({allowed})"
                )
            if not isinstance(value, (str, int, float, bool)):
                raise DefinitionError(f"{at}: {name!r} must be one value, got {value!r}")
        for key in (canonical(candidate), label(candidate)):
            if key in seen:
                raise DefinitionError(
                    f"{at} repeats tuning.groups[{index}].candidates[{seen[key]}] "
                    f"({label(candidate)})"
                )
            seen[key] = j
    released = _released(where, spec.get("released", []), candidates)
    extend = _extensions(where, spec.get("extend", {}), candidates)
    return dataclasses.replace(
        group, source=source, candidates=tuple(candidates), released=released, extend=extend
    )


def _released(where: str, given: Any, candidates: list[dict[str, Any]]) -> tuple[dict, ...]:
    """The group's "released": candidates of it, each an author's released value."""
    if not isinstance(given, list):
        raise DefinitionError(f"{where}.released must be a list of the group's candidates")
    listed = {canonical(c) for c in candidates}
    for j, candidate in enumerate(given):
        if not isinstance(candidate, dict) or canonical(candidate) not in listed:
            raise DefinitionError(
                f"{where}.released[{j}] is not one of the group's candidates: {candidate!r}"
            )
    return tuple(dict(c) for c in given)


def _extensions(where: str, given: Any, candidates: list[dict[str, Any]]) -> tuple:
    """The group's "extend": {flag: {"factor": f > 1, "min": lo, "max": hi, "why": reason}}."""
    if not isinstance(given, dict):
        raise DefinitionError(f"{where}.extend must map flags to {list(_EXTEND_KEYS)}")
    found = []
    for flag, spec in given.items():
        at = f"{where}.extend.{flag}"
        values = [c[flag] for c in candidates if flag in c]
        if not values or not all(_number(v) for v in values):
            raise DefinitionError(f"{at}: extends a flag that the candidates set to numbers")
        if not isinstance(spec, dict) or sorted(spec) != sorted(_EXTEND_KEYS):
            raise DefinitionError(f"{at} must give exactly {list(_EXTEND_KEYS)}")
        factor, low, high, why = (spec[k] for k in _EXTEND_KEYS)
        if not (_number(factor) and factor > 1):
            raise DefinitionError(f"{at}.factor must be a number above 1, got {factor!r}")
        if not (_number(low) and _number(high) and 0 < low <= min(values) <= max(values) <= high):
            raise DefinitionError(
                f"{at}: need 0 < min <= every candidate's value <= max, got min {low!r}, "
                f"max {high!r} for values {sorted(values)}"
            )
        if not isinstance(why, str) or not why.strip():
            raise DefinitionError(f"{at}.why: say why the grid stops at its bounds")
        found.append(Extension(flag, float(factor), float(low), float(high), why))
    return tuple(found)


def edges(
    group: Group, found: Sequence[Candidate], best: int
) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Where the best of the finished candidates `found` sits on each flag the group extends:
    the candidates to add (one past each edge it is at, inside the bounds) and, per flag, in
    words, "interior" or the bound it stands at and why."""
    chosen = found[best].flags
    have = {canonical(c.flags) for c in found}
    added, where = [], {}
    for extension in group.extend:
        flag = extension.flag
        if flag not in chosen:
            where[flag] = "not set by the pick"
            continue
        line = [
            c.flags[flag]
            for c in found
            if flag in c.flags
            and {k: v for k, v in c.flags.items() if k != flag}
            == {k: v for k, v in chosen.items() if k != flag}
        ]
        value, words = chosen[flag], []
        for up, at_edge in ((True, value >= max(line)), (False, value <= min(line))):
            if not at_edge:
                continue
            further = extension.beyond(value, up)
            side = "largest" if up else "smallest"
            if further is None:
                bound = extension.maximum if up else extension.minimum
                if value == bound:
                    words.append(f"the {side} tried, at the bound {bound:g} ({extension.why})")
                else:
                    words.append(
                        f"the {side} tried: the next, {extension.step(value, up):g}, would "
                        f"pass the bound {bound:g} ({extension.why})"
                    )
                continue
            candidate = {**chosen, flag: further}
            if canonical(candidate) not in have:
                added.append(candidate)
                have.add(canonical(candidate))
            words.append(f"the {side} tried: {further:g} added")
        where[flag] = "; ".join(words) if words else "interior"
    return added, where


def edge_words(group: Group, entry: Pick) -> dict[str, str] | None:
    """Where the pick of a written entry sits on each flag its grid extends, in the words of
    this revision (`edges`, from the entry's own candidates: the pick stands as written); None
    for an entry written before picks recorded their edges."""
    if entry.edges is None:
        return None
    labels = [c.label for c in entry.candidates]
    return edges(group, entry.candidates, labels.index(entry.pick))[1]


# ------------------------------------------------------------------------------ the cells


def with_picks(definition: Any, cells: list[Cell]) -> list[Cell]:
    """The grid's cells with their tuning state: a cell of a tuned unit carries the pick's
    flags, or is pending while its unit has none."""
    tuning = definition.tuning
    if tuning is None:
        return cells
    overridden = sorted(set(definition.overrides) & tuning.flags())
    if overridden:
        raise DefinitionError(
            f"--override cannot set {', '.join(overridden)}: the tuning stage picks it"
        )
    found = []
    for cell in cells:
        unit = tuning.unit_for(cell.variant(), cell.eps)
        if unit is None:
            found.append(cell)
            continue
        pick = definition.picks.get(unit.key)
        if pick is None:
            found.append(dataclasses.replace(cell, unit=unit.key, pending=True))
        else:
            found.append(dataclasses.replace(cell, flags={**cell.flags, **pick}, unit=unit.key))
    return found
