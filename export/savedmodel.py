"""Export a classifier as a SavedModel that TF-Serving loads as it is, with its model card.

    from export.savedmodel import export_model, export_run, model_card

    path = export_run("runs/fmnist-fastbat")    # -> runs/fmnist-fastbat/export/<name>/<N>
    path = export_model(classifier, "/srv/models", "fmnist", version=3, model_card={...})
    card = model_card("runs/fmnist-fastbat")    # what assets.extra/model_card.json records
    add_formats("runs/fmnist-fastbat", path, ["saved_model", "onnx"])   # files it lacks, added

`export_run` is what train.py calls at the end of a run: it rebuilds the run's best checkpoint
(`checkpoints/best.weights.h5`) in float32 and writes `<export_dir>/<name>/<version>/` with the
default name `<dataset>-<model>-<method>` and the next free version.

The SavedModel has two signatures (method tensorflow/serving/predict), both taking a batch of
raw pixels; normalization is the model's first layer:

    serving_default   images: float32 [None, H, W, C], pixels in [0, 1]
    serve_uint8       images: uint8   [None, H, W, C], pixels in [0, 255] (divided by 255 inside)
    outputs (both)    logits: float32 [None, K], probabilities: float32 [None, K] (softmax),
                      classes: int64 [None] (argmax of the logits),
                      class_names: string [None] (the classes' names, where the dataset's
                      are known: fbat_tf/data/class_names.py; the model card lists them too)

Input that the model was not trained on is rejected, never served: a float pixel outside [0, 1]
(NaN included) fails a `tf.debugging.Assert`, and a batch of another shape or rank fails
`tf.ensure_shape`; both run inside the graph, so TF-Serving answers them with
INVALID_ARGUMENT (HTTP 400) and the message says what was wrong. Values are not clipped: floats in
[0, 255] clipped to [0, 1] would be classified, wrongly, without a word. uint8 pixels are always
in range. The exported graph runs in float32 whatever the training precision, without XLA, and
loads with TensorFlow alone (no fbat_tf, no custom objects).

A version directory is never overwritten (FileExistsError), and an export that fails leaves no
version directory behind: the SavedModel and its card are written to a hidden sibling directory,
which TF-Serving ignores, and renamed into place only when complete.

`formats` adds ONNX and LiteRT files of the same classifier to the version directory
(export/artifacts.py: model.onnx, model.tflite and, calibrated on the first training images of
the run's dataset, model_int8.tflite); the card lists them under "artifacts". `add_formats`
writes those an existing version of the run lacks into it (train.py, on a finished run asked
for formats its export lacks): files of the weights the SavedModel holds, the SavedModel left
as it is.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import shutil
import socket
import stat
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import keras
import tensorflow as tf

from export import artifacts, modelcard, versions
from fbat_tf import data, provenance
from fbat_tf.records import (
    MethodRecord,
    ModelCard,
    files,
    finite_or_null,
    read_json,
    write_json_atomic,
)
from fbat_tf.run import FLOAT_SIGNATURE, MODEL_CARD, UINT8_SIGNATURE, Run, file_sha256

INPUT_KEY = "images"
OUTPUT_KEYS = ("logits", "probabilities", "classes")
_OUT_OF_RANGE = (
    f"{FLOAT_SIGNATURE}: images must be float32 pixels in [0, 1] (divide uint8 pixels by 255, "
    f"or send them to the {UINT8_SIGNATURE} signature); got min and max:"
)

# How the exported model treats its input, recorded in the model card for whoever serves it.
SERVING_CONTRACT: dict[str, Any] = {
    "signatures": {
        FLOAT_SIGNATURE: {"input": INPUT_KEY, "dtype": "float32", "range": [0.0, 1.0]},
        UINT8_SIGNATURE: {"input": INPUT_KEY, "dtype": "uint8", "range": [0, 255]},
    },
    "outputs": {"logits": "float32", "probabilities": "float32", "classes": "int64"},
    "out_of_range": "rejected (INVALID_ARGUMENT); float pixels are not clipped",
    "wrong_shape": "rejected (INVALID_ARGUMENT) by tf.ensure_shape in the graph",
    "normalization": "inside the model: send raw pixels",
}


def image_shape(classifier: keras.Model) -> tuple[int, int, int]:
    """(H, W, C) of the classifier's input; ValueError unless it is a fully known NHWC shape."""
    shape = tuple(classifier.input_shape)
    if len(shape) != 4 or any(not isinstance(d, int) for d in shape[1:]):
        raise ValueError(
            f"export needs a classifier of images with a known [batch, H, W, C] input shape, "
            f"got {shape}"
        )
    return shape[1], shape[2], shape[3]


def build_archive(
    classifier: keras.Model, class_names: Sequence[str] = ()
) -> keras.export.ExportArchive:
    """An ExportArchive of `classifier` with the float32 and uint8 signatures of this module;
    with `class_names` (one per class), a `class_names` output names each predicted class."""
    batch_shape = [None, *image_shape(classifier)]
    names = tf.constant(list(class_names), tf.string) if class_names else None

    def predictions(pixels: tf.Tensor) -> dict[str, tf.Tensor]:
        logits = tf.cast(classifier(pixels, training=False), tf.float32)
        classes = tf.argmax(logits, axis=-1, output_type=tf.int64)
        outputs = {
            "logits": logits,
            "probabilities": tf.nn.softmax(logits, axis=-1),
            "classes": classes,
        }
        if names is not None:
            outputs["class_names"] = tf.gather(names, classes)
        return outputs

    def serve_float(images: tf.Tensor) -> dict[str, tf.Tensor]:
        # Neither a loaded signature (TF 2.21) nor TF-Serving, which feeds the graph the tensor
        # it was sent, checks the batch against the signature's shape, and global pooling would
        # classify a 32x32 image: check it in the graph.
        images = tf.ensure_shape(images, batch_shape)
        # Comparisons with NaN are false, so NaN pixels fail this check too.
        in_range = tf.reduce_all(tf.logical_and(images >= 0.0, images <= 1.0))
        check = tf.debugging.Assert(
            in_range, [_OUT_OF_RANGE, tf.reduce_min(images), tf.reduce_max(images)]
        )
        with tf.control_dependencies([check]):
            return predictions(tf.identity(images))

    def serve_uint8(images: tf.Tensor) -> dict[str, tf.Tensor]:
        images = tf.ensure_shape(images, batch_shape)
        return predictions(tf.cast(images, tf.float32) / 255.0)

    archive = keras.export.ExportArchive()
    archive.track(classifier)
    # The argument name and the TensorSpec name become the signature's input key ("images").
    archive.add_endpoint(
        FLOAT_SIGNATURE,
        serve_float,
        input_signature=[tf.TensorSpec(batch_shape, tf.float32, name=INPUT_KEY)],
    )
    archive.add_endpoint(
        UINT8_SIGNATURE,
        serve_uint8,
        input_signature=[tf.TensorSpec(batch_shape, tf.uint8, name=INPUT_KEY)],
    )
    return archive


def export_model(
    classifier: keras.Model,
    export_dir: str,
    name: str,
    version: int | None = None,
    model_card: Mapping[str, Any] | None = None,
    formats: Sequence[str] = ("saved_model",),
    representative: Sequence[Any] | None = None,
) -> str:
    """Write `classifier` to `<export_dir>/<name>/<version>/` and return that path.

    `formats` beyond "saved_model" are written beside it (artifacts.write; `representative`:
    the batches of training images the int8 LiteRT file is calibrated on, None for none).

    `version=None` takes the next free integer. `model_card` (e.g. `model_card(workdir)`) is
    written to `assets.extra/model_card.json` with the export's name, version, serving contract
    and software versions added; its `class_names`, if any, become the `class_names` output.
    Raises FileExistsError for an existing version and ValueError for a bad name, version,
    input shape or list of class names, before anything is written.
    """
    target, version = versions.free_version_dir(export_dir, name, version)
    card, class_names = _export_card(classifier, name, version, model_card)

    model_root = os.path.dirname(target)
    files.refuse_links(model_root, inside=export_dir)  # nothing is exported behind a link
    created = _make_dirs(model_root)
    # A hidden sibling on the same filesystem: TF-Serving ignores it (not an integer), and the
    # final rename is atomic, so a server never sees a half-written version.
    partial = _partial_dir(model_root, version)
    try:
        build_archive(classifier, class_names).write_out(partial, verbose=False)
        if set(formats) - {"saved_model"}:
            card["artifacts"] = artifacts.write(classifier, partial, formats, representative)
        _write_model_card(os.path.join(partial, MODEL_CARD), card)
        # Checked again: another process may have exported this version in the meantime (a
        # rename onto an existing empty directory would succeed and replace it).
        versions.free_version_dir(export_dir, name, version)
        os.rename(partial, target)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        for path in reversed(created):
            try:
                os.rmdir(path)  # only the folders this call created, and only if still empty
            except OSError:
                break
        raise
    return target


def _export_card(
    classifier: keras.Model, name: str, version: int, model_card: Mapping[str, Any] | None
) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The card an export writes: `model_card` with the export's name, version and time, the
    classifier's shapes, the serving contract and software versions; and the class names the
    `class_names` output gives. ValueError for a bad input shape or list of class names."""
    height, width, channels = image_shape(classifier)
    class_names = _class_names(model_card, int(classifier.output_shape[-1]))
    card = {
        "name": name,
        "version": version,
        "exported_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        **(model_card or {}),
    }
    card.update(
        model={
            **(card.get("model") or {}),
            "input_shape": [None, height, width, channels],
            "num_classes": int(classifier.output_shape[-1]),
            "parameters": int(classifier.count_params()),
        },
        serving=serving_contract(bool(class_names)),
        software=software_versions(),
    )
    return card, class_names


def export_run(
    workdir: str,
    export_dir: str | None = None,
    name: str | None = None,
    version: int | None = None,
    formats: Sequence[str] = ("saved_model",),
    int8_examples: int = 0,
) -> str:
    """Export the best checkpoint of a training run with its model card; returns the path.

    Defaults: `export_dir` = `<workdir>/export`, `name` = `<dataset>-<model>-<method>`,
    `version` = the next free integer. The model is rebuilt in float32 whatever the global
    mixed-precision policy (restored afterwards). Checks the target before loading the model.
    `formats` as export_model's; with "litert", `int8_examples` > 0 also writes the int8 file,
    calibrated on the first that many images of the run's training split.
    """
    artifacts.check_formats(formats)
    if name is None:
        known = ModelCard.from_dict(model_card(workdir))
        name = versions.run_name(known.dataset, known.model.name, known.method.name)
    export_dir = export_dir if export_dir is not None else Run(workdir).export_dir
    target, _ = versions.free_version_dir(export_dir, name, version)
    # Made once its place is known: it names the run from there.
    card = model_card(workdir, card_file=os.path.join(target, MODEL_CARD))
    classifier = _float32_classifier(workdir)
    representative = None
    if "litert" in formats and int8_examples > 0:
        representative = training_images(Run(workdir).config(), int8_examples)
    return export_model(classifier, export_dir, name, version, card, formats, representative)


def _float32_classifier(workdir: str) -> keras.Model:
    """The run's best model rebuilt in float32 whatever the global mixed-precision policy
    (restored afterwards)."""
    from fbat_tf import classifiers

    previous_policy = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("float32")
    try:
        classifier, _ = classifiers.load_classifier(workdir)
    finally:
        keras.mixed_precision.set_global_policy(previous_policy)
    return classifier


def add_formats(
    workdir: str, version_dir: str, formats: Sequence[str], int8_examples: int = 0
) -> list[str]:
    """Write into `version_dir`, a version exported from this run's best weights, the files
    of `formats` it lacks (artifacts.missing), and list them in its model card; returns their
    names. The SavedModel there is not touched. Each file is written in a hidden sibling
    folder first and renamed into place, then the card is replaced whole, so that a version
    never lists a file half-written. ValueError where the card says other weights were
    exported than the run's best (a new version is then the way: python -m export)."""
    artifacts.check_formats(formats)
    todo = artifacts.missing(version_dir, formats, int8_examples > 0)
    if not todo:
        return []
    card_path = os.path.join(version_dir, MODEL_CARD)
    # What it writes, never behind a link: the version's folder (from the run's export/ on),
    # its files and its card's folder.
    files.refuse_links(version_dir, inside=Run(workdir).export_dir)
    for name in (*todo, MODEL_CARD):
        files.refuse_links(os.path.join(version_dir, name), inside=version_dir)
    weights = Run(workdir).best_weights
    exported = ModelCard.load(card_path).weights_sha256
    if exported is not None and exported != file_sha256(weights):
        raise ValueError(
            f"{version_dir} holds other weights than {weights} (its card's "
            "source.weights_sha256 differs): export a new version with python -m export "
            f"--workdir={workdir} --export_formats={','.join(formats)}"
        )
    classifier = _float32_classifier(workdir)
    wanted, int8 = artifacts.formats_writing(todo)
    representative = None
    if int8:
        representative = training_images(Run(workdir).config(), int8_examples)
    partial = _partial_dir(os.path.dirname(version_dir), os.path.basename(version_dir))
    try:
        written = artifacts.write(classifier, partial, wanted, representative)
        written = {name: written[name] for name in todo}
        for file_name in written:
            os.replace(os.path.join(partial, file_name), os.path.join(version_dir, file_name))
        card = read_json(card_path, "a model card as fbat-tf exports it", "model")
        card.setdefault("artifacts", {}).update(written)
        write_json_atomic(card_path, finite_or_null(card))
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return list(written)


# `.partial-<version>-<host>-<pid>-<8 hex digits>`: an export's folder in progress, by whom.
_PARTIAL = re.compile(r"\.partial-\d+-(?P<host>.+)-(?P<pid>\d+)-[0-9a-f]{8}")


def _partial_dir(model_root: str, version: int | str) -> str:
    """A new hidden folder beside the versions (TF-Serving ignores it: not an integer) on the
    same filesystem, so that what is written there is renamed into place atomically. Those an
    export of this machine left when it was killed go first (_remove_stale_partials)."""
    _remove_stale_partials(model_root)
    name = f".partial-{version}-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    partial = os.path.join(model_root, name)
    os.mkdir(partial)
    return partial


def _remove_stale_partials(model_root: str) -> list[str]:
    """Remove the folders in `model_root` that an export on this machine made (its name, with
    this host and a process id) and left behind because that process ended without its
    cleanup (kill -9): real folders only (os.lstat; a link of that name is left, never
    followed), whose process is gone. Returns their paths."""
    removed = []
    for entry in os.listdir(model_root):
        found = _PARTIAL.fullmatch(entry)
        if not found or found["host"] != socket.gethostname() or _alive(int(found["pid"])):
            continue
        path = os.path.join(model_root, entry)
        try:
            if not stat.S_ISDIR(os.lstat(path).st_mode):
                continue
            shutil.rmtree(path)  # removes links inside it, never what they point to
        except FileNotFoundError:
            continue  # another export removed it
        removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def training_images(config, count: int, batch_size: int = 32) -> list:
    """The first `count` images of a run's training split, in file order and unaugmented, as
    NumPy batches: the sample the int8 file's activation ranges are calibrated on."""
    from fbat_tf import data

    split = data.load(
        config.dataset,
        "train",
        data_dir=config.data_dir,
        batch_size=min(batch_size, count),
        shuffle=False,
        augment=False,
        drop_remainder=False,
        max_examples=count,
        download=config.download,
    )
    return [x.numpy() for x, _ in split]


def export_keras_file(
    model_path: str,
    export_dir: str | None = None,
    name: str | None = None,
    version: int | None = None,
    trust_code: bool = False,
    formats: Sequence[str] = ("saved_model",),
) -> str:
    """Export a saved `.keras` classifier; returns the version path.

    Defaults: `export_dir` = `export/` next to the file, `name` = the file name without
    `.keras`. Its model card records the model only: a .keras file carries no training run, so
    the dataset, method and robustness figures are null, and no training images calibrate an
    int8 LiteRT file (only the float32 one is written). A file that holds code (a Python
    lambda, a TFSMLayer) is refused with fbat_tf.trust.UntrustedCodeError, before anything is
    written, unless `trust_code` (classifiers.load_keras_file).
    """
    from fbat_tf import (
        classifiers,
        models,  # noqa: F401  (registers the custom layers the file refers to)
    )

    if not model_path.endswith(".keras") or not os.path.isfile(model_path):
        raise FileNotFoundError(f"no .keras model file at {model_path}")
    artifacts.check_formats(formats)
    name = name if name is not None else os.path.basename(model_path)[: -len(".keras")]
    export_dir = export_dir or Run(os.path.dirname(os.path.abspath(model_path))).export_dir
    target, _ = versions.free_version_dir(export_dir, name, version)
    classifier = classifiers.load_keras_file(model_path, trust_code, compile=False)
    card = {
        "source": {
            "model_path": modelcard.relative_to_card(model_path, os.path.join(target, MODEL_CARD)),
            "weights_sha256": file_sha256(model_path),
        },
        "model": {"name": classifier.name},
        **dict.fromkeys(("dataset", "method", "eps", "training", "selection", "robustness")),
    }
    return export_model(classifier, export_dir, name, version, card, formats)


def model_card(workdir: str, card_file: str | None = None) -> dict[str, Any]:
    """What a training run's results.json says about its model, for assets.extra (at
    `card_file`, from which the run directory is named; absolute where None).

    Figures the run does not hold are null, never estimated: the test numbers before the run
    has finished, RA-AA until the run's final evaluation holds AutoAttack's, the training
    time if an epoch lacks its time.
    """
    run = Run(workdir)
    record = run.record()
    config = record.config
    return {
        "source": modelcard.source(workdir, run, record, card_file),
        "dataset": config.dataset,
        # Label k's name (null where the dataset's names are not kept: class indices only).
        "class_names": list(data.info(config.dataset).class_names) or None,
        # Where selection's validation examples came from: "test" means half the test split
        # was seen in selection, and evaluating on the test split leaves it out.
        "validation_from": config.validation_from,
        "model": {
            "name": config.model,
            "width": config.width,
            "activation": config.activation,
        },
        "method": (
            record.method or MethodRecord(config.method, config=config.method_options)
        ).to_dict(),
        "eps": modelcard.epsilon(config),
        "training": modelcard.training(record),
        "selection": modelcard.selection(record),
        "robustness": modelcard.robustness(record),
    }


def serving_contract(named: bool) -> dict[str, Any]:
    """SERVING_CONTRACT, with the `class_names` output where the export has one."""
    if not named:
        return SERVING_CONTRACT
    outputs = {**SERVING_CONTRACT["outputs"], "class_names": "string"}
    return {**SERVING_CONTRACT, "outputs": outputs}


def _class_names(card: Mapping[str, Any] | None, num_classes: int) -> tuple[str, ...]:
    try:
        names = ModelCard.from_dict(card or {}).class_names or ()
    except ValueError as error:
        raise ValueError(f"model card {error}") from None
    if names and len(names) != num_classes:
        raise ValueError(
            f"model card class_names has {len(names)} names for a classifier of "
            f"{num_classes} classes"
        )
    return tuple(names)


def software_versions() -> dict[str, str]:
    """Versions of what wrote the export: fbat-tf, TensorFlow, Keras, Python."""
    return {
        "fbat_tf": provenance.version() or "unknown",
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "python": platform.python_version(),
    }


def _write_model_card(path: str, card: Mapping[str, Any]) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)  # in the version folder export made
    with files.open_own(path, "w") as f:
        json.dump(finite_or_null(card), f, indent=2, allow_nan=False)
        f.write("\n")


def _make_dirs(path: str) -> list[str]:
    """os.makedirs that returns the folders it created, outermost first."""
    missing = []
    while path and not os.path.isdir(path):
        missing.append(path)
        path = os.path.dirname(path)
    for folder in reversed(missing):
        os.makedirs(folder, exist_ok=True)
    return list(reversed(missing))
