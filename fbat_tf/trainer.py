"""AdversarialTrainer: `keras.Model.fit` with a training method's gradient in `train_step`.

    trainer = AdversarialTrainer(classifier, methods.create("fastbat", eps=8 / 255),
                                 weight_decay=5e-4, seed=0, jit_compile=True)
    trainer.compile(optimizer=keras.optimizers.SGD(schedules.Cyclic(0.2, steps), momentum=0.9))
    trainer.fit(train_ds, epochs=20, callbacks=[...])

The method's gradient computation alone is compiled with XLA (`tf.function(jit_compile=True)`);
weight decay and the optimizer update run outside it. That split also works under
`tf.distribute.MirroredStrategy`, where XLA cannot compile the variable updates of the whole
step (DESIGN.md §7).

A method that differentiates input gradients again (Fast-BAT, GradAlign) gets a classifier
whose `keras.layers.BatchNormalization`, `MaxPooling2D` and `Resizing` layers (nested ones too)
are switched, in place and with their weights, to `fbat_tf.models.layers`' classes of the same
name, whose second derivatives are exact (a warning names them); other subclasses of those
Keras layers are refused.

Every step draws its randomness from a stateless seed: [seed, counter] with the replica's index
folded in (`step_seed`). The counter advances on every step, including one that a loss-scaled
optimizer skips, and is checkpointed with the weights, so a step is reproducible from (weights,
batch, seed, counter), a resumed run continues the same stream, and each replica of a
distributed step draws its own noise.

A batch is applied only if everything it would write is finite: its loss, its weight gradients
(weight decay included), and the state its passes wrote (batch-norm moving statistics,
Free-AT's δ, ELLE-A's λ, FGSM-PGI's rows of the batch). Otherwise it is skipped on every
replica: no optimizer step, no slot update, and that state is put back. A method with state per
training example (FGSM-PGI's prior) gets the batch's example indices, the third element of a
training batch, and its rows are written into the split's state only once the batch is applied
(`Method.commit`). A finite loss does not make a batch safe: a model whose
activations overflow can give a finite loss with infinite moving variances, and a layer like
sqrt(relu(·)) a finite loss with NaN gradients. Under a `LossScaleOptimizer` a skipped batch also
lowers the loss scale, as the optimizer does for its own non-finite gradients: an attack pass
that overflows (non-finite δ) would otherwise be skipped at the same scale forever.

`fit` and `evaluate` first refuse a classifier whose outputs are probabilities and labels that
are not class indices of its outputs (`classifiers.check_data`), in one line, before any step.

The epoch's metrics are over the applied batches: `loss` and the method's other logs are their
means (NaN when none was applied, not 0), and `nonfinite_batches` counts the epoch's skipped
ones. `last_finite_loss` holds the loss of the latest applied batch.
"""

from __future__ import annotations

import functools

import keras
import tensorflow as tf
from absl import logging

from fbat_tf import classifiers
from fbat_tf.attacks.losses import correct, cross_entropy
from fbat_tf.methods.base import Method
from fbat_tf.models.layers import use_exact_second_derivatives


class AdversarialTrainer(keras.Model):
    def __init__(
        self,
        classifier: keras.Model,
        method: Method,
        *,
        weight_decay: float = 5e-4,
        seed: int = 0,
        jit_compile: bool = True,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {weight_decay!r}")
        if method.second_order:
            converted = use_exact_second_derivatives(classifier)
            if converted:
                more = f" and {len(converted) - 5} more" if len(converted) > 5 else ""
                logging.warning(
                    "%s differentiates input gradients again, which Keras' BatchNormalization "
                    "(in training mode), MaxPooling2D (under XLA) and Resizing (as zero) get "
                    "wrong; these layers of the model now use fbat_tf.models.layers' class of "
                    "the same name, with the same weights: %s%s",
                    method.name,
                    ", ".join(converted[:5]),
                    more,
                )
        self.classifier = classifier
        self.method = method
        self.weight_decay = float(weight_decay)
        self.seed = int(seed)
        self.jit_compile_gradients = bool(jit_compile)
        # One copy, written once per step (by the first replica under a distribution strategy).
        self.seed_counter = tf.Variable(
            0,
            dtype=tf.int64,
            trainable=False,
            name="seed_counter",
            aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
        )
        # Batches skipped because something they would write was not finite, in all (each
        # epoch's count is the `nonfinite_batches` metric).
        self.nonfinite_batches = tf.Variable(
            0,
            dtype=tf.int64,
            trainable=False,
            name="nonfinite_batches",
            aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
        )
        # The loss of the latest applied batch (first replica's share), NaN before any.
        self.last_finite_loss = tf.Variable(
            float("nan"),
            dtype=tf.float32,
            trainable=False,
            name="last_finite_loss",
            aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
        )
        self._gradients = tf.function(
            self._method_gradients, jit_compile=self.jit_compile_gradients, autograph=False
        )
        self.trackers = {name: AppliedMean(name=name) for name in method.log_names}
        self.skipped = keras.metrics.Sum(name="nonfinite_batches")
        self.eval_loss = keras.metrics.Mean(name="loss")
        self.eval_accuracy = keras.metrics.Mean(name="accuracy")

    def fit(self, x=None, y=None, *args, **kwargs):
        """Keras' fit, after `classifiers.check_data` refused, in one line, outputs that are
        probabilities and labels that are not class indices (on a dataset's first batch, or
        every label of arrays): cross-entropy on probabilities trains silently, a float label
        is truncated, and a label out of range makes every batch non-finite, each skipped.
        A tf.data pipeline is shuffled by its own `shuffle`, never by fit's: fit's default
        `shuffle=True` is then left unsaid, which Keras would warn is ignored."""
        classifiers.check_data(self.classifier, x, y)
        if isinstance(x, tf.data.Dataset) and len(args) < 7:  # args[6] is shuffle
            kwargs.setdefault("shuffle", False)
        return super().fit(x, y, *args, **kwargs)

    def evaluate(self, x=None, y=None, *args, **kwargs):
        """Keras' evaluate, after the same check as `fit`."""
        classifiers.check_data(self.classifier, x, y)
        return super().evaluate(x, y, *args, **kwargs)

    def _method_gradients(self, x, y, seed, loss_scale, *indices):
        # A method with state per example also takes the batch's example indices.
        return self.method.gradients(self.classifier, x, y, seed, loss_scale, *indices)

    def call(self, x, training=False):
        return self.classifier(x, training=training)

    @property
    def metrics(self):
        return [*self.trackers.values(), self.skipped, self.eval_loss, self.eval_accuracy]

    def step_seed(self) -> tf.Tensor:
        """This step's seed on this replica: fold_in([seed, counter], replica index), int32."""
        base = tf.stack([tf.constant(self.seed, tf.int64), tf.identity(self.seed_counter)])
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        seed = tf.random.experimental.stateless_fold_in(base, tf.cast(replica, tf.int64))
        return tf.cast(seed, tf.int32)

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        # Without a strategy Keras leaves the optimizer to be built inside the first trace of
        # the train function, and tf.function then traces the whole step a second time (it does
        # whenever a first call creates variables). Built here, the step is traced once.
        if not self.optimizer.built:
            with self.distribute_strategy.scope():
                self.optimizer.build(self.classifier.trainable_variables)
        if _multi_worker(self.distribute_strategy):
            # Keras 3 reduces a first distributed batch with strategy.reduce to build the model
            # symbolically, which MultiWorkerMirroredStrategy cannot do eagerly; the classifier
            # and the optimizer are built already.
            return
        super()._maybe_symbolic_build(iterator, data_batch)

    def _logs(self, logs: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        # Keras 3 reduces each replica's logs under MultiWorkerMirroredStrategy with
        # reduce("MEAN", axis=0), which needs a dimension to reduce: give it one of size 1.
        if _multi_worker(tf.distribute.get_strategy()):
            return {name: tf.reshape(value, [1]) for name, value in logs.items()}
        return logs

    # The step and the method's gradient are traced without AutoGraph: their control flow is
    # Python over static values, or tf.cond and tf.while_loop written out, so its rewriting of
    # their source at every first trace would buy nothing.
    @tf.autograph.experimental.do_not_convert
    def train_step(self, data):
        x, y = data[0], data[1]
        # The batch's positions in the training split, for a method with state per example
        # (a batch without them: its own positions, as for a fixed batch).
        indices = ()
        if self.method.per_example_state:
            indices = (data[2] if len(data) > 2 else tf.range(tf.shape(x)[0], dtype=tf.int64),)
        weights = self.classifier.trainable_variables
        for _ in range(self.method.replays):
            # 1.0 for a plain optimizer, the dynamic scale for LossScaleOptimizer; divided by
            # the replica count, because gradients are summed over replicas.
            replicas = tf.distribute.get_strategy().num_replicas_in_sync
            loss_scale = self.optimizer.scale_loss(tf.constant(1.0 / replicas, tf.float32))
            # The state a forward pass or the method writes (batch-norm statistics, Free-AT's
            # δ, ELLE-A's λ, FGSM-PGI's rows of the batch), kept to be put back if the batch
            # turns out non-finite.
            state = self.classifier.non_trainable_variables + self.method.step_state()
            saved = [tf.identity(v) for v in state]
            grads, logs = self._gradients(x, y, self.step_seed(), loss_scale, *indices)
            self.method.after_gradients(logs)  # ELLE-A's λ; put back with `state` if skipped
            self.seed_counter.assign_add(1)
            if self.weight_decay:
                # Coupled decay, as PyTorch's SGD: added to the gradient before momentum.
                grads = [
                    g + tf.cast(self.weight_decay * loss_scale, g.dtype) * tf.cast(w, g.dtype)
                    for g, w in zip(grads, weights, strict=True)
                ]
            # Everything the batch would write, and its loss (non-finite logits or δ); on any
            # replica, the step is skipped on all of them.
            bad = _on_any_replica(tf.logical_not(_all_finite([logs["loss"], *grads, *state])))
            self._apply_unless(bad, grads, weights)

            tf.cond(bad, functools.partial(_assign, state, saved), lambda: tf.constant(False))
            if self.method.per_example_state:  # the batch's rows, written once it is applied
                tf.cond(bad, lambda: tf.constant(False), self._commit)
            self.nonfinite_batches.assign_add(tf.cast(bad, tf.int64))
            self.skipped.update_state(tf.cast(bad, tf.float32))
            loss = tf.cast(logs["loss"], tf.float32)
            self.last_finite_loss.assign(tf.where(bad, self.last_finite_loss, loss))
            keep = 1.0 - tf.cast(bad, tf.float32)
            for name, tracker in self.trackers.items():
                value = tf.cast(logs[name], tf.float32)
                tracker.update_state(tf.where(bad, 0.0, value), sample_weight=keep)
        logs = {name: tracker.result() for name, tracker in self.trackers.items()}
        logs["nonfinite_batches"] = self.skipped.result()
        return self._logs(logs)

    def _commit(self) -> tf.Tensor:
        self.method.commit()
        return tf.constant(True)

    def _apply_unless(self, skip: tf.Tensor, grads, weights) -> None:
        """The optimizer step, or nothing where `skip` (the same on every replica); a loss-scaled
        optimizer lowers its scale where `skip`.

        A conditional step under a distribution strategy that needs `merge_call` runs its
        condition in the cross-replica context, as Keras' LossScaleOptimizer does."""

        if isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer):
            # It skips a step whose gradients are not finite and halves its scale, under any
            # strategy: a skipped batch is handed to it as one, its first gradient made NaN.
            first = tf.where(skip, tf.constant(float("nan"), grads[0].dtype), grads[0])
            self.optimizer.apply([first, *grads[1:]], weights)
            return

        def apply(grads, weights):
            self.optimizer.apply(grads, weights)
            return tf.constant(True)

        if tf.__internal__.distribute.strategy_supports_no_merge_call():
            tf.cond(skip, lambda: tf.constant(False), lambda: apply(grads, weights))
            return

        def in_cross_replica(distribution, skip, grads, weights):
            def apply_everywhere():
                distribution.extended.call_for_each_replica(apply, args=(grads, weights))
                return tf.constant(True)

            skip = distribution.experimental_local_results(skip)[0]
            tf.cond(skip, lambda: tf.constant(False), apply_everywhere)

        tf.distribute.get_replica_context().merge_call(
            in_cross_replica, args=(skip, grads, weights)
        )

    @tf.autograph.experimental.do_not_convert
    def test_step(self, data):
        x, y = data[0], data[1]
        logits = self.classifier(x, training=False)
        self.eval_loss.update_state(cross_entropy(logits, y))
        self.eval_accuracy.update_state(correct(logits, y))
        return self._logs(
            {"loss": self.eval_loss.result(), "accuracy": self.eval_accuracy.result()}
        )


class AppliedMean(keras.metrics.Mean):
    """The mean over the batches given a weight; NaN while none was, where Keras' Mean says 0
    (an epoch whose batches were all skipped has no loss, not a loss of 0)."""

    def result(self):
        count = tf.cast(self.count, self.dtype)
        return tf.where(count > 0, tf.math.divide_no_nan(self.total, count), float("nan"))


def _all_finite(tensors) -> tf.Tensor:
    """True when every element of every floating-point tensor is finite (others are)."""
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    checks = [tf.reduce_all(tf.math.is_finite(t)) for t in tensors if t.dtype.is_floating]
    return tf.reduce_all(tf.stack(checks)) if checks else tf.constant(True)


def _assign(variables, values) -> tf.Tensor:
    for variable, value in zip(variables, values, strict=True):
        variable.assign(value)
    return tf.constant(True)


def _on_any_replica(flag: tf.Tensor) -> tf.Tensor:
    """True on every replica if `flag` is true on any of them."""
    context = tf.distribute.get_replica_context()
    if context.num_replicas_in_sync == 1:
        return flag
    return context.all_reduce("SUM", tf.cast(flag, tf.float32)) > 0.5


def _multi_worker(strategy: tf.distribute.Strategy) -> bool:
    return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
