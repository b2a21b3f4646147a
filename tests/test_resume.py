"""A run killed after an epoch and resumed ends with exactly the state of an uninterrupted run:
every variable of the last checkpoint (weights, batch-norm statistics, optimizer slots, the seed
counter, Free-AT's δ, ELLE-A's λ and E_lin statistic, FGSM-PGI's prior, momentum and visits per
example) is equal, and the method's state is restored bit for bit as the killed run saved it.
Free-AT also takes the promised number of gradient steps.

The killed run is the uninterrupted run's directory as it was the moment its first epoch's
checkpoint was written (copied there, in the checkpoint's callback): what a kill at that moment
leaves, at the same path, without a second training of that epoch."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

from fbat_tf import callbacks
from fbat_tf.training import TrainConfig, train
from tests.tiny import FASHION_MNIST, fashion_mnist_config


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


@pytest.mark.slow
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
        # A resumed FGSM-PGI run carries every example's prior, momentum and visits.
        ("fgsm_pgi", 2, {}, 2 * 4),
    ],
)
def test_a_resumed_run_ends_where_an_uninterrupted_one_does(
    tmp_path, monkeypatch, method, epochs, options, steps
):
    run, at_kill_copy = tmp_path / "run", tmp_path / "at_kill"
    save = callbacks.ResumeCheckpoint.on_epoch_end

    def save_then_copy(self, epoch, logs=None):
        save(self, epoch, logs)
        if epoch == 0:  # the first epoch's checkpoint written: the kill's moment
            shutil.copytree(run, at_kill_copy)

    monkeypatch.setattr(callbacks.ResumeCheckpoint, "on_epoch_end", save_then_copy)
    complete = train(_config(str(run), method, epochs, **options))
    monkeypatch.setattr(callbacks.ResumeCheckpoint, "on_epoch_end", save)
    assert complete.optimizer_steps == steps
    # The uninterrupted run moves aside; the killed one is resumed where both ran.
    os.rename(run, tmp_path / "complete")
    os.rename(at_kill_copy, run)
    killed = str(run)
    # The method's state as the resumed run restores it, against the killed run's checkpoint.
    at_kill = _checkpoint_values(killed)
    own = sorted({name.split("/")[1] for name in at_kill if name.startswith("method/")})
    restore, restored = callbacks.ResumeCheckpoint.restore, {}

    def restore_and_read(self, directory=None):
        epochs = restore(self, directory)
        restored.update({name: getattr(self.checkpoint.method, name).numpy() for name in own})
        return epochs

    monkeypatch.setattr(callbacks.ResumeCheckpoint, "restore", restore_and_read)
    resumed = train(_config(killed, method, epochs, **options))
    for name in own:
        saved = next(v for key, v in at_kill.items() if key.startswith(f"method/{name}/"))
        np.testing.assert_array_equal(restored[name], saved, err_msg=name)
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
    if method == "fgsm_pgi":
        state = {name.split("/")[1]: value for name, value in got.items() if "method/" in name}
        # 256 examples in 4 batches of 64: each of the two passes visits every one once.
        assert state["visits"].shape == (256,) and np.all(state["visits"] == 2)
        assert np.abs(state["prior"]).max() > 0 and np.abs(state["momentum"]).max() > 0
        assert own == ["momentum", "prior", "visits"]
    for name, value in expected.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-6, atol=1e-7, err_msg=name)
    # The same test numbers; only the time they took differs.
    untimed = [r.to_dict() for r in (resumed.final, complete.final)]
    for payload in untimed:
        del payload["time_s"], payload["autoattack_seconds"], payload["indicators"]["seconds"]
    assert untimed[0] == untimed[1]
