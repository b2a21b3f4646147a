"""Readers for datasets kept as local files, decoded into uint8 numpy arrays.

Formats, found by `find(format_name, directory)` in a directory or its usual subfolder:

- `cifar10`, `cifar100`: the CIFAR "python version", either the tarball
  (`cifar-10-python.tar.gz`, `cifar-100-python.tar.gz`, read without extracting) or its
  extracted folder (`cifar-10-batches-py/`, `cifar-100-python/`); CIFAR-100 uses fine labels.
- `idx`: MNIST-style IDX files (`train-images-idx3-ubyte.gz`, `train-labels-idx1-ubyte.gz`,
  `t10k-images-idx3-ubyte.gz`, `t10k-labels-idx1-ubyte.gz`, gzipped or not), as used by
  MNIST and Fashion-MNIST.
- `tiny_imagenet`: the `tiny-imagenet-200/` layout (wnids.txt, train/<wnid>/images/*.JPEG,
  val/images/*.JPEG + val/val_annotations.txt); its labelled val set is the test split. A
  folder the paper's released loader has prepared (val images moved to val/<wnid>/images/ and
  test/<wnid>/images/) reads the same, image for image.

    from fbat_tf.data import local

    found = local.find("idx", "/usr/share/datasets/fashion-mnist")
    if found is not None:
        images, labels = local.read(found, "train")   # uint8 [N, 28, 28, 1], int32 [N]

CIFAR batches are Python pickles, and a pickle can name any Python function to call while it
loads. They are unpickled admitting only what the official batches use: numpy's reconstruction of
arrays and dtypes, and dicts, lists, bytes, strings and numbers. Any other global (os.system, a
class, ...) is refused with `pickle.UnpicklingError` naming the file and the global, before
anything of it runs. A tarball is read member by member into memory and never extracted, so a
member named `../x` or `/x` writes nothing anywhere.
"""

from __future__ import annotations

import dataclasses
import gzip
import os
import pickle
import tarfile
import zlib
from typing import IO

import numpy as np


@dataclasses.dataclass(frozen=True)
class LocalFiles:
    """Where a dataset was found: its format, the file or folder, and a short description."""

    format_name: str
    path: str
    description: str


@dataclasses.dataclass(frozen=True)
class _Cifar:
    folder: str
    tarball: str
    train_files: tuple[str, ...]
    test_files: tuple[str, ...]
    label_key: str


_CIFAR = {
    "cifar10": _Cifar(
        folder="cifar-10-batches-py",
        tarball="cifar-10-python.tar.gz",
        train_files=tuple(f"data_batch_{i}" for i in range(1, 6)),
        test_files=("test_batch",),
        label_key="labels",
    ),
    "cifar100": _Cifar(
        folder="cifar-100-python",
        tarball="cifar-100-python.tar.gz",
        train_files=("train",),
        test_files=("test",),
        label_key="fine_labels",
    ),
}

_IDX_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}

_TINY_IMAGENET_FOLDER = "tiny-imagenet-200"

# What each format looks like on disk, for error messages.
DESCRIPTIONS = {
    "cifar10": "the CIFAR python tarball 'cifar-10-python.tar.gz' or its extracted folder "
    "'cifar-10-batches-py/'",
    "cifar100": "the CIFAR python tarball 'cifar-100-python.tar.gz' or its extracted folder "
    "'cifar-100-python/'",
    "idx": "the four IDX files 'train-images-idx3-ubyte.gz', 'train-labels-idx1-ubyte.gz', "
    "'t10k-images-idx3-ubyte.gz', 't10k-labels-idx1-ubyte.gz' (gzipped or not)",
    "tiny_imagenet": "the extracted 'tiny-imagenet-200/' folder (wnids.txt, "
    "train/<wnid>/images/*.JPEG, val/images/ and val/val_annotations.txt)",
}


def find(format_name: str, directory: str) -> LocalFiles | None:
    """The files of `format_name` in `directory`, or None; checks names only, decodes nothing."""
    if not os.path.isdir(directory):
        return None
    if format_name in _CIFAR:
        return _find_cifar(format_name, directory)
    if format_name == "idx":
        return _find_idx(directory)
    if format_name == "tiny_imagenet":
        return _find_tiny_imagenet(directory)
    raise ValueError(f"unknown local format {format_name!r}; known: {sorted(DESCRIPTIONS)}")


def read(found: LocalFiles, part: str, classes: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Decode the "train" or "test" part: uint8 images [N, H, W, C], int32 labels [N]. Every
    label must be a whole number, and with `classes`, one of 0 … classes − 1: ValueError naming
    the file otherwise."""
    if part not in ("train", "test"):
        raise ValueError(f"part must be 'train' or 'test', got {part!r}")
    if found.format_name in _CIFAR:
        return _read_cifar(found, part, classes)
    if found.format_name == "idx":
        return _read_idx_pair(found.path, part, classes)
    if found.format_name == "tiny_imagenet":
        return _read_tiny_imagenet(found.path, part)
    raise ValueError(f"unknown local format {found.format_name!r}")


def checked_labels(labels: np.ndarray, classes: int | None, source: str) -> np.ndarray:
    """`labels` as int32, each a whole number in 0 … classes − 1 (any whole number without
    `classes`); ValueError naming `source` and the first label that is not."""
    values = np.asarray(labels)
    if values.dtype.kind not in "iuf" or values.ndim != 1:
        raise ValueError(f"{source}: labels must be a list of class numbers, got {values.dtype}")
    if values.dtype.kind == "f":
        whole = np.isfinite(values) & (values == np.round(values))
        if not whole.all():
            at = int(np.flatnonzero(~whole)[0])
            raise ValueError(
                f"{source}: label {values[at]:g} (example {at}) is not a whole class number"
            )
    if classes is not None:
        outside = (values < 0) | (values >= classes)
        if outside.any():
            at = int(np.flatnonzero(outside)[0])
            raise ValueError(
                f"{source}: label {values[at]:g} (example {at}) is outside the dataset's "
                f"{classes} classes (0 to {classes - 1})"
            )
    return values.astype(np.int32)


# ---------------------------------------------------------------------------------------- CIFAR


def _find_cifar(format_name: str, directory: str) -> LocalFiles | None:
    spec = _CIFAR[format_name]
    folder = os.path.join(directory, spec.folder)
    if all(os.path.isfile(os.path.join(folder, f)) for f in spec.train_files + spec.test_files):
        return LocalFiles(format_name, folder, f"local CIFAR python folder {folder}")
    tarball = os.path.join(directory, spec.tarball)
    if os.path.isfile(tarball):
        return LocalFiles(format_name, tarball, f"local CIFAR python tarball {tarball}")
    return None


def _read_cifar(found: LocalFiles, part: str, classes: int | None) -> tuple[np.ndarray, np.ndarray]:
    spec = _CIFAR[found.format_name]
    wanted = spec.train_files if part == "train" else spec.test_files
    if os.path.isdir(found.path):
        batches = []
        for name in wanted:
            path = os.path.join(found.path, name)
            with open(path, "rb") as f:
                batches.append((load_cifar_batch(f, path), path))
    else:
        with tarfile.open(found.path, "r:gz") as tar:
            # Members sit under the folder name; match on the base name to allow any prefix.
            members = {os.path.basename(m.name): m for m in tar.getmembers() if m.isfile()}
            missing = [name for name in wanted if name not in members]
            if missing:
                raise ValueError(f"{found.path} lacks the CIFAR batch files {missing}")
            sources = [f"{found.path} (member {members[name].name})" for name in wanted]
            batches = [
                (load_cifar_batch(tar.extractfile(members[name]), source), source)
                for name, source in zip(wanted, sources, strict=True)
            ]
    images, labels = [], []
    for batch, source in batches:
        images.append(_cifar_pixels(_cifar_field(batch, "data", source), source))
        labels.append(checked_labels(_cifar_field(batch, spec.label_key, source), classes, source))
        if len(images[-1]) != len(labels[-1]):
            raise ValueError(
                f"{source}: {len(images[-1])} CIFAR images but {len(labels[-1])} labels"
            )
    images, labels = np.concatenate(images), np.concatenate(labels)
    # Each row is 3072 bytes: the 32x32 red plane, then green, then blue.
    images = images.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    return np.ascontiguousarray(images), labels


def _cifar_pixels(images: np.ndarray, path: str) -> np.ndarray:
    """The batch's pixels as uint8, or ValueError naming what they are instead: CIFAR stores
    bytes 0-255, so floats (a normalized copy), values outside 0-255 or a row that is not
    3072 values would be cast silently into other images."""
    where = f"{path}: CIFAR pixels"
    if images.ndim != 2 or images.shape[1] != 3 * 32 * 32:
        raise ValueError(f"{where} must be rows of 3072 values, got shape {images.shape}")
    if images.dtype == np.uint8:
        return images
    if not np.issubdtype(images.dtype, np.integer):
        low, high = (float(np.nanmin(images)), float(np.nanmax(images))) if images.size else (0, 0)
        raise ValueError(
            f"{where} are {images.dtype} (from {low:g} to {high:g}), not bytes 0-255; "
            "fbat-tf reads the official CIFAR python files, whose pixels are uint8"
        )
    if images.size and (images.min() < 0 or images.max() > 255):
        raise ValueError(
            f"{where} run from {images.min()} to {images.max()}, outside the bytes 0-255"
        )
    return images.astype(np.uint8)


# The only Python globals a CIFAR batch may name, as (module, name) the way pickles spell them.
# The official batches (pickled by Python 2 with numpy 1.x) name numpy's array reconstruction
# under numpy.core, numpy.ndarray and numpy.dtype; copies pickled again by numpy 2.x name
# numpy._core, by pickle protocol 5 numpy's _frombuffer, and numpy scalars (e.g. a list of
# np.int64 labels) name scalar. Python 3 writes bytes in protocols 0-2 as _codecs.encode(text,
# "latin1"), or bytes() when empty. None of these runs anything but numpy's and Python's own
# constructors of data.
_CIFAR_GLOBALS = frozenset(
    [
        *((f"numpy.{core}.multiarray", "_reconstruct") for core in ("core", "_core")),
        *((f"numpy.{core}.multiarray", "scalar") for core in ("core", "_core")),
        *((f"numpy.{core}.numeric", "_frombuffer") for core in ("core", "_core")),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("_codecs", "encode"),
        ("__builtin__", "bytes"),
        ("builtins", "bytes"),
    ]
)


class _CifarUnpickler(pickle.Unpickler):
    """An unpickler that finds only the globals in _CIFAR_GLOBALS, and encodes only latin1."""

    def __init__(self, file: IO[bytes], source: str):
        # Python 2's str (every key and file name in the official batches) loads as bytes.
        super().__init__(file, encoding="bytes")
        self.source = source

    def find_class(self, module: str, name: str):
        if (module, name) not in _CIFAR_GLOBALS:
            raise pickle.UnpicklingError(
                f"refusing to load {self.source}: it asks for the Python global {module}.{name}, "
                "which a CIFAR batch never holds; fbat-tf unpickles from a CIFAR batch only "
                "dicts, lists, bytes, strings, numbers and numpy arrays, since any other global "
                "can run code. Use the official CIFAR python files."
            )
        if (module, name) == ("_codecs", "encode"):
            return self._latin1
        return super().find_class(module, name)

    def _latin1(self, text: str, encoding: str = "utf-8") -> bytes:
        # What Python 3 pickles bytes as (protocols 0-2); other codecs are not data.
        if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
            raise pickle.UnpicklingError(
                f"refusing to load {self.source}: it asks for _codecs.encode of a "
                f"{type(text).__name__} with the codec {encoding!r}; a CIFAR batch stores bytes "
                "as latin1 text only"
            )
        return text.encode("latin1")


def load_cifar_batch(file: IO[bytes], source: str) -> dict:
    """Unpickle one CIFAR python batch from `file`, admitting only the globals such a batch
    uses (numpy arrays, dtypes and scalars, and bytes); anything else raises
    pickle.UnpicklingError naming `source` (the file, for messages) and the global, before it
    runs."""
    batch = _CifarUnpickler(file, source).load()
    if not isinstance(batch, dict):
        raise ValueError(f"{source} is not a CIFAR batch: it holds a {type(batch).__name__}")
    return batch


def _cifar_field(batch: dict, key: str, path: str) -> np.ndarray:
    # The official pickles (Python 2) have bytes keys; accept str keys from re-pickled copies.
    for candidate in (key.encode(), key):
        if candidate in batch:
            return np.asarray(batch[candidate])
    raise ValueError(f"CIFAR batch in {path} has no {key!r} entry (keys: {list(batch)})")


# ------------------------------------------------------------------------------------------ IDX


def _idx_file(directory: str, stem: str) -> str | None:
    for name in (stem + ".gz", stem):
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            return path
    return None


def _find_idx(directory: str) -> LocalFiles | None:
    stems = [stem for pair in _IDX_FILES.values() for stem in pair]
    if all(_idx_file(directory, stem) for stem in stems):
        return LocalFiles("idx", directory, f"local IDX files in {directory}")
    return None


def read_idx(path: str) -> np.ndarray:
    """Decode one IDX file (gzipped if it ends in .gz) of unsigned bytes into a numpy array."""
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except (EOFError, gzip.BadGzipFile, zlib.error) as error:  # truncated or not gzip
        raise ValueError(f"{path} cannot be read whole ({error}): fetch it again") from None
    # Header: two zero bytes, a type code (0x08 = unsigned byte), the number of dimensions,
    # then each dimension as a big-endian uint32.
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise ValueError(f"{path} is not an IDX file of unsigned bytes")
    ndim = raw[3]
    dims = tuple(int(d) for d in np.frombuffer(raw, ">u4", count=ndim, offset=4))
    data = np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(dims)):
        raise ValueError(f"{path}: header says {dims} but holds {data.size} values")
    return data.reshape(dims)


def _read_idx_pair(directory: str, part: str, classes: int | None) -> tuple[np.ndarray, np.ndarray]:
    images_stem, labels_stem = _IDX_FILES[part]
    images = read_idx(_idx_file(directory, images_stem))
    labels_path = _idx_file(directory, labels_stem)
    labels = read_idx(labels_path)
    if images.ndim != 3 or len(images) != len(labels):
        raise ValueError(f"IDX files in {directory}: images {images.shape}, labels {labels.shape}")
    return images[..., np.newaxis], checked_labels(labels, classes, labels_path)


# ---------------------------------------------------------------------------------- Tiny-ImageNet


def _find_tiny_imagenet(directory: str) -> LocalFiles | None:
    for folder in (os.path.join(directory, _TINY_IMAGENET_FOLDER), directory):
        required = ["wnids.txt", "train", os.path.join("val", "val_annotations.txt")]
        if all(os.path.exists(os.path.join(folder, r)) for r in required):
            return LocalFiles("tiny_imagenet", folder, f"local Tiny-ImageNet folder {folder}")
    return None


def tiny_imagenet_files(folder: str, part: str) -> tuple[list[str], np.ndarray]:
    """Image paths and labels of a `tiny-imagenet-200/` folder in this project's file order.

    Labels index the sorted wnids (what torchvision's ImageFolder does, so class ids match
    PyTorch code). The train files are listed round-robin over classes (image 0 of every class,
    then image 1, ...) because the validation cut takes the last 10% in file order: a class-
    sorted list would put only the last 20 classes in validation. The test part ("val" on
    disk) follows the lines of val_annotations.txt.
    """
    with open(os.path.join(folder, "wnids.txt")) as f:
        wnids = sorted(line.strip() for line in f if line.strip())
    index = {wnid: i for i, wnid in enumerate(wnids)}
    if part == "test":
        paths, labels = [], []
        with open(os.path.join(folder, "val", "val_annotations.txt")) as f:
            for line in f:
                fields = line.split("\t")
                if len(fields) >= 2:
                    wnid = fields[1].strip()
                    paths.append(_val_image(folder, fields[0], wnid))
                    labels.append(index[wnid])
        return paths, np.asarray(labels, np.int32)
    per_class = []
    for wnid in wnids:
        images_dir = os.path.join(folder, "train", wnid, "images")
        names = sorted(os.listdir(images_dir), key=_natural_key)
        per_class.append([os.path.join(images_dir, n) for n in names])
    paths, labels = [], []
    for rank in range(max(len(files) for files in per_class)):
        for label, files in enumerate(per_class):
            if rank < len(files):
                paths.append(files[rank])
                labels.append(label)
    return paths, np.asarray(labels, np.int32)


def _val_image(folder: str, name: str, wnid: str) -> str:
    """Where a labelled val image is: val/images/ as downloaded, or, in a folder the paper's
    released loader has prepared, val/<wnid>/images/ (25 a class) or test/<wnid>/images/ (the
    rest; the unlabelled test set was renamed test_original/)."""
    candidates = [
        os.path.join(folder, "val", "images", name),
        os.path.join(folder, "val", wnid, "images", name),
        os.path.join(folder, "test", wnid, "images", name),
    ]
    for path in candidates:
        if os.path.exists(path):
            return path
    raise ValueError(
        f"Tiny-ImageNet folder {folder}: val image {name} (class {wnid}) is in none of "
        "val/images/, val/<class>/images/ or test/<class>/images/"
    )


def _natural_key(name: str) -> tuple:
    # "n01443537_10.JPEG" after "n01443537_9.JPEG": compare the number as a number.
    stem = os.path.splitext(name)[0]
    prefix, _, number = stem.rpartition("_")
    return (prefix, int(number)) if number.isdigit() else (stem, -1)


def _read_tiny_imagenet(folder: str, part: str) -> tuple[np.ndarray, np.ndarray]:
    # Loaded here alone: finding local files (`find`, as `check_available` does) and reading
    # the other formats need no TensorFlow.
    import tensorflow as tf

    paths, labels = tiny_imagenet_files(folder, part)

    def decode(path: tf.Tensor) -> tf.Tensor:
        # channels=3: a few Tiny-ImageNet JPEGs are grayscale.
        image = tf.io.decode_jpeg(tf.io.read_file(path), channels=3)
        return tf.ensure_shape(image, [64, 64, 3])

    # Decoding ~100k JPEGs is the slow part; tf.data spreads it over all cores, in order.
    decoded = (
        tf.data.Dataset.from_tensor_slices(paths)
        .map(decode, num_parallel_calls=tf.data.AUTOTUNE)
        .batch(1024)
    )
    if not paths:
        raise ValueError(f"no {part} images found in Tiny-ImageNet folder {folder}")
    images = np.concatenate(list(decoded.as_numpy_iterator()))
    return images, labels
