"""The private Keras and TensorFlow APIs the library relies on, each with what breaks if an
upgrade changes it. A failure here names the place to rewrite before anything else fails."""

from __future__ import annotations

import inspect

import keras
import tensorflow as tf


def test_keras_model_builds_symbolically_through_maybe_symbolic_build():
    """fbat_tf/trainer.py overrides Model._maybe_symbolic_build(iterator, data_batch) to build
    the optimizer before the first trace (else tf.function traces the step twice) and to skip
    Keras' symbolic build under MultiWorkerMirroredStrategy (it fails there). If Keras renames
    or changes it, the override silently stops being called: the step is traced twice and
    multi-worker training fails at its first batch."""
    method = getattr(keras.Model, "_maybe_symbolic_build", None)
    assert method is not None, "keras.Model._maybe_symbolic_build is gone: see fbat_tf/trainer.py"
    parameters = list(inspect.signature(method).parameters)
    assert parameters == ["self", "iterator", "data_batch"], parameters
    source = inspect.getsource(keras.src.backend.tensorflow.trainer.TensorFlowTrainer.fit)
    assert "_maybe_symbolic_build" in source, "fit no longer calls _maybe_symbolic_build"


def test_tensorflow_says_whether_a_strategy_needs_merge_call():
    """fbat_tf/trainer.py skips a non-finite batch with a conditional optimizer step; under a
    strategy that needs merge_call it runs the condition in the cross-replica context, as
    Keras' LossScaleOptimizer does, and asks tf.__internal__ which case it is in. Without it,
    the conditional step fails under MirroredStrategy."""
    ask = tf.__internal__.distribute.strategy_supports_no_merge_call
    with tf.distribute.get_strategy().scope():
        assert ask() in (True, False)


def test_sgd_finds_a_variables_velocity_by_its_private_index():
    """fbat_tf/schedules.py's CyclicMomentumSGD finds a variable's velocity as SGD.update_step
    does, with Optimizer._get_variable_index; if it changes, the cycling momentum's update
    fails (tests/test_schedules.py too)."""
    optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
    weights = [keras.Variable(1.0), keras.Variable(2.0)]
    optimizer.build(weights)
    assert [optimizer._get_variable_index(w) for w in weights] == [0, 1]
    assert "_get_variable_index" in inspect.getsource(keras.optimizers.SGD.update_step)
