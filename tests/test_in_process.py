"""tests/in_process.py runs train.py's and evaluate.py's main() in one process, where the
programs each have one of their own: whichever runs first, each reads its own flags. --eps is a
float for train.py and a list of budgets for evaluate.py, the shared --dataset and --norm take
each program's own default, each program's validators of --eps see its own --eps, and train.py's
flag words (its flags.txt) hold none of evaluate.py's flags. Each order runs in a fresh process:
in a test process, which program defined its flags first depends on the tests run before (no run
here loads TensorFlow: each is refused before it would)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def check(first: str, folder: str) -> None:
    """Both programs run twice each in this process, `first` first, each refusing and taking
    --eps as its own; `folder` holds no model."""
    from tests import in_process

    monkeypatch = pytest.MonkeyPatch()
    a_file = os.path.join(folder, "a-file")
    open(a_file, "w").close()

    def evaluate(*args: str) -> in_process.Ran:
        return in_process.evaluate(f"--model_path={folder}", *args, monkeypatch=monkeypatch)

    def train(*args: str) -> in_process.Ran:
        return in_process.train(*args, monkeypatch=monkeypatch)

    def evaluate_runs() -> None:
        # A list of budgets, checked under --norm=linf by evaluate.py's validators alone: taken,
        # and the folder, no model, refused by main.
        line = evaluate("--eps=8,16", "--norm=linf").one_line()
        assert line.startswith(f"error: --model_path={folder} is neither"), line
        refused = evaluate("--eps=abc")
        assert refused.returncode == 1, refused.stderr
        assert "flag --eps=['abc']: --eps values must be numbers in (0, 255]" in refused.stderr
        # --norm's default is evaluate.py's, None: main checks the units by the model's norm.
        line = evaluate("--eps=0.5").one_line()
        assert line.startswith("error: --eps=0.5: ε is in 1/255 units"), line

    def train_runs() -> None:
        refused = train("--eps=8,16", f"--workdir={a_file}")
        assert refused.returncode == 1, refused.stderr
        assert "flag --eps=8,16: could not convert string to float" in refused.stderr
        # A float, checked under --norm=linf by train.py's validators alone: taken, and the
        # workdir, a file, refused by main.
        line = train("--eps=8", "--norm=linf", f"--workdir={a_file}").one_line()
        assert line == f"error: --workdir={a_file} is a file, not a folder; name a folder"
        # --dataset's default is train.py's, CIFAR-10 (32×32×3 images).
        line = train("--eps=40", "--norm=l2", f"--workdir={folder}/new").one_line()
        assert "--eps=40 under --norm=l2 is 72.2%" in line and "32×32×3 images" in line, line
        from flags.run import run_flags

        words = run_flags()  # what train.py writes into flags.txt
        assert words["eps"] == "--eps=8.0" and words["dataset"] == "--dataset=cifar10"
        assert not {"model_path", "attacks", "pgd_steps", "aa_version"} & set(words), words

    runs = [evaluate_runs, train_runs]
    for run in (runs if first == "evaluate" else runs[::-1]) * 2:
        run()
    monkeypatch.undo()
    assert "tensorflow" not in sys.modules


@pytest.mark.parametrize("first", ["train", "evaluate"])
def test_each_program_reads_its_own_flags_whichever_runs_first(first, tmp_path):
    code = f"from tests.test_in_process import check; check({first!r}, {str(tmp_path)!r})"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
