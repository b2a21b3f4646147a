"""A run killed after an epoch and resumed ends with exactly the state of an uninterrupted run:
every variable of the last checkpoint (weights, batch-norm statistics, optimizer slots, the seed
counter, Free-AT's δ, ELLE-A's λ and E_lin statistic) is equal. Free-AT also takes the promised
number of gradient steps."""

from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf

from fbat_tf import callbacks
from fbat_tf.training import TrainConfig, train
from tests.tiny import FASHION_MNIST, fashion_mnist_config


class _Killed(Exception):
    pass


def _config(workdir: str, method: str, epochs: int, **options) -> TrainConfig:
    return fashion_mnist_config(workdir, method=method, epochs=epochs, method_options=options)


def _checkpoint_values(workdir: str) -> dict[str, np.ndarray]:
    path = tf.train.latest_checkpoint(os.path.join(workdir, "checkpoints", "last"))
    reader = tf.train.load_checkpoint(path)
    return {
        name: reader.get_tensor(name)
        for name, _ in tf.train.list_variables(path)
        if not name.startswith("save_counter") and name != "_CHECKPOINTABLE_OBJECT_GRAPH"
    }


@pytest.mark.skipif(not os.path.isdir(FASHION_MNIST), reason="needs dataset-fashion-mnist")
@pytest.mark.parametrize(
    ("method", "epochs", "options", "steps"),
    [
        ("fastat", 3, {}, 3 * 4),
        # 4 epochs of 4 batches = 16 gradient steps; replayed 3 times: ceil(16 / 3) = 6 batches,
        # a whole pass and a partial one, 18 steps.
        ("free", 4, {"replays": 3}, 18),
        # A resumed ELLE-A run carries λ and the statistic of every earlier E_lin.
        ("elle", 2, {}, 2 * 4),
    ],
)
def test_a_resumed_run_ends_where_an_uninterrupted_one_does(
    tmp_path, monkeypatch, method, epochs, options, steps
):
    complete = train(_config(str(tmp_path / "complete"), method, epochs, **options))
    assert complete.optimizer_steps == steps

    save = callbacks.ResumeCheckpoint.on_epoch_end

    def save_then_die(self, epoch, logs=None):
        save(self, epoch, logs)
        raise _Killed

    killed = str(tmp_path / "killed")
    monkeypatch.setattr(callbacks.ResumeCheckpoint, "on_epoch_end", save_then_die)
    with pytest.raises(_Killed):
        train(_config(killed, method, epochs, **options))
    monkeypatch.setattr(callbacks.ResumeCheckpoint, "on_epoch_end", save)
    resumed = train(_config(killed, method, epochs, **options))
    assert resumed.optimizer_steps == steps
    assert [e.epoch for e in resumed.history] == [e.epoch for e in complete.history]

    expected = _checkpoint_values(str(tmp_path / "complete"))
    got = _checkpoint_values(killed)
    assert set(got) == set(expected)
    assert any("seed_counter" in name for name in got)
    if method == "free":
        assert any("delta" in name for name in got)
        delta = next(value for name, value in got.items() if "delta" in name)
        assert np.abs(delta).max() > 0
    if method == "elle":
        state = {name.split("/")[1]: value for name, value in got.items() if "method/" in name}
        assert state["count"] == steps  # every step's E_lin, the killed run's first epoch's too
        assert state["mean"] > 0 and state["m2"] > 0
    for name, value in expected.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-6, atol=1e-7, err_msg=name)
    # The same test numbers; only the time they took differs.
    untimed = [r.to_dict() for r in (resumed.final, complete.final)]
    for payload in untimed:
        del payload["time_s"], payload["autoattack_seconds"]
    assert untimed[0] == untimed[1]
