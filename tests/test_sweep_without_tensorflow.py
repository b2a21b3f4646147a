"""sweep.py checks every cell of a definition before anything runs, and for the built-in methods
on local data it does so without TensorFlow: each method's rules (its class, in its module
under fbat_tf/methods/) and the local files are asked, not a method created nor TFDS imported.
Here TensorFlow cannot be imported at all, as a user types the commands."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.commands import NO_TENSORFLOW, python_command
from tests.test_sweep import TINY_FLAGS, write_definition

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FASHION_MNIST = "/usr/share/datasets/fashion-mnist"

pytestmark = pytest.mark.skipif(
    not os.path.isdir(FASHION_MNIST), reason="needs dataset-fashion-mnist"
)


def sweep_without_tensorflow(*words: str) -> subprocess.CompletedProcess:
    command = python_command(os.path.join(ROOT, "sweep.py"), *words, prelude=NO_TENSORFLOW)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_a_dry_run_checks_every_built_in_method_and_local_data_without_tensorflow(tmp_path):
    grid = [
        {
            "method": ["standard", "fastat", "fastat_ga", "nfgsm", "pgd", "free", "fastbat"],
            "eps": [8],
        },
        {"method": ["elle"], "eps": [8], "elle_schedule": ["adaptive", "constant"]},
        {"method": ["fastbat"], "eps": [16], "ig": ["hessian_aware"], "lambda_inv": [2500]},
        {"method": ["pgd", "fastat"], "norm": ["l2"], "eps": [1.5]},
    ]
    path = write_definition(tmp_path, grid)
    out = tmp_path / "out"
    words = (f"--sweep={path}", f"--sweep_dir={out}", f"--data_dir={FASHION_MNIST}", "--dry_run")
    done = sweep_without_tensorflow(*words)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    # The data were found: no warning that a real run would stop at them.
    assert not [line for line in lines if line.startswith("warning:")], done.stdout
    assert lines[-1] == "12 cells: 12 new"
    assert [line for line in lines if line.startswith("fastbat-eps16")] == [
        "fastbat-eps16-ighessian_aware-lambda_inv2500: new"
    ], lines
    assert not out.exists()


# A cell whose method refuses an option value, a norm or a strategy: refused in one line naming
# the cell, with the message creating the method gives (tests/test_methods.py holds the two
# equal), before any run and without TensorFlow.
REFUSED = {
    "fastbat-lambda": (
        # --allow_small_units: a λ⁻¹ of 0 is meant, not a λ⁻¹ in pixel units.
        {"method": ["fastbat"], "eps": [8], "lambda_inv": [0], "allow_small_units": [True]},
        "cell fastbat-eps8-allow_small_unitstrue-lambda_inv0: lambda_inv must be > 0, got 0.0",
    ),
    "elle-decay": (
        {"method": ["elle"], "eps": [8], "elle_decay": [1.5]},
        "cell elle-eps8-elle_decay1.5: elle decay (γ) must be in (0, 1], got 1.5",
    ),
    "gradalign-l2": (
        {"method": ["fastat_ga"], "eps": [1.5], "norm": ["l2"]},
        "cell fastat_ga-eps1.5-norml2: --method=fastat_ga has no L2 form: its released form "
        "and settings are for the L∞ ball only; train it with --norm=linf",
    ),
    "free-mirrored": (
        {"method": ["free"], "eps": [8], "strategy": ["mirrored"]},
        "cell free-eps8-strategymirrored: --method=free carries δ across batches on one "
        "device: use --strategy=default, not --strategy=mirrored",
    ),
    # true for a flag of a number read as "--epochs=--steps_per_epoch=2: invalid literal".
    "epochs-true": (
        {"method": ["fastat"], "eps": [8], "epochs": [True]},
        "cell fastat-eps8-epochstrue: 'epochs' is true, but --epochs is not a true/false flag: "
        "give it a value of its type (int)",
    ),
    # An L2 ball that holds every 28×28 image, and one sized like an L∞ ε (8/255).
    "l2-whole-box": (
        {"method": ["pgd"], "eps": [100], "norm": ["l2"]},
        "cell pgd-eps100-norml2: --eps=100 under --norm=l2 is 357.1% of the largest L2 "
        "distance between 28×28×1 images in [0, 1] (√784 ≈ 28): the ball holds every image, so "
        "nothing is robust to it; give an L2 budget in [0, 1]-pixel units, a few percent of "
        "that (e.g. 1.5 for Fashion-MNIST, 0.5 for CIFAR-10)",
    ),
    "l2-linf-sized": (
        {"method": ["pgd"], "eps": [8], "norm": ["l2"]},
        "cell pgd-eps8-norml2: --eps=8 under --norm=l2 is 28.6% of the largest L2 distance "
        "between 28×28×1 images in [0, 1] (√784 ≈ 28), 10% or more: an L∞ number in 1/255 "
        "units? L2 budgets are a few percent of it (1.5 for Fashion-MNIST, 0.5 for CIFAR-10); "
        "did you mean --norm=linf --eps=8? Pass --allow_large_l2_eps to keep --eps=8 (L2)",
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_bad_method_option_is_refused_in_one_line_without_tensorflow(tmp_path, case):
    grid, says = REFUSED[case]
    path = write_definition(tmp_path, [grid], {**TINY_FLAGS, "data_dir": FASHION_MNIST})
    out = tmp_path / "out"
    # A real run (its code unpinned: refused before anything is pinned) and a dry run.
    for extra in (("--allow_dirty",), ("--dry_run",)):
        done = sweep_without_tensorflow(f"--sweep={path}", f"--sweep_dir={out}", *extra)
        assert done.returncode != 0, done.stdout[-2000:]
        assert done.stderr.strip().splitlines() == [f"error: {says}"], done.stderr[-3000:]
        assert not out.exists()


@pytest.mark.parametrize("override", ["only_check_args=true", "undefok=eps", "--flagfile=x"])
def test_an_override_of_absl_s_own_flags_is_refused_naming_it(tmp_path, override):
    """--override once let absl's own flags into every cell (the definition refuses them in its
    flags and grid): only_check_args made each train.py parse and stop, and the failure named a
    run directory that did not exist."""
    path = write_definition(tmp_path, [{"method": ["standard"], "eps": [8]}])
    out = tmp_path / "out"
    words = (f"--sweep={path}", f"--sweep_dir={out}", f"--data_dir={FASHION_MNIST}")
    done = sweep_without_tensorflow(*words, f"--override={override}", "--dry_run")
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith(f"error: --override={override}: "), line
    assert "absl's own flags" in line and not out.exists()


@pytest.mark.slow
def test_a_study_by_name_resumes_its_committed_cells_and_a_kit_writes_to_results():
    """`--sweep=<name>` finds the paper's kits in configs/sweeps/ and the studies in
    study/definitions/; a study's cells default to study/results/<name>, where its committed
    cells are (a dry run finds them done), a kit's to results/<name>. An unknown name lists
    both folders' names."""
    study = sweep_without_tensorflow("--sweep=fashion_mnist_fast", "--dry_run")
    assert study.returncode == 0, study.stderr[-3000:]
    assert study.stdout.splitlines()[-1] == "90 cells: 90 done"
    assert "--workdir=study/results/fashion_mnist_fast/fastat-eps16-seed0 " in study.stdout
    kit = sweep_without_tensorflow("--sweep=paper_table2", "--dry_run", "--nodownload")
    assert "--workdir=results/paper_table2/" in kit.stdout, kit.stdout[-2000:] + kit.stderr
    unknown = sweep_without_tensorflow("--sweep=no_such_study", "--dry_run")
    line = unknown.stderr.strip().splitlines()[-1]
    assert line.startswith(
        "error: --sweep=no_such_study: no such definition file, nor a name in configs/sweeps/ or "
        "study/definitions/ ("
    ), line
    assert "fashion_mnist_tuned" in line and "paper_table2" in line
