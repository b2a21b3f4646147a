"""Classifiers to evaluate: a training run's, an exported SavedModel's or ONNX or LiteRT
file's (fbat_tf/artifacts.py), a .keras file's.

    classifier, config = load_classifier("runs/fmnist")   # the run's selected weights
    classifier, known = load_model(path)                  # a run, SavedModel or .keras file
    check_logits(classifier, x)                           # refuses softmax outputs
    check_data(classifier, dataset)                       # ... and labels that are no classes
    check_finite(classifier, dataset)                     # refuses NaN or infinite logits
    graph = InferenceGraph(classifier)                    # weights folded into constants

Every classifier here is called as `classifier(x, training=False)` and returns logits,
differentiably, so that the attacks run on it.

A .keras file is loaded with Keras' safe mode on: one that holds code (a Python lambda, a
TFSMLayer) is refused with `trust.UntrustedCodeError` unless the caller passes `trust_code=True`
(fbat_tf/trust.py). A SavedModel is a TensorFlow program and runs as one: load only SavedModels
from sources you trust, as TensorFlow's security guidance says.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from fbat_tf import catalog, run, trust
from fbat_tf.records import TrainConfig
from fbat_tf.run import FLOAT_SIGNATURE, Run


def load_classifier(workdir: str, weights: str = "best") -> tuple[keras.Model, TrainConfig]:
    """A training run's classifier with its weights ("best", the selected checkpoint, or a
    .weights.h5 path), and the run's saved config."""
    run = Run(workdir)
    return run.build_classifier(weights), run.config()


class SavedModelClassifier:
    """An exported SavedModel's `serving_default` as a classifier: `model(x, training=False)`
    returns its logits, differentiably, so every attack runs against the served graph."""

    compute_dtype = "float32"  # exports compute in float32 whatever the training precision

    def __init__(self, path: str):
        self.loaded = tf.saved_model.load(path)
        if FLOAT_SIGNATURE not in self.loaded.signatures:
            raise ValueError(
                f"{path} is a SavedModel without the {FLOAT_SIGNATURE} signature that takes "
                "images and answers logits (it has: "
                f"{', '.join(self.loaded.signatures) or 'none'}); export the model with "
                "python -m export, or pass its run directory or .keras file"
            )
        self.signature = self.loaded.signatures[FLOAT_SIGNATURE]

    def __call__(self, x: tf.Tensor, training: bool = False) -> tf.Tensor:
        return self.signature(images=tf.cast(x, tf.float32))["logits"]


def fold_weights(classifier):
    """A Keras model as its inference graph with the weights folded in (InferenceGraph); any
    other classifier (a SavedModel's) as it is."""
    return InferenceGraph(classifier) if isinstance(classifier, keras.Model) else classifier


class InferenceGraph:
    """A Keras classifier's inference pass (`training=False`) as one graph with its weights
    folded into constants: `graph(x)` gives the same logits, differentiably, and Grappler can
    fold the normalization layers into the convolutions (AutoAttack on the small CNN 14% faster
    on a CPU, bench/README.md). For a model whose weights no longer change.
    """

    def __init__(self, model: keras.Model):
        # A private TensorFlow module: TF 2 has no public way to fold variables into a graph's
        # constants. The public route, attacking the Keras model, is what --nofold_weights
        # runs; folding is kept for the speed-up measured in bench/README.md.
        from tensorflow.python.framework.convert_to_constants import (
            convert_variables_to_constants_v2,
        )

        spec = tf.TensorSpec([None, *model.input_shape[1:]], tf.float32)
        inference = tf.function(
            lambda x: model(x, training=False), autograph=False
        ).get_concrete_function(spec)
        self.function = convert_variables_to_constants_v2(inference)
        self.compute_dtype = model.compute_dtype

    def __call__(self, x: tf.Tensor, training: bool = False) -> tf.Tensor:
        return self.function(tf.cast(x, tf.float32))[0]


def load_keras_file(path: str, trust_code: bool = False, compile: bool = True) -> keras.Model:
    """The model in a .keras file, loaded with Keras' safe mode on unless `trust_code`.

    A file that holds code (a Python lambda, a TFSMLayer: trust.keras_file_code) raises
    trust.UntrustedCodeError before Keras reads it, naming what it holds and how to allow it;
    so does anything else Keras' safe mode refuses. `trust_code=True` loads such a file with safe
    mode off, running its code: only for files from a source the caller trusts.
    """
    trust.check_keras_file(path, trust_code)
    try:
        return keras.saving.load_model(path, compile=compile, safe_mode=not trust_code)
    except ValueError as error:
        if not trust_code and "safe_mode" in str(error):
            # A refusal of Keras' safe mode that keras_file_code does not foresee.
            raise trust.UntrustedCodeError(
                trust.refusal(path, [f"what Keras' safe mode refuses ({error})"])
            ) from None
        raise ValueError(f"{path}: Keras cannot rebuild the model it holds ({error})") from None
    except TypeError as error:
        # A config naming a function or class Keras does not rebuild (os.system, say).
        text = " ".join(str(error).split())
        raise ValueError(
            f"{path}: Keras cannot rebuild the model it holds: "
            f"{text[:200]}{' ...' if len(text) > 200 else ''}"
        ) from None


def load_model(
    path: str, trust_code: bool = False, opened: Callable | None = None
) -> tuple[Callable, dict[str, Any]]:
    """A classifier from a training run directory, a .keras file, a SavedModel directory or an
    exported .onnx or .tflite file (artifacts.load_artifact), with what is known of it
    ({"dataset", "eps", "norm", "validation_from", "architecture"} from the run or the model
    card of the export the file sits in, else {}).

    `opened`: the exported file `path` as its caller opened it already, not opened again.
    A .keras file that holds code is refused unless `trust_code` (load_keras_file). A SavedModel
    is loaded as the program it is: pass only SavedModels from sources you trust.
    """
    known = run.model_facts(path)  # a damaged record or card is named before the model loads
    if Run(path).is_run():
        return load_classifier(path)[0], known
    if os.path.exists(os.path.join(path, "saved_model.pb")):
        return SavedModelClassifier(path), known
    if catalog.artifact_format(path) is not None:
        from fbat_tf import artifacts

        return opened or artifacts.load_artifact(path), known
    if path.endswith(".keras") and os.path.isfile(path):
        return load_keras_file(path, trust_code), {}
    hint = run.model_path_suggestion(path)
    raise FileNotFoundError(
        f"{path} is neither a training run directory ({run.RESULTS}), a SavedModel directory "
        "(saved_model.pb), an .onnx or .tflite file nor a .keras file"
        + (f"; did you mean {hint}?" if hint else "")
    )


def check_logits(classifier: Callable, x: tf.Tensor) -> None:
    """Raise ValueError for a classifier whose outputs look like probabilities: every row
    non-negative and summing to 1. The attacks' losses (cross-entropy, DLR, FAB's boundaries)
    take logits; on probabilities they compute something else, silently."""
    _check_outputs(tf.cast(classifier(x, training=False), tf.float32))


def check_data(classifier: Callable, data, labels=None) -> None:
    """Raise ValueError, in one line, for what the losses would misread silently or fail on
    inside TensorFlow: outputs that are probabilities (check_logits) on the first batch, and
    labels that are not one class index per example, 0 to classes − 1, the classes being the
    model's outputs (a float label as 0.5, a label 10 of a 10-class model, one-hot labels).
    `data`: a tf.data.Dataset of (images, labels, ...) batches, whose first batch is checked,
    or an array of images with their `labels`, all of which are checked; other inputs (a
    Python generator, a distributed dataset) are left unchecked."""
    if isinstance(data, tf.data.Dataset):
        batch = next(iter(data.take(1)), None)
        if not isinstance(batch, tuple | list) or len(batch) < 2:
            return
        x, labels = batch[0], batch[1]
    elif labels is not None and hasattr(data, "shape") and hasattr(labels, "shape"):
        x = data[:64]
    else:
        return
    outputs = tf.cast(classifier(x, training=False), tf.float32)
    _check_outputs(outputs)
    check_labels(labels, int(outputs.shape[-1]))


def check_labels(labels, classes: int) -> None:
    """Raise ValueError, in one line, where `labels` are not one class index per example in 0
    to `classes` − 1 (whole numbers: float labels are taken only where each is one)."""
    y = np.asarray(labels)
    span = f"0 to {classes - 1} (the model gives {classes} class scores)"
    if y.ndim != 1:
        raise ValueError(
            f"the labels have shape {list(y.shape)}, not one class index per example: give "
            f"labels of shape [batch], each one of {span}; for one-hot labels their argmax, for "
            "labels of shape [n, 1] labels.reshape(-1)"
        )
    if y.dtype == bool or not np.issubdtype(y.dtype, np.number):
        raise ValueError(
            f"the labels are of type {y.dtype}, not class indices: give integers {span}"
        )
    if np.issubdtype(y.dtype, np.floating):
        fractional = y[~np.isfinite(y) | (y != np.round(y))]
        if fractional.size:
            raise ValueError(
                f"label {fractional[0]:g} is not a class index: the labels must be whole "
                f"numbers {span}"
            )
    outside = y[(y < 0) | (y >= classes)]
    if outside.size:
        raise ValueError(
            f"label {outside[0]:g} is outside {span}: give labels {span}, or a model with one "
            "output per class"
        )


def _check_outputs(outputs: tf.Tensor) -> None:
    rows_sum_to_one = tf.reduce_all(tf.abs(tf.reduce_sum(outputs, -1) - 1.0) < 1e-3)
    if bool(tf.reduce_all(outputs >= 0.0)) and bool(rows_sum_to_one):
        raise ValueError(
            "the model's outputs are probabilities (every row is non-negative and sums to 1, as "
            "after a softmax), but the attacks and training losses need logits: use the model "
            "without its final softmax, e.g. keras.Model(model.inputs, model.layers[-1].input) "
            "when the softmax is a layer of its own, or rebuild the last Dense layer with "
            "activation=None"
        )


def check_finite(classifier: Callable, dataset: tf.data.Dataset) -> None:
    """Raise ValueError naming how many examples of `dataset` give NaN or infinite logits on
    their clean inputs (and how many of them have non-finite pixels). Such an example can be
    counted neither right nor wrong, so an evaluation that meets one stops; this tells it at
    once, for the whole set, before any attack. One inference pass over the set."""
    examples = nonfinite = bad_pixels = 0
    for x, _ in dataset:
        logits = tf.reshape(tf.cast(classifier(x, training=False), tf.float32), [len(x), -1])
        pixels = tf.reshape(tf.cast(x, tf.float32), [len(x), -1])
        examples += len(x)
        nonfinite += int(
            tf.reduce_sum(tf.cast(~tf.reduce_all(tf.math.is_finite(logits), 1), tf.int32))
        )
        bad_pixels += int(
            tf.reduce_sum(tf.cast(~tf.reduce_all(tf.math.is_finite(pixels), 1), tf.int32))
        )
    if nonfinite or bad_pixels:
        raise ValueError(
            f"{nonfinite} of the {examples} examples give non-finite logits (NaN or infinite) "
            f"on their clean inputs ({bad_pixels} have non-finite pixels); an example whose "
            "logits are not finite can be counted neither right nor wrong, so nothing was "
            "attacked. The model is broken for these inputs (a run that diverged?)."
        )
