"""Callbacks of a training run: robust validation with best-model selection, a catastrophic-
overfitting guard, divergence, timing, per-epoch results, and the resumable last checkpoint.

    run = Run(workdir)
    divergence = Divergence(steps_per_epoch)
    callbacks = [
        EpochTiming(examples_per_epoch),
        RobustValidation(val_ds, PGD(eps, steps=10, restarts=1), best_path=run.best_weights),
        divergence,                                       # after validation: it reads its logs
        ResultsLog(run.results_path, payload),
        TensorBoard(run.tensorboard_dir),                 # after them: it sees what they logged
        ResumeCheckpoint(trainer, run.last_checkpoint_dir, divergence),  # last, as below
        Progress(),                                       # the epoch's line shows every log
    ]
    trainer.fit(...)
    divergence.outcome                                    # None, or what made the run diverge

The validation callbacks write into the epoch's `logs` dict under `val_*` keys, so the
TensorBoard callback, which runs after them, puts them in its validation/ directory. The
resumable checkpoint comes after the logs, so an epoch it holds is logged; it does not hold an
epoch in which the run diverged.
"""

from __future__ import annotations

import errno
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable

import keras
import tensorflow as tf
from absl import logging

from fbat_tf.attacks.base import Attack
from fbat_tf.attacks.pgd import PGD
from fbat_tf.evaluation import NonFiniteError, evaluate
from fbat_tf.log_names import renamed
from fbat_tf.records import DivergenceOutcome, Epoch, RunRecord, files


class RobustValidation(keras.callbacks.Callback):
    """Each epoch: clean and PGD accuracy on the validation set, best-weights checkpoint, and the
    catastrophic-overfitting guard.

    The guard fires on any of three signatures of catastrophic overfitting:
    - the validation robust accuracy falls more than `drop` below its best;
    - the robust accuracy on a fixed validation batch (the first) falls more than `drop` below
      its own best while its clean accuracy does not (Wong et al., 2020);
    - the accuracy under `single_step` (default FGSM: one signed step of ε from x) exceeds the
      robust accuracy by more than `masking_gap`: the model masks its gradient, so the
      single-step attack that trains it no longer finds what the multi-step attack finds
      (Andriushchenko and Flammarion, 2020). This one fires also on a model that collapsed
      from its first epoch and so never had a best to fall from. On the Fashion-MNIST sweep's
      selected models (bench/README.md) the gap is at most 0.26 for every method up to
      ε = 76/255 (Fast-BAT at 76 the largest) but the collapsed Fast-AT models at 64 and 76,
      which have 0.38 to 0.58: 0.3 lies between.
    It warns, logs `val_overfitting` = 1, and stops training when `stop_on_overfitting` is
    set; `val_fgsm_accuracy` is logged every epoch. A model that gives non-finite logits on
    validation examples cannot be validated: the epoch logs `val_nonfinite_examples` (how many
    in the batch where evaluation met them) instead of accuracies, and training stops (the
    Divergence callback names it). Every epoch attacks with the same seeds
    (`seed`, as `evaluate` derives them per batch), so epochs differ by their weights alone, and
    a resumed run validates as the uninterrupted one.
    """

    def __init__(
        self,
        dataset: tf.data.Dataset,
        attack: Callable,
        eps: float,
        classifier: keras.Model,
        best_path: str | None = None,
        drop: float = 0.2,
        stop_on_overfitting: bool = False,
        best_robust_accuracy: float = -1.0,
        seed: int = 0,
        single_step: Attack | None = None,
        masking_gap: float = 0.3,
    ):
        super().__init__()
        self.dataset = dataset
        self.attack = attack
        self.eps = eps
        self.classifier = classifier
        self.best_path = best_path
        self.drop = drop
        self.stop_on_overfitting = stop_on_overfitting
        self.best = best_robust_accuracy
        self.fixed_best = -1.0
        self.seed = seed
        # FGSM from x in the validation attack's ball (a step of ε: L∞'s sign step, or L2's
        # normalized one, lands on the ball's surface before the box clips it).
        self.single_step = single_step or PGD(
            eps,
            steps=1,
            restarts=1,
            step_size=eps,
            random_start=False,
            norm=getattr(attack, "norm", "linf"),
        )
        self.masking_gap = masking_gap

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        logs = logs if logs is not None else {}
        attacks = {("pgd", self.eps): self.attack, ("fgsm", self.eps): self.single_step}
        try:
            result = evaluate(self.classifier, self.dataset, attacks, seed=self.seed)
        except NonFiniteError as error:
            logging.warning("epoch %d: validation stopped: %s", epoch + 1, error)
            logs["val_nonfinite_examples"] = float(error.examples)
            self.model.stop_training = True
            return
        robust = result.robust_accuracy("pgd")
        single_step = result.robust_accuracy("fgsm")
        logs["val_loss"] = result.loss
        logs["val_clean_accuracy"] = result.clean_accuracy
        logs["val_robust_accuracy"] = robust
        logs["val_fgsm_accuracy"] = single_step
        # With a black-box part after PGD (the ensemble of evaluation.validation_attack),
        # PGD's own figure, its first part's, beside the criterion's.
        parts = [v for part, v in result.attacked("pgd").parts.items() if part != "clean"]
        if parts:
            logs["val_pgd_accuracy"] = parts[0]

        # The fixed batch is the validation set's first: its own figures come with the whole
        # set's (same examples, same seed), without attacking it a second time.
        fixed = result.per_batch[0]
        fixed_robust = fixed.robust_accuracy("pgd")
        overfitting = (
            robust < self.best - self.drop
            or (
                fixed_robust < self.fixed_best - self.drop
                and fixed.clean_accuracy >= fixed_robust + self.drop
            )
            or single_step > robust + self.masking_gap
        )
        self.fixed_best = max(self.fixed_best, fixed_robust)
        logs["val_overfitting"] = float(overfitting)
        if overfitting:
            logging.warning(
                "epoch %d: catastrophic overfitting suspected: validation robust accuracy %.4f "
                "(best %.4f, single-step attack %.4f), fixed batch %.4f (best %.4f)%s",
                epoch + 1,
                robust,
                self.best,
                single_step,
                fixed_robust,
                self.fixed_best,
                "; stopping" if self.stop_on_overfitting else "",
            )
            if self.stop_on_overfitting:
                self.model.stop_training = True

        if robust > self.best:
            self.best = robust
            logs["val_best"] = 1.0
            if self.best_path:
                save_weights(self.classifier, self.best_path)
        else:
            logs["val_best"] = 0.0
        logs["val_best_robust_accuracy"] = self.best


# What an .h5 weights file holds beside the weights' bytes (its tree of groups), at most.
_H5_OVERHEAD = 1 << 20


def save_weights(classifier: keras.Model, path: str) -> None:
    """Write `classifier`'s weights to `path` whole or not at all (a file renamed into place).
    On a disk without room for them, OSError(ENOSPC) naming the file before anything is
    written: h5py, run out of space mid-write, reports it in a RuntimeError and can take the
    process down as it frees what it held."""
    folder = os.path.dirname(os.path.abspath(path))
    needed = _H5_OVERHEAD + sum(
        math.prod(weight.shape) * tf.as_dtype(weight.dtype).size for weight in classifier.weights
    )
    if shutil.disk_usage(folder).free < needed:
        raise OSError(errno.ENOSPC, "No space left on device", path)
    # h5py opens its file by name: it writes in a folder made here (mkdtemp), where no link
    # can be, and a link at `path` is never replaced.
    files.refuse_links(path)
    staging = tempfile.mkdtemp(prefix=".best-", dir=folder)
    try:
        tmp = os.path.join(staging, os.path.basename(path))
        classifier.save_weights(tmp)
        files.refuse_links(path)
        os.replace(tmp, path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


class TensorBoard(keras.callbacks.TensorBoard):
    """Keras' TensorBoard callback whose epoch curves are written whatever `update_freq` is,
    whose batch curves go on from where a resumed run's stopped, and which writes no
    non-finite value (an epoch whose batches were all skipped has no loss point).

    With an integer `update_freq`, Keras records every summary under a gate that is open only on
    steps that are multiples of it, its own epoch summaries included, so an epoch that ends off
    that cadence writes no epoch point at all (tensorflow/tensorboard#4975).

    The x-axis of the epoch curves (`epoch_*`) is the epoch counted from 0 (results.json's
    epoch 1 is step 0); that of the batch curves (`batch_*`) the batch counted from 1 since the
    run began, `first_batch` being the batches finished before this process (a resumed run's).
    """

    def __init__(self, *args, first_batch: int = 0, names: dict | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.first_batch = first_batch
        self.names = dict(names or {})  # its tags for logs kept by other names (shown_names)

    def on_train_begin(self, logs: dict | None = None) -> None:
        super().on_train_begin(logs)
        self._global_train_batch = self.first_batch

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        super().on_train_batch_end(batch, renamed(_finite_logs(logs), self.names))

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        with tf.summary.record_if(True):
            super().on_epoch_end(epoch, renamed(_finite_logs(logs), self.names))


def _finite_logs(logs: dict | None) -> dict | None:
    """The logs without their non-finite values (a copy; the shared dict is left as it is)."""
    if logs is None:
        return None
    return {k: v for k, v in logs.items() if not isinstance(v, float) or math.isfinite(v)}


class EpochTiming(keras.callbacks.Callback):
    """Logs `epoch_time` (s), `images_per_second` and the learning rate at the epoch's end."""

    def __init__(self, images_per_batch: int):
        super().__init__()
        self.images_per_batch = images_per_batch
        self._start = 0.0
        self._batches = 0

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._start = time.perf_counter()
        self._batches = 0

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self._batches += 1

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if logs is None:
            return
        elapsed = time.perf_counter() - self._start
        logs["epoch_time"] = elapsed
        logs["images_per_second"] = self._batches * self.images_per_batch / max(elapsed, 1e-9)
        # The public property: the schedule's value at the step count, also through the
        # LossScaleOptimizer of mixed_float16 (whose own private getter gives 0).
        logs["learning_rate"] = float(self.model.optimizer.learning_rate)


class StopAfterBatches(keras.callbacks.Callback):
    """Ends training after `batches` batches in all (counting `steps_per_epoch` for each epoch
    before the first one run), inside an epoch if need be; that epoch still ends normally."""

    def __init__(self, batches: int, steps_per_epoch: int):
        super().__init__()
        self.batches = batches
        self.steps_per_epoch = steps_per_epoch
        self._epoch = 0

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._epoch = epoch

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if self._epoch * self.steps_per_epoch + batch + 1 >= self.batches:
            self.model.stop_training = True


class Progress(keras.callbacks.ProgbarLogger):
    """Keras' progress bar with the numbers that matter (the rest are in TensorBoard and
    results.json): the training loss and accuracy, validation's clean, PGD and FGSM accuracy
    and the epoch's seconds; skipped batches and the overfitting guard only when they are not
    zero. Its line for an epoch that ended early (StopAfterBatches, divergence) counts the
    batches that ran, "10/20", not the epoch's planned steps.

    Put it last in the callbacks, so that the epoch's line shows what the others logged."""

    SHOWN = (
        "loss",
        "adv_accuracy",
        "val_clean_accuracy",
        "val_robust_accuracy",
        "val_fgsm_accuracy",
        "epoch_time",
    )
    WHEN_NOT_ZERO = ("nonfinite_batches", "val_overfitting")

    def __init__(self, names: dict | None = None):
        super().__init__()
        self.names = dict(names or {})  # what it calls logs kept by other names (shown_names)

    def _shown(self, logs: dict | None) -> dict:
        logs = logs or {}
        shown = {key: logs[key] for key in self.SHOWN if key in logs}
        shown.update({key: logs[key] for key in self.WHEN_NOT_ZERO if logs.get(key)})
        return renamed(shown, self.names)

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        super().on_train_batch_end(batch, self._shown(logs))

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        logs = self._shown(logs)
        if self.progbar is not None and self.target is not None and 0 < self.seen < self.target:
            self.progbar.update(self.seen, list(logs.items()), finalize=True)
            return
        super().on_epoch_end(epoch, logs)


class Divergence(keras.callbacks.Callback):
    """Stops a run that diverges, and says what happened in `outcome`.

    A run diverges when more than `max_skipped_fraction` of the steps of an epoch (the batches
    it ran, each tried `replays` times: Free-AT's m; a last epoch cut short runs fewer than
    `steps_per_epoch`) were skipped because
    something they would write was not finite (the trainer's `nonfinite_batches` metric;
    checked after every batch, so such an epoch stops as soon as it is past the limit), or when
    validation met non-finite logits (`val_nonfinite_examples`, logged by RobustValidation).
    The epoch still ends, so its logs are recorded; ResumeCheckpoint does not save it.
    `outcome` is then a records.DivergenceOutcome: `epoch` (from 1), `reason`
    ("skipped_batches" or "validation"), `nonfinite_batches` and `steps` (skipped and tried in
    that epoch), `max_skipped_fraction`, `val_nonfinite_examples`, and `last_finite_loss` (the
    loss of the latest applied batch, None if there was none).
    """

    def __init__(self, steps_per_epoch: int, max_skipped_fraction: float = 0.25, replays: int = 1):
        super().__init__()
        if not 0.0 <= max_skipped_fraction <= 1.0:
            raise ValueError(
                f"max_skipped_fraction must be in [0, 1], got {max_skipped_fraction!r}"
            )
        self.steps_per_epoch = steps_per_epoch
        self.max_skipped_fraction = max_skipped_fraction
        self.replays = replays
        self.outcome: DivergenceOutcome | None = None
        self._batches = 0
        self._skipped = 0

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._batches = self._skipped = 0

    def _too_many(self, batches: int | None = None) -> bool:
        """Past the limit: over the epoch's planned batches, or over those run (at its end: a
        last epoch cut short runs fewer)."""
        batches = self.steps_per_epoch if batches is None else batches
        return self._skipped > self.max_skipped_fraction * batches * self.replays

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self._batches = batch + 1
        self._skipped = int((logs or {}).get("nonfinite_batches", 0))
        if self._too_many():
            self.model.stop_training = True

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        logs = logs or {}
        nonfinite = int(logs.get("val_nonfinite_examples", 0))
        skipped_too_many = self._too_many(self._batches)
        if not (skipped_too_many or nonfinite):
            return
        last = float(getattr(self.model, "last_finite_loss", float("nan")))
        self.outcome = DivergenceOutcome(
            epoch=epoch + 1,
            reason="skipped_batches" if skipped_too_many else "validation",
            nonfinite_batches=self._skipped,
            steps=self._batches * self.replays,
            max_skipped_fraction=self.max_skipped_fraction,
            val_nonfinite_examples=nonfinite,
            last_finite_loss=last if math.isfinite(last) else None,
        )
        self.model.stop_training = True


class ResumeCheckpoint(keras.callbacks.Callback):
    """Saves every piece of training state each epoch: weights and batch-norm statistics, the
    optimizer, the trainer's seed counter, the method's own state (Free-AT's δ, ELLE-A's λ,
    FGSM-PGI's prior per example) and the finished-epoch count (tf.train checkpoints: a partly
    written one is never the latest), and restores them on resume. An epoch in which
    `divergence` found the run diverged is not saved: the last checkpoint stays that of the
    epoch before."""

    def __init__(
        self,
        trainer: keras.Model,
        directory: str,
        divergence: Divergence | None = None,
        keep: int = 2,
    ):
        super().__init__()
        self.divergence = divergence
        self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="finished_epochs")
        self.checkpoint = tf.train.Checkpoint(
            classifier=trainer.classifier,
            optimizer=trainer.optimizer,
            epoch=self.epoch,
            seed_counter=trainer.seed_counter,
            method=tf.train.Checkpoint(**trainer.method.variables()),
        )
        self.manager = tf.train.CheckpointManager(self.checkpoint, directory, max_to_keep=keep)

    def restore(self, directory: str | None = None) -> int:
        """Restore the latest checkpoint, if any, of this callback's directory or of
        `directory` (a multi-worker run's non-chief workers read the chief's); returns the
        number of finished epochs."""
        latest = (
            self.manager.latest_checkpoint
            if directory is None
            else tf.train.latest_checkpoint(directory)
        )
        if latest is None:
            return 0
        try:
            self.checkpoint.restore(latest).assert_existing_objects_matched()
        except (tf.errors.OpError, IndexError, ValueError, AssertionError) as error:
            # A checkpoint cut short (a full disk, a killed copy) or from another model.
            raise ValueError(
                f"the checkpoint {latest} cannot be read ({' '.join(str(error).split())[:300]}), "
                "so the run cannot resume: restore it, or start over in another --workdir"
            ) from None
        return int(self.epoch.numpy())

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if self.divergence is not None and self.divergence.outcome is not None:
            return
        self.epoch.assign(epoch + 1)
        self.manager.save(checkpoint_number=epoch + 1)


class ResultsLog(keras.callbacks.Callback):
    """Records each epoch's logs in the run's record and saves it (results.json, atomically
    rewritten); a value that is not finite (the loss of an epoch whose batches were all
    skipped) is null."""

    def __init__(self, path: str, record: RunRecord):
        super().__init__()
        self.path = path
        self.record = record

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        values = {k: float(v) for k, v in (logs or {}).items()}
        self.record.record_epoch(Epoch(epoch + 1, values))
        self.record.save(self.path)
