"""An exported ONNX or LiteRT file as a classifier, run by its own runtime (DESIGN.md §5.4).

    classifier = load_artifact("export/fmnist/1/model.onnx")       # onnxruntime
    classifier = load_artifact("export/fmnist/1/model_int8.tflite")  # ai-edge-litert
    logits = classifier(x)              # a float32 tensor [N, classes], also inside tf.function
    agree, source_right, right = compare(source, classifier, dataset)   # bool [examples] each

The file runs as it will be deployed: through onnxruntime's CPU provider, or the LiteRT
interpreter of the `ai-edge-litert` package, never through TensorFlow. The classifier reads only
outputs, so attacks that need its gradients cannot run on it: evaluate.py replays the source
model's adversarial examples on it instead, and runs score-based attacks (Square) on it.

A runtime that is not installed is a MissingExtra naming the package and the extra that
installs it; a file the runtime cannot read, or one that does not take a batch of NHWC float32
images and give a batch of scores, is a ValueError of one line naming the file.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from fbat_tf import catalog, startup

if TYPE_CHECKING:
    import tensorflow as tf

EXTRA = 'pip install -e ".[export]"'


class MissingExtra(ImportError):
    """A package an export format needs is not installed; the message names it."""


def installed(package: str) -> bool:
    """Whether `package` can be imported, found without importing it (tf2onnx would load
    TensorFlow): a command line checks its flags before TensorFlow loads."""
    if package in sys.modules:
        return sys.modules[package] is not None
    return importlib.util.find_spec(package) is not None


def require(packages: tuple[str, ...], what: str) -> None:
    """MissingExtra naming the first of `packages` that is not installed, if any."""
    for package in packages:
        if not installed(package):
            name = package.replace("_", "-")
            raise MissingExtra(
                f"{what} needs the Python package {name}, which is not installed: {EXTRA}"
            )


def _first_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return text[:300] + (" ..." if len(text) > 300 else "")


class ArtifactClassifier:
    """A classifier over a runtime's session: `model(x, training=False)` gives float32 logits,
    from NumPy through tf.numpy_function, so that it also runs inside an attack's graph (not
    under XLA, and without gradients)."""

    compute_dtype = "float32"
    format = ""

    def __init__(self, path: str):
        self.path = path
        self.lock = threading.Lock()  # a LiteRT interpreter is not safe across threads

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Logits [N, classes] for images [N, H, W, C] (float32 in [0, 1])."""
        raise NotImplementedError

    image_shape: tuple = ()  # [H, W, C] as the file declares them (None where not fixed)
    declared_classes: int | None = None  # the class scores it declares a row of (None: not fixed)

    def check_classes(self, classes: int, shape: tuple, dataset: str = "this dataset") -> None:
        """ValueError where the file gives another number of class scores per image than
        `classes`: the count it declares, else the one it gives for a black image of `shape`
        ([H, W, C]), run here by its runtime (no TensorFlow)."""
        given = self.declared_classes
        if given is None:
            with self.lock:
                scores = np.asarray(self.predict(np.zeros((1, *shape), np.float32)))
            given = int(scores.shape[-1]) if scores.ndim == 2 else None
        if given is not None and given != classes:
            raise ValueError(
                f"the file gives {given} class scores per image, not one for each of the "
                f"{classes} classes of {dataset}: evaluate it on the dataset it was trained on "
                "(--dataset), or export the model for this one"
            )

    def check_images(self, shape: tuple, dataset: str = "this dataset") -> None:
        """ValueError where the file declares images of another [H, W, C] than `shape`."""
        wanted = self.image_shape
        if any(w is not None and w != got for w, got in zip(wanted, shape, strict=False)):
            shown = "x".join("?" if w is None else str(w) for w in wanted)
            raise ValueError(
                f"the file takes {shown} images, not the {'x'.join(map(str, shape))} images of "
                f"{dataset}"
            )

    def _checked(self, x: np.ndarray) -> np.ndarray:
        self.check_images(x.shape[1:])
        with self.lock:
            try:
                logits = self.predict(np.ascontiguousarray(x, np.float32))
            except Exception as error:  # the runtimes raise their own types
                raise ValueError(
                    f"the {self.format} runtime refused a batch of shape {tuple(x.shape)}: "
                    f"{_first_line(error)}"
                ) from None
        logits = np.asarray(logits, np.float32)
        if logits.ndim != 2 or logits.shape[0] != x.shape[0]:
            raise ValueError(
                f"the file gives outputs of shape {logits.shape} for {x.shape[0]} images, not "
                "one row of class scores per image"
            )
        return logits

    def __call__(self, x: tf.Tensor, training: bool = False) -> tf.Tensor:
        import tensorflow as tf

        x = tf.cast(x, tf.float32)
        if tf.executing_eagerly():
            return tf.constant(self._checked(x.numpy()))
        logits = tf.numpy_function(self._checked, [x], tf.float32, stateful=False)
        logits.set_shape([x.shape[0], None])
        return logits


class OnnxClassifier(ArtifactClassifier):
    format = "ONNX"

    def __init__(self, path: str):
        super().__init__(path)
        require(catalog.EXPORT_RUNTIMES["onnx"], "evaluating an .onnx file")
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.log_severity_level = 3  # errors only
        try:
            self.session = onnxruntime.InferenceSession(
                path, options, providers=["CPUExecutionProvider"]
            )
        except Exception as error:
            raise ValueError(
                f"{path}: not an ONNX model onnxruntime can run ({_first_line(error)})"
            ) from None
        inputs = self.session.get_inputs()
        self.image_shape = _check_signature(
            path, [(i.shape, i.type) for i in inputs], "tensor(float)"
        )
        self.input_name = inputs[0].name
        self.declared_classes = _fixed((self.session.get_outputs()[0].shape or [None])[-1])

    def predict(self, x: np.ndarray) -> np.ndarray:
        return self.session.run(None, {self.input_name: x})[0]


# What the LiteRT interpreter prints on standard error each time it prepares its tensors.
_LITERT_NOISE = re.compile(r"^INFO: Created TensorFlow Lite XNNPACK delegate for CPU\.$")


class LiteRTClassifier(ArtifactClassifier):
    format = "LiteRT"

    def __init__(self, path: str):
        super().__init__(path)
        require(catalog.EXPORT_RUNTIMES["litert"], "evaluating a .tflite file")
        from ai_edge_litert.interpreter import Interpreter

        try:
            self.interpreter = Interpreter(model_path=path, num_threads=os.cpu_count() or 1)
        except Exception as error:
            raise ValueError(
                f"{path}: not a LiteRT model the interpreter can run ({_first_line(error)})"
            ) from None
        inputs = self.interpreter.get_input_details()
        self.image_shape = _check_signature(
            path, [(list(i["shape_signature"]), np.dtype(i["dtype"]).name) for i in inputs]
        )
        self.input_index = inputs[0]["index"]
        output = self.interpreter.get_output_details()[0]
        self.output_index = output["index"]
        self.declared_classes = _fixed((list(output["shape_signature"]) or [None])[-1])
        self.batch = None

    def predict(self, x: np.ndarray) -> np.ndarray:
        if self.batch != x.shape[0]:
            self.interpreter.resize_tensor_input(self.input_index, list(x.shape))
            with startup.held_back(_LITERT_NOISE):
                self.interpreter.allocate_tensors()
            self.batch = x.shape[0]
        self.interpreter.set_tensor(self.input_index, x)
        self.interpreter.invoke()
        return self.interpreter.get_tensor(self.output_index).copy()


def _check_signature(path: str, inputs: list, float_type: str = "float32") -> tuple:
    """The [H, W, C] a model takes (None where not fixed); ValueError unless it takes one input,
    a batch of images [N, H, W, C] of floats."""
    if len(inputs) != 1:
        raise ValueError(f"{path}: takes {len(inputs)} inputs, not one batch of images")
    shape, dtype = inputs[0]
    if len(shape) != 4 or dtype != float_type:
        raise ValueError(
            f"{path}: takes {dtype} of shape {list(shape)}, not a batch of float32 images "
            "[N, height, width, channels]"
        )
    return tuple(_fixed(d) for d in shape[1:])


def _fixed(dimension) -> int | None:
    """A dimension a file fixes (a positive integer, NumPy's too), else None (-1, a name)."""
    try:
        dimension = int(dimension)
    except (TypeError, ValueError):
        return None
    return dimension if dimension > 0 else None


LOADERS: dict[str, Callable[[str], ArtifactClassifier]] = {
    "onnx": OnnxClassifier,
    "litert": LiteRTClassifier,
}


def load_artifact(path: str) -> ArtifactClassifier:
    """The classifier of an .onnx or .tflite file; ValueError for another suffix or a file the
    runtime refuses, MissingExtra where the runtime is not installed."""
    found = catalog.artifact_format(path)
    if found is None or not os.path.isfile(path):
        raise ValueError(f"{path}: not an .onnx or .tflite file")
    return LOADERS[found](path)


def predictions(classifier: Callable, x) -> np.ndarray:
    """The class each image is given, as NumPy int64."""
    return np.argmax(np.asarray(classifier(x, training=False)), axis=-1)


def compare(source: Callable, target: Callable, dataset: tf.data.Dataset):
    """Per example of `dataset`, in its order: whether `target` gives it the class `source`
    gives it, whether `source` classifies it correctly, and whether `target` does (three bool
    arrays)."""
    agree, right, target_right = [np.zeros([0], bool)], [np.zeros([0], bool)], [np.zeros([0], bool)]
    for x, y in dataset:
        given, answered = predictions(source, x), predictions(target, x)
        agree.append(given == answered)
        right.append(given == np.asarray(y))
        target_right.append(answered == np.asarray(y))
    return np.concatenate(agree), np.concatenate(right), np.concatenate(target_right)
