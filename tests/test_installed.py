"""fbat-tf installed as a user installs a tool, outside its checkout: the wheel `pip wheel .`
builds, installed into a fresh virtual environment, runs its console scripts on real
Fashion-MNIST (the demo's flag file by name, shortened), and --help of each lists its flags.
The environment sees the packages already installed here (`--system-site-packages`), so the
wheel's dependencies come from them, offline; fbat-tf itself is the wheel's, never the
checkout's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FASHION_MNIST = "/usr/share/datasets/fashion-mnist"
SCRIPTS = {
    "fbat-train": "--method:",
    "fbat-evaluate": "--model_path:",
    "fbat-sweep": "--sweep:",
    "fbat-export": "--workdir:",
    "fbat-serve-client": "--server:",
}
SHORTENED = [
    "--epochs=1",
    "--max_train_examples=256",
    "--val_examples=64",
    "--val_attack_steps=2",
    "--eval_examples=64",
    "--eval_pgd_steps=2",
    "--tensorboard_every=0",
    "--verbose=2",
]

pytestmark = pytest.mark.slow


def _run(command: list[str], cwd: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    return subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict[str, str]:
    """The wheel built from this checkout, installed into a new virtual environment."""
    where = tmp_path_factory.mktemp("installed")
    wheels = where / "wheels"
    # pip builds in the checkout's build/: a leftover there would be packed into the next wheel,
    # so the one this build makes is removed after it.
    made_build = not os.path.exists(os.path.join(ROOT, "build"))
    built = _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", ROOT, "-w", str(wheels)],
        str(where),
    )
    assert built.returncode == 0, built.stderr[-3000:]
    if made_build:
        shutil.rmtree(os.path.join(ROOT, "build"), ignore_errors=True)
    (wheel,) = wheels.glob("fbat_tf-*.whl")
    venv = where / "venv"
    # Without a pip of its own: the pip installed here, which the environment sees through
    # --system-site-packages, installs into it as its own copy would (ensurepip's copy took
    # about 9 s of CPU time to put there and to run for the first time).
    made = _run(
        [sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)],
        str(where),
    )
    assert made.returncode == 0, made.stderr[-3000:]
    bin_dir = venv / "bin"
    # With the runtime extras of the export (ONNX, LiteRT), offline: every dependency is
    # already installed beside it.
    done = _run(
        [str(bin_dir / "python"), "-m", "pip", "install", "-q", "--no-index", f"{wheel}[export]"],
        str(where),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    work = where / "elsewhere"  # outside the checkout: no train.py, no configs/ here
    work.mkdir()
    return {"bin": str(bin_dir), "work": str(work)}


def test_the_installed_packages_are_the_wheels_not_the_checkouts(installed):
    code = "import fbat_tf, fbat_cli, export, flags; print(fbat_tf.__file__, fbat_cli.configs())"
    done = _run([os.path.join(installed["bin"], "python"), "-c", code], installed["work"])
    assert done.returncode == 0, done.stderr[-3000:]
    library, configs = done.stdout.split()
    assert not library.startswith(ROOT) and "site-packages" in library, library
    assert os.path.isfile(os.path.join(configs, "fashion_mnist_demo.flags"))
    assert os.path.isfile(os.path.join(configs, "sweeps", "paper_table2.json"))


def test_help_of_each_console_script_lists_its_flags(installed):
    for script, flag in SCRIPTS.items():
        done = _run([os.path.join(installed["bin"], script), "--help"], installed["work"])
        assert done.returncode == 0, (script, done.stderr[-2000:])
        assert flag in done.stdout and "(default: " in done.stdout, script


@pytest.mark.skipif(not os.path.isdir(FASHION_MNIST), reason="needs dataset-fashion-mnist")
def test_the_demo_trains_evaluates_and_exports_through_the_console_scripts(installed):
    bin_dir, work = installed["bin"], installed["work"]
    trained = _run(
        [
            os.path.join(bin_dir, "fbat-train"),
            "--flagfile=fashion_mnist_demo",
            "--workdir=run",
            *SHORTENED,
        ],
        work,
    )
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert "Starting run: fastbat at ε = 8/255" in trained.stdout
    assert "test (64 examples): clean " in trained.stdout
    with open(os.path.join(work, "run", "results.json")) as f:
        assert json.load(f)["status"] == "complete"
    evaluated = _run(
        [
            os.path.join(bin_dir, "fbat-evaluate"),
            "--model_path=run",
            "--n_examples=16",
            "--attacks=pgd",
            "--pgd_steps=2",
            "--pgd_restarts=1",
        ],
        work,
    )
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert os.path.isfile(os.path.join(work, "run", "eval-test.json"))
    exported = _run(
        [
            os.path.join(bin_dir, "fbat-export"),
            "--workdir=run",
            "--version=7",
            "--export_formats=saved_model,onnx",  # the export extra, installed with the wheel
        ],
        work,
    )
    assert exported.returncode == 0, exported.stderr[-3000:]
    version = os.path.join(work, "run", "export", "fashion_mnist-small_cnn-fastbat", "7")
    assert os.path.isfile(os.path.join(version, "saved_model.pb"))
    assert os.path.isfile(os.path.join(version, "model.onnx"))
    # A sweep pins its cells' code by git revision: from an installed copy it says, in one line,
    # where it runs instead.
    # (The studies' definitions are the clone's, not installed: a definition of one's own.)
    with open(os.path.join(work, "grid.json"), "w") as f:
        json.dump(
            {
                "description": "a user's grid",
                "flags": {"dataset": "fashion_mnist", "model": "small_cnn", "epochs": 1},
                "grid": [{"method": ["fastat"], "eps": [8], "seed": [0]}],
            },
            f,
        )
    swept = _run([os.path.join(bin_dir, "fbat-sweep"), "--sweep=grid.json", "--dry_run"], work)
    assert swept.returncode == 1 and "Traceback" not in swept.stderr
    (line,) = swept.stderr.strip().splitlines()
    assert (
        line.startswith("error: a sweep pins its cells' code by git revision") and "clone" in line
    )
