"""A sweep's definition: its JSON format, its cells and the commands each cell runs.

    definition = load_definition("study/definitions/fashion_mnist.json")
    for cell in expand(definition):           # method × ε × seed × any other train.py flag
        cell.name, cell.flags                 # "fastbat-eps16-seed0", {"method": "fastbat", ...}
    commands(definition, cell, "study/results/fashion_mnist")  # {"train": [...], "pgd": ...}

A definition is a JSON object:

    {"description": "...",
     "flags": {"dataset": "fashion_mnist", "model": "small_cnn", "epochs": 8},  # every cell
     "grid": [{"method": ["fastat", "fastbat"], "eps": [8, 16], "seed": [0]},  # products,
              {"method": ["fastbat"], "eps": [16], "ig_coef": [0, 0.3]}],       # their union
     "evaluation": {"batch_size": 500, "attacks": [
         {"attack": "pgd", "eps": "grid", "examples": 1000,
          "options": {"steps": 50, "restarts": 10}},
         {"attack": "autoattack", "eps": "own", "examples": 1000}]},
     "paper": "paper_numbers.json",          # optional, beside the definition
     "comparisons": [["fastbat", "fastat"]],  # optional: variants compared, paired by seed
     "margin": 1.0,                           # optional: equivalence margin (points)
     "tuning": {"seeds": [100, 101], "groups": [...]},  # optional: fbat_tf/sweeps/tuning.py
     "masking_check": {"of": "autoattack", "threshold": 1.0,      # optional: see masking.py
                       "attack": {"attack": "square", "examples": 1000,
                                  "options": {"n_queries": 10000, "restarts": 5}}}}

Values are train.py's flag values in its units (ε in 1/255); `true`/`false` set a boolean flag.
A cell's value beats the shared one. Each cell is a train.py run directory `<sweep_dir>/<name>`.

Each evaluation runs an attack of the registry (`fbat_tf.attacks`) by name, with its options,
at every ε of the grid ("grid"), at the cell's own ε ("own") or at listed budgets, on the
first `examples` test images, into `eval-<name>.json` in the cell (`name` defaults to the
attack's; give one where an attack is run twice with other options). Budgets added to the grid
after a cell was evaluated go into `eval-<name>-eps<ε>_<ε>.json`. A "masking_check" runs its
attack on a cell only where the cell's finished AutoAttack shows Square breaking more than
`threshold` points after the white-box parts (fbat_tf/sweeps/masking.py). The older form,
{"pgd_steps", "pgd_restarts", "pgd_examples", "autoattack_examples", "batch_size"}, means PGD
at the grid's budgets and AutoAttack at the cell's own (fbat_tf/upgrade.py reads it so).

With "tuning", candidate flag settings of the listed methods (and variants) are first trained on
tuning seeds of their own under `<sweep_dir>/tuning/`, validated and never tested; the best by
validation is picked into `<sweep_dir>/tuning.json` and the grid's cells of that variant and ε
run with its flags (tuning.py: `tuning_cells(definition)`, the picks, the report's section).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from fbat_tf import attacks, methods, run
from fbat_tf.sweeps import masking, tuning_groups
from fbat_tf.sweeps.cells import NAME_FIRST, NAME_LAST, Cell, cell_name, flag_word
from fbat_tf.sweeps.errors import DefinitionError
from fbat_tf.sweeps.evaluations import EVALUATION_DEFAULTS, Evaluation, parse_evaluations

RESULTS = run.RESULTS
FLAGS_FILE = run.FLAGS
# The files of the default evaluations (PGD at the grid's budgets, AutoAttack at the cell's).
EVAL_PGD = run.eval_file("pgd")
EVAL_AUTOATTACK = run.eval_file("autoattack")

# Flags of a cell that its evaluate.py commands need too (where the data is).
_DATA_FLAGS = ("dataset", "data_dir", "download")
_KEYS = (
    "description",
    "flags",
    "grid",
    "evaluation",
    "paper",
    "estimate",
    "cost",
    "comparisons",
    "margin",
    "tuning",
    "masking_check",
)


@dataclasses.dataclass
class Definition:
    name: str
    path: str
    description: str
    flags: dict[str, Any]
    grid: list[dict[str, list[Any]]]
    evaluations: list[Evaluation]
    # evaluate.py's --batch_size in every evaluation command; a definition's "evaluation" may
    # set it.
    batch_size: int = EVALUATION_DEFAULTS["batch_size"]
    paper: str | None = None
    # Flags set on every cell over the definition and the grid (sweep.py --override); a report
    # of such a sweep says its numbers are not comparable with the definition's.
    overrides: dict[str, Any] = dataclasses.field(default_factory=dict)
    # Anchors of the GPU time estimate (fbat_tf/sweeps/estimate.py), or None.
    estimate: dict[str, Any] | None = None
    # A bench/step_time.py JSON (path relative to the definition) that prices each cell's
    # optimizer steps for the report's robustness-against-cost figure, or None.
    cost: str | None = None
    # Pairs of variants ("fastbat ig=none", as Cell.variant names them) the report compares,
    # paired over seeds, at every ε both ran; and the equivalence margin (points).
    comparisons: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    margin: float = 1.0
    # The tuning block (fbat_tf/sweeps/tuning_groups.py: a Tuning), or None; and the picks of
    # its units that the sweep directory's tuning.json holds ({unit: flags}), set by
    # tuning.refresh.
    tuning: Any = None
    picks: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    # The candidates tuning.json added to each unit's grid where its pick sat at an edge
    # ({unit: [candidate flags]}), set by tuning.refresh.
    extensions: dict[str, list[dict[str, Any]]] = dataclasses.field(default_factory=dict)
    # The conditional stronger black-box check of AutoAttack (sweeps/masking.py), or None.
    masking_check: masking.MaskingCheck | None = None

    def eps_values(self) -> list[float]:
        """Every ε of the grid (1/255 units), ascending."""
        return sorted({cell.eps for cell in expand(self)})

    def evaluation(self, name: str) -> Evaluation | None:
        return next((e for e in self.evaluations if e.name == name), None)


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
    for key in shared:
        _check_flag_name(path, "flags", key)
    grid = raw.get("grid")
    if isinstance(grid, dict):
        grid = [grid]
    if not isinstance(grid, list) or not grid:
        raise DefinitionError(f"{path}: 'grid' is empty; give at least one {{flag: [values]}}")
    for i, part in enumerate(grid):
        if not isinstance(part, dict) or not part:
            raise DefinitionError(f"{path}: grid part {i} must be a non-empty {{flag: [values]}}")
        for key, values in part.items():
            _check_flag_name(path, f"grid part {i}", key)
            if not isinstance(values, list) or not values:
                raise DefinitionError(
                    f"{path}: grid part {i}: {key!r} must be a non-empty list, got {values!r}"
                )
        if "method" not in part and "method" not in shared:
            raise DefinitionError(f"{path}: grid part {i} names no method")
        for method in part.get("method", [shared.get("method")]):
            if method not in methods.names():
                raise DefinitionError(
                    f"{path}: grid part {i}: 'method' {method!r} is not a method; known: "
                    f"{', '.join(methods.names())}"
                )
        for seed in part.get("seed", []):
            if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**31:
                raise DefinitionError(
                    f"{path}: grid part {i}: 'seed' {seed!r} must be a whole number from 0 to "
                    f"{2**31 - 1}"
                )
    cells = sum(math.prod(len(values) for values in part.values()) for part in grid)
    if cells > MAX_CELLS:
        raise DefinitionError(
            f"{path}: 'grid' makes {cells:,} cells, more than a sweep runs ({MAX_CELLS:,}): "
            "split it into several definitions, or list fewer values"
        )
    batch_size, evaluations = parse_evaluations(path, raw.get("evaluation", {}))
    definition = Definition(
        name=name,
        path=path,
        description=str(raw.get("description", "")),
        flags=dict(shared),
        grid=[dict(part) for part in grid],
        evaluations=evaluations,
        batch_size=batch_size,
        paper=raw.get("paper"),
        estimate=_estimate_anchors(path, raw.get("estimate")),
        cost=raw.get("cost"),
        masking_check=masking.parse(path, raw.get("masking_check"), evaluations),
    )
    margin = raw.get("margin", 1.0)
    if (
        not isinstance(margin, (int, float))
        or isinstance(margin, bool)
        or not 0 < margin < math.inf
    ):
        raise DefinitionError(f"{path}: 'margin' must be a positive, finite number of points")
    definition.margin = float(margin)
    variants = {cell.variant() for cell in expand(definition)}
    for pair in raw.get("comparisons", []):
        if not (isinstance(pair, list) and len(pair) == 2 and set(pair) <= variants):
            raise DefinitionError(
                f"{path}: a comparison is a pair of the grid's variants {sorted(variants)}, "
                f"got {pair!r}"
            )
        definition.comparisons.append((pair[0], pair[1]))
    for cell in expand(definition):
        eps = cell.flags.get("eps")
        if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not 0 < eps <= 255:
            raise DefinitionError(
                f"{path}: cell {cell.name}: eps must be a number in (0, 255] (1/255 units), "
                f"got {eps!r}"
            )
    definition.tuning = tuning_groups.parse(path, raw.get("tuning"), expand(definition))
    return definition


# The most cells a definition may make: every cell is a training run (the largest committed
# kit has a few hundred); a mistyped grid of 100,000 took minutes and gigabytes to list.
MAX_CELLS = 10_000
# A flag's name as train.py spells it: lower-case letters, digits and '_'.
_FLAG_NAME = re.compile(r"[a-z][a-z0-9_]*")
# absl's own flags, which read files or change how the rest is parsed: never a cell's.
_ABSL_FLAGS = ("flagfile", "undefok", "helpfull", "helpshort", "helpxml", "help", "only_check_args")


def is_cell_flag_name(key: Any) -> bool:
    """Whether `key` may name a flag of a cell: train.py's spelling of a flag's name, and none of
    absl's own flags (which read files or change how the rest is parsed)."""
    return isinstance(key, str) and bool(_FLAG_NAME.fullmatch(key)) and key not in _ABSL_FLAGS


def _check_flag_name(path: str, where: str, key: Any) -> None:
    """A flag key of `flags` or a grid part: train.py's spelling of one of its flags' names."""
    if not is_cell_flag_name(key):
        raise DefinitionError(
            f"{path}: {where}: {key!r} is not a train.py flag name (lower-case letters, digits "
            "and '_'; absl's own flags, such as flagfile, are not a cell's)"
        )


_ESTIMATE_KEYS = (
    "anchor",
    "seconds_per_epoch",
    "seconds_per_pass",
    "robust_fraction",
    "validation_examples",
    "test_examples",
)


def _estimate_anchors(path: str, spec: Any) -> dict[str, Any] | None:
    """The definition's "estimate" block (fbat_tf/sweeps/estimate.py), checked."""
    if spec is None:
        return None
    where = f"{path}: estimate"
    if not isinstance(spec, dict) or not {"anchor", "seconds_per_epoch"} <= set(spec):
        raise DefinitionError(f"{where}: give at least 'anchor' and 'seconds_per_epoch'")
    unknown = sorted(set(spec) - set(_ESTIMATE_KEYS))
    if unknown:
        raise DefinitionError(f"{where}: unknown keys {unknown}; known {list(_ESTIMATE_KEYS)}")
    for key in ("seconds_per_epoch", "seconds_per_pass"):
        value = spec.get(key, {})
        values = value.values() if isinstance(value, dict) else [value]
        if not all(isinstance(v, (int, float)) and v > 0 for v in values):
            raise DefinitionError(f"{where}: {key} must be positive seconds")
    for key in ("validation_examples", "test_examples"):
        value = spec.get(key, {})
        values = value.values() if isinstance(value, dict) else [value]
        if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values):
            raise DefinitionError(f"{where}: {key} must be positive counts of examples")
    robust = spec.get("robust_fraction", 0.5)
    if not isinstance(robust, (int, float)) or not 0 <= robust <= 1:
        raise DefinitionError(f"{where}: robust_fraction must be in [0, 1]")
    return dict(spec)


def expand(definition: Definition) -> list[Cell]:
    """The cells of the grid: the union of each part's product, in order, without repeats; a
    cell of a tuned variant and ε with the flags of its pick, or pending while it has none
    (fbat_tf/sweeps/tuning.py)."""
    cells = grid_cells(definition)
    if definition.tuning is None:
        return cells
    return tuning_groups.with_picks(definition, cells)


def grid_cells(definition: Definition) -> list[Cell]:
    """The cells of the grid as the definition gives them, without tuning picks."""
    cells: dict[str, Cell] = {}
    for part in definition.grid:
        keys = list(part)
        for combination in itertools.product(*(part[k] for k in keys)):
            values = dict(zip(keys, combination, strict=True))
            overridden = sorted(set(definition.overrides) & {*keys, *NAME_FIRST, *NAME_LAST})
            if overridden:
                raise DefinitionError(
                    f"--override cannot set {', '.join(overridden)}: the grid names its cells "
                    "by it; choose the cells with --only"
                )
            flags = {**definition.flags, **values, **definition.overrides}
            named = tuple(dict.fromkeys([*NAME_FIRST, *keys, *NAME_LAST]))
            named = tuple(k for k in named if k in flags)
            cell = Cell(cell_name(flags, named), flags, named)
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
            words.append(f"--{name}={','.join(flag_word(v) for v in value)}")
        else:
            words.append(f"--{name}={flag_word(value)}")
    return words


def commands(
    definition: Definition,
    cell: Cell,
    sweep_dir: str,
    missing: Mapping[str, Sequence[float]] | None = None,
) -> dict[str, list[str]]:
    """The programs a cell runs, as argument lists after `python`: "train", then one evaluate.py
    command per evaluation, by its name. `missing`: evaluations to run at these budgets only,
    into a file of their own (budgets added to the grid after the cell was evaluated); and the
    masking check's budgets under its name where it is due (results.missing_budgets), then
    its command too."""
    cell_dir = os.path.join(sweep_dir, cell.name)
    data = {name: cell.flags[name] for name in _DATA_FLAGS if name in cell.flags}
    evaluate = [
        "evaluate.py",
        f"--model_path={cell_dir}",
        *flag_words(data),
        f"--batch_size={definition.batch_size}",
    ]
    argv = {
        "train": [
            "train.py",
            *flag_words(cell.flags),
            f"--workdir={cell_dir}",
            "--noexport",
            "--verbose=2",
        ]
    }
    if cell.stage == "tuning":  # trained and validated only: never evaluated
        return argv

    def evaluate_argv(evaluation, budgets, file):
        entry = attacks.entry(evaluation.attack)
        options = {
            entry.flag_name(option): evaluation.options.get(option.name, option.default)
            for option in entry.options
        }
        # An L2 cell's budgets are in its units (pixels): said, though evaluate.py would
        # take the run's norm without it.
        norm = cell.config.norm
        return [
            *evaluate,
            f"--attacks={evaluation.attack}",
            *([f"--norm={norm}"] if norm != "linf" else []),
            f"--eps={','.join(flag_word(float(eps)) for eps in budgets)}",
            *flag_words(options),
            f"--n_examples={evaluation.examples}",
            f"--results={os.path.join(cell_dir, file)}",
        ]

    for evaluation in definition.evaluations:
        budgets = (missing or {}).get(evaluation.name)
        argv[evaluation.name] = evaluate_argv(
            evaluation, budgets or evaluation.budgets(definition, cell), evaluation.file(budgets)
        )
    check = definition.masking_check
    if check is not None and (missing or {}).get(check.name):
        # Due where the cell's AutoAttack triggered it: into eval-<name>.json the first time.
        budgets = missing[check.name]
        first = not check.evaluation.files(cell_dir)
        argv[check.name] = evaluate_argv(
            check.evaluation, budgets, check.evaluation.file(None if first else budgets)
        )
    return argv
