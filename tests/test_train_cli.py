"""train.py end to end: bad flags fail before any work, a real Fashion-MNIST run writes what
DESIGN.md §5 promises, a finished run is not redone, other flags are refused, and a CIFAR-10 run
through mocked TFDS writes TensorBoard events (read back here). Resuming after a kill is tested in
test_resume.py."""

from __future__ import annotations

import glob
import json
import os
import re
import signal
import subprocess
import time

import numpy as np
import pytest
import tensorflow as tf

from fbat_tf.records import RunRecord
from fbat_tf.run import Run
from fbat_tf.training import TrainConfig, train
from tests import in_process
from tests.commands import NO_TENSORFLOW, python_command
from tests.mock_tfds.mocked_tfds import mock_tfds
from tests.snapshots import snapshot
from tests.tiny import fashion_mnist_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FASHION_MNIST = "/usr/share/datasets/fashion-mnist"

TINY_RUN = [
    "--dataset=fashion_mnist",
    "--model=small_cnn",
    "--width=4",
    "--epochs=2",
    "--max_train_examples=256",
    "--batch_size=64",
    "--val_examples=64",
    "--val_attack_steps=2",
    "--eval_examples=64",
    "--eval_pgd_steps=2",
    "--eval_pgd_restarts=1",
    "--noeval_autoattack",
    "--tensorboard_every=0",
    "--verbose=0",
]


def start_train(*args: str, program: str = "train.py", prelude: str = "") -> subprocess.Popen:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.Popen(
        python_command(os.path.join(ROOT, program), *args, prelude=prelude),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=env,
    )


def finish(process: subprocess.Popen) -> subprocess.CompletedProcess:
    stdout, stderr = process.communicate(timeout=600)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def run_train(*args: str, program: str = "train.py") -> subprocess.CompletedProcess:
    return finish(start_train(*args, program=program))


@pytest.mark.slow
def test_bad_flags_and_missing_data_fail_before_any_work(tmp_path):
    """Each bad command (run side by side) fails, names what is wrong, and writes nothing;
    before TensorFlow loads: a dataset that is not there (no local files, nothing in TFDS's
    data dir, no download) is told without asking TFDS, which loads TensorFlow."""
    newline = tmp_path / "data\n--momentum_at_peak=0.5"
    newline.mkdir()
    cases = {
        "method": (["--method=fastbatt", "--dataset=fashion_mnist"], ["--method"]),
        "eps0": (["--eps=0", "--dataset=fashion_mnist"], ["--eps"]),
        "eps300": (["--eps=300", "--dataset=fashion_mnist"], ["--eps"]),
        "data_dir": (["--data_dir=/nonexistent/dir", "--dataset=fashion_mnist"], ["--data_dir"]),
        # Free-AT says it needs one device (Method.single_device), not a flag rule by its name.
        "free_mirrored": (
            ["--method=free", "--strategy=mirrored", "--dataset=fashion_mnist"],
            ["--method=free", "--strategy=default", "--strategy=mirrored"],
        ),
        # A method's own rules: an option's value, a threat model it has no form for.
        "lambda_inv0": (
            ["--method=fastbat", "--lambda_inv=0", "--allow_small_units"],
            ["error: lambda_inv must be > 0, got 0.0"],
        ),
        "ga_l2": (
            ["--method=fastat_ga", "--norm=l2", "--eps=1.5", "--dataset=fashion_mnist"],
            ["error: --method=fastat_ga has no L2 form"],
        ),
        "missing": (
            ["--dataset=cifar10", f"--data_dir={tmp_path}", "--nodownload"],
            ["--data_dir", "cifar10"],
        ),
        "streamed_held_out": (
            ["--dataset=imagenet", "--validation_from=test"],
            ["--validation_from=test", "imagenet"],
        ),
        # NaN passes every bound; infinity passes a lower one.
        "nan_decay": (["--weight_decay=nan"], ["--weight_decay must be a finite number"]),
        "nan_skipped": (["--max_skipped_fraction=nan"], ["--max_skipped_fraction must be"]),
        "inf_lr": (["--lr_max=inf"], ["--lr_max must be a finite number"]),
        # A line break would write a second line into flags.txt: an existing folder so named.
        "newline": ([f"--data_dir={newline}"], ["--data_dir must not hold a line break"]),
    }
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    runs = {
        name: subprocess.Popen(
            python_command(
                os.path.join(ROOT, "train.py"),
                *args,
                f"--workdir={tmp_path / name}",
                prelude=NO_TENSORFLOW,
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=env,
        )
        for name, (args, _) in cases.items()
    }
    for name, process in runs.items():
        _, stderr = process.communicate(timeout=600)
        assert process.returncode != 0, name
        for named in cases[name][1]:
            assert named in stderr, (name, stderr[-2000:])
        assert not (tmp_path / name).exists(), name


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir(FASHION_MNIST), reason="needs dataset-fashion-mnist")
def test_real_fashion_mnist_run_then_no_redo_and_no_overwrite(tmp_path):
    workdir = tmp_path / "run"
    result = run_train("--method=fastbat", f"--workdir={workdir}", *TINY_RUN)
    assert result.returncode == 0, result.stderr[-3000:]
    # Only the run's own lines, warnings and errors: no absl INFO line of Python code (the
    # export's "Assets written to", ...) without --verbosity.
    info = re.compile(r"^I\d{4} [\d:.]+ +\d+ \w+\.py:\d+\]", re.MULTILINE)
    assert not info.findall(result.stdout + result.stderr), result.stderr[-3000:]
    # Nor TensorFlow's start-up lines, which its log level no longer hides (fbat_tf/startup.py).
    for line in ("InitializeLog", "cuInit", "oneDNN custom operations", "To enable the following"):
        assert line not in result.stderr, result.stderr[-3000:]
    results = json.loads((workdir / "results.json").read_text())
    assert results["status"] == "complete"
    assert [h["epoch"] for h in results["history"]] == [1, 2]
    assert not (workdir / "robustbench.json").exists()  # no AutoAttack, no entry
    # It starts saying what it trains: the method, ε in both units and the data.
    assert f"Starting {workdir}: fastbat at ε = 8/255 (0.03137) on fashion_mnist" in result.stdout
    # It ends saying which epoch was selected, where things are, and what to run next.
    selected = [h["epoch"] for h in results["history"] if h["val_best"]][-1]
    assert f"selected epoch {selected} of 2 (validation PGD accuracy" in result.stdout
    assert f"python evaluate.py --model_path={workdir}" in result.stdout
    assert "# PGD-50-10, AutoAttack: " in result.stdout and " here" in result.stdout
    assert f"tensorboard --logdir={workdir / 'tensorboard'}" in result.stdout
    for key in ("val_robust_accuracy", "val_clean_accuracy", "epoch_time", "ig_norm_ratio"):
        assert key in results["history"][-1]
    final = results["final"]
    assert final["examples"] == 64
    assert 0.0 <= final["robust_accuracy"]["pgd@8"] <= final["clean_accuracy"] <= 1.0
    assert (workdir / "checkpoints" / "best.weights.h5").exists()
    assert "--eps=8.0" in (workdir / "flags.txt").read_text()
    assert glob.glob(str(workdir / "tensorboard" / "train" / "events.out.tfevents.*"))
    exported = glob.glob(str(workdir / "export" / "fashion_mnist-small_cnn-fastbat" / "*"))
    assert [os.path.basename(p) for p in exported] == ["1"]
    assert os.path.exists(os.path.join(exported[0], "saved_model.pb"))
    # "auto" is recorded as what it resolved to on this CPU, in results.json and the model card.
    assert results["method"]["implicit_autodiff"] == "backward_over_backward"
    with open(os.path.join(exported[0], "assets.extra", "model_card.json")) as f:
        card = json.load(f)
    assert card["method"]["implicit_autodiff"] == "backward_over_backward"
    # The final test's indicators of attack failure, as evaluate.py computes them: said on the
    # console, in results.json and in the model card.
    indicators = final["indicators"]
    assert 0 < indicators["points"] <= 32 and "pgd@8" in indicators["attacks"]
    assert "indicators of attack failure (" in result.stdout
    assert "  indicators pgd@8: " in result.stdout
    assert set(card["robustness"]["indicators"]) == {"pgd@8"}
    assert card["method"]["title"] == "Fast-BAT"
    # The code that made each file: this checkout's revision.
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert results["code"]["revision"] == head and results["code"]["version"] == "0.1.0"
    assert card["source"]["trained_by"] == results["code"]
    assert card["source"]["exported_by"]["revision"] == head
    # And the machine: the same code gives other last digits on another CPU or build.
    with open("/proc/cpuinfo") as f:
        cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    assert results["machine"]["cpu"] == cpu and results["machine"]["cpu_count"] == os.cpu_count()
    assert results["machine"]["tensorflow"] == tf.__version__
    assert results["machine"]["numpy"] == np.__version__

    # The same command again and one with other flags, side by side: neither writes anything.
    before = {p: os.path.getmtime(p) for p in glob.glob(str(workdir / "**"), recursive=True)}
    again = start_train("--method=fastbat", f"--workdir={workdir}", *TINY_RUN)
    other = start_train("--method=fastbat", "--eps=4", f"--workdir={workdir}", *TINY_RUN)
    again, other = finish(again), finish(other)
    assert again.returncode == 0 and "finished run" in again.stdout
    assert other.returncode != 0
    assert "--eps=8.0 -> --eps=4.0" in other.stderr
    after = {p: os.path.getmtime(p) for p in glob.glob(str(workdir / "**"), recursive=True)}
    assert before == after

    evaluation = [f"--model_path={workdir}", "--n_examples=64", "--eps=4,8", "--pgd_steps=2"]
    evaluation += ["--attacks=pgd,apgd-ce", "--pgd_restarts=1"]
    evaluated = run_train(*evaluation, program="evaluate.py")
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    report = json.loads((workdir / "eval-test.json").read_text())
    assert report["examples"] == 64
    assert report["code"] == results["code"] and report["machine"] == results["machine"]
    assert set(report["robust_accuracy"]) == {"pgd@4", "pgd@8", "apgd-ce@4", "apgd-ce@8"}
    assert (workdir / "eval-test.png").stat().st_size > 1000
    # A larger budget cannot help the model.
    assert report["robust_accuracy"]["pgd@8"] <= report["robust_accuracy"]["pgd@4"] + 1e-9
    assert report["robust_accuracy"]["pgd@4"] <= report["clean_accuracy"]
    assert "| PGD-2-1 | 8 |" in evaluated.stdout
    # train.py's test numbers are evaluate.py's: the same float32 model, points and attack.
    assert report["clean_accuracy"] == final["clean_accuracy"]
    assert report["robust_accuracy"]["pgd@8"] == final["robust_accuracy"]["pgd@8"]
    # Image by image, on the same points (the test split's first 64).
    for key in ("clean", "pgd@8"):
        assert len(final["outcomes"][key]) == 64
        assert report["outcomes"][key] == final["outcomes"][key], key
    assert report["first_point"] == final["first_point"] == 0
    again = run_train(*evaluation, program="evaluate.py")
    assert again.returncode != 0 and "exists" in again.stderr


@pytest.fixture(scope="module")
def fgsm_pgi_run(tmp_path_factory) -> tuple:
    """One train.py run (main in this process) that two tests read: --method=fgsm_pgi, its
    step compiled with XLA, two epochs of 256 real images, and a final test with AutoAttack on
    the first 16 test images; its workdir and what main gave. Each of those tests would
    otherwise train a run of its own (a start-up, a step's tracing and a final test each)."""
    workdir = tmp_path_factory.mktemp("fgsm_pgi") / "run"
    tiny = [f for f in TINY_RUN if f != "--noeval_autoattack" and "eval_examples" not in f]
    with pytest.MonkeyPatch.context() as monkeypatch:
        result = in_process.train(
            "--method=fgsm_pgi",
            "--jit_compile=true",
            "--noexport",
            f"--workdir={workdir}",
            *tiny,
            "--eval_examples=16",
            monkeypatch=monkeypatch,
        )
    return workdir, result


@pytest.mark.slow
@pytest.mark.xdist_group("fgsm_pgi_run")
@pytest.mark.skipif(not os.path.isdir(FASHION_MNIST), reason="needs dataset-fashion-mnist")
def test_fgsm_pgi_trains_end_to_end_on_real_fashion_mnist(fgsm_pgi_run):
    """train.py --method=fgsm_pgi (main in this process, fgsm_pgi_run), its step compiled with
    XLA: two epochs of real images, each a pass over the 256 training examples, so the second
    epoch starts from every example's prior; the run records the method and its passes, logs
    the regularizer, and its checkpoint holds one prior per training example, each visited
    twice."""
    workdir, result = fgsm_pgi_run
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"Starting {workdir}: fgsm_pgi at ε = 8/255" in result.stdout
    results = json.loads((workdir / "results.json").read_text())
    assert results["status"] == "complete"
    method = results["method"]
    assert method["title"] == "FGSM-PGI"
    assert (method["weight"], method["decay"], method["step"], method["reset"]) == (10, 0.3, 1, 40)
    assert method["passes"] == {"forward": 2, "backward": 3, "second_order": 0, "tangent": 0}
    history = results["history"]
    assert [h["epoch"] for h in history] == [1, 2]
    assert all(h["pgi_penalty"] > 0 and np.isfinite(h["loss"]) for h in history)
    assert 0.0 <= results["final"]["robust_accuracy"]["pgd@8"] <= 1.0
    path = tf.train.latest_checkpoint(str(workdir / "checkpoints" / "last"))
    reader = tf.train.load_checkpoint(path)
    visits = reader.get_tensor("method/visits/.ATTRIBUTES/VARIABLE_VALUE")
    prior = reader.get_tensor("method/prior/.ATTRIBUTES/VARIABLE_VALUE")
    assert visits.shape == (256,) and np.all(visits == 2)
    assert prior.shape == (256, 28, 28, 1)
    assert np.abs(prior).max() == pytest.approx(8 / 255)


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir(FASHION_MNIST), reason="needs dataset-fashion-mnist")
def test_final_evaluation_runs_the_float32_model_evaluate_py_loads(tmp_path, monkeypatch):
    """The final evaluation attacks the float32 model evaluate.py loads, and the caller's
    precision policy is back when train returns."""
    import keras

    from fbat_tf import classifiers, data, training

    seen = {}
    evaluate_test = training.evaluate_test

    def spy(classifier, config):
        seen["classifier"] = classifier
        return evaluate_test(classifier, config)

    monkeypatch.setattr(training, "evaluate_test", spy)
    workdir = str(tmp_path / "run")
    config = fashion_mnist_config(workdir, max_train_examples=128, precision="mixed_bfloat16")
    keras.mixed_precision.set_global_policy("mixed_float16")  # the caller's
    train(config)
    assert keras.mixed_precision.global_policy().name == "mixed_float16"
    keras.mixed_precision.set_global_policy("float32")  # as evaluate.py builds the model
    tested = seen["classifier"]
    assert tested.compute_dtype == "float32"
    loaded, _ = classifiers.load_classifier(workdir)  # what evaluate.py attacks
    x, _ = next(iter(data.load("fashion_mnist", "test", batch_size=64, download=False)))
    np.testing.assert_array_equal(tested(x).numpy(), loaded(x).numpy())


def _scalars(directory: str) -> dict[str, list[float]]:
    """Scalars of every event file under `directory`, read with TensorFlow's record reader."""
    values: dict[str, list[float]] = {}
    for path in sorted(glob.glob(os.path.join(directory, "events.out.tfevents.*"))):
        for record in tf.data.TFRecordDataset(path):
            event = tf.compat.v1.Event.FromString(record.numpy())
            for value in event.summary.value:
                number = (
                    float(tf.make_ndarray(value.tensor))
                    if value.HasField("tensor")
                    else value.simple_value
                )
                values.setdefault(value.tag, []).append(number)
    return values


def _cifar_config(workdir: str, eval_autoattack: bool = False) -> TrainConfig:
    return TrainConfig(
        workdir=workdir,
        method="fastbat",
        dataset="cifar10",
        model="preact_resnet18",
        width=4,
        epochs=2,
        batch_size=8,
        val_examples=8,
        val_attack_steps=2,
        eval_examples=8,
        eval_pgd_steps=2,
        eval_pgd_restarts=1,
        eval_autoattack=eval_autoattack,
        jit_compile=False,
        download=False,
        tensorboard_every=2,
        verbose=0,
    )


@pytest.mark.slow
def test_cifar10_mocked_tfds_run_writes_tensorboard(tmp_path):
    with mock_tfds(num_examples=40):
        complete = train(_cifar_config(str(tmp_path / "complete"), eval_autoattack=True))
        steps_per_epoch = complete.steps_per_epoch
        assert steps_per_epoch == 36 // 8  # 40 examples, the last 10% held out, partial dropped
        assert complete.optimizer_steps == 2 * steps_per_epoch
        final = complete.final
        assert final.examples == 8
        # The per-example worst case over more attacks can only be lower.
        assert final.robust_accuracy("autoattack") <= final.clean_accuracy
        per_attack = list(final.attacked("autoattack").parts.values())
        assert per_attack == sorted(per_attack, reverse=True)
        assert per_attack[-1] == final.robust_accuracy("autoattack")

        scalars = _scalars(str(tmp_path / "complete" / "tensorboard" / "validation"))
        assert len(scalars["epoch_robust_accuracy"]) == 2
        train_scalars = _scalars(str(tmp_path / "complete" / "tensorboard" / "train"))
        assert len(train_scalars["epoch_ig_norm_ratio"]) == 2
        assert len(train_scalars["epoch_learning_rate"]) == 2
        history = complete.history
        np.testing.assert_allclose(
            scalars["epoch_robust_accuracy"], [e.val_robust_accuracy for e in history]
        )
        assert os.listdir(tmp_path / "complete" / "checkpoints" / "last")


def test_each_method_option_comes_from_the_flag_of_its_name(tmp_path):
    """In-process: a method's constructor parameters take the flags of their names (some are
    spelt otherwise), with --lambda_inv converted from 1/255 units and the attack steps given
    as multiples of ε."""
    import copy

    from absl import flags

    from flags import run as train_run

    def options(*words):
        values = copy.deepcopy(flags.FLAGS)
        values(["train.py", *words])
        return train_run.config_from_flags(str(tmp_path), values).method_options

    fastbat = options("--method=fastbat", "--tau=1e-6", "--lambda_inv=2500", "--cg_steps=5")
    assert fastbat["tau"] == 1e-6 and fastbat["cg_steps"] == 5
    assert fastbat["lambda_inv"] == pytest.approx(2500 / 255)
    assert options("--method=pgd", "--attack_steps=3") == {"steps": 3, "step": None}
    assert options("--method=pgd", "--pgd_step=0.25") == {"steps": 2, "step": 0.25}
    assert options("--method=free", "--free_replays=4") == {"replays": 4}
    assert options("--method=fastat_ga", "--ga_coef=1") == {"ga_coef": 1.0}
    assert options("--method=fastat") == {"step": 1.25}
    assert options("--method=nfgsm", "--nfgsm_step=0.5")["step"] == 0.5
    elle = options("--method=elle", "--elle_schedule=constant", "--elle_lambda=500")
    assert elle == {
        "weight": 500.0,
        "schedule": "constant",
        "decay": 0.99,
        "sensitivity": 2.0,
        "attack": "fgsm",
        "step": 1.0,
    }
    elle = options("--method=elle", "--elle_step=0.5", "--elle_attack=nfgsm")
    assert elle["step"] == 0.5 and elle["attack"] == "nfgsm"
    assert elle["weight"] is None and elle["schedule"] == "adaptive"


def test_a_run_older_than_a_flag_resumes_at_its_default_and_not_at_another_value(
    tmp_path, monkeypatch
):
    """In-process: a run directory whose flags.txt predates a flag (written before
    --implicit_autodiff existed) is the same run at that flag's default, and another run at any
    other value, named in the error."""
    import copy

    from absl import flags

    from flags import run as train_run

    def current(*words):
        values = copy.deepcopy(flags.FLAGS)
        values(["train.py", "--method=fastbat", "--noexport", f"--workdir={tmp_path}", *words])
        return train_run.run_flags(values)

    words = current()
    assert words["implicit_autodiff"] == "--implicit_autodiff=auto"
    older = [word for name, word in words.items() if word and name != "implicit_autodiff"]
    (tmp_path / "flags.txt").write_text("".join(f"{word}\n" for word in older))
    assert train_run.check_workdir(str(tmp_path), words) == "resume"
    with pytest.raises(ValueError) as error:
        train_run.check_workdir(str(tmp_path), current("--implicit_autodiff=forward_over_backward"))
    assert "--implicit_autodiff unset -> --implicit_autodiff=forward_over_backward" in str(
        error.value
    )
    with pytest.raises(ValueError, match="--eps=8.0 -> --eps=4.0"):
        train_run.check_workdir(str(tmp_path), current("--eps=4"))

    # As a user meets it: the same command on that finished run is told it is done.
    finished = {"config": {"workdir": str(tmp_path)}, "status": "complete", "history": []}
    (tmp_path / "results.json").write_text(json.dumps(finished))
    again = in_process.train(
        "--method=fastbat", "--noexport", f"--workdir={tmp_path}", monkeypatch=monkeypatch
    )
    assert again.returncode == 0, again.stderr[-2000:]
    assert "finished run" in again.stdout


DIVERGING = [
    "--method=fastbat",
    "--dataset=fashion_mnist",
    "--model=small_cnn",
    "--eps=8",
    "--epochs=1",
    "--steps_per_epoch=5",
    "--batch_size=32",
    "--eval_examples=100",
    "--noeval_autoattack",
    "--lr_max=1e6",
]


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir(FASHION_MNIST), reason="needs dataset-fashion-mnist")
def test_a_diverging_run_says_so_keeps_what_it_had_and_is_not_redone(tmp_path, monkeypatch):
    """The command a user typed at lr 1e6 (train.py's main, in this process): it stops with a
    message naming divergence and what to try (no traceback), exits non-zero, and leaves
    results.json (status "diverged", the history) and TensorBoard logs; the same command again
    says so and writes nothing."""
    workdir = tmp_path / "run"
    result = in_process.train(*DIVERGING, f"--workdir={workdir}", monkeypatch=monkeypatch)
    message = result.one_line()
    assert message.startswith("error: training diverged: in epoch 1"), result.stderr[-3000:]
    for named in ("--lr_max", "--stop_on_overfitting", "last finite training loss"):
        assert named in message
    results = json.loads((workdir / "results.json").read_text())
    assert results["status"] == "diverged"
    assert [h["epoch"] for h in results["history"]] == [1]
    outcome = results["divergence"]
    assert outcome["epoch"] == 1
    assert outcome["nonfinite_batches"] >= 1 or outcome["val_nonfinite_examples"] >= 1
    assert results["history"][0]["nonfinite_batches"] == outcome["nonfinite_batches"]
    assert "final" not in results
    best = workdir / "checkpoints" / "best.weights.h5"
    assert best.exists() == ("the best checkpoint so far" in message)
    assert glob.glob(str(workdir / "tensorboard" / "train" / "events.out.tfevents.*"))
    assert not (workdir / "export").exists()
    assert not (workdir / "train.lock").exists()  # a diverged run holds the directory no more

    before = {p: os.path.getmtime(p) for p in glob.glob(str(workdir / "**"), recursive=True)}
    again = in_process.train(*DIVERGING, f"--workdir={workdir}", monkeypatch=monkeypatch)
    message = again.one_line()
    assert "holds a run with these flags that diverged: in epoch 1" in message
    assert "another --workdir or delete it" in message
    after = {p: os.path.getmtime(p) for p in glob.glob(str(workdir / "**"), recursive=True)}
    assert before == after


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir(FASHION_MNIST), reason="needs dataset-fashion-mnist")
def test_a_run_diverging_in_its_second_epoch_keeps_the_first(tmp_path, monkeypatch):
    """In-process: a learning rate that jumps to 1e6 in epoch 2. The run raises Diverged; the
    best checkpoint and the last (resumable) one are epoch 1's; a second call raises again
    without training; the caller's precision policy is back in both cases."""
    import keras

    from fbat_tf import schedules, training

    steps = 4  # 256 examples in batches of 64

    def jump(name, lr_max, total_steps):
        return keras.optimizers.schedules.PiecewiseConstantDecay([steps - 1], [0.01, 1e6])

    monkeypatch.setattr(schedules, "create", jump)
    workdir = tmp_path / "run"
    config = fashion_mnist_config(str(workdir), epochs=3)
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    with pytest.raises(training.Diverged, match="training diverged: (in|after) epoch 2") as error:
        train(config)
    assert keras.mixed_precision.global_policy().name == "mixed_bfloat16"
    results = json.loads((workdir / "results.json").read_text())
    assert results["status"] == "diverged" and results["divergence"]["epoch"] == 2
    assert error.value.record.to_dict()["divergence"] == results["divergence"]
    assert [h["epoch"] for h in results["history"]] == [1, 2]
    assert results["history"][0]["val_best"] == 1.0
    assert "the best checkpoint so far" in str(error.value)
    assert (workdir / "checkpoints" / "best.weights.h5").exists()
    last = tf.train.latest_checkpoint(str(workdir / "checkpoints" / "last"))
    assert last.endswith("ckpt-1")
    reader = tf.train.load_checkpoint(last)
    assert int(reader.get_tensor("epoch/.ATTRIBUTES/VARIABLE_VALUE")) == 1

    before = {p: os.path.getmtime(p) for p in glob.glob(str(workdir / "**"), recursive=True)}
    with pytest.raises(training.Diverged, match="holds a run that diverged"):
        train(config)
    assert keras.mixed_precision.global_policy().name == "mixed_bfloat16"
    after = {p: os.path.getmtime(p) for p in glob.glob(str(workdir / "**"), recursive=True)}
    assert before == after


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir(FASHION_MNIST), reason="needs dataset-fashion-mnist")
def test_a_second_train_py_in_a_run_directory_in_use_is_refused(tmp_path, monkeypatch):
    """The same command started twice, the second while the first trains: the second says the
    directory is in use and by whom, and writes nothing; the first ends as if alone, with one
    TensorBoard event stream per curve. Once it ends the directory is free again."""
    workdir = tmp_path / "run"
    # No final test: the claims concern the lock, and the curves of the epochs.
    no_test = [flag for flag in TINY_RUN if not flag.startswith(("--eval_", "--noeval_"))]
    command = [
        "--method=standard",
        *no_test,
        "--nofinal_test",
        "--noexport",
        f"--workdir={workdir}",
    ]
    first = start_train(*command)
    deadline = time.time() + 300
    while not (workdir / "flags.txt").exists():
        assert first.poll() is None and time.time() < deadline
        time.sleep(0.1)
    # flags.txt is written once the lock is held. Stopped there, the first cannot end before
    # the second starts however fast the machine trains it.
    first.send_signal(signal.SIGSTOP)
    try:
        second = in_process.train(*command, monkeypatch=monkeypatch)
    finally:
        first.send_signal(signal.SIGCONT)
    assert second.returncode != 0 and "Traceback" not in second.stderr
    message = second.stderr.strip().splitlines()[-1]
    assert message.startswith(f"error: {workdir} is in use: process {first.pid} on ")
    done = finish(first)
    assert done.returncode == 0, done.stderr[-3000:]
    for curve in ("train", "validation"):
        assert len(glob.glob(str(workdir / "tensorboard" / curve / "events.out.tfevents.*"))) == 1
    assert not (workdir / "train.lock").exists()  # a finished run is no one's
    # Finished: not redone, and not refused as in use.
    again = in_process.train(*command, monkeypatch=monkeypatch)
    assert again.returncode == 0 and "holds a finished run" in again.stdout


@pytest.mark.slow
def test_a_run_that_selects_on_half_the_test_split_is_tested_on_the_other_half(
    tmp_path, monkeypatch
):
    """--validation_from=test: train.py (main in this process) validates on one half of the
    Fashion-MNIST test split and tests the selected model on the other 5,000 images; evaluate.py
    (main in this process too) tests it on the same half unless told otherwise."""
    workdir = tmp_path / "run"
    result = in_process.train(
        *TINY_RUN,
        "--epochs=1",
        "--eval_examples=0",
        "--validation_from=test",
        f"--workdir={workdir}",
        monkeypatch=monkeypatch,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads((workdir / "results.json").read_text())
    assert results["split"] == {"validation_from": "test", "held_out_seed": 10}
    assert results["final"]["examples"] == 5000
    assert results["tf32"] is False  # a CPU has none
    counts, points = {}, {}
    where = ("first_point", "held_out_seed", "held_out_sha256")
    for chosen in ([], ["--validation_from=train"]):
        out = tmp_path / f"eval{len(chosen)}.json"
        done = in_process.evaluate(  # evaluate.py's main, in this process too
            f"--model_path={workdir}",
            "--attacks=pgd",
            "--pgd_steps=1",
            "--pgd_restarts=1",
            "--batch_size=1000",
            f"--results={out}",
            *chosen,
            monkeypatch=monkeypatch,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        evaluated = json.loads(out.read_text())
        counts[evaluated["validation_from"]] = evaluated["examples"]
        points[evaluated["validation_from"]] = [evaluated.get(key) for key in where]
        assert len(evaluated["outcomes"]["clean"]) == evaluated["examples"]
        # train.py's test and evaluate.py describe an evaluation under the same keys.
        described = ("split", "validation_from", "attacks", "pgd_steps", "pgd_restarts", "seed")
        assert [evaluated[key] for key in described] == [
            "test",
            evaluated["validation_from"],
            ["pgd"],
            1,
            1,
            0,
        ]
        final = results["final"]
        assert [final[key] for key in described] == ["test", "test", ["pgd"], 2, 1, 0]
    assert counts == {"test": 5000, "train": 10000}
    # Which points: the held-out half, fingerprinted, for train.py's test and evaluate.py's
    # default alike; the whole test split from its first point otherwise.
    assert points["test"] == [results["final"].get(key) for key in where]
    assert points["test"][:2] == [0, 10] and len(points["test"][2]) == 16
    assert points["train"] == [0, None, None]


TERMINAL_SIGINT = "import signal\nsignal.signal(signal.SIGINT, signal.default_int_handler)"


def on_terminal(command: list[str], interrupt_at: bytes, timings: dict | None = None):
    """Run `command` on a pseudo-terminal as a user at a terminal does (its progress bars
    drawn, stdout and stderr on one screen), press Ctrl-C once `interrupt_at` is on the screen
    and then a second of work has gone by; its exit status and the screen. `timings` gets the
    seconds from the press to the interrupt's line ("said") and to the end ("ended")."""
    import pty
    import select

    pid, terminal = pty.fork()
    if pid == 0:  # the program
        os.chdir(ROOT)
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
        os.execv(command[0], command)
    screen, pressed, deadline, at = b"", None, time.time() + 300, 0.0
    while time.time() < deadline:
        if select.select([terminal], [], [], 0.1)[0]:
            try:
                chunk = os.read(terminal, 4096)
            except OSError:  # the program has ended
                break
            if not chunk:
                break
            screen += chunk
            if at and b"interrupted:" in screen and timings is not None:
                timings.setdefault("said", time.time() - at)
        if pressed is None and interrupt_at in screen:
            pressed = time.time() + 1.0
        if pressed is not None and 0 < pressed <= time.time():
            os.kill(pid, signal.SIGINT)
            pressed, at = -1.0, time.time()
    else:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    if timings is not None and at:
        timings["ended"] = time.time() - at
    return os.waitstatus_to_exitcode(status), screen.decode(errors="replace")


@pytest.mark.slow
def test_ctrl_c_is_one_line_of_its_own_saying_what_the_same_command_does(tmp_path, monkeypatch):
    """Ctrl-C printed Python's traceback (43 lines from sweep.py), then one line glued to the
    end of the progress bar, and left train.lock behind. On a terminal it now ends the bar's
    line and says in a line of its own that the same command resumes; the run's directory is
    no one's, and the run, stopped in its second epoch, resumes."""
    workdir = tmp_path / "run"
    # Progress bars drawn, an epoch long enough to press Ctrl-C inside it.
    drawn = {"--verbose=0": "--verbose=1", "--max_train_examples=256": "--max_train_examples=8192"}
    tiny = [drawn.get(flag, flag) for flag in TINY_RUN]
    # Two epochs: stopped in its last, the resumed run trains one epoch of 8,192 images, not two.
    command = ["--method=standard", *tiny, "--epochs=2", "--noexport", f"--workdir={workdir}"]
    # Ctrl-C as a terminal sends it, however the suite was started: a background job of a
    # non-interactive shell, and every program it starts, inherits SIGINT ignored.
    status, screen = on_terminal(
        python_command(os.path.join(ROOT, "train.py"), *command, prelude=TERMINAL_SIGINT),
        interrupt_at=b"Epoch 2/2",
    )
    assert status == 1, screen[-2000:]
    assert "Traceback" not in screen
    last = screen.rstrip().split("\n")[-1].strip()
    assert last == (
        "interrupted: what was finished is kept; the same command again resumes a training run "
        "or a sweep, and starts an evaluation over"
    ), screen[-2000:]
    before = screen.rstrip().split("\n")[-2]
    assert "/step" in before and before.rstrip("\r").endswith(tuple("0123456789")), before
    assert not (workdir / "train.lock").exists()
    assert Run(str(workdir)).in_use() is None
    again = in_process.train(*command, monkeypatch=monkeypatch)
    assert again.returncode == 0 and "Resuming" in again.stdout, again.stderr[-2000:]


@pytest.mark.slow
def test_ctrl_c_is_answered_while_tensorflow_holds_the_interpreter(tmp_path):
    """Ctrl-C during Square's search (thousands of queries in one TensorFlow call, which
    Python's handler waits for) took 17-45 s with no sign of life. The line comes within a few
    seconds, and the process ends within errors.INTERRUPT_EXIT_SECONDS, nothing written."""
    from flags import errors

    results = tmp_path / "eval.json"
    evaluated = os.path.join(ROOT, "study", "results", "deploy", "fmnist-fastbat")
    timings: dict = {}
    command = [f"--model_path={evaluated}", "--n_examples=256", "--attacks=square"]
    status, screen = on_terminal(
        python_command(
            os.path.join(ROOT, "evaluate.py"),
            *command,
            "--square_n_queries=10000",
            f"--results={results}",
            prelude=TERMINAL_SIGINT,
        ),
        interrupt_at=b"estimate: ",  # said before the attacks start
        timings=timings,
    )
    assert status == 1 and "Traceback" not in screen, screen[-2000:]
    assert screen.rstrip().split("\n")[-1].strip() == errors.INTERRUPTED, screen[-2000:]
    assert timings["said"] < errors.INTERRUPT_SAY_SECONDS + 3, timings
    assert timings["ended"] < errors.INTERRUPT_EXIT_SECONDS + 3, timings
    assert not results.exists()


@pytest.mark.slow
@pytest.mark.xdist_group("fgsm_pgi_run")
@pytest.mark.skipif(not os.path.isdir(FASHION_MNIST), reason="needs dataset-fashion-mnist")
def test_a_final_test_with_autoattack_writes_the_robustbench_entry_evaluate_py_would(
    fgsm_pgi_run,
):
    """train.py's main in this process (fgsm_pgi_run), its final test with AutoAttack."""
    workdir, result = fgsm_pgi_run
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"RobustBench entry: {workdir / 'robustbench.json'}" in result.stdout
    entry = json.loads((workdir / "robustbench.json").read_text())
    final = RunRecord.load(str(workdir / "results.json")).final
    assert entry["dataset"] == "fashion_mnist" and entry["eps"] == "8/255"
    assert entry["architecture"] == "small_cnn width 4"
    assert entry["clean_acc"] == f"{100 * final.clean_accuracy:.2f}"
    assert entry["autoattack_acc"] == f"{100 * final.robust_accuracy('autoattack'):.2f}"
    assert "first 16 points of the test split" in entry["footnote"]
    assert entry["name"] == entry["authors"] == entry["link"] == ""  # not fbat-tf's to know


def _l2_check(*words: str) -> str | None:
    """flags/run.py's check_norm on train.py's flags parsed from `words` (a copy of them, as
    sweep.py parses a cell's): its refusal, or None."""
    import copy

    from absl import flags as absl_flags

    from flags import run as run_flags

    values = copy.deepcopy(absl_flags.FLAGS)
    values(["train.py", "--dataset=fashion_mnist", "--norm=l2", *words])
    try:
        run_flags.check_norm(values)
    except ValueError as error:
        return str(error)
    return None


def test_an_l2_eps_sized_like_an_linf_one_is_refused_by_its_share_of_the_image():
    """--norm=l2 --eps=8 on 28×28 images trained nine minutes to 1 % accuracy, and --eps=100 (a
    ball holding every image) trained too, without a word. Refused from 10 % of √(H·W·C) = 28:
    2.85 (10.2 %) is, 2.75 (9.8 %) is not; --allow_large_l2_eps keeps 8, never 100 (357 %)."""
    said = _l2_check("--eps=8")
    assert said.startswith("--eps=8 under --norm=l2 is 28.6% of the largest L2 distance"), said
    assert "did you mean --norm=linf --eps=8?" in said and "--allow_large_l2_eps" in said
    assert "10.2%" in _l2_check("--eps=2.85")
    assert _l2_check("--eps=2.75") is None
    assert _l2_check("--eps=1.5") is None
    assert _l2_check("--eps=8", "--allow_large_l2_eps") is None
    whole = _l2_check("--eps=100", "--allow_large_l2_eps")
    assert "357.1%" in whole and "the ball holds every image" in whole
    # As train.py says it: one line, before TensorFlow loads (here it cannot).
    done = subprocess.run(
        python_command(
            "train.py",
            "--dataset=fashion_mnist",
            "--norm=l2",
            "--eps=8",
            "--method=pgd",
            prelude=NO_TENSORFLOW,
        ),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1].startswith("error: --eps=8 under --norm=l2 is")


@pytest.mark.parametrize("behind", ["a file", "nothing"])
def test_a_train_lock_that_is_a_link_is_refused_and_nothing_behind_it_is_written(
    tmp_path, behind, monkeypatch
):
    """train.lock held with open(..., "a+") truncated and rewrote the file a link there points
    at (outside the run directory), or made one where it pointed nowhere. train.py now stops in
    one line naming the link, before anything is written, and leaves what is behind it as it
    was."""
    workdir = tmp_path / "run"
    workdir.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    if behind == "a file":
        (outside / "notes.txt").write_text("a user's notes, not a lock\n")
    os.symlink(outside / "notes.txt", workdir / "train.lock")
    before = snapshot(outside)
    done = in_process.train(
        "--method=standard",
        *TINY_RUN,
        "--epochs=1",
        f"--workdir={workdir}",
        monkeypatch=monkeypatch,
    )
    assert snapshot(outside) == before
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 and len(lines) == 1, done.stderr[-3000:]
    assert lines[0].startswith(f"error: {workdir / 'train.lock'}: a symbolic link")
    assert "move the link away" in lines[0]
    assert sorted(os.listdir(workdir)) == ["train.lock"] and (workdir / "train.lock").is_symlink()
