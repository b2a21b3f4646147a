"""ONNX and LiteRT files beside the SavedModel, written by Keras' own export (DESIGN.md §5.4).

    from export import artifacts

    artifacts.check_formats(["saved_model", "onnx"])   # or MissingExtra, naming the package
    written = artifacts.write(classifier, version_dir, ["onnx", "litert"], representative)
    artifacts.record_recheck(version_dir, "model.onnx", row)   # evaluate.py's row in the card

Each file is `Model.export(format="onnx" | "litert")` of the classifier the SavedModel serves
(raw pixels in [0, 1] in, logits out; the normalization is inside): ONNX through tf2onnx,
LiteRT through TensorFlow's converter, and LiteRT int8 through the same converter with
post-training quantization calibrated on `representative`, a few batches of training images
(its inputs and outputs stay float32). fbat-tf writes none of the conversion itself.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import warnings
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from fbat_tf import catalog, startup
from fbat_tf.artifacts import MissingExtra, require
from fbat_tf.run import ARTIFACTS, MODEL_CARD

__all__ = [
    "MissingExtra",
    "check_formats",
    "file_names",
    "formats_writing",
    "missing",
    "record_recheck",
    "versions_of",
    "write",
]


def check_formats(formats: Iterable[str]) -> None:
    """ValueError for an unknown format or a list without the SavedModel; MissingExtra (one
    line, naming the package) where a format's converter is not installed."""
    formats = list(formats)
    unknown = sorted(set(formats) - set(catalog.EXPORT_FORMATS))
    if unknown:
        raise ValueError(
            f"unknown export format(s) {unknown}; choose from {list(catalog.EXPORT_FORMATS)}"
        )
    if "saved_model" not in formats:
        raise ValueError(
            "the formats must include saved_model: TF-Serving serves its version directory, "
            "and the other formats are written beside it and checked against it"
        )
    for name in formats:
        require(catalog.EXPORT_WRITERS.get(name, ()), f"--export_formats={name}")


def formats_writing(names: Iterable[str]) -> tuple[list[str], bool]:
    """The formats that write the files `names` (of file_names), and whether the int8 LiteRT
    file is among them."""
    names = set(names)
    formats = [f for f in ("onnx", "litert") if names & set(file_names([f], int8=True))]
    return formats, ARTIFACTS["litert_int8"] in names


def file_names(formats: Iterable[str], int8: bool) -> list[str]:
    """The files `formats` write beside the SavedModel (the int8 LiteRT file where `int8`)."""
    formats = set(formats)
    names = [ARTIFACTS["onnx"]] if "onnx" in formats else []
    if "litert" in formats:
        names += [ARTIFACTS["litert"], *([ARTIFACTS["litert_int8"]] if int8 else [])]
    return names


def missing(version_dir: str, formats: Iterable[str], int8: bool) -> list[str]:
    """The files of `formats` an exported version directory lacks: not there, or not listed
    in its model card (a file the card does not describe was not finished). Reads no
    TensorFlow; ValueError naming the card where it does not read."""
    from fbat_tf.records import ModelCard

    try:
        listed = ModelCard.load(os.path.join(version_dir, MODEL_CARD)).artifacts
    except FileNotFoundError:
        listed = ()
    return [
        name
        for name in file_names(formats, int8)
        if name not in listed or not os.path.isfile(os.path.join(version_dir, name))
    ]


@contextlib.contextmanager
def _constants_in_graph(classifier) -> Iterator[None]:
    """keras.layers.Normalization holds its mean and variance as eager tensors, which a traced
    function captures and tf2onnx turns into inputs of the ONNX graph; as NumPy arrays for the
    conversion they trace as constants (the same values, the same arithmetic)."""
    import keras
    import numpy as np

    held = []
    for layer in classifier._flatten_layers(include_self=False):
        if isinstance(layer, keras.layers.Normalization) and layer.mean is not None:
            held.append((layer, layer.mean, layer.variance))
            layer.mean, layer.variance = np.asarray(layer.mean), np.asarray(layer.variance)
    try:
        yield
    finally:
        for layer, mean, variance in held:
            layer.mean, layer.variance = mean, variance


# What TensorFlow's LiteRT converter writes on every conversion, from native code: the
# options it ignores, the quantizer's settings, the version metadata it leaves to the exporter.
CONVERTER_NOISE = re.compile(
    r"^(W\d{4} .*(Ignored output_format|Ignored drop_control_dependency|"
    r"Skipping runtime version metadata)|fully_quantize: \d+, inference_type: )"
)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """tf2onnx's INFO lines and its numpy-2 FutureWarning, and the LiteRT converter's lines
    (CONVERTER_NOISE), held back; any other line still shows."""
    logger = logging.getLogger("tf2onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), startup.held_back(CONVERTER_NOISE):
            warnings.simplefilter("ignore", FutureWarning)
            yield
    finally:
        logger.setLevel(level)


def write(
    classifier,
    folder: str,
    formats: Sequence[str],
    representative: Sequence[Any] | None = None,
) -> dict[str, dict[str, Any]]:
    """Write the formats asked for (of "onnx", "litert") into `folder`; returns what the model
    card records of each file, by file name. "litert" writes the float32 file and, given
    `representative` (batches of training images), the int8 one."""
    import tensorflow as tf

    height, width, channels = classifier.input_shape[1:]
    spec = [tf.TensorSpec([None, height, width, channels], tf.float32, name="images")]
    written: dict[str, dict[str, Any]] = {}
    with _constants_in_graph(classifier), _quiet():
        if "onnx" in formats:
            path = os.path.join(folder, ARTIFACTS["onnx"])
            classifier.export(path, format="onnx", input_signature=spec, verbose=False)
            written[ARTIFACTS["onnx"]] = _described(path, "onnx", "float32")
        if "litert" in formats:
            path = os.path.join(folder, ARTIFACTS["litert"])
            classifier.export(path, format="litert", input_signature=spec, verbose=False)
            written[ARTIFACTS["litert"]] = _described(path, "litert", "float32")
        if "litert" in formats and representative is not None:
            path = os.path.join(folder, ARTIFACTS["litert_int8"])
            classifier.export(
                path,
                format="litert",
                input_signature=spec,
                verbose=False,
                optimizations=[tf.lite.Optimize.DEFAULT],
                representative_dataset=lambda: ([batch] for batch in representative),
            )
            examples = sum(len(batch) for batch in representative)
            written[ARTIFACTS["litert_int8"]] = _described(
                path, "litert", "int8", calibration_examples=examples
            )
    return written


def _described(path: str, format_: str, precision: str, **more: Any) -> dict[str, Any]:
    return {
        "format": format_,
        "precision": precision,
        "bytes": os.path.getsize(path),
        "input": "float32 [N, H, W, C] in [0, 1]",
        "output": "logits",
        **versions_of(format_),
        **more,
    }


def versions_of(format_: str) -> dict[str, str]:
    """The converter that wrote a format and the runtime that runs it, with their versions
    where installed."""
    from importlib import metadata

    import tensorflow as tf

    def version(package: str) -> str:
        try:
            return f"{package} {metadata.version(package)}"
        except metadata.PackageNotFoundError:
            return f"{package} (not installed)"

    if format_ == "onnx":
        return {"converter": version("tf2onnx"), "runtime": version("onnxruntime")}
    return {"converter": f"tensorflow {tf.__version__}", "runtime": version("ai-edge-litert")}


def record_recheck(version_dir: str, file_name: str, row: dict[str, Any]) -> str | None:
    """Add evaluate.py's re-check of an artifact to the model card of the export it sits in
    (under "deployment", by file name, replacing an earlier one); returns the card's path, or
    None where the folder holds no card."""
    from fbat_tf.records import files, finite_or_null, read_json, write_json_atomic

    path = os.path.join(version_dir, MODEL_CARD)
    files.refuse_links(path, inside=version_dir)  # the card and its folder, never a link's
    if not os.path.isfile(path):
        return None
    # A card cut short or of another shape is named, never rewritten from what was misread.
    card = read_json(path, "a model card as fbat-tf exports it", "model")
    card.setdefault("deployment", {})[file_name] = row
    write_json_atomic(path, finite_or_null(card))
    return path
