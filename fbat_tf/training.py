"""One training run, from a config to a trained, selected and evaluated model in a workdir.

    config = TrainConfig(workdir="runs/demo", method="fastbat", dataset="fashion_mnist",
                         model="small_cnn", eps=8 / 255, epochs=5)
    record = train(config)           # a records.RunRecord; also writes results.json,
                                     # checkpoints/, tensorboard/

A run that diverges (too many batches skipped as non-finite in an epoch, or non-finite
validation logits: callbacks.Divergence) stops there and raises Diverged, whose message says
what happened and what to try; its workdir keeps results.json (status "diverged", the history
so far and a "divergence" record), the best checkpoint so far, the last checkpoint of the epoch
before and the TensorBoard logs. Training a workdir whose run diverged raises Diverged again:
it is not redone.

A workdir that holds a checkpoint is resumed from its last finished epoch, exactly: the
checkpoint holds every piece of training state (weights, batch-norm statistics, optimizer, seed
counter, Free-AT's δ, ELLE-A's λ, FGSM-PGI's prior per example), and the training data is a
stream whose order is a function of the seed and the batch's position alone, read on from where
the epoch ended. A resumed run ends with the weights of an uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import shutil
import tempfile
from collections.abc import Callable

import keras
import numpy as np
import tensorflow as tf

from fbat_tf import (
    attacks,
    classifiers,
    data,
    device,
    distribute,
    evaluation,
    indicators,
    methods,
    provenance,
    schedules,
)
from fbat_tf.callbacks import (
    Divergence,
    EpochTiming,
    Progress,
    ResultsLog,
    ResumeCheckpoint,
    RobustValidation,
    StopAfterBatches,
    TensorBoard,
)
from fbat_tf.checks import reference_checks
from fbat_tf.log_names import shown_names
from fbat_tf.methods.base import Method
from fbat_tf.records import EvaluationResult, MethodRecord, RunRecord, TrainConfig, files
from fbat_tf.run import Run, build_architecture
from fbat_tf.trainer import AdversarialTrainer


def _batches_per_epoch(dataset: tf.data.Dataset) -> int:
    cardinality = int(dataset.cardinality())
    if cardinality > 0:
        return cardinality
    return sum(1 for _ in dataset)


def fingerprint(arrays) -> str:
    """A short hash of arrays' values: runs of one seed record the same fingerprints of their
    initial weights and first training batch whatever the method, which a report checks
    before it pairs them."""
    digest = hashlib.sha256()
    for array in tf.nest.flatten(arrays):
        digest.update(np.ascontiguousarray(np.asarray(array)).tobytes())
    return digest.hexdigest()[:16]


def _build_classifier(config: TrainConfig) -> keras.Model:
    return build_architecture(config.model, config.dataset, config.activation, config.width)


def _optimizer(config: TrainConfig, total_steps: int) -> keras.optimizers.Optimizer:
    schedule = schedules.create(config.lr_schedule, config.lr_max, total_steps)
    if config.momentum_at_peak is None:
        optimizer = keras.optimizers.SGD(learning_rate=schedule, momentum=config.momentum)
    else:
        optimizer = schedules.CyclicMomentumSGD(
            schedule, momentum=config.momentum, momentum_at_peak=config.momentum_at_peak
        )
    if config.precision == "mixed_float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer


class Diverged(RuntimeError):
    """A run that diverged: its message says where, why and what to try; `record` is what
    results.json holds."""

    def __init__(self, message: str, record: RunRecord):
        super().__init__(message)
        self.record = record


def _load_record(path: str, config: TrainConfig) -> RunRecord:
    """The record a resumed run goes on with, or a new one."""
    if not os.path.exists(path):
        return RunRecord(config=config)
    try:
        return RunRecord.load(path)
    except ValueError as error:
        raise ValueError(
            f"{error}, so the run cannot resume: restore the file, or start over in another "
            "--workdir"
        ) from None


def train(config: TrainConfig) -> RunRecord:
    """Train, select the best validation-robust checkpoint, evaluate it on the test split
    (unless `config.final_test` is False: then the test split is never built).

    Raises Diverged for a run that diverges, or diverged before in this workdir. The global
    Keras precision policy is the caller's again when it returns or raises."""
    policy = keras.mixed_precision.global_policy()
    try:
        # Created first: a multi-worker strategy must exist before other TensorFlow work.
        strategy = distribute.create_strategy(config.strategy)
        if distribute.is_chief(strategy):
            return _train(config, strategy)
        # Every worker runs the callbacks; only the chief writes into the shared workdir. The
        # others resume from the chief's checkpoint and write into a scratch directory, removed
        # at the end.
        scratch = tempfile.mkdtemp(prefix="fbat_worker_")
        try:
            return _train(dataclasses.replace(config, workdir=scratch), strategy, config.workdir)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    finally:
        keras.mixed_precision.set_global_policy(policy)


@dataclasses.dataclass
class _Built:
    """What a run trains with, made from its config: the method, the model and its trainer,
    the data, and the length of training."""

    run: Run
    method: Method
    classifier: keras.Model
    trainer: AdversarialTrainer
    stream: Callable[[int], tf.data.Dataset]  # the training stream from its n-th batch
    validation: tf.data.Dataset
    steps_per_epoch: int
    batches: int  # batches read (Free-AT reads each one m times)
    epochs: int
    total_steps: int
    pairing: dict[str, str]


def _train(
    config: TrainConfig, strategy: tf.distribute.Strategy, resume_from: str | None = None
) -> RunRecord:
    run = Run(config.workdir)
    if run.is_diverged():
        message = f"{config.workdir} holds a run that diverged: {run.divergence_message()}"
        raise Diverged(message, run.record())
    keras.utils.set_random_seed(config.seed)
    keras.mixed_precision.set_global_policy(config.precision)
    run.refuse_links()  # nothing of the run is written through a link
    files.make_dirs(run.checkpoints_dir, inside=run.workdir)
    built = _build(config, strategy, run)
    record, divergence = _fit(config, strategy, built, resume_from)
    return _finish(config, built, record, divergence)


def _build(config: TrainConfig, strategy: tf.distribute.Strategy, run: Run) -> _Built:
    """The data, the method, the model, its trainer and optimizer, under the strategy."""
    method = methods.create(
        config.method, eps=config.eps, norm=config.norm, **config.method_options
    )
    methods.check_strategy(method, config.strategy)
    stream, validation, steps_per_epoch, examples = _data(config, method.per_example_state)
    # Free-AT replays each batch m times: it reads ceil(E·S/m) batches, so that its number of
    # gradient steps matches the E·S of the other methods (rounded up to whole batches).
    batches = math.ceil(config.epochs * steps_per_epoch / method.replays)
    total_steps = batches * method.replays
    with strategy.scope():
        classifier = _build_classifier(config)
        pairing = {
            "initial_weights": fingerprint(classifier.get_weights()),
            # The stream's first batch (pass 0) whichever epoch a resumed run starts from: its
            # images and labels, whether or not the method reads their indices.
            "first_batch": fingerprint(next(iter(stream().take(1)))[:2]),
        }
        method.build((config.batch_size, *data.info(config.dataset).image_shape), **examples)
        trainer = AdversarialTrainer(
            classifier,
            method,
            weight_decay=config.weight_decay,
            seed=config.seed,
            jit_compile=config.jit_compile,
        )
        optimizer = _optimizer(config, total_steps)
        trainer.compile(optimizer=optimizer, jit_compile=False)
        optimizer.build(classifier.trainable_variables)
    return _Built(
        run=run,
        method=method,
        classifier=classifier,
        trainer=trainer,
        stream=stream,
        validation=validation,
        steps_per_epoch=steps_per_epoch,
        batches=batches,
        epochs=math.ceil(batches / steps_per_epoch),
        total_steps=total_steps,
        pairing=pairing,
    )


def _data(
    config: TrainConfig, with_indices: bool = False
) -> tuple[Callable[[int], tf.data.Dataset], tf.data.Dataset, int, dict[str, int]]:
    """The training stream (from its n-th batch; with each example's index in the split where
    `with_indices`), the validation split, the batches of a training epoch, and where
    `with_indices` the split's size (`build`'s `examples`, for a method's state per example)."""
    load = dict(
        data_dir=config.data_dir,
        batch_size=config.batch_size,
        download=config.download,
        validation_from=config.validation_from,
    )
    train = dict(seed=config.seed, max_examples=config.max_train_examples, **load)
    train_epoch = data.load(config.dataset, "train", **train)
    steps_per_epoch = config.steps_per_epoch or _batches_per_epoch(train_epoch)

    def stream(start_batch: int = 0) -> tf.data.Dataset:
        """The stream training reads, passes 0, 1, ... from its `start_batch`-th batch."""
        return data.load(
            config.dataset,
            "train",
            repeat=True,
            start_batch=start_batch,
            with_indices=with_indices,
            **train,
        )

    validation = data.load(
        config.dataset, "validation", max_examples=config.val_examples or None, **load
    )
    examples = {"examples": data.examples(config.dataset, "train", **train)} if with_indices else {}
    return stream, validation, steps_per_epoch, examples


def _fit(
    config: TrainConfig,
    strategy: tf.distribute.Strategy,
    built: _Built,
    resume_from: str | None,
) -> tuple[RunRecord, Divergence]:
    """Resume where the run stopped, or start it, and train its remaining epochs; each one's
    logs go into the record (and results.json) as it ends."""
    run = built.run
    resume = ResumeCheckpoint(built.trainer, run.last_checkpoint_dir)
    initial_epoch = resume.restore(
        None if resume_from is None else Run(resume_from).last_checkpoint_dir
    )
    record = _load_record(run.results_path, config)
    record.keep_epochs_until(initial_epoch)
    _describe(record, config, built, strategy)
    divergence = Divergence(
        built.steps_per_epoch, config.max_skipped_fraction, built.method.replays
    )
    resume.divergence = divergence
    callbacks = _callbacks(config, built, record, divergence, resume, initial_epoch)
    if initial_epoch < built.epochs:
        built.trainer.fit(
            built.stream(initial_epoch * built.steps_per_epoch),
            epochs=built.epochs,
            initial_epoch=initial_epoch,
            steps_per_epoch=built.steps_per_epoch,
            callbacks=callbacks,
            verbose=config.verbose,
            shuffle=False,  # the training split is shuffled by data.load
        )
    record.optimizer_steps = int(built.trainer.optimizer.iterations.numpy())
    return record, divergence


def _describe(
    record: RunRecord, config: TrainConfig, built: _Built, strategy: tf.distribute.Strategy
) -> None:
    """What the record says of the code, the method, the machine and the run's length."""
    record.code = provenance.code()
    record.method = MethodRecord.from_dict({**built.method.config(), "passes": built.method.passes})
    record.pairing = built.pairing
    record.dataset, record.model = config.dataset, config.model
    # The seed that halved the test split, where validation comes from it.
    record.split = {
        "validation_from": config.validation_from,
        "held_out_seed": data.HELD_OUT_SEED if config.validation_from == "test" else None,
    }
    record.device = device.describe()
    # float32 convolutions in TF32 (TensorFlow's default on Ampere and newer GPUs).
    record.tf32 = device.tf32_in_use()
    record.machine = provenance.machine()
    record.replicas = strategy.num_replicas_in_sync
    record.steps_per_epoch, record.epochs = built.steps_per_epoch, built.epochs
    record.total_steps = built.total_steps


def _callbacks(
    config: TrainConfig,
    built: _Built,
    record: RunRecord,
    divergence: Divergence,
    resume: ResumeCheckpoint,
    initial_epoch: int,
) -> list[keras.callbacks.Callback]:
    """Order matters: validation writes into the epoch's logs before divergence reads them and
    before they are recorded, the resumable checkpoint comes after them, so an epoch it holds
    is in results.json and TensorBoard too, and the progress line last, to show them all."""
    c = config
    validation_attack = evaluation.validation_attack(
        c.eps, c.norm, c.val_attack_steps, c.val_restarts, c.val_square_queries, c.jit_compile
    )
    best_so_far = max(
        (e.val_robust_accuracy for e in record.history if e.val_robust_accuracy is not None),
        default=-1.0,
    )
    names = shown_names(built.method.adversarial)  # on screen and in TensorBoard
    callbacks = [
        EpochTiming(config.batch_size * built.method.replays),
        RobustValidation(
            built.validation,
            validation_attack,
            config.eps,
            built.classifier,
            best_path=built.run.best_weights,
            stop_on_overfitting=config.stop_on_overfitting,
            best_robust_accuracy=best_so_far,
            seed=config.seed,
        ),
        divergence,
        ResultsLog(built.run.results_path, record),
        TensorBoard(
            built.run.tensorboard_dir,
            update_freq=config.tensorboard_every or "epoch",
            write_graph=False,
            first_batch=initial_epoch * built.steps_per_epoch,
            names=names,
        ),
        resume,
        Progress(names),
    ]
    if built.batches < built.epochs * built.steps_per_epoch:
        callbacks.insert(0, StopAfterBatches(built.batches, built.steps_per_epoch))
    return callbacks


def _finish(
    config: TrainConfig, built: _Built, record: RunRecord, divergence: Divergence
) -> RunRecord:
    """A diverged run's record, or the selected model's test numbers in a complete one (none
    where the config asks for no final test)."""
    run = built.run
    if divergence.outcome is not None:
        record.status = "diverged"
        record.divergence = divergence.outcome
        record.save(run.results_path)
        raise Diverged(f"training diverged: {run.divergence_message(record)}", record)
    if not config.final_test:
        # Trained and validated only: the test split is never built.
        record.status = "complete"
        record.save(run.results_path)
        return record
    if os.path.exists(run.best_weights):
        built.classifier.load_weights(run.best_weights)
    # The test numbers are those of the float32 model, as evaluate.py and the export compute.
    keras.mixed_precision.set_global_policy("float32")
    float32_classifier = _build_classifier(config)
    float32_classifier.set_weights(built.classifier.get_weights())
    record.final = evaluate_test(float32_classifier, config)
    record.status = "complete"
    record.save(run.results_path)
    # On the epoch curves' axis (epochs from 0), at the epoch of the model they measure.
    selected = record.selected_epoch()
    step = (selected.epoch if selected else len(record.history)) - 1
    test_logs = os.path.join(run.tensorboard_dir, "test")
    final = record.final
    with tf.summary.create_file_writer(test_logs).as_default():
        tf.summary.scalar("test_clean_accuracy", final.clean_accuracy, step=max(step, 0))
        for attacked in final.robust:
            tag = f"test_{attacked.attack}_robust_accuracy"
            tf.summary.scalar(tag, attacked.robust_accuracy, step=max(step, 0))
    return record


def final_attack_options(config: TrainConfig) -> dict[str, dict[str, int]]:
    """The options of the final test's attacks, by attack name (PGD's steps and restarts)."""
    return {"pgd": {"steps": config.eval_pgd_steps, "restarts": config.eval_pgd_restarts}}


def evaluate_test(classifier: keras.Model, config: TrainConfig) -> EvaluationResult:
    """SA, PGD-K-R and AutoAttack (standard) robust accuracy of the selected model on the first
    N test examples, and the indicators of attack failure on its first clean-correct ones
    (DESIGN.md §4.5): evaluate.py's evaluation of the run, with the run's settings."""
    where = {"data_dir": config.data_dir, "download": config.download}
    where["validation_from"] = config.validation_from
    size = {"batch_size": config.batch_size, "max_examples": config.eval_examples or None}
    test_ds = data.load(config.dataset, "test", **size, **where)
    names = ["pgd", "autoattack"] if config.eval_autoattack else ["pgd"]
    options = final_attack_options(config)
    built = evaluation.registry_attacks(
        names[:1], [config.eps], norm=config.norm, options=options, jit_compile=config.jit_compile
    )
    # AutoAttack chooses where to compile with XLA itself (attacks/autoattack.py), as
    # evaluate.py's default leaves it to; in the run's threat model, as PGD.
    built.update(evaluation.registry_attacks(names[1:], [config.eps], norm=config.norm))
    # The attacks differentiate the inference graph with the weights folded in (the same
    # function, faster); the progress bar names each as the line of test numbers does.
    inference = classifiers.InferenceGraph(classifier)
    labels = {key: attacks.label(key[0], options.get(key[0])) for key in built}
    result = evaluation.evaluate(
        inference, test_ds, built, progress=config.verbose > 0, seed=config.seed, labels=labels
    )
    result.dataset = config.dataset
    result.describe(
        "test",
        config.validation_from,
        data.points(config.dataset, "test", **where),
        names,
        {"pgd_steps": config.eval_pgd_steps, "pgd_restarts": config.eval_pgd_restarts},
        config.seed,
        config.norm,
    )
    x, y = next(iter(test_ds))[:2]
    checks = reference_checks(inference, x[:64], y[:64], built, config.seed)
    taken = indicators.sample(test_ds, result.clean_outcomes or "", indicators.POINTS)
    if taken is not None:  # as evaluate.py computes them
        result.indicators = indicators.compute(
            inference, *taken, built, result, seed=config.seed, checks=checks
        )
    return result
