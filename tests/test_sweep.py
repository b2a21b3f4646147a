"""sweep.py: the grid it expands, the definitions it refuses before any run, resuming a killed
sweep (also from a fresh clone that holds only the committed results), and the report (tables
and plots) it builds from the cells' files."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import subprocess
import sys

import pytest

import study
from fbat_tf import sweeps
from fbat_tf.records import CellCode, CellResult, EvaluationSummary, TrainSummary, units
from study.cells import CostBench

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TINY_FLAGS = {
    "dataset": "fashion_mnist",
    "model": "small_cnn",
    "width": 4,
    "epochs": 2,
    "max_train_examples": 256,
    "batch_size": 64,
    "val_examples": 64,
    "val_attack_steps": 2,
    "eval_examples": 64,
    "eval_pgd_steps": 2,
    "eval_pgd_restarts": 1,
    "eval_autoattack": False,
    "tensorboard_every": 0,
}
# The same without train.py's final test (its PGD and the indicators after it, about 4 s of a tiny
# run's CPU time), for a sweep whose claims do not concern it; the cells' evaluations still run.
TINY_FLAGS_WITHOUT_FINAL_TEST = {
    **{name: value for name, value in TINY_FLAGS.items() if not name.startswith("eval_")},
    "final_test": False,
}
# One PGD step at each cell's own ε on 16 test images: the cheapest evaluation of a cell.
PGD_OWN = {
    "batch_size": 16,
    "attacks": [
        {"attack": "pgd", "eps": "own", "examples": 16, "options": {"steps": 1, "restarts": 1}}
    ],
}
TINY_EVALUATION = {
    "pgd_steps": 2,
    "pgd_restarts": 2,
    "pgd_examples": 32,
    "autoattack_examples": 8,
    "batch_size": 32,
}


def write_definition(directory, grid, flags=None, **extra) -> str:
    path = os.path.join(directory, "tiny.json")
    definition = {
        "description": "a tiny sweep",
        "flags": TINY_FLAGS if flags is None else flags,
        "grid": grid,
        "evaluation": TINY_EVALUATION,
        **extra,
    }
    with open(path, "w") as f:
        json.dump(definition, f)
    return path


def run_sweep(*args: str, env: dict | None = None, wait: bool = True, tree: str = ROOT):
    """sweep.py of `tree` (a clean checkout where cells run: the committed_tree fixture)."""
    command = [sys.executable, os.path.join(tree, "sweep.py"), *args]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", **(env or {}))
    if not wait:
        # A session of its own, so that a kill can take the sweep and its children at once.
        return subprocess.Popen(
            command,
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)


def print_commands(path, out, data, tree: str):
    """sweep.py's lines for a scheduler, run from the checkout `tree`."""
    return run_sweep(
        f"--sweep={path}",
        f"--sweep_dir={out}",
        f"--data_dir={data}",
        "--dry_run",
        "--print_commands",
        tree=tree,
    )


# Grid expansion ---------------------------------------------------------------------------------


def test_grid_is_the_union_of_products_with_cell_values_over_shared_ones(tmp_path):
    path = write_definition(
        tmp_path,
        [
            {"method": ["fastat", "fastbat"], "eps": [8, 16], "seed": [0]},
            {"method": ["fastbat"], "eps": [16], "seed": [0, 1]},  # repeats fastbat-eps16-seed0
            {"method": ["fastbat"], "eps": [16], "ig_coef": [0, 0.3], "epochs": [3]},
        ],
    )
    definition = sweeps.load_definition(path)
    cells = sweeps.expand(definition)
    assert [c.name for c in cells] == [
        "fastat-eps8-seed0",
        "fastat-eps16-seed0",
        "fastbat-eps8-seed0",
        "fastbat-eps16-seed0",
        "fastbat-eps16-seed1",
        "fastbat-eps16-epochs3-ig_coef0",
        "fastbat-eps16-epochs3-ig_coef0.3",
    ]
    last = cells[-1]
    assert last.flags["epochs"] == 3 and last.flags["ig_coef"] == 0.3
    assert last.flags["width"] == TINY_FLAGS["width"]
    assert last.variant() == "fastbat epochs=3 ig_coef=0.3"
    assert cells[0].variant() == "fastat"
    assert definition.eps_values() == [8, 16]
    words = sweeps.commands(definition, last, "out")["train"]
    assert "--noeval_autoattack" in words and "--ig_coef=0.3" in words
    assert "--workdir=out/fastbat-eps16-epochs3-ig_coef0.3" in words
    pgd = sweeps.commands(definition, cells[0], "out")["pgd"]
    assert "--eps=8,16" in pgd and "--attacks=pgd" in pgd


# Bad definitions ----------------------------------------------------------------------------------


BAD_DEFINITIONS = {
    "unknown-method": ([{"method": ["fastbatt"], "eps": [8]}], None, "fastbatt"),
    "unknown-flag": (
        [{"method": ["fastat"], "eps": [8], "learning_rate": [0.1]}],
        None,
        "learning_rate",
    ),
    "eps-out-of-range": ([{"method": ["fastat"], "eps": [8, 300]}], None, "eps"),
    "empty-grid": ([], None, "grid"),
    "reserved": ([{"method": ["fastat"], "eps": [8]}], {**TINY_FLAGS, "workdir": "x"}, "workdir"),
    "value": ([{"method": ["fastbat"], "eps": [8], "ig_coef": [-1]}], None, "ig_coef"),
}


def test_bad_definitions_fail_before_any_run_naming_the_problem(tmp_path):
    """Each bad definition (run side by side) fails with one error line naming the problem, and
    creates no sweep directory."""
    runs = {}
    for name, (grid, flags, _) in BAD_DEFINITIONS.items():
        (tmp_path / name).mkdir()
        path = write_definition(tmp_path / name, grid, flags)
        out = tmp_path / name / "out"
        runs[name] = subprocess.Popen(
            [
                sys.executable,
                os.path.join(ROOT, "sweep.py"),
                f"--sweep={path}",
                f"--sweep_dir={out}",
            ],
            cwd=ROOT,
            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    for name, process in runs.items():
        _, stderr = process.communicate(timeout=600)
        assert process.returncode != 0, name
        message = stderr.strip().splitlines()[-1]
        assert message.startswith("error:") and BAD_DEFINITIONS[name][2] in message, name
        assert not (tmp_path / name / "out").exists(), name


@pytest.mark.slow
def test_data_dir_given_to_sweep_py_reaches_every_command_and_dry_run_needs_no_data(
    tmp_path, committed_tree
):
    """--data_dir on sweep.py's command line reaches every train.py and evaluate.py command of
    every cell; a dry run on a machine without the data lists the cells and says what a real
    run would miss, instead of failing."""
    data = tmp_path / "data"
    data.mkdir()
    flags = {**TINY_FLAGS, "dataset": "cifar10", "download": False}
    path = write_definition(tmp_path, [{"method": ["fastat", "fastbat"], "eps": [8]}], flags)
    out = tmp_path / "out"
    done = run_sweep(f"--sweep={path}", f"--sweep_dir={out}", f"--data_dir={data}", "--dry_run")
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    commands = [
        line.split(": ", 1)[1] for line in lines if line.startswith("  ") and ": python " in line
    ]
    assert len(commands) == 2 * 3  # train, PGD, AutoAttack per cell
    assert all(f"--data_dir={data}" in command for command in commands)
    assert all("--nodownload" in command for command in commands)
    assert "a real run would stop here" in done.stdout and "cifar10" in done.stdout
    assert lines[-1] == "2 cells: 2 new"  # and no time to estimate from: no cell is done
    assert not out.exists()
    # For a scheduler: one shell line per cell, which a shell runs as it is (here train.py
    # starts, and stops at the missing data as it would on its own).
    # The lines run the pinned revision, which is checked out for them.
    printed = print_commands(path, out, data, committed_tree)
    assert printed.returncode == 0, printed.stderr[-3000:]
    lines = printed.stdout.strip().splitlines()
    assert len(lines) == 2 and all(line.startswith(f"cd {ROOT} && ") for line in lines)
    assert all(line.count("evaluate.py") == 2 and "train.py" in line for line in lines)
    pinned = json.loads((out / "revision.json").read_text())["revision"]
    assert all(f"{out}/code/{pinned[:12]}/train.py" in line for line in lines)
    shell = subprocess.run(["bash", "-c", lines[0]], capture_output=True, text=True, timeout=600)
    assert shell.returncode != 0 and "cifar10" in shell.stderr and str(data) in shell.stderr
    assert sorted(os.listdir(out)) == ["code", "revision.json"]  # no cell was started
    shutil.rmtree(out)
    # The real run stops at the same place, before any cell starts.
    real = run_sweep(
        f"--sweep={path}", f"--sweep_dir={out}", f"--data_dir={data}", tree=committed_tree
    )
    assert real.returncode != 0 and "cifar10" in real.stderr and not out.exists()


# Resume -------------------------------------------------------------------------------------------

COMMITTED = (sweeps.RESULTS, sweeps.FLAGS_FILE, sweeps.EVAL_PGD, sweeps.EVAL_AUTOATTACK)


def _mtimes(directory) -> dict[str, float]:
    return {
        os.path.relpath(os.path.join(top, name), directory): os.path.getmtime(
            os.path.join(top, name)
        )
        for top, _, names in os.walk(directory)
        for name in names
    }


# Report -------------------------------------------------------------------------------------------


def _fake_cell(
    sweep_dir,
    name,
    *,
    clean,
    pgd,
    aa,
    val_robust,
    overfit=(),
    epoch_time=2.0,
    val_fgsm=None,
    title=None,
    aa_outcomes=None,
    norm="linf",
):
    """A cell directory as train.py and evaluate.py leave it, with chosen numbers (norm: the
    threat model its evaluations name their budgets by; val_fgsm:
    FGSM accuracies per epoch, which runs before the FGSM guard did not log; title: the
    method's title, which runs before titles did not record; aa_outcomes: AutoAttack's
    per-point outcomes, which evaluations before them did not record); its PGD evaluation keeps
    per-example outcomes, as evaluate.py now writes."""
    cell = os.path.join(sweep_dir, name)
    os.makedirs(cell)
    history = [
        {
            "epoch": i + 1,
            "val_robust_accuracy": robust,
            "val_clean_accuracy": 0.9,
            "val_overfitting": float(i + 1 in overfit),
            "epoch_time": epoch_time,
            "ig_norm_ratio": 1e-3,
            "inactive_fraction": 0.2,
        }
        for i, robust in enumerate(val_robust)
    ]
    for epoch, fgsm in zip(history, val_fgsm or [], strict=False):
        epoch["val_fgsm_accuracy"] = fgsm
    code = {"package": "fbat-tf", "revision": "0" * 40, "dirty": False}
    with open(os.path.join(cell, sweeps.RESULTS), "w") as f:
        results = {
            "config": {"workdir": cell},  # as every run's record holds its config
            "status": "complete",
            "history": history,
            "epochs": len(history),
            "code": code,
        }
        if title is not None:
            results["method"] = {"title": title}
        json.dump(results, f)
    with open(os.path.join(cell, sweeps.FLAGS_FILE), "w") as f:
        f.write("--method=x\n")
    eps = name.split("-eps")[1].split("-")[0]

    def outcomes(accuracy: float) -> str:  # per example, as evaluate.py writes them
        right = round(accuracy * 100)
        assert right / 100 == accuracy, accuracy
        return "1" * right + "0" * (100 - right)

    with open(os.path.join(cell, sweeps.EVAL_PGD), "w") as f:
        json.dump(
            {
                "examples": 100,
                "code": code,
                "clean_accuracy": clean,
                "pgd_steps": 50,
                "pgd_restarts": 10,
                "robust_accuracy": {units.key("pgd", e, norm): v for e, v in pgd.items()},
                "outcomes": {
                    "clean": outcomes(clean),
                    **{units.key("pgd", e, norm): outcomes(v) for e, v in pgd.items()},
                },
            },
            f,
        )
    key = units.key("autoattack", float(eps), norm)
    if aa_outcomes:  # a whole record of them: clean, the ensemble's part and its final
        n = len(aa_outcomes)
        right = round(clean * n)
        assert right / n == clean, clean
        record = {
            "examples": n,
            "autoattack_per_attack": {key: {"apgd-ce": aa}},
            "outcomes": {
                "clean": "1" * right + "0" * (n - right),
                key: aa_outcomes,
                f"{key}/apgd-ce": aa_outcomes,
            },
        }
    else:
        record = {"examples": 50, "autoattack_per_attack": {key: {"apgd-ce": aa + 0.02}}}
    with open(os.path.join(cell, sweeps.EVAL_AUTOATTACK), "w") as f:
        json.dump(
            {
                "code": code,
                "clean_accuracy": clean,
                "robust_accuracy": {key: aa},
                "time_s": {key: 12.0},
                "split": "test",
                **record,
            },
            f,
        )


def test_report_tables_and_plots_come_from_the_cells_files(tmp_path, monkeypatch):
    path = write_definition(
        tmp_path, [{"method": ["fastat", "fastbat"], "eps": [8, 16], "seed": [0, 1]}]
    )
    definition = sweeps.load_definition(path)
    out = str(tmp_path / "out")
    # fastat collapses at ε = 16 (seed 0 only), fastbat does not; fastat-eps8-seed1 not run.
    numbers = {
        "fastat-eps8-seed0": dict(clean=0.80, pgd={8: 0.50, 16: 0.10}, aa=0.45, val=[0.4, 0.5]),
        "fastat-eps16-seed0": dict(
            clean=0.60,
            pgd={8: 0.05, 16: 0.01},
            aa=0.00,
            val=[0.3, 0.0],
            overfit=(2,),
            fgsm=[0.4, 0.5],
        ),
        "fastat-eps16-seed1": dict(clean=0.70, pgd={8: 0.45, 16: 0.30}, aa=0.20, val=[0.3, 0.3]),
        "fastbat-eps8-seed0": dict(clean=0.78, pgd={8: 0.52, 16: 0.15}, aa=0.47, val=[0.45, 0.5]),
        "fastbat-eps8-seed1": dict(clean=0.76, pgd={8: 0.54, 16: 0.17}, aa=0.49, val=[0.5, 0.45]),
        "fastbat-eps16-seed0": dict(clean=0.68, pgd={8: 0.55, 16: 0.32}, aa=0.28, val=[0.3, 0.32]),
        "fastbat-eps16-seed1": dict(clean=0.66, pgd={8: 0.57, 16: 0.34}, aa=0.30, val=[0.3, 0.34]),
    }
    for name, n in numbers.items():
        _fake_cell(
            out,
            name,
            clean=n["clean"],
            pgd=n["pgd"],
            aa=n["aa"],
            val_robust=n["val"],
            overfit=n.get("overfit", ()),
            val_fgsm=n.get("fgsm"),
        )
    report = study.collect(definition, out)
    paths = study.write_report(report, out)

    cells = {c.name: c for c in report.cells}
    assert cells["fastat-eps8-seed1"].state == "new" and cells["fastat-eps8-seed1"].train is None
    assert cells["fastat-eps16-seed0"].train.overfitting_epochs == [2]
    assert cells["fastat-eps16-seed0"].train.val_fgsm_accuracy == [0.4, 0.5]
    assert cells["fastbat-eps16-seed0"].train.val_fgsm_accuracy == [None, None]
    assert cells["fastbat-eps8-seed1"].train.selected_epoch == 1
    source = cells["fastbat-eps16-seed1"].evaluation("pgd").source
    assert source == os.path.join(out, "fastbat-eps16-seed1", "eval-pgd.json")

    table = open(paths["markdown"]).read()
    main_table = table.split("\n## ")[0].splitlines()
    rows = {tuple(line.split(" | ")[:2]): line for line in main_table if line.startswith("| fast")}
    # Means ± sample std over seeds, in percent: AA of fastbat at 16 is 29.0 ± 1.4.
    assert "| 29.0 ± 1.4 |" in rows[("| fastbat", "16")]
    assert "| 67.0 ± 1.4 |" in rows[("| fastbat", "16")]  # clean
    assert "| 1/2 |" in rows[("| fastat", "8")]  # one seed of two evaluated
    assert "| 2; – |" in rows[("| fastat", "16")]  # CO flagged at epoch 2 of seed 0
    assert "| 15.5 ± 20.5 |" in rows[("| fastat", "16")]  # PGD at 16: 1% and 30%
    assert "## PGD-2-2 accuracy (%) across budgets" in table
    assert "robust_vs_cost" not in paths  # no step times given
    for kind in set(study.PLOTS) - {"robust_vs_cost"}:
        with open(paths[kind], "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
        assert os.path.getsize(paths[kind]) > 10_000
    saved = json.load(open(paths["json"]))
    assert saved["cells"][0]["commands"]["train"].startswith("python train.py ")
    # The committed report names its definition relative to where the sweep ran, not by the
    # machine's absolute path.
    monkeypatch.chdir(tmp_path)
    assert study.collect(definition, out).definition == "tiny.json"


def test_a_cell_between_its_attacks_joins_the_main_table_when_its_last_attack_is_in(tmp_path):
    """An interim report: seed 1 has its PGD evaluation and not yet AutoAttack. The main
    table's clean, PGD and AutoAttack means are all over seed 0 alone, as its seeds column
    says, not PGD and clean over two seeds beside AutoAttack over one."""
    path = write_definition(tmp_path, [{"method": ["fastat"], "eps": [8], "seed": [0, 1]}])
    out = str(tmp_path / "out")
    _fake_cell(out, "fastat-eps8-seed0", clean=0.8, pgd={8: 0.5}, aa=0.4, val_robust=[0.4])
    _fake_cell(out, "fastat-eps8-seed1", clean=0.6, pgd={8: 0.3}, aa=0.2, val_robust=[0.4])
    os.remove(os.path.join(out, "fastat-eps8-seed1", sweeps.EVAL_AUTOATTACK))
    report = study.collect(sweeps.load_definition(path), out)
    table = study.markdown(report)
    assert "| fastat | 8 | 1/2 | 80.0 | 50.0 | 40.0 |" in table
    # The across-budgets table reads each evaluation alone: PGD at 8 over both seeds.
    assert "| fastat | 8 | 40.0 ± 14.1 |" in table


def test_report_names_each_variant_by_the_title_its_runs_recorded(tmp_path):
    path = write_definition(
        tmp_path, [{"method": ["fastbat"], "eps": [8], "ig_coef": [0, 0.1], "seed": [0]}]
    )
    out = str(tmp_path / "out")
    numbers = dict(clean=0.8, pgd={8: 0.5}, aa=0.4, val_robust=[0.4])
    _fake_cell(out, "fastbat-eps8-ig_coef0-seed0", title="first-order Fast-BAT", **numbers)
    _fake_cell(out, "fastbat-eps8-ig_coef0.1-seed0", **numbers)  # from before titles
    table = study.markdown(study.collect(sweeps.load_definition(path), out))
    assert "| fastbat ig_coef=0 (first-order Fast-BAT) | 8 |" in table
    assert "| fastbat ig_coef=0.1 | 8 |" in table


def test_an_l2_sweep_s_report_gives_its_budgets_in_pixels(tmp_path):
    """A sweep of --norm=l2 cells: its tables head the ε column in pixels, read each cell's
    evaluations at its L2 budgets ("pgd@l2:1.5"), and say the unit of the bare budgets."""
    grid = [{"method": ["fastat", "pgd"], "eps": [1, 1.5], "seed": [0, 1]}]
    path = write_definition(tmp_path, grid, flags={**TINY_FLAGS, "norm": "l2"})
    out = str(tmp_path / "out")
    for method, robust in (("fastat", 0.5), ("pgd", 0.6)):
        for eps in ("1", "1.5"):
            for seed in (0, 1):
                pgd = {1.0: robust, 1.5: robust - 0.1}
                numbers = dict(clean=0.8, pgd=pgd, aa=robust - 0.05, val_robust=[0.4, 0.5])
                _fake_cell(out, f"{method}-eps{eps}-seed{seed}", norm="l2", **numbers)
    report = study.collect(sweeps.load_definition(path), out)
    assert {cell.norm for cell in report.cells} == {"l2"}
    table = study.markdown(report)
    assert "| method | ε (L2, pixels) | seeds | clean |" in table
    # PGD at the cell's own budget and AutoAttack, read at the L2 keys; a cell's ε as given.
    assert "| pgd | 1.5 | 2/2 | 80.0 ± 0.0 | 50.0 ± 0.0 | 55.0 ± 0.0 |" in table
    assert "| fastat | 1 | 50.0 ± 0.0 | 40.0 ± 0.0 |" in table  # across budgets
    assert "Every ε in [0, 1] pixels, L2 norm over the image." in table
    assert "/255" not in table


# The paper kit --------------------------------------------------------------------------------


def test_paper_kit_reported_from_committed_results(tmp_path, committed_tree):
    """configs/sweeps/paper_table2.json with one of its cells and a small CNN in place of its
    PreActResNet-18, reported from a folder that holds only a cell's committed files, as
    train.py and evaluate.py leave them: each published number beside the measured one. (The
    kit's cells trained, killed, resumed and reported from a clone: tests/test_paper_kits.py.)"""
    with open(os.path.join(ROOT, "configs", "sweeps", "paper_table2.json")) as f:
        kit = json.load(f)
    assert kit["flags"]["dataset"] == "cifar10" and kit["flags"]["model"] == "preact_resnet18"
    kit["flags"].update(model="small_cnn", width=4, epochs=2, download=False)
    kit["grid"] = [{"method": ["fastbat"], "eps": [8], "seed": [0]}]
    # AutoAttack alone: the rows compared below are its and the clean accuracy.
    kit["evaluation"] = {
        "batch_size": 4,
        "attacks": [{"attack": "autoattack", "eps": "own", "examples": 4}],
    }
    # The paper's numbers, the small CNN standing in for PreActResNet-18.
    with open(os.path.join(ROOT, "study", "papers", "fast_bat_icml2022.json")) as f:
        paper = json.load(f)
    for entry in paper["rows"]:
        if entry["flags"]["model"] == "preact_resnet18":
            entry["flags"]["model"] = "small_cnn"
    (tmp_path / "paper.json").write_text(json.dumps(paper))
    kit["paper"] = str(tmp_path / "paper.json")
    path = tmp_path / "paper_table2.json"
    path.write_text(json.dumps(kit))
    clone = tmp_path / "clone"
    _fake_cell(str(clone), "fastbat-eps8-seed0", clean=0.5, pgd={8: 0.3}, aa=0.25, val_robust=[0.3])
    cell = clone / "fastbat-eps8-seed0"
    definition = sweeps.load_definition(str(path))
    (planned,) = sweeps.expand(definition)
    with open(cell / sweeps.FLAGS_FILE, "w") as f:  # as train.py wrote them
        f.write("\n".join(sweeps.flag_words({**planned.flags, "eps": "8.0"})) + "\n")
    assert sweeps.cell_state(str(cell), definition) == "done"

    # A folder with only the committed files of its cell: nothing runs, the report is made.
    again = run_sweep(f"--sweep={path}", f"--sweep_dir={clone}", tree=committed_tree)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "1 cells, 1 done, 0 to run" in again.stdout
    assert not (clone / "logs").exists()  # no program was started

    report = json.loads((clone / "sweep.json").read_text())
    with open(cell / sweeps.EVAL_AUTOATTACK) as f:
        autoattack = json.load(f)["robust_accuracy"]["autoattack@8"]
    assert report["cells"][0]["autoattack"]["robust_accuracy"]["8"] == autoattack
    rows = {
        (r["table"], r["method"], r["eps"], r["attacked_eps"], r["metric"]): r
        for r in report["paper_vs_measured"]
    }
    row = rows["2", "fastbat", 8, 8, "autoattack"]
    assert (row["paper_mean"], row["paper_std"]) == (45.19, 0.12)
    assert row["measured_mean"] == pytest.approx(100 * autoattack)
    assert row["difference"] == pytest.approx(100 * autoattack - 45.19)
    assert row["measured_runs"] == [str(clone / "fastbat-eps8-seed0")]
    # Each table's std: Table 1 and Table 2 print other stds for Fast-AT's SA.
    assert (
        rows["1", "fastat", 8, 8, "clean"]["paper_std"],
        rows["2", "fastat", 8, 8, "clean"]["paper_std"],
    ) == (0.14, 0.44)
    assert rows["2", "fastat", 8, 8, "clean"]["paper_mean"] == 82.39
    assert rows["2", "fastat", 8, 8, "clean"]["measured_mean"] is None  # not in this grid
    assert rows["2", "pgd", 8, 16, "pgd"]["paper_mean"] == 9.39  # PGD-2-AT, attacked at ε = 16
    # Only the sweep's setting: no other dataset, model or Fast-BAT option.
    assert {r["table"] for r in report["paper_vs_measured"]} == {"1", "2"}
    assert len([r for r in report["paper_vs_measured"] if r["table"] == "1"]) == 24
    # Published numbers without a measured cell (ε = 16 was not run) say so.
    unmeasured = [r for r in report["paper_vs_measured"] if r["eps"] == 16]
    assert unmeasured and all(r["measured_mean"] is None for r in unmeasured)
    table = (clone / "sweep.md").read_text()
    assert "## Paper against measured" in table
    line = next(
        x for x in table.splitlines() if x.startswith("| 2 | fastbat | – | 8 | 8 | autoattack")
    )
    measured = f"{100 * autoattack:.2f} (n = 1 of 1)"
    assert f"| 45.19 ± 0.12 | {measured} | {100 * autoattack - 45.19:+.2f} |" in line


def test_budgets_added_to_the_grid_are_evaluated_alone_and_merged(tmp_path):
    out = str(tmp_path / "out")
    for name, pgd in (
        ("fastat-eps8-seed0", {8: 0.5, 16: 0.2}),
        ("fastat-eps16-seed0", {8: 0.6, 16: 0.4}),
    ):
        _fake_cell(out, name, clean=0.8, pgd=pgd, aa=0.3, val_robust=[0.3, 0.4])
    before = sweeps.load_definition(
        write_definition(tmp_path, [{"method": ["fastat"], "eps": [8, 16], "seed": [0]}])
    )
    first = os.path.join(out, "fastat-eps8-seed0")
    assert sweeps.cell_state(first, before) == "done"

    grown = sweeps.load_definition(
        write_definition(tmp_path, [{"method": ["fastat"], "eps": [8, 16, 24], "seed": [0]}])
    )
    assert sweeps.cell_state(first, grown) == "trained"
    cell = sweeps.expand(grown)[0]
    assert sweeps.missing_budgets(grown, cell, first) == {"pgd": [24]}
    pgd = sweeps.commands(grown, cell, out, {"pgd": [24]})["pgd"]
    extra = os.path.join(first, "eval-pgd-eps24.json")
    assert "--eps=24" in pgd and f"--results={extra}" in pgd
    with open(extra, "w") as f:
        json.dump({"examples": 100, "clean_accuracy": 0.8, "robust_accuracy": {"pgd@24": 0.05}}, f)
    assert sweeps.cell_state(first, grown) == "done"
    pgd = study.cell_record(grown, cell, out).evaluation("pgd")
    assert pgd.robust_accuracy == {8.0: 0.5, 16.0: 0.2, 24.0: 0.05}
    assert pgd.sources[24.0] == extra
    assert pgd.sources[8.0] == os.path.join(first, sweeps.EVAL_PGD)


NO_TRAINING = TrainSummary(
    source="",
    status="complete",
    epochs=None,
    epochs_run=0,
    selected_epoch=None,
    val_clean_accuracy=[],
    val_robust_accuracy=[],
    val_fgsm_accuracy=[],
    overfitting_epochs=[],
    seconds_per_epoch=None,
    train_seconds=0.0,
    optimizer_steps=None,
    code=None,
    cost_variant="",
    passes={},
    pairing=None,
)


def made_evaluation(attack: str, eps="own", examples: int = 1000) -> sweeps.Evaluation:
    """An evaluation of the definition as the report holds it: `attack` of the registry, named
    after it, with its default options."""
    return sweeps.Evaluation(attack, attack, eps, examples, {})


def made_cell(method, seed, eps=8.0, train=None, flags=None, **robust) -> CellResult:
    """A cell as the report holds it, of the parts a test gives: its training summary's fields
    (`train`), and each evaluation's robust accuracy by ε (under the evaluation's name); from
    committed revision r1, the rest empty."""
    evaluations = {
        name: EvaluationSummary("", name, 0, 0.0, dict(values), {}, {}, {}, {}, None)
        for name, values in robust.items()
    }
    name = f"{method}-eps{eps:g}-seed{seed}"
    return CellResult(
        name=name,
        run_dir=f"out/{name}",
        method=method,
        variant=method,
        options={},
        flags=flags or {},
        eps=eps,
        seed=seed,
        state="done",
        tuning=None,
        commands={},
        code=CellCode(("r1",), False),
        train=None if train is None else dataclasses.replace(NO_TRAINING, **train),
        evaluations=evaluations,
    )


def test_robustness_against_cost_prices_passes_and_names_the_cheapest_shown_equivalent(tmp_path):
    """Cost = the run's optimizer steps × its method's passes per step; each variant is paired
    over seeds with the most robust, and the cheapest one shown equivalent is named; measured
    time comes second, marked when taken under load. By hand."""
    from study import comparisons, costs, plots

    def passes(forward, backward, second=0):
        return {"forward": forward, "backward": backward, "second_order": second, "tangent": 0}

    def cell(variant, per_step, robust, seed):
        train = dict(
            cost_variant=variant,
            optimizer_steps=100,
            passes=per_step,
            pairing={"initial_weights": f"w{seed}"},
        )
        return made_cell(variant, seed, train=train, autoattack={8.0: robust})

    seeds = range(5)
    base = [0.50, 0.47, 0.55, 0.49, 0.52]  # seed effects shared by every variant
    fastbat = [v + d for v, d in zip(base, [0.001, -0.001, 0.002, 0.0, 0.0], strict=True)]
    pgd = [v + d for v, d in zip(base, [-0.001, 0.002, 0.0, -0.001, 0.001], strict=True)]
    fastat = [v - 0.05 for v in base]
    report = study.Report(
        sweep="made up",
        evaluations=(made_evaluation("autoattack"),),
        margin=1.0,
        eps_values=(8.0,),
        comparisons=(("fastbat", "pgd"),),
        cost=CostBench(
            source="bench/results/x.json",
            setting={
                "model": "small_cnn",
                "width": 16,
                "batch_size": 128,
                "device": "CPU",
                "machine": {"cpu_count": 2},
                "load_average_1min": {"before": 4.4, "after": 4.8},
            },
            command=None,
            step_seconds={"fastat": 0.1, "pgd": 0.12, "fastbat": 0.3},
            round_step_seconds={
                "fastat": [0.1, 0.1, 0.2],
                "pgd": [0.11, 0.12, 0.24],
                "fastbat": [0.3, 0.3, 0.3],
            },
        ),
        cells=(
            *[cell("fastat", passes(2, 2), fastat[s], s) for s in seeds],
            *[cell("pgd", passes(3, 3), pgd[s], s) for s in seeds],
            *[cell("fastbat", passes(3, 4, 1), fastbat[s], s) for s in seeds],
        ),
    )
    rows = {r.variant: r for r in costs.cost_rows(report)[8.0]}
    assert [rows[v].passes for v in ("fastat", "pgd", "fastbat")] == [400, 600, 800]
    assert rows["fastbat"].most_robust  # mean 0.5064 against pgd's 0.5062
    # Paired differences pgd − fastbat, in points: -0.2, 0.3, -0.2, -0.1, 0.1; mean -0.02.
    versus = rows["pgd"].versus_best
    assert versus.differences == pytest.approx([-0.2, 0.3, -0.2, -0.1, 0.1])
    s_d = math.sqrt(sum((d + 0.02) ** 2 for d in versus.differences) / 4)
    half = 2.776445 * s_d / math.sqrt(5)
    assert versus.interval == pytest.approx((-0.02 - half, -0.02 + half), abs=1e-4)
    assert versus.verdict == "equivalent"
    assert rows["fastat"].versus_best.verdict == "b"  # 5 points behind at every seed
    assert costs.cheapest_equivalent(list(rows.values())).variant == "pgd"
    assert [rows[v].pareto for v in ("fastat", "pgd", "fastbat")] == [True, True, True]

    # What the reader of sweep.md sees: passes first, time second and marked.
    table = "\n".join(costs.cost_table(report))
    # fastat − fastbat: -5.1, -4.9, -5.2, -5.0, -5.0 points; mean -5.04 ± 0.14.
    assert (
        "| 8 | fastat | 4 | 0.4 | 45.6 | 5 | -5.0 [-5.2, -4.9] | fastbat ahead (seeds only) | yes |"
        in table
    )
    assert "vs the most robust | verdict (Holm) |" in table
    assert "equivalent within ±1 point" in table
    # One family, Holm-corrected: pgd − fastbat (listed, and against the most robust: one
    # hypothesis) and fastat − fastbat, m = 2. Equivalence: pgd's p is the smaller, times 2.
    assert versus.family == rows["fastat"].versus_best.family == 2
    assert versus.p_equivalence_holm == pytest.approx(2 * versus.p_equivalence)
    (listed_pair,) = comparisons.listed_comparisons(report)
    assert (listed_pair.a, listed_pair.b) == ("fastbat", "pgd")
    assert listed_pair.p_holm == versus.p_holm and listed_pair.family == 2
    assert "10 (10–20) |" in table  # fastat: 100 steps × 0.1 s, rounds 0.1–0.2 s
    assert "Measured under a load above the cores: indicative only." in table
    assert "- ε = 8: pgd (50.6%, 0.6k passes); most robust fastbat (50.6%, 0.8k passes)" in table
    listed = "\n".join(comparisons.comparison_table(report))
    assert "| 8 | fastbat | pgd | 5 | +0.0 [" in listed and "| seeds only |" in listed
    assert "m = 2" in listed

    # Comparisons across revisions, uncommitted code or unpaired runs are marked.
    cells = list(report.cells)
    cells[5] = dataclasses.replace(cells[5], code=CellCode(("r2",), True))
    train = dataclasses.replace(cells[10].train, pairing={"initial_weights": "other"})
    cells[10] = dataclasses.replace(cells[10], train=train)
    report = dataclasses.replace(report, cells=tuple(cells))
    marks = comparisons.comparison(report, 8.0, "fastbat", "pgd").marks
    assert marks == [
        "different revisions",
        "uncommitted or unrecorded code †",
        "not paired",
        "seeds only",
    ]
    figure = tmp_path / "robust_vs_cost.png"
    plots.plot_robust_vs_cost(report, str(figure))
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and figure.stat().st_size > 10_000


def test_a_report_written_while_a_run_of_a_finished_one_s_row_still_trains(tmp_path):
    """Another sweep.py process writes the report when its cell finishes, while a run of the
    same row is still training (its record holds no optimizer steps yet): the report is
    written, and the row is priced by the finished run alone (100 steps × 4 passes, × 0.1 s)."""
    from study import costs

    per_step = {"forward": 2, "backward": 2, "second_order": 0, "tangent": 0}
    finished = made_cell(
        "fastat",
        0,
        train=dict(cost_variant="fastat", optimizer_steps=100, passes=per_step),
        autoattack={8.0: 0.4},
    )
    training = dataclasses.replace(
        made_cell(
            "fastat", 1, train=dict(cost_variant="fastat", optimizer_steps=None, passes=per_step)
        ),
        state="started",
    )
    report = study.Report(
        sweep="made up",
        description="",
        evaluations=(made_evaluation("autoattack", examples=10),),
        margin=1.0,
        eps_values=(8.0,),
        comparisons=(),
        cost=CostBench(
            source="bench/results/x.json",
            setting={"device": "CPU", "machine": {"cpu_count": 2}},
            command=None,
            step_seconds={"fastat": 0.1},
            round_step_seconds={"fastat": [0.1, 0.2]},
        ),
        cells=(finished, training),
    )
    (row,) = costs.cost_rows(report)[8.0]
    assert (row.passes, row.seeds) == (400, 1)
    assert row.seconds == pytest.approx(10.0)
    assert row.seconds_rounds == pytest.approx([10.0, 20.0])
    paths = study.write_report(report, str(tmp_path))
    assert "| 8 | fastat | 4 | 0.4 | 40.0 | 1 |" in open(paths["markdown"]).read()


def test_a_comparison_says_how_many_runs_of_a_side_diverged_and_left_it():
    """Seeds whose run diverged have no number, so a comparison speaks of the other seeds (or
    of none): its marks say how many of the runs trained so far diverged, in the table as in
    sweep.json."""
    from study import comparisons

    def cell(method, seed, eps, robust=None):
        found = {} if robust is None else {eps: robust}
        made = made_cell(method, seed, eps=eps, train={}, autoattack=found)
        return made if robust is not None else dataclasses.replace(made, state="diverged")

    # A cell not run yet (no training record) counts among no side's runs.
    waiting = dataclasses.replace(made_cell("elle", 3, eps=76.0), state="new")

    report = study.Report(
        evaluations=(made_evaluation("autoattack"),),
        margin=1.0,
        eps_values=(48.0, 76.0),
        comparisons=(("elle", "nfgsm"),),
        cells=(
            cell("elle", 0, 48.0, 0.30),
            cell("elle", 1, 48.0, 0.32),
            cell("elle", 2, 48.0),
            *[cell("nfgsm", s, 48.0, 0.40 + 0.01 * s) for s in range(3)],
            *[cell("elle", s, 76.0) for s in range(3)],
            waiting,
            *[cell("nfgsm", s, 76.0, 0.10) for s in range(3)],
        ),
    )
    at48, at76 = comparisons.listed_comparisons(report)
    assert at48.seeds == [0, 1] and "elle diverged in 1 of 3 runs" in at48.marks
    assert at76.seeds == [] and at76.marks == ["elle diverged in 3 of 3 runs"]
    table = "\n".join(comparisons.comparison_table(report))
    assert "| 76 | elle | nfgsm | 0 | – |" in table
    assert table.count("elle diverged in") == 2


def test_paired_comparisons_count_the_images_where_the_evaluations_recorded_them(tmp_path):
    """Where every cell's AutoAttack file records its per-point outcomes, the comparison is the
    seeds × images model on them (the se of paired.crossed on the outcome matrix); where a cell
    lacks them, or they do not give its accuracy, seeds only, marked. The table is one family,
    corrected by Holm, raw and corrected side by side; sweep.json holds both."""
    import random

    from study import comparisons, paired

    rng = random.Random(0)
    points = 40

    def outcomes(right):
        return "".join("1" if rng.random() < right else "0" for _ in range(points))

    strings = {}
    for seed in range(3):
        strings["fastat", seed] = outcomes(0.4)
        strings["fastbat", seed] = outcomes(0.7)
    out = str(tmp_path / "out")
    for (method, seed), string in strings.items():
        for eps in (8, 16):
            aa = string.count("1") / points
            given = string
            if (method, eps, seed) == ("fastat", 16, 2):
                given = None  # at ε = 16 one cell recorded none
            _fake_cell(
                out,
                f"{method}-eps{eps}-seed{seed}",
                clean=0.8,
                pgd={8: 0.5, 16: 0.3},
                aa=aa,
                val_robust=[0.3, 0.4],
                aa_outcomes=given,
            )
    path = write_definition(
        tmp_path,
        [{"method": ["fastat", "fastbat"], "eps": [8, 16], "seed": [0, 1, 2]}],
        comparisons=[["fastbat", "fastat"]],
    )
    report = study.collect(sweeps.load_definition(path), out)
    cell = next(c for c in report.cells if c.name == "fastat-eps8-seed0")
    assert cell.to_dict()["autoattack"]["outcomes"] == {
        "8": {"points": strings["fastat", 0], "split": "test"}
    }

    at8, at16 = comparisons.listed_comparisons(report)
    seeds = [0, 1, 2]
    matrix = paired.outcome_matrix(
        {s: strings["fastbat", s] for s in seeds}, {s: strings["fastat", s] for s in seeds}, seeds
    )
    model = paired.crossed(matrix, resolution=100 / points)
    assert at8.model == "seeds × images" and at8.images == points
    assert at8.se == pytest.approx(model.se) and at8.df == pytest.approx(model.df)
    assert at8.mean == pytest.approx(sum(map(sum, matrix)) / (3 * points))
    assert "seeds only" not in at8.marks
    assert at16.model == "seeds only" and "seeds only" in at16.marks
    assert at8.family == at16.family == 2
    holm = paired.holm([at8.p, at16.p])
    assert [at8.p_holm, at16.p_holm] == pytest.approx(holm)

    table = "\n".join(comparisons.comparison_table(report))
    assert "m = 2" in table and "Holm" in table
    assert "| 8 | fastbat | fastat | 3 × 40 images |" in table
    assert "| 16 | fastbat | fastat | 3 |" in table and "| seeds only |" in table
    paths = study.write_report(report, out)
    saved = json.load(open(paths["json"]))
    assert saved["paired_family"]["size"] == 2
    row = saved["paired_comparisons"][0]
    assert {"p", "p_holm", "p_equivalence", "p_equivalence_holm", "verdict", "raw_verdict"} <= set(
        row
    )

    # Outcomes that do not give the recorded accuracy are not used.
    cell = next(c for c in report.cells if c.name == "fastbat-eps8-seed1")
    cell.evaluation("autoattack").robust_accuracy[8.0] += 0.1
    found = comparisons.comparison(report, 8.0, "fastbat", "fastat")
    assert found.model == "seeds only"
    assert "seeds only (outcomes disagree with the accuracy)" in found.marks


def test_the_gpu_time_estimate_is_epochs_and_passes_times_the_anchors(tmp_path):
    """Every term of every cell by hand: training (epochs × the anchor's seconds per epoch),
    per-epoch validation and train.py's final evaluation (examples × passes × the seconds of a
    pass), and each evaluation (examples × budgets × the attack's passes, AutoAttack's later
    parts on the robust fraction); the total is their sum."""
    from fbat_tf.sweeps import estimate

    evaluation = {
        "batch_size": 100,
        "attacks": [
            {
                "attack": "pgd",
                "eps": "grid",
                "examples": 1000,
                "options": {"steps": 50, "restarts": 10},
            },
            {"attack": "autoattack", "eps": "own", "examples": 1000},
        ],
    }
    spec = {
        "flags": {**TINY_FLAGS, "epochs": 20},
        "grid": [{"method": ["fastat", "fastbat"], "eps": [8, 16]}],
        "evaluation": evaluation,
        "estimate": {
            "anchor": "made up",
            "seconds_per_epoch": {"fastat": 20.0, "fastbat": 60.0},
            "seconds_per_pass": 0.001,
            "robust_fraction": 0.5,
        },
    }
    path = tmp_path / "kit.json"

    def found_for(spec):
        path.write_text(json.dumps(spec))
        return estimate.estimate(sweeps.load_definition(str(path)))

    found = found_for(spec)
    hours = 1 / 3600
    assert found["training_hours"] == pytest.approx(2 * 20 * (20 + 60) * hours)
    # Each epoch validates 64 examples with PGD-2-1, FGSM and a clean pass (4 cells).
    assert found["validation_hours"] == pytest.approx(4 * 20 * 64 * (2 * 1 + 2) * 0.001 * hours)
    # train.py tests 64 examples: a clean pass and PGD-2-1, no AutoAttack.
    assert found["final_evaluation_hours"] == pytest.approx(4 * 64 * (1 + 2) * 0.001 * hours)
    pgd = 4 * 1000 * 2 * 500 * 0.001 * hours  # 4 cells, 2 budgets, 50 × 10 passes
    autoattack_passes = 101 + 0.5 * (909 + 900 + 910 / 3 + 5000 / 3)
    autoattack = 4 * 1000 * 1 * autoattack_passes * 0.001 * hours
    assert found["evaluation_hours"] == pytest.approx(
        {"PGD-50-10": pgd, "AutoAttack (standard)": autoattack}
    )
    assert found["total_hours"] == pytest.approx(
        found["training_hours"]
        + found["validation_hours"]
        + found["final_evaluation_hours"]
        + pgd
        + autoattack
    )
    assert found["not_estimated"] == []
    said = estimate.describe(found)
    assert "not a measurement" in said
    for term in ("training", "per-epoch validation", "final evaluation", "PGD-50-10"):
        assert term in said
    # Validating on the whole split (val_examples 0): the split's size from the anchors; a
    # final evaluation with AutoAttack; evaluations capped at the test split's size.
    spec["flags"].update(val_examples=0, eval_examples=0, eval_autoattack=True)
    spec["estimate"].update(
        validation_examples={"fashion_mnist": 6000}, test_examples={"fashion_mnist": 500}
    )
    found = found_for(spec)
    assert found["validation_hours"] == pytest.approx(4 * 20 * 6000 * (2 * 1 + 2) * 0.001 * hours)
    assert found["final_evaluation_hours"] == pytest.approx(
        4 * 500 * (1 + 2 + autoattack_passes) * 0.001 * hours
    )
    assert found["evaluation_hours"]["PGD-50-10"] == pytest.approx(pgd / 2)


def test_runs_recorded_before_their_passes_are_priced_by_their_method_config(tmp_path):
    """fashion_mnist_ig's first cells ran before results.json named the cost variant: the method
    config they recorded prices them, first-order Fast-BAT at its own step time, in the report
    sweep.py writes as in the records it reads."""
    sweep_dir = os.path.join(ROOT, "study", "results", "fashion_mnist_ig")
    definition = sweeps.load_definition(
        os.path.join(ROOT, "study/definitions/fashion_mnist_ig.json")
    )
    report = study.collect(definition, sweep_dir)
    legacy = 0
    for cell in report.cells:
        with open(cell.train.source) as f:
            legacy += "cost_variant" not in json.load(f)["method"]
        if cell.options.get("ig") == "hessian_aware":
            expected = "fastbat ig=hessian_aware"
        elif cell.options.get("ig_coef") == 0:
            expected = "fastbat ig=none"
        else:
            expected = "fastbat"
        assert cell.train.cost_variant == expected, cell.name
    assert legacy >= 20  # the committed sweep holds such runs

    # The user's view: the cost table of sweep.md, rewritten from a copy of the sweep: each
    # run priced by the passes its recorded config declares.
    copy = tmp_path / "fashion_mnist_ig"
    shutil.copytree(sweep_dir, copy, ignore=shutil.ignore_patterns("*.h5", "*.png"))
    done = run_sweep("--sweep=fashion_mnist_ig", f"--sweep_dir={copy}", "--report_only")
    assert done.returncode == 0, done.stderr[-3000:]
    table = (copy / "sweep.md").read_text().split("## Robustness against cost")[1]
    table = table.split("\n## ")[0]  # the paired comparisons follow, with as many columns
    per_step = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.split("|")[1:-1]]
        if len(cells) >= 9 and cells[0] == "64":
            per_step.setdefault(cells[1].split(" (")[-1], set()).add(int(cells[2]))
    # First-order Fast-BAT 6 passes a step; Fast-BAT 8, and 20 Hessian-aware (3 CG steps).
    assert per_step == {"first-order Fast-BAT)": {6}, "Fast-BAT)": {8, 20}}


@pytest.mark.slow
def test_a_diverged_cell_is_reported_as_diverged_and_not_run_again(tmp_path, committed_tree):
    """A cell whose training diverges is a finding, not a failure: the sweep says so and ends
    well, the report shows it diverged with no selected epoch, and a second start runs
    nothing."""
    path = write_definition(
        tmp_path,
        [{"method": ["standard"], "eps": [8]}],
        {**TINY_FLAGS, "epochs": 1, "lr_max": 1e6},
        evaluation=PGD_OWN,
    )
    out = tmp_path / "out"
    done = run_sweep(f"--sweep={path}", f"--sweep_dir={out}", tree=committed_tree)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("[1/1] standard-eps8"))
    assert "diverged in training, not evaluated:" in line and "Try a lower --lr_max" in line
    assert "1 cells diverged in training: standard-eps8" in done.stdout
    report = json.loads((out / "sweep.json").read_text())
    cell = report["cells"][0]
    assert cell["state"] == "diverged" and cell["train"]["selected_epoch"] is None
    row = next(x for x in (out / "sweep.md").read_text().splitlines() if x.startswith("| standard"))
    assert "| diverged |" in row
    again = run_sweep(f"--sweep={path}", f"--sweep_dir={out}", tree=committed_tree)
    assert again.returncode == 0 and "1 cells, 0 done, 1 diverged, 0 to run" in again.stdout
    assert not (out / "standard-eps8" / "eval-pgd.json").exists()


@pytest.mark.slow
def test_recorded_commands_are_quoted_as_a_shell_reads_them(tmp_path, committed_tree):
    """A data folder whose name holds a space, ';', '$()' and backticks reaches sweep.json's
    commands, the dry-run listing and the scheduler's lines quoted: bash reads each back as
    the same arguments, and runs nothing the name holds."""
    data = tmp_path / "my data;touch SEMI;$(touch DOLLAR)`touch TICK`"
    data.mkdir()
    path = write_definition(tmp_path, [{"method": ["fastat"], "eps": [8]}])
    out = tmp_path / "out"
    work = tmp_path / "work"
    work.mkdir()
    definition = sweeps.load_definition(path)
    definition.flags["data_dir"] = str(data)
    cell = sweeps.expand(definition)[0]
    expected = sweeps.commands(definition, cell, str(out))
    record = study.cell_record(definition, cell, str(out))
    dry = run_sweep(f"--sweep={path}", f"--sweep_dir={out}", f"--data_dir={data}", "--dry_run")
    assert dry.returncode == 0, dry.stderr[-3000:]
    listed = {
        line.split(": ", 1)[0].strip(): line.split(": ", 1)[1]
        for line in dry.stdout.splitlines()
        if line.startswith("  ") and ": python " in line
    }
    for shown in (record.commands, listed):
        for part, command in shown.items():
            # The shell's reading of the line, with the program replaced by one that prints it.
            echoed = subprocess.run(
                ["bash", "-c", "printf '%s\\n' " + command.removeprefix("python ")],
                cwd=work,
                capture_output=True,
                text=True,
            )
            assert echoed.stdout.splitlines() == expected[part], part
    printed = print_commands(path, out, data, committed_tree)
    line = printed.stdout.strip().splitlines()[0]
    shell = subprocess.run(
        ["bash", "-c", line.replace(f"{sys.executable} ", "printf '%s\\n' ")],
        cwd=work,
        capture_output=True,
        text=True,
    )
    assert f"--data_dir={data}" in shell.stdout.splitlines()
    assert not [p for p in os.listdir(work)] and not (tmp_path / "SEMI").exists()
    assert not os.path.exists(os.path.join(ROOT, "SEMI"))


def test_paper_rows_count_only_the_seeds_that_ran():
    """A published row whose setting has three seeds, one of them run: the report names that
    run alone and says n = 1 of 3."""
    from study import paper

    def cell(seed, robust=None):
        flags = {"dataset": "cifar10", "model": "preact_resnet18", "seed": seed}
        evaluated = {} if robust is None else {"autoattack": {8.0: robust}}
        return made_cell("fastbat", seed, flags=flags, **evaluated)

    report = study.Report(
        evaluations=(made_evaluation("autoattack"),),
        cells=(cell(0, 0.45), cell(1), cell(2)),
        paper={
            "source": "made up",
            "defaults": {},
            "rows": [
                {
                    "table": "2",
                    "method": "fastbat",
                    "eps": 8,
                    "flags": {"dataset": "cifar10"},
                    "autoattack": [45.19, 0.12],
                }
            ],
        },
    )
    (row,) = paper.paper_rows(report)
    assert row.measured_runs == ("out/fastbat-eps8-seed0",) and row.setting_runs == 3
    assert "45.00 (n = 1 of 3)" in "\n".join(paper.paper_table(report))


def test_a_cell_whose_evaluations_have_not_run_is_not_marked_as_unrecorded_code(tmp_path):
    """Trained but not yet evaluated: its code is its training's; the evaluations to come are
    not counted as parts run from unrecorded code (the report's †)."""
    path = write_definition(tmp_path, [{"method": ["standard"], "eps": [8]}])
    definition = sweeps.load_definition(path)
    (cell,) = sweeps.expand(definition)
    cell_dir = tmp_path / "out" / cell.name
    cell_dir.mkdir(parents=True)
    code = {"package": "fbat-tf", "revision": "a" * 40, "dirty": False}
    (cell_dir / sweeps.RESULTS).write_text(
        json.dumps(
            {
                "config": {"workdir": str(cell_dir)},
                "status": "complete",
                "history": [],
                "code": code,
            }
        )
    )
    record = study.cell_record(definition, cell, str(tmp_path / "out"))
    assert record.code == CellCode(("a" * 40,), False)


def test_a_number_that_is_no_accuracy_is_left_out_with_its_seed_naming_the_file(tmp_path):
    """A NaN robust accuracy (a hand edit, a bug) stopped the report with an AttributeError
    naming nothing. It is left out, marked, its file named, and the comparisons count the seeds
    that remain."""
    from study import comparisons

    out = str(tmp_path / "out")
    for method, aa in (("fastat", 0.4), ("fastbat", 0.45)):
        for seed in (0, 1, 2):
            _fake_cell(
                out, f"{method}-eps8-seed{seed}", clean=0.8, pgd={8: 0.5}, aa=aa, val_robust=[0.4]
            )
    broken = os.path.join(out, "fastat-eps8-seed1", sweeps.EVAL_AUTOATTACK)
    with open(broken) as f:
        payload = json.load(f)
    payload["robust_accuracy"] = {"autoattack@8": float("nan")}
    with open(broken, "w") as f:
        json.dump(payload, f)
    path = write_definition(
        tmp_path,
        [{"method": ["fastat", "fastbat"], "eps": [8], "seed": [0, 1, 2]}],
        comparisons=[["fastbat", "fastat"]],
    )
    report = study.collect(sweeps.load_definition(path), out)
    paths = study.write_report(report, out)
    text = open(paths["markdown"]).read()
    assert "| fastat | 8 | 3/3 | 80.0 ± 0.0 | 50.0 ± 0.0 | 40.0 ± 0.0 (2 of 3 seeds §) |" in text
    assert (
        f"- § fastat-eps8-seed1: {broken}: robust accuracy nan is not a number from 0 to 1, "
        "left out"
    ) in text
    (pair,) = comparisons.listed_comparisons(report)
    assert pair.seeds == [0, 2]
    assert "| 8 | fastbat | fastat | 2 |" in text
