"""What a researcher sees in TensorBoard: a real `tensorboard` server, started on a train.py run
directory, serves one point per epoch of every epoch curve (validation clean and robust
accuracy, learning rate, loss, images per second, Fast-BAT's diagnostics), whatever the batch
cadence `--tensorboard_every`, and the points are the run's own per-epoch numbers."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

import numpy as np
import pytest

from tests.test_train_cli import TINY_RUN

EPOCHS = 3
TRAIN_CURVES = (
    "epoch_loss",
    "epoch_adv_accuracy",
    "epoch_learning_rate",
    "epoch_images_per_second",
    "epoch_train_seconds",  # the epoch's training time, not "epoch_epoch_time"
    "epoch_ig_norm_ratio",
    "epoch_inactive_fraction",
    "epoch_nonfinite_batches",
)
VALIDATION_CURVES = ("epoch_clean_accuracy", "epoch_robust_accuracy", "epoch_fgsm_accuracy")
RUNS = ("train", "validation")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


class TensorBoardServer:
    """The `tensorboard` program serving a log directory on 127.0.0.1."""

    def __init__(self, logdir: str):
        self.port = free_port()
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tensorboard.main",
                f"--logdir={logdir}",
                "--host=127.0.0.1",
                f"--port={self.port}",
                "--load_fast=false",
                "--reload_interval=1",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.base = f"http://127.0.0.1:{self.port}"

    def scalars(self, run: str, tag: str) -> list[tuple[int, float]]:
        query = urllib.parse.urlencode({"run": run, "tag": tag})
        events = get_json(f"{self.base}/data/plugin/scalars/scalars?{query}")
        return [(step, value) for _, step, value in events]

    def tags(self, runs: list[str]) -> dict[str, list[str]]:
        """Scalar tags per run, once the server has loaded every one of `runs` (waits up to a
        minute)."""
        deadline = time.time() + 60
        while True:
            try:
                tags = get_json(f"{self.base}/data/plugin/scalars/tags")
                if set(runs) <= set(tags) and all(tags[run] for run in runs):
                    return {run: sorted(found) for run, found in tags.items()}
            except (urllib.error.URLError, ConnectionError):
                pass
            if time.time() > deadline or self.process.poll() is not None:
                raise AssertionError("tensorboard did not serve the run's scalars")
            time.sleep(1)

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


@pytest.mark.slow
def test_tensorboard_serves_one_point_per_epoch_of_every_epoch_curve(tmp_path, monkeypatch):
    """Three train.py runs (main in this process, tests/in_process.py), at batch cadences 0
    (epochs only), 3 and 100, served by one server (as runs every0/tensorboard/train,
    every3/tensorboard/validation, ...)."""
    from tests import in_process

    args = [a for a in TINY_RUN if not a.startswith(("--epochs", "--tensorboard_every"))]
    cadences = (0, 3, 100)
    for every in cadences:
        done = in_process.train(
            *args,
            "--method=fastbat",
            f"--epochs={EPOCHS}",
            f"--tensorboard_every={every}",
            f"--workdir={tmp_path / f'every{every}'}",
            "--noexport",
            monkeypatch=monkeypatch,
        )
        assert done.returncode == 0, done.stderr[-3000:]

    server = TensorBoardServer(str(tmp_path))
    try:
        tags = server.tags(
            [f"every{every}/tensorboard/{run}" for every in cadences for run in (*RUNS, "test")]
        )
        for every in cadences:
            workdir = tmp_path / f"every{every}"
            with open(workdir / "results.json") as f:
                results = json.load(f)
            steps = results["steps_per_epoch"]
            if every:
                # The case that used to lose the epoch curves: epochs off the batch cadence.
                assert any((epoch * steps) % every for epoch in range(1, EPOCHS + 1))
            history = results["history"]
            train = f"every{every}/tensorboard/train"
            validation = f"every{every}/tensorboard/validation"
            assert not [tag for tag in tags[train] if tag.startswith("epoch_epoch_")], tags
            for tag in TRAIN_CURVES:
                assert tag in tags[train], tags
                assert [s for s, _ in server.scalars(train, tag)] == list(range(EPOCHS))
            for tag in VALIDATION_CURVES:
                assert tag in tags[validation], tags
                assert [s for s, _ in server.scalars(validation, tag)] == list(range(EPOCHS))
            robust = [v for _, v in server.scalars(validation, "epoch_robust_accuracy")]
            np.testing.assert_allclose(
                robust, [h["val_robust_accuracy"] for h in history], rtol=1e-6
            )
            rate = [v for _, v in server.scalars(train, "epoch_learning_rate")]
            np.testing.assert_allclose(rate, [h["learning_rate"] for h in history], rtol=1e-6)
            batch_curves = any(tag.startswith("batch_") for tag in tags[train])
            assert batch_curves == (0 < every <= EPOCHS * steps)
            if batch_curves:  # BUILD.md: the batch counted from 1 since the run began
                served = [s for s, _ in server.scalars(train, "batch_loss")]
                assert served == list(range(every, EPOCHS * steps + 1, every))
            # BUILD.md: the test numbers at the epoch of the model they measure, epochs from 0.
            selected = [h["epoch"] for h in history if h.get("val_best")][-1]
            test = server.scalars(f"every{every}/tensorboard/test", "test_clean_accuracy")
            assert test == [(selected - 1, test[0][1])]
            np.testing.assert_allclose(test[0][1], results["final"]["clean_accuracy"], rtol=1e-6)
            # And each attack's robust accuracy, named by the attack, at the same step.
            for key, accuracy in results["final"]["robust_accuracy"].items():
                tag = f"test_{key.split('@')[0]}_robust_accuracy"
                served = server.scalars(f"every{every}/tensorboard/test", tag)
                assert served == [(selected - 1, served[0][1])], tag
                np.testing.assert_allclose(served[0][1], accuracy, rtol=1e-6)
    finally:
        server.close()
