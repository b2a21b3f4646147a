"""README's Deploying commands, typed after its first command as they are written there.

    python -m pytest -q -n 0 tests/test_readme_deploying.py

The commands are read from README.md: the train.py command of "Two commands", then the block of
"Deploying". They run in a folder that looks like a checkout (its programs and packages linked
in), so that README's relative paths (`runs/fmnist-fastbat`) land there; the demo is shortened
as README says, with flags appended after the flag file (one epoch on 256 images), and the
evaluation with flags appended too (a few points, PGD only).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from tests.test_train_cli import TINY_RUN

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINKED = ("train.py", "evaluate.py", "configs", "export", "fbat_tf", "flags")
SHORTER_DEMO = [flag for flag in TINY_RUN if not flag.startswith("--epochs")] + [
    "--epochs=1",
    "--int8_examples=32",
]
SAVED_MODEL_CLI = "tensorflow.python.tools.saved_model_cli"
SHORTER_EVALUATION = ["--n_examples=32", "--attacks=pgd", "--pgd_steps=2", "--pgd_restarts=1"]


def _section(heading: str) -> str:
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end]


def _bash_blocks(section: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", section, re.DOTALL)


def _commands(block: str) -> list[str]:
    """The block's command lines, continuation lines joined."""
    return [line for line in block.replace("\\\n", " ").splitlines() if line.strip()]


def _run(line: str, variables: dict[str, str], cwd: str) -> subprocess.CompletedProcess | None:
    """One README line as bash would run it: `NAME=value` sets a variable; `python ...` runs
    with $NAME expanded and `#` comments left out, and the shortening flags appended."""
    words = shlex.split(line, comments=True)
    if len(words) == 1 and re.fullmatch(r"[A-Z_]+=\S+", words[0]):
        name, value = words[0].split("=", 1)
        variables[name] = value
        return None
    words = [re.sub(r"\$(\w+)", lambda m: variables[m.group(1)], word) for word in words]
    assert words[0] == "python", line
    extra = {"train.py": SHORTER_DEMO, "evaluate.py": SHORTER_EVALUATION}.get(words[1], [])
    return subprocess.run(
        [sys.executable, *words[1:], *extra],
        cwd=cwd,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
        capture_output=True,
        text=True,
        timeout=900,
    )


@pytest.mark.slow
@pytest.mark.xdist_group("deploy")
def test_readmes_deploying_commands_work_after_its_first_command(tmp_path):
    for name in LINKED:
        os.symlink(os.path.join(ROOT, name), tmp_path / name)
    (first_block,) = _bash_blocks(_section("Two commands"))[:1]
    first = _commands(first_block)[0].split("&&")[-1].strip()
    assert first.startswith("python train.py --flagfile=configs/fashion_mnist_demo.flags")
    variables: dict[str, str] = {}
    done = _run(first, variables, str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]

    (deploying,) = _bash_blocks(_section("Deploying"))
    lines = _commands(deploying)
    outputs = []
    for line in lines:
        done = _run(line, variables, str(tmp_path))
        if done is None:
            continue
        assert done.returncode == 0, (line, done.stderr[-3000:])
        outputs.append(done.stdout)
    version = tmp_path / variables["VERSION"]
    for name in ("model.onnx", "model.tflite", "model_int8.tflite"):
        assert (version / name).is_file(), sorted(os.listdir(version))
        # evaluate.py checked each file against the SavedModel beside it.
        stem = name.replace(".", "_")
        assert (version / f"eval-test-{stem}.json").is_file(), sorted(os.listdir(version))
    # train.py said it added the files to the existing version, which is the only one.
    assert "exists already; adding model.onnx, model.tflite, model_int8.tflite" in outputs[0]
    assert sorted(os.listdir(version.parent)) == ["1"]

    # Then "Export and serving" as far as it runs offline (no docker, no server): its variables,
    # the image file it writes (under runs/, not into the checkout) and saved_model_cli on it.
    (serving,) = _bash_blocks(_section("Export and serving"))
    program = shutil.which("saved_model_cli")
    ran = []
    for line in _commands(serving):
        words = shlex.split(line, comments=True)
        if words[0] == "saved_model_cli":
            words = [re.sub(r"\$(\w+)", lambda m: variables[m.group(1)], w) for w in words]
            command = [program] if program else [sys.executable, "-m", SAVED_MODEL_CLI]
            done = subprocess.run(
                [*command, *words[1:]], cwd=tmp_path, capture_output=True, text=True, timeout=300
            )
        elif words[:2] == ["python", "-c"]:
            done = subprocess.run(
                [sys.executable, *words[1:]], cwd=tmp_path, capture_output=True, text=True
            )
        elif len(words) == 1:  # NAME=value, expanded as bash does when it assigns
            name, value = words[0].split("=", 1)
            variables[name] = re.sub(r"\$(\w+)", lambda m: variables[m.group(1)], value)
            continue
        else:
            continue  # `python -m export` (done above), docker and the client of a server
        assert done.returncode == 0, (line, done.stderr[-3000:])
        ran.append((words[0], done.stdout))
    assert [name for name, _ in ran] == ["saved_model_cli", "python", "saved_model_cli"]
    assert (tmp_path / "runs" / "black.npy").is_file()
    assert not (tmp_path / "black.npy").exists()  # nothing written into the checkout's root
    assert "classes" in ran[-1][1] and "class_names" in ran[-1][1]
