"""The paper's published numbers, study/papers/fast_bat_icml2022.json: their structure, and
every number against the paper's LaTeX source where that is at hand (../shared/paper/ beside
the repository; the test that reads it is skipped elsewhere). Plain text only: no TensorFlow."""

from __future__ import annotations

import itertools
import json
import os
import re
from collections.abc import Callable

import pytest

from fbat_tf import catalog, methods

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAPER = os.path.join(ROOT, "study", "papers", "fast_bat_icml2022.json")
TEX = os.path.join(ROOT, "..", "shared", "paper", "fast_bat_icml2022.tex")

# The \label of each of the paper's tables, by the number LaTeX gives it (table, table* and
# wraptable environments in source order).
TABLES = {
    "1": "table: motivation_intro_overview",
    "2": "tab: different_eval_epsilon",
    "3": "tab: different_model",
    "4": "tab:transfer_attack",
    "5": "tab: hessian_study",
    "6": "tab: imagenet",
    "7": "tab: lambda_sensitivity",
    "8": "tab: alpha_2_study",
    "9": "tab: linearization_sensitivity",
    "10": "tab:baseline",
    "11": "tab: activation_function",
}
TRANSCRIBED = ("1", "2", "3", "7", "8", "9")
METRICS = ("clean", "pgd", "autoattack", "seconds_per_epoch")
# The train.py flags a row may name: the names among which it chooses, or its value's type.
FLAGS = {
    "dataset": catalog.DATASETS,
    "model": catalog.MODELS,
    "linearization": catalog.LINEARIZATIONS,
    "lambda_inv": (int, float),
    "ig_coef": (int, float, type(None)),  # null: the paper's c is not derivable (notes)
    "attack_steps": (int,),
}
CHOICES = ("dataset", "model", "linearization")


def load_rows() -> list[dict]:
    with open(PAPER) as f:
        return json.load(f)["rows"]


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def test_rows_are_well_formed():
    with open(PAPER) as f:
        paper = json.load(f)
    assert paper["source"] and paper["notes"]
    rows = paper["rows"]
    seen = set()
    for row in rows:
        assert TABLES.get(row["table"]) == row["label"], row
        assert row["caption"], row
        if row.get("implemented") is False:
            assert re.fullmatch(r"[a-z][a-z0-9_]*", row["method"]), row
        else:
            assert row["method"] in methods.names(), row
        assert _number(row["eps"]) and row.get("attacked_eps", 0) != row["eps"], row
        flags = row["flags"]
        assert {"dataset", "model"} <= set(flags) <= set(FLAGS), row
        for name, value in flags.items():
            if name in CHOICES:
                assert value in FLAGS[name], row
            else:
                assert isinstance(value, FLAGS[name]) and not isinstance(value, bool), row
        assert (row["method"] == "pgd") == ("attack_steps" in flags), row
        metrics = [m for m in METRICS if m in row]
        assert metrics, row
        for metric in metrics:
            mean, std = row[metric]
            assert _number(mean) and (std is None or _number(std)), row
        key = (row["table"], row["method"], row["eps"], row.get("attacked_eps"))
        assert _number(row.get("alpha2_over_alpha1", 0)), row
        key += (json.dumps(flags, sort_keys=True), row.get("alpha2_over_alpha1"))
        assert key not in seen, f"two rows of {key}"
        seen.add(key)
    assert {row["table"] for row in rows} == set(TRANSCRIBED)

    # Table 2: four methods, each trained at 8 and 16 and attacked at 8 and 16.
    table2 = {
        (r["method"], r["eps"], r.get("attacked_eps", r["eps"])) for r in rows if r["table"] == "2"
    }
    assert len([r for r in rows if r["table"] == "2"]) == 16
    assert table2 == set(
        itertools.product(("fastat", "fastat_ga", "pgd", "fastbat"), (8, 16), (8, 16))
    )
    # Every CIFAR-10 PreActResNet-18 accuracy of Tables 1 and 2 has its table's std.
    main = [
        r
        for r in rows
        if r["table"] in ("1", "2")
        and (r["flags"]["dataset"], r["flags"]["model"]) == ("cifar10", "preact_resnet18")
    ]
    assert len(main) == 6 + 16
    for row in main:
        assert all(row[m][1] is not None for m in ("clean", "pgd", "autoattack") if m in row), row


# The LaTeX source -------------------------------------------------------------------------------

MACROS = {"FATGA": "Fast-AT-GA", "FAT": "Fast-AT", "FBAT": "Fast-BAT", "ATF": "PGD-2-AT"}
METHOD_NAMES = {
    "Fast-AT": "fastat",
    "Fast-AT-GA": "fastat_ga",
    "PGD-2-AT": "pgd",
    "Fast-BAT": "fastbat",
}
DATASET_NAMES = {"CIFAR-10": "cifar10", "CIFAR-100": "cifar100", "Tiny-ImageNet": "tiny_imagenet"}
# Table 3's WRN-16-8 is the network the released code builds under that name (a WRN-22-8).
MODEL_NAMES = {"PARN-50": "preact_resnet50", "WRN-16-8": "wide_resnet22_8_fastbat"}
LINEARIZATION_NAMES = {
    "PGD w/o Sign": "pgd_nosign",
    "Uniformly Random": "uniform",
    "Random Corner": "corner",
    "PGD": "pgd_sign",
}
CIFAR10 = {"dataset": "cifar10", "model": "preact_resnet18"}
VALUE = re.compile(r"(\d+(?:\.\d+)?)(?: ± (\d+(?:\.\d+)?))?")


def tables(text: str) -> dict[str, tuple[str, str]]:
    """\\label -> (the number LaTeX gives the table, its source), comments left out."""
    source = "\n".join(re.sub(r"(?<!\\)%.*", "", line) for line in text.splitlines())
    found = {}
    environments = re.finditer(r"\\begin\{(table\*?|wraptable)\}(.*?)\\end\{\1\}", source, re.S)
    for number, match in enumerate(environments, 1):
        label = re.search(r"\\label\{([^}]*)\}", match.group(2)).group(1)
        found[label] = (str(number), match.group(2))
    return found


def cell_text(cell: str) -> str:
    """A tabular cell as plain text: "82.39 ± 0.14", "Fast-AT-GA", "RA-PGD (%) (ε=8/255)"."""
    for name, title in MACROS.items():
        cell = re.sub(rf"\\{name}(?![A-Za-z])", title, cell)
    for command, text in (("\\pm", "±"), ("\\epsilon", "ε"), ("\\lambda", "λ"), ("\\%", "%")):
        cell = cell.replace(command, text)
    cell = re.sub(r"\\alpha_(\d)", r"α\1", cell)
    cell = re.sub(
        r"\\multicolumn\{\d+\}\{[^}]*\}|\\multirow\{\d+\}\{\*\}|\\(?:cell|row)color\{[^}]*\}"
        r"|\\(?:top|mid|bottom)rule(?:\[[^\]]*\])?",
        " ",
        cell,
    )
    cell = re.sub(r"\\[A-Za-z]+", " ", cell)  # \textbf, \footnotesize, \mycolorrow
    return " ".join(re.sub(r"[{}~]", " ", cell.replace("$", "")).split())


def grid(source: str) -> list[list[str]]:
    """The table's tabular as rows of plain-text cells (a cell's inner tabular on one line)."""
    source = re.sub(
        r"\\begin\{tabular\}\[c\]\{@\{\}c@\{\}\}(.*?)\\end\{tabular\}",
        lambda m: m.group(1).replace("\\\\", " "),
        source,
        flags=re.S,
    )
    body = source[source.index("\\begin{tabular}") : source.rindex("\\end{tabular}")]
    body = re.sub(r"^\\begin\{tabular\}\{(?:[^{}]|\{[^{}]*\})*\}", "", body)
    rows = [[cell_text(cell) for cell in row.split("&")] for row in body.split("\\\\")]
    return [row for row in rows if any(row)]


def value(cell: str) -> tuple[float, float | None]:
    match = VALUE.fullmatch(cell)
    assert match, f"not a number: {cell!r}"
    return float(match.group(1)), None if match.group(2) is None else float(match.group(2))


def setting_of(method: str, **values: object) -> dict:
    """A row's train.py flags: PGD-2-AT's rows name its two steps."""
    return {**values, "attack_steps": 2} if method == "pgd" else dict(values)


def key(method: str, eps: float, attacked: float, setting: dict) -> tuple:
    """A published number's identity: method, ε trained and attacked at, and its setting."""
    setting = {k: float(v) if _number(v) else v for k, v in setting.items()}
    return method, float(eps), float(attacked), json.dumps(setting, sort_keys=True)


def overview(rows: list[list[str]]) -> dict:
    """Table 1: per dataset, each method's SA, RA-PGD, RA-AA at 8, the same at 16, s/epoch."""
    assert rows[1] == [
        "Method",
        *(f"{m} (%) (ε = {e}/255)" for e in (8, 16) for m in ("SA", "RA-PGD", "RA-AA")),
        "Time (s/epoch)",
    ]
    found, dataset = {}, None
    for row in rows:
        if len(row) == 1 and row[0].endswith(", PreActResNet-18"):
            dataset = DATASET_NAMES[row[0].split(",")[0]]
        elif row[0] in METHOD_NAMES:
            method, values = METHOD_NAMES[row[0]], [value(c) for c in row[1:]]
            assert len(values) == 7, row
            for eps, (sa, pgd, aa) in ((8, values[0:3]), (16, values[3:6])):
                setting = setting_of(method, dataset=dataset, model="preact_resnet18")
                found[key(method, eps, eps, setting)] = {
                    "clean": sa,
                    "pgd": pgd,
                    "autoattack": aa,
                    "seconds_per_epoch": values[6],
                }
    return found


def cross_eps(rows: list[list[str]]) -> dict:
    """Table 2: per training ε, each method's SA, RA-PGD at 8 and 16, RA-AA at 8 and 16."""
    assert rows[1] == ["Method", "SA (%)", "RA-PGD (%)", "RA-AA (%)"]
    assert rows[2] == ["", "", "ε=8", "ε=16", "ε=8", "ε=16"]
    found, eps = {}, None
    for row in rows:
        trained = re.fullmatch(r"CIFAR-10, PARN-18 trained with ε = (\d+)/255", row[0])
        if trained:
            eps = int(trained.group(1))
        elif row[0] in METHOD_NAMES:
            method = METHOD_NAMES[row[0]]
            sa, pgd8, pgd16, aa8, aa16 = (value(c) for c in row[1:])
            pgd, aa = {8: pgd8, 16: pgd16}, {8: aa8, 16: aa16}
            setting = setting_of(method, **CIFAR10)
            for attacked in (8, 16):
                numbers = {"pgd": pgd[attacked], "autoattack": aa[attacked]}
                if attacked == eps:
                    numbers["clean"] = sa
                found[key(method, eps, attacked, setting)] = numbers
    return found


def architectures(rows: list[list[str]]) -> dict:
    """Table 3: per model, each method's SA and RA-PGD at 8, then at 16 (CIFAR-10: notes)."""
    assert rows[0] == [
        "Model",
        "Method",
        *(f"{m}(%) (ε=8/255)" for m in ("SA", "RA-PGD")),
        *(f"{m}(%) (ε=16/255)" for m in ("SA", "RA-PGD")),
    ]
    found, model = {}, None
    for row in rows[1:]:
        model = MODEL_NAMES[row[0]] if row[0] else model
        method = METHOD_NAMES[row[1]]
        sa8, pgd8, sa16, pgd16 = (value(c) for c in row[2:])
        setting = setting_of(method, dataset="cifar10", model=model)
        found[key(method, 8, 8, setting)] = {"clean": sa8, "pgd": pgd8}
        found[key(method, 16, 16, setting)] = {"clean": sa16, "pgd": pgd16}
    return found


def ablation(rows: list[list[str]], setting: Callable[[str], dict]) -> dict:
    """Tables 7-9: a header row of Fast-BAT settings, then a row of SA and one of RA-PGD."""
    text = " ".join(" ".join(row) for row in rows)
    assert "CIFAR-10" in text and re.search(r"PreActResNet-?18", text)
    eps = int(re.search(r"ε ?= ?(\d+)/255", text).group(1))
    header, sa, pgd = (row for row in rows if len(row) > 1)
    assert sa[0] == "SA (%)" and pgd[0] == "RA-PGD (%)"
    found = {}
    for column, clean, robust in zip(header[1:], sa[1:], pgd[1:], strict=True):
        identity = key("fastbat", eps, eps, {**CIFAR10, **setting(column)})
        found[identity] = {"clean": value(clean), "pgd": value(robust)}
    return found


def alpha2(column: str) -> dict:
    """Table 8's α2 as a multiple of α1; the c it means is not derivable (notes)."""
    return {"ig_coef": None, "alpha2_over_alpha1": float(re.fullmatch(r"([\d.]+)α1", column)[1])}


PARSERS = {
    "1": overview,
    "2": cross_eps,
    "3": architectures,
    "7": lambda rows: ablation(rows, lambda column: {"lambda_inv": float(column)}),
    "8": lambda rows: ablation(rows, alpha2),
    "9": lambda rows: ablation(rows, lambda column: {"linearization": LINEARIZATION_NAMES[column]}),
}


def transcribed(row: dict) -> tuple[tuple, dict]:
    setting = dict(row["flags"])
    if "alpha2_over_alpha1" in row:
        setting["alpha2_over_alpha1"] = row["alpha2_over_alpha1"]
    identity = key(row["method"], row["eps"], row.get("attacked_eps", row["eps"]), setting)
    return identity, {m: tuple(row[m]) for m in METRICS if m in row}


def test_every_number_is_the_papers():
    """Each transcribed table against its LaTeX source, cell by cell: the same numbers, means
    and stds, for the same method, ε and setting, and none left out or added."""
    if not os.path.exists(TEX):
        pytest.skip(f"the paper's LaTeX source is not at {os.path.normpath(TEX)}")
    with open(TEX, encoding="utf-8") as f:
        source = tables(f.read())
    assert {label: number for label, (number, _) in source.items()} == {
        label: number for number, label in TABLES.items()
    }
    rows = load_rows()
    compared = {}
    for table in TRANSCRIBED:
        expected = PARSERS[table](grid(source[TABLES[table]][1]))
        found = dict(transcribed(row) for row in rows if row["table"] == table)
        assert found.keys() == expected.keys(), f"Table {table}: other rows than the paper's"
        for identity, numbers in expected.items():
            assert found[identity] == numbers, f"Table {table}, {identity}"
        compared[table] = sum(len(numbers) for numbers in expected.values())
    assert set(compared) == set(TRANSCRIBED) and sum(compared.values()) >= 20


def test_the_papers_defaults_are_train_pys():
    """A row names only the flags where it leaves the paper's defaults; reports match cells
    against them over train.py's defaults, so the two must agree."""
    from absl import flags as absl_flags

    import flags.train  # noqa: F401  (defines train.py's flags)
    from fbat_tf.methods.fast_bat import default_lambda_inv

    with open(PAPER) as f:
        defaults = json.load(f)["defaults"]
    values = absl_flags.FLAGS
    for name, value in defaults.items():
        if name == "lambda_inv":
            for eps, inverse in value.items():
                assert default_lambda_inv(float(eps) / 255) * 255 == pytest.approx(inverse)
        else:
            assert values[name].default == value, name
