"""A sweep: a grid of training runs, each evaluated at every budget of the grid, and its report.

    definition = load_definition("configs/sweeps/fashion_mnist.json")
    for cell in expand(definition):           # method × ε × seed × any other train.py flag
        cell.name, cell.flags                 # "fastbat-eps16-seed0", {"method": "fastbat", ...}
    report = collect(definition, "results/fashion_mnist")   # what the cells' files say
    write_report(report, "results/fashion_mnist")           # sweep.json, sweep.md, PNG plots

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
This module reads and writes files only; sweep.py runs the programs.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import statistics
from collections.abc import Iterable, Mapping, Sequence
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


def pgd_results(cell_dir: str) -> dict[str, tuple[float, str]]:
    """PGD robust accuracy by ε (as evaluate.py names it, "8") over every PGD file of the cell,
    with the file each number came from."""
    found: dict[str, tuple[float, str]] = {}
    # eval-pgd.json first: where files overlap, the grid's own evaluation counts.
    names = sorted(run.Run(cell_dir).eval_files("pgd"), key=lambda n: (n != EVAL_PGD, n))
    for name in names:
        path = os.path.join(cell_dir, name)
        for key, value in _read(path)["robust_accuracy"].items():
            found.setdefault(key.split("@")[1], (value, path))
    return found


def missing_pgd_eps(definition: Definition, cell_dir: str) -> list[float]:
    """The grid's budgets the cell has no PGD number for yet (all of them before its first
    evaluation; those added to the grid since, after it)."""
    have = pgd_results(cell_dir)
    return [eps for eps in definition.eps_values() if f"{eps:g}" not in have]


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


# Reading results ------------------------------------------------------------------------------


def _read(path: str) -> dict[str, Any] | None:
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def cell_state(cell_dir: str, definition: Definition | None = None) -> str:
    """'done' (trained and evaluated), 'trained', 'started' or 'new'. With the definition, a
    cell lacking PGD at a budget of its grid is not done."""
    cell = run.Run(cell_dir)
    if not cell.is_complete():
        return "started" if os.path.exists(cell.flags_path) else "new"
    evaluated = all(os.path.exists(os.path.join(cell_dir, f)) for f in (EVAL_PGD, EVAL_AUTOATTACK))
    if evaluated and definition is not None and missing_pgd_eps(definition, cell_dir):
        evaluated = False
    return "done" if evaluated else "trained"


def _mean(values: Iterable[float]) -> float | None:
    values = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.fmean(values) if values else None


def cell_record(definition: Definition, cell: Cell, sweep_dir: str) -> dict[str, Any]:
    """Everything the report says of one cell, each number with the file it came from, and
    the commands that made them."""
    cell_dir = os.path.join(sweep_dir, cell.name)
    record: dict[str, Any] = {
        "name": cell.name,
        "run_dir": cell_dir,
        "method": cell.method,
        "variant": cell.variant(),
        "options": cell.options,
        "eps": cell.eps,
        "seed": cell.seed,
        "state": cell_state(cell_dir, definition),
        "commands": {
            name: "python " + " ".join(argv)
            for name, argv in commands(definition, cell, sweep_dir).items()
        },
    }
    results = _read(os.path.join(cell_dir, RESULTS))
    if results is None:
        return record
    history = results.get("history", [])
    # How the run named its method ("first-order Fast-BAT"); runs before titles have none.
    record["title"] = (results.get("method") or {}).get("title")
    robust = [h.get("val_robust_accuracy") for h in history]
    selected = max(range(len(robust)), key=lambda i: robust[i]) if robust else None
    record["train"] = {
        "source": os.path.join(cell_dir, RESULTS),
        "status": results.get("status"),
        "epochs": results.get("epochs"),
        "epochs_run": len(history),
        "selected_epoch": None if selected is None else history[selected]["epoch"],
        "val_clean_accuracy": [h.get("val_clean_accuracy") for h in history],
        "val_robust_accuracy": robust,
        # FGSM accuracy, logged by runs since the guard compares it with PGD's.
        "val_fgsm_accuracy": [h.get("val_fgsm_accuracy") for h in history],
        "overfitting_epochs": [h["epoch"] for h in history if h.get("val_overfitting", 0) > 0],
        "seconds_per_epoch": _mean(h.get("epoch_time") for h in history),
        "train_seconds": sum(h.get("epoch_time", 0.0) for h in history),
        "optimizer_steps": results.get("optimizer_steps"),
        "code": results.get("code"),
    }
    if cell.method == "fastbat":
        record["train"]["ig_norm_ratio"] = _mean(h.get("ig_norm_ratio") for h in history)
        record["train"]["inactive_fraction"] = _mean(h.get("inactive_fraction") for h in history)
    pgd = _read(os.path.join(cell_dir, EVAL_PGD))
    if pgd is not None:
        merged = pgd_results(cell_dir)
        record["pgd"] = {
            "source": os.path.join(cell_dir, EVAL_PGD),
            "examples": pgd["examples"],
            "clean_accuracy": pgd["clean_accuracy"],
            "steps": pgd.get("pgd_steps"),
            "restarts": pgd.get("pgd_restarts"),
            "robust_accuracy": {eps: value for eps, (value, _) in merged.items()},
            "sources": {eps: path for eps, (_, path) in merged.items()},
            "code": pgd.get("code"),
        }
    autoattack = _read(os.path.join(cell_dir, EVAL_AUTOATTACK))
    if autoattack is not None:
        (key, value), *_ = autoattack["robust_accuracy"].items()
        record["autoattack"] = {
            "source": os.path.join(cell_dir, EVAL_AUTOATTACK),
            "examples": autoattack["examples"],
            "clean_accuracy": autoattack["clean_accuracy"],
            "robust_accuracy": value,
            "per_attack": autoattack.get("autoattack_per_attack", {}).get(key, {}),
            "seconds": autoattack["time_s"][key],
            "code": autoattack.get("code"),
        }
    return record


def _portable(path: str) -> str:
    """`path` relative to the working directory when it lies below it, else as given."""
    relative = os.path.relpath(os.path.abspath(path))
    return path if relative.startswith(os.pardir) else relative


def collect(definition: Definition, sweep_dir: str) -> dict[str, Any]:
    """The sweep's report data: every cell's record and the paper's numbers, if any."""
    cells = [cell_record(definition, c, sweep_dir) for c in expand(definition)]
    report = {
        "sweep": definition.name,
        # Relative to the working directory, as the cells' run directories are, so that the
        # committed report does not name the machine it was written on.
        "definition": _portable(definition.path),
        "description": definition.description,
        "flags": definition.flags,
        "evaluation": definition.evaluation,
        "eps_values": definition.eps_values(),
        "cells": cells,
    }
    if definition.paper:
        path = os.path.join(os.path.dirname(definition.path), definition.paper)
        report["paper"] = load_paper(path)
    return report


def load_paper(path: str) -> dict[str, Any]:
    """Published numbers: {"source": ..., "rows": [{"table", "method", "eps", metric: [mean,
    std]}]} with metrics among clean, pgd, autoattack (percent) and seconds_per_epoch."""
    paper = _read(path)
    if paper is None:
        raise DefinitionError(f"the paper numbers file {path} does not exist")
    return paper


# Tables ------------------------------------------------------------------------------------------


def _groups(cells: Sequence[dict[str, Any]]) -> dict[tuple[str, float], list[dict[str, Any]]]:
    """Cells by (variant, ε), seeds together: the variants in grid order, each one's ε rising
    (a later grid entry may add budgets to a variant listed earlier)."""
    groups: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for cell in cells:
        groups.setdefault((cell["variant"], cell["eps"]), []).append(cell)
    order = list(dict.fromkeys(variant for variant, _ in groups))
    return dict(sorted(groups.items(), key=lambda item: (order.index(item[0][0]), item[0][1])))


def _values(cells: Sequence[dict[str, Any]], *path: str) -> list[float]:
    values = []
    for cell in cells:
        value: Any = cell
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        if isinstance(value, (int, float)):
            values.append(float(value))
    return values


def _label(variant: str, cells: Sequence[dict[str, Any]]) -> str:
    """The variant with the method's title, where its runs recorded one."""
    titles = list(dict.fromkeys(c["title"] for c in cells if c.get("title")))
    return f"{variant} ({', '.join(titles)})" if titles else variant


def _percent(values: Sequence[float]) -> str:
    if not values:
        return "–"
    if len(values) == 1:
        return f"{100 * values[0]:.1f}"
    return f"{100 * statistics.fmean(values):.1f} ± {100 * statistics.stdev(values):.1f}"


def _number(values: Sequence[float], digits: int = 1) -> str:
    return f"{statistics.fmean(values):.{digits}f}" if values else "–"


def markdown(report: dict[str, Any]) -> str:
    """The report's tables: one row per method variant and ε (mean ± std over seeds)."""
    evaluation = report["evaluation"]
    pgd_name = f"PGD-{evaluation['pgd_steps']}-{evaluation['pgd_restarts']}"
    lines = [
        f"# Sweep {report['sweep']}",
        "",
        report["description"],
        "",
        f"Clean and {pgd_name} accuracy (%) on the first {evaluation['pgd_examples']} test "
        f"images, AutoAttack (standard) on the first {evaluation['autoattack_examples']}, at the "
        "training ε; mean ± sample std over seeds. CO: epochs where the catastrophic-overfitting "
        "guard fired. IG ratio: mean ‖c·g2‖/‖g1‖ over training; inactive: mean fraction of "
        "inactive constraints at δ* (Fast-BAT only).",
        "",
        f"| method | ε (/255) | seeds | clean | {pgd_name} | AutoAttack | selected epoch | CO "
        "(epochs) | s/epoch | IG ratio | inactive |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (variant, eps), cells in _groups(report["cells"]).items():
        done = [c for c in cells if "pgd" in c]
        pgd = [c["pgd"]["robust_accuracy"].get(f"{eps:g}") for c in done]
        selected = ", ".join(str(c["train"]["selected_epoch"]) for c in cells if "train" in c)
        overfit = "; ".join(
            ",".join(map(str, c["train"]["overfitting_epochs"])) or "–"
            for c in cells
            if "train" in c
        )
        ratio = _values(cells, "train", "ig_norm_ratio")
        inactive = _values(cells, "train", "inactive_fraction")
        lines.append(
            f"| {_label(variant, cells)} | {eps:g} | {len(done)}/{len(cells)} | "
            f"{_percent(_values(done, 'pgd', 'clean_accuracy'))} | "
            f"{_percent([p for p in pgd if p is not None])} | "
            f"{_percent(_values(cells, 'autoattack', 'robust_accuracy'))} | {selected or '–'} | "
            f"{overfit or '–'} | {_number(_values(cells, 'train', 'seconds_per_epoch'))} | "
            f"{'–' if not ratio else f'{statistics.fmean(ratio):.2e}'} | "
            f"{'–' if not inactive else f'{100 * statistics.fmean(inactive):.0f}%'} |"
        )
    eps_values = report["eps_values"]
    lines += [
        "",
        f"## {pgd_name} accuracy (%) across budgets",
        "",
        "Rows: the trained models (ε they were trained at); columns: the ε they are attacked at.",
        "",
        "| method | trained at | " + " | ".join(f"ε={e:g}" for e in eps_values) + " |",
        "|---|---|" + "---|" * len(eps_values),
    ]
    for (variant, eps), cells in _groups(report["cells"]).items():
        row = []
        for attacked in eps_values:
            values = [
                c["pgd"]["robust_accuracy"][f"{attacked:g}"]
                for c in cells
                if f"{attacked:g}" in c.get("pgd", {}).get("robust_accuracy", {})
            ]
            row.append(_percent(values))
        lines.append(f"| {variant} | {eps:g} | " + " | ".join(row) + " |")
    if "paper" in report:
        lines += ["", *paper_table(report)]
    return "\n".join(lines) + "\n"


PAPER_METRICS = (("clean", "clean"), ("pgd", "PGD"), ("autoattack", "AA"))


def measured_metric(cells: Sequence[dict[str, Any]], metric: str) -> list[float]:
    """The cells' values of a paper metric, in percent (seconds for seconds_per_epoch)."""
    if metric == "clean":
        return [100 * v for v in _values(cells, "pgd", "clean_accuracy")]
    if metric == "pgd":
        return [
            100 * c["pgd"]["robust_accuracy"][f"{c['eps']:g}"]
            for c in cells
            if f"{c['eps']:g}" in c.get("pgd", {}).get("robust_accuracy", {})
        ]
    if metric == "autoattack":
        return [100 * v for v in _values(cells, "autoattack", "robust_accuracy")]
    if metric == "seconds_per_epoch":
        return _values(cells, "train", "seconds_per_epoch")
    raise KeyError(metric)


def paper_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Paper against measured, per published number that has a cell of the same method and ε."""
    groups = _groups(report["cells"])
    rows = []
    for entry in report["paper"]["rows"]:
        cells = groups.get((entry["method"], float(entry["eps"])), [])
        for metric, _ in (*PAPER_METRICS, ("seconds_per_epoch", "s/epoch")):
            if metric not in entry:
                continue
            mean, std = entry[metric]
            measured = measured_metric(cells, metric)
            value = statistics.fmean(measured) if measured else None
            rows.append(
                {
                    "table": entry["table"],
                    "method": entry["method"],
                    "eps": entry["eps"],
                    "metric": metric,
                    "paper_mean": mean,
                    "paper_std": std,
                    "measured_mean": value,
                    "measured_std": statistics.stdev(measured) if len(measured) > 1 else None,
                    "measured_runs": [c["run_dir"] for c in cells],
                    "difference": None if value is None else value - mean,
                }
            )
    return rows


def paper_table(report: dict[str, Any]) -> list[str]:
    lines = [
        f"## Paper against measured ({report['paper'].get('source', 'paper')})",
        "",
        "Accuracies in %, time in seconds per epoch; difference = measured − paper.",
        "",
        "| table | method | ε | metric | paper | measured | difference |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in paper_rows(report):
        paper = f"{row['paper_mean']:.2f}" + (
            f" ± {row['paper_std']:.2f}" if row["paper_std"] is not None else ""
        )
        if row["measured_mean"] is None:
            measured = difference = "not run"
        else:
            measured = f"{row['measured_mean']:.2f}" + (
                f" ± {row['measured_std']:.2f}" if row["measured_std"] is not None else ""
            )
            difference = f"{row['difference']:+.2f}"
        lines.append(
            f"| {row['table']} | {row['method']} | {row['eps']:g} | {row['metric']} | {paper} | "
            f"{measured} | {difference} |"
        )
    return lines


# Plots ------------------------------------------------------------------------------------------

PLOTS = {
    "robust_vs_eps": "robust_vs_eps.png",
    "clean_vs_robust": "clean_vs_robust.png",
    "val_robust_per_epoch": "val_robust_per_epoch.png",
    "seconds_per_epoch": "seconds_per_epoch.png",
}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_robust_vs_eps(report: dict[str, Any], path: str) -> None:
    """AutoAttack (solid) and PGD (dashed) accuracy at the training ε, one colour per variant."""
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(6.5, 4.2))
    colours = _colours(report)
    by_variant: dict[str, dict[float, list[dict]]] = {}
    for (variant, eps), cells in _groups(report["cells"]).items():
        by_variant.setdefault(variant, {})[eps] = cells
    for variant, per_eps in by_variant.items():
        for metric, style in (("autoattack", "-"), ("pgd", "--")):
            points = [
                (eps, measured_metric(cells, metric)) for eps, cells in sorted(per_eps.items())
            ]
            points = [(eps, values) for eps, values in points if values]
            if not points:
                continue
            eps, values = zip(*points, strict=True)
            means = [statistics.fmean(v) for v in values]
            spread = [statistics.stdev(v) if len(v) > 1 else 0.0 for v in values]
            axes.errorbar(
                eps,
                means,
                yerr=spread,
                linestyle=style,
                marker="o",
                markersize=4,
                capsize=2,
                color=colours[variant],
                label=f"{variant} ({'AA' if metric == 'autoattack' else 'PGD'})",
            )
    axes.set_xlabel("ε (1/255), trained and attacked at")
    axes.set_ylabel("robust accuracy (%)")
    axes.set_ylim(0, 100)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=7, ncol=2)
    axes.set_title(f"{report['sweep']}: robust accuracy against ε")
    _save(figure, path)


def plot_clean_vs_robust(report: dict[str, Any], path: str) -> None:
    """One point per evaluated cell: AutoAttack accuracy against clean accuracy, ε written."""
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(6.5, 4.2))
    colours = _colours(report)
    labelled = set()
    for cell in report["cells"]:
        if "autoattack" not in cell or "pgd" not in cell:
            continue
        x = 100 * cell["autoattack"]["robust_accuracy"]
        y = 100 * cell["pgd"]["clean_accuracy"]
        label = None if cell["variant"] in labelled else cell["variant"]
        labelled.add(cell["variant"])
        axes.scatter(x, y, color=colours[cell["variant"]], label=label, s=18)
        axes.annotate(
            f"{cell['eps']:g}", (x, y), fontsize=6, xytext=(2, 2), textcoords="offset points"
        )
    axes.set_xlabel("AutoAttack accuracy (%) at the training ε")
    axes.set_ylabel("clean accuracy (%)")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=7)
    axes.set_title(f"{report['sweep']}: clean against robust (labels: ε/255)")
    _save(figure, path)


def plot_val_robust_per_epoch(report: dict[str, Any], path: str) -> None:
    """Validation PGD accuracy per epoch: one panel per ε, one line per cell, × where the
    catastrophic-overfitting guard fired; dotted in the same colour, the FGSM accuracy where
    the run logged it (far above the PGD line: the gradient-masking signature)."""
    plt = _pyplot()
    eps_values = sorted({c["eps"] for c in report["cells"] if "train" in c})
    if not eps_values:
        eps_values = [0.0]
    columns = min(len(eps_values), 3)
    rows = math.ceil(len(eps_values) / columns)
    figure, grid = plt.subplots(
        rows, columns, figsize=(4.2 * columns, 3.2 * rows), squeeze=False, sharey=True
    )
    colours = _colours(report)
    for axes, eps in zip(grid.flat, eps_values, strict=False):
        labelled = set()
        for cell in report["cells"]:
            if cell["eps"] != eps or "train" not in cell:
                continue
            robust = [
                math.nan if v is None else 100 * v for v in cell["train"]["val_robust_accuracy"]
            ]
            epochs = list(range(1, len(robust) + 1))
            label = None if cell["variant"] in labelled else cell["variant"]
            labelled.add(cell["variant"])
            colour = colours[cell["variant"]]
            axes.plot(epochs, robust, marker=".", color=colour, label=label, linewidth=1)
            fgsm = cell["train"].get("val_fgsm_accuracy", [])
            if any(v is not None for v in fgsm):
                fgsm = [math.nan if v is None else 100 * v for v in fgsm]
                axes.plot(epochs, fgsm, linestyle=":", color=colour, linewidth=1)
            for epoch in cell["train"]["overfitting_epochs"]:
                axes.scatter(epoch, robust[epoch - 1], marker="x", color=colour, s=60, zorder=3)
        axes.set_title(f"ε = {eps:g}/255", fontsize=9)
        axes.set_xlabel("epoch")
        axes.set_ylim(0, 100)
        axes.grid(alpha=0.3)
        axes.legend(fontsize=6)
    for axes in grid[:, 0]:
        axes.set_ylabel("validation PGD accuracy (%)")
    for axes in list(grid.flat)[len(eps_values) :]:
        axes.set_visible(False)
    figure.suptitle(
        f"{report['sweep']}: validation PGD accuracy per epoch (× guard fired; dotted: FGSM)"
    )
    _save(figure, path)


def plot_seconds_per_epoch(report: dict[str, Any], path: str) -> None:
    """Mean seconds per epoch of each variant over its cells."""
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(6.5, 3.6))
    colours = _colours(report)
    variants = list(colours)
    means = []
    for variant in variants:
        cells = [c for c in report["cells"] if c["variant"] == variant]
        values = _values(cells, "train", "seconds_per_epoch")
        means.append(statistics.fmean(values) if values else 0.0)
    axes.bar(range(len(variants)), means, color=[colours[v] for v in variants])
    axes.set_xticks(range(len(variants)), variants, rotation=20, ha="right", fontsize=7)
    axes.set_ylabel("seconds per epoch")
    axes.grid(alpha=0.3, axis="y")
    axes.set_title(f"{report['sweep']}: training time per epoch")
    _save(figure, path)


def _colours(report: dict[str, Any]) -> dict[str, Any]:
    plt = _pyplot()
    variants = list(dict.fromkeys(c["variant"] for c in report["cells"]))
    cycle = plt.get_cmap("tab10")
    return {variant: cycle(i % 10) for i, variant in enumerate(variants)}


def _save(figure, path: str) -> None:
    figure.tight_layout()
    tmp = f"{path}.tmp.png"
    figure.savefig(tmp, dpi=120)
    _pyplot().close(figure)
    os.replace(tmp, path)


def write_report(report: dict[str, Any], sweep_dir: str) -> dict[str, str]:
    """sweep.json, sweep.md and the plots in `sweep_dir`; returns their paths by kind."""
    os.makedirs(sweep_dir, exist_ok=True)
    paths = {"json": os.path.join(sweep_dir, "sweep.json")}
    payload = dict(report)
    if "paper" in report:
        payload["paper_vs_measured"] = paper_rows(report)
    _write_text(paths["json"], json.dumps(payload, indent=2) + "\n")
    paths["markdown"] = os.path.join(sweep_dir, "sweep.md")
    _write_text(paths["markdown"], markdown(report))
    plotters = {
        "robust_vs_eps": plot_robust_vs_eps,
        "clean_vs_robust": plot_clean_vs_robust,
        "val_robust_per_epoch": plot_val_robust_per_epoch,
        "seconds_per_epoch": plot_seconds_per_epoch,
    }
    for kind, plot in plotters.items():
        paths[kind] = os.path.join(sweep_dir, PLOTS[kind])
        plot(report, paths[kind])
    return paths


def _write_text(path: str, text: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)
