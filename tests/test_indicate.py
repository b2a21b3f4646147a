"""`python -m fbat_tf.indicate`, on the committed L2 PGD-AT MLP (tests/data/l2_reference):

- an evaluation evaluate.py wrote, its indicators taken out as in a file from before them, gets
  back the indicators and checks evaluate.py computed, without attacking the test points again;
- an evaluation whose zero-gradient check counted points the model gets wrong gets the check
  computed again on the same points: the MLP's first 64 test points hold 9 where the old check
  saw a zero DLR gradient, all of them misclassified; the old check is kept beside the new;
- nothing else in either file changes, a second run changes nothing, a link and a sweep's
  pinned code copy are left alone.

evaluate.py's main() and indicate's run in the test's process (tests/in_process.py), both under
its one choice of oneDNN kernels, so that what they compute compares exactly; the refusals of a
missing path and of a link are the program's own exit status and run as programs."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tests import in_process
from tests.test_indicators import MLP
from tests.test_train_cli import FASHION_MNIST, ROOT

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not os.path.isdir(FASHION_MNIST), reason="needs dataset-fashion-mnist"),
]

OLD = {"fired": True, "detail": "9 of 64 points: the DLR gradient is zero", "keys": []}
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")


def old_style_zero_points() -> int:
    """The check as it was: the DLR gradient at APGD's start on every one of the 64 points."""
    import keras

    from fbat_tf import checks, constraints, data
    from fbat_tf.attacks import losses

    mlp = keras.saving.load_model(MLP)
    x, y = next(iter(data.load("fashion_mnist", "test", batch_size=64, max_examples=64)))[:2]
    y = tf.cast(y, tf.int32)
    start = checks.apgd_start(x, 1.5, "l2", constraints.as_seed(0))
    grad = checks.input_gradients(mlp, start, lambda z: losses.dlr(z, y))
    zero = np.abs(grad).sum(1) == 0
    right = np.argmax(mlp(x), -1) == y.numpy()
    assert not (zero & right).any()  # every such point is one the model gets wrong
    return int(zero.sum())


def indicate_program(*paths: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fbat_tf.indicate", *paths],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=600,
    )


def indicate(*paths: str) -> in_process.Ran:
    """`python -m fbat_tf.indicate paths` as its main() runs in this process: what it prints
    and its exit status, the environment (its oneDNN choice) put back after."""
    from fbat_tf import indicate as program

    environment = dict(os.environ)
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = program.main(list(paths))
    finally:
        os.environ.clear()
        os.environ.update(environment)
    return in_process.Ran(code, out.getvalue(), err.getvalue())


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory) -> dict:
    """evaluate.py's PGD and AutoAttack (its first 64 test points) on the MLP, at its ε."""
    results = tmp_path_factory.mktemp("evaluated") / "eval.json"
    with pytest.MonkeyPatch.context() as monkeypatch:
        done = in_process.evaluate(
            f"--model_path={MLP}",
            "--dataset=fashion_mnist",
            "--norm=l2",
            "--eps=1.5",
            "--attacks=pgd,autoattack",
            "--pgd_steps=5",
            "--pgd_restarts=1",
            "--n_examples=64",
            "--batch_size=64",
            f"--results={results}",
            monkeypatch=monkeypatch,
        )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(results.read_text())


def _without_seconds(indicators: dict) -> dict:
    return {k: v for k, v in indicators.items() if k not in ("seconds", "computed_later")}


def test_an_evaluation_from_before_the_indicators_gets_those_evaluate_py_computes(
    tmp_path, evaluated
):
    assert evaluated["indicators"]["attacks"]  # evaluate.py computed some
    older = {k: v for k, v in evaluated.items() if k != "indicators"}
    path = tmp_path / "run" / "eval-both.json"
    path.parent.mkdir()
    path.write_text(json.dumps(older))
    done = indicate(str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    again = json.loads(path.read_text())
    assert _without_seconds(again["indicators"]) == _without_seconds(evaluated["indicators"])
    assert again["indicators"]["computed_later"]["package"] == "fbat-tf"
    assert {k: v for k, v in again.items() if k != "indicators"} == older
    assert f"{path}: indicators computed: " in done.stdout
    assert "1 files given indicators, 0 zero-gradient checks computed again" in done.stdout
    # Given them, it is left alone.
    twice = indicate(str(path))
    assert twice.returncode == 0 and "0 files given indicators, 0 zero" in twice.stdout
    assert json.loads(path.read_text()) == again


def test_a_check_that_counted_misclassified_points_is_computed_again(tmp_path, evaluated):
    assert old_style_zero_points() == 9
    written = json.loads(json.dumps(evaluated))
    written["indicators"]["checks"]["zero_gradients"] = OLD
    run = tmp_path / "run"
    run.mkdir()
    path = run / "eval-pgd.json"
    path.write_text(json.dumps(written))
    shutil.copy(path, tmp_path / "elsewhere.json")
    (run / "eval-linked.json").symlink_to(tmp_path / "elsewhere.json")
    copy = run / "code" / "abc" / "eval-pgd.json"  # a sweep's pinned code copy
    copy.parent.mkdir(parents=True)
    shutil.copy(path, copy)

    done = indicate(str(tmp_path))
    assert done.returncode == 0, done.stderr[-2000:]
    rewritten = json.loads(path.read_text())
    check = rewritten["indicators"]["checks"]["zero_gradients"]
    assert check["fired"] is False
    assert check["detail"].startswith("0 of the 42 points the model classifies right")
    assert check == {
        **evaluated["indicators"]["checks"]["zero_gradients"],
        "rechecked": check["rechecked"],
    }
    assert check["rechecked"]["before"] == OLD
    assert check["rechecked"]["code"]["package"] == "fbat-tf"
    rewritten["indicators"]["checks"]["zero_gradients"] = OLD
    assert rewritten == written  # nothing else changed
    assert f"{path}: zero-gradient check computed again: " in done.stdout
    assert "0 files given indicators, 1 zero-gradient checks computed again" in done.stdout
    assert f"{run / 'eval-linked.json'}: a link, left as it is" in done.stdout
    assert json.loads((tmp_path / "elsewhere.json").read_text()) == written
    assert json.loads(copy.read_text()) == written

    missing = indicate_program(str(tmp_path / "nothing"))
    assert missing.returncode == 2 and "nothing: no such file or folder" in missing.stderr
    # A folder named through a link: refused before anything is read, nothing behind it written.
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "eval-pgd.json").write_text(json.dumps(written))
    (tmp_path / "linked").symlink_to(outside)
    refused = indicate_program(str(tmp_path / "linked"))
    assert refused.returncode == 2, refused.stdout
    assert refused.stderr.strip().endswith(
        "linked: a symbolic link; name the file or folder it points at"
    )
    assert json.loads((outside / "eval-pgd.json").read_text()) == written


def test_a_committed_run_moved_with_its_evaluations_is_found_where_they_are(tmp_path):
    """An evaluation names its model by the path it had (results/deploy/fmnist-fastbat before
    the committed results moved under study/): where nothing is there any more and the file
    lies in a run directory of that name, that run directory is the model; a model still at its
    path is that one, and a file outside such a run keeps the path it names."""
    from fbat_tf import indicate

    run = tmp_path / "study" / "results" / "deploy" / "fmnist-fastbat"
    run.mkdir(parents=True)
    committed = os.path.join(ROOT, "study", "results", "deploy", "fmnist-fastbat")
    shutil.copy(os.path.join(committed, "results.json"), run / "results.json")
    gone = {"model_path": str(tmp_path / "gone" / "fmnist-fastbat")}
    assert indicate.model_of(str(run / "eval-test.json"), gone) == str(run)
    there = {"model_path": committed}
    assert indicate.model_of(str(run / "eval-test.json"), there) == committed
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert indicate.model_of(str(elsewhere / "eval-test.json"), gone) == gone["model_path"]
    # A folder of that name that holds no run is not taken for the model either.
    (tmp_path / "other" / "fmnist-fastbat").mkdir(parents=True)
    stray = tmp_path / "other" / "fmnist-fastbat" / "eval-test.json"
    assert indicate.model_of(str(stray), gone) == gone["model_path"]
