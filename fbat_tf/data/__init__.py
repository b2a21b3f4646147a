"""Datasets by name: static facts, where the data comes from, augmentation and splits.

    from fbat_tf import data

    data.names()                              # ['cifar10', 'cifar100', 'svhn', ...]
    data.info("cifar10").mean                 # (0.4914, 0.4822, 0.4465), for the model's
                                              # normalization layer
    data.check_available("cifar10", "/data")  # 'local CIFAR python tarball /data/...' or raises
    train = data.load("cifar10", "train", data_dir="/data", batch_size=128, seed=0)
    val = data.load("cifar10", "validation", data_dir="/data", batch_size=256)
    test = data.load("cifar10", "test", data_dir="/data", max_examples=1000)

`load` yields (images, labels): float32 NHWC in [0, 1] and int32 [batch]. Splits:
"train" is the first 90% of the training split and "validation" the last 10%, in file order;
"train_full" is all of it; "test" is the test split (Tiny-ImageNet's labelled val set,
ImageNet's validation set). Training splits are shuffled, augmented and drop the last partial
batch unless told otherwise; evaluation splits are in file order, so "the first N test
examples" (`max_examples=N`) means the same N everywhere.

Where the data comes from, first match wins (`check_available` says which, without decoding):
1. local files in `data_dir` (or, with no `data_dir`, in ~/.keras/datasets and, for
   Fashion-MNIST, /usr/share/datasets/fashion-mnist from Debian's dataset-fashion-mnist);
   formats in `fbat_tf.data.local`;
2. TFDS data already prepared in `data_dir` (or TFDS's default data dir);
3. TFDS inside `tfds.testing.mock_data` (tests);
4. a TFDS download, if `download` and the machine is online (ImageNet: from hand-downloaded
   archives only). Otherwise `DatasetNotFoundError`, at once, saying where it looked.

Everything but ImageNet is decoded once per process into memory (uint8) and batched from there.

Adding a dataset: one `_Entry` in `_REGISTRY` below (and a reader in `local.py` for a new
local file format).
"""

from __future__ import annotations

import collections
import dataclasses
import os
from types import ModuleType

import numpy as np
import tensorflow as tf

from fbat_tf.data import augment as augment_lib
from fbat_tf.data import local, pipeline

__all__ = ["DatasetInfo", "DatasetNotFoundError", "check_available", "info", "load", "names"]

SPLITS = ("train", "validation", "train_full", "test")
# The validation split is the last 1/_VALIDATION_DIVISOR of the training split.
_VALIDATION_DIVISOR = 10
_KERAS_CACHE = os.path.join("~", ".keras", "datasets")
_FASHION_MNIST_DEBIAN = "/usr/share/datasets/fashion-mnist"
_TINY_IMAGENET_URL = "http://cs231n.stanford.edu/tiny-imagenet-200.zip"


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    """Static facts about a dataset; `info(name)` returns one without touching the disk."""

    name: str  # registry name
    num_classes: int
    image_shape: tuple[int, int, int]  # H, W, C of what load() yields
    mean: tuple[float, ...]  # per-channel mean of the training pixels in [0, 1]
    std: tuple[float, ...]  # per-channel std
    train_examples: int  # size of the full training split (before the validation cut)
    test_examples: int  # size of the test split ("test" in load())


class DatasetNotFoundError(FileNotFoundError):
    """No local files, no prepared TFDS data, and no download possible; says where it looked."""


@dataclasses.dataclass(frozen=True)
class _Entry:
    info: DatasetInfo
    tfds_name: str | None  # None: local files only
    tfds_test_split: str = "test"
    local_format: str | None = None  # a format of local.find
    local_subdirs: tuple[str, ...] = ()  # subfolders of a data dir that may hold the files
    default_dirs: tuple[str, ...] = (_KERAS_CACHE,)  # searched when no data_dir is given
    augment_fn: augment_lib.AugmentFn | None = None
    in_memory: bool = True  # False: streamed and decoded per example (ImageNet)


_CIFAR10_STATS = ((0.4914, 0.4822, 0.4465), (0.2471, 0.2435, 0.2616))
_CIFAR100_STATS = ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762))
_IMAGENET_STATS = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))

_REGISTRY: dict[str, _Entry] = {
    entry.info.name: entry
    for entry in [
        _Entry(
            DatasetInfo("cifar10", 10, (32, 32, 3), *_CIFAR10_STATS, 50_000, 10_000),
            tfds_name="cifar10",
            local_format="cifar10",
            augment_fn=augment_lib.pad_crop_flip,
        ),
        _Entry(
            DatasetInfo("cifar100", 100, (32, 32, 3), *_CIFAR100_STATS, 50_000, 10_000),
            tfds_name="cifar100",
            local_format="cifar100",
            augment_fn=augment_lib.pad_crop_flip_rotate,
        ),
        _Entry(
            DatasetInfo(
                "svhn",
                10,
                (32, 32, 3),
                (0.4377, 0.4438, 0.4728),
                (0.198, 0.201, 0.197),
                73_257,
                26_032,
            ),
            tfds_name="svhn_cropped",
        ),
        _Entry(
            DatasetInfo("tiny_imagenet", 200, (64, 64, 3), *_IMAGENET_STATS, 100_000, 10_000),
            tfds_name=None,
            local_format="tiny_imagenet",
            augment_fn=augment_lib.pad_crop_flip,
        ),
        _Entry(
            DatasetInfo("imagenet", 1000, (224, 224, 3), *_IMAGENET_STATS, 1_281_167, 50_000),
            tfds_name="imagenet2012",
            tfds_test_split="validation",
            in_memory=False,
        ),
        _Entry(
            DatasetInfo("mnist", 10, (28, 28, 1), (0.1307,), (0.3081,), 60_000, 10_000),
            tfds_name="mnist",
            local_format="idx",
            local_subdirs=("mnist",),
            default_dirs=(os.path.join(_KERAS_CACHE, "mnist"),),
        ),
        _Entry(
            DatasetInfo("fashion_mnist", 10, (28, 28, 1), (0.2860,), (0.3530,), 60_000, 10_000),
            tfds_name="fashion_mnist",
            local_format="idx",
            local_subdirs=("fashion-mnist", "fashion_mnist"),
            # Keras caches Fashion-MNIST as IDX files in its own subfolder.
            default_dirs=(os.path.join(_KERAS_CACHE, "fashion-mnist"), _FASHION_MNIST_DEBIAN),
        ),
    ]
}


def names() -> list[str]:
    """Registry names, in registry order."""
    return list(_REGISTRY)


def info(name: str) -> DatasetInfo:
    """Static facts about `name` (no I/O); ValueError for an unknown name."""
    return _entry(name).info


def check_available(name: str, data_dir: str | None = None, download: bool = True) -> str:
    """Describe the source `load` will use, cheaply (no decoding), or raise DatasetNotFoundError.

    With `download=True` and nothing on disk, this opens one TCP connection (a few seconds at
    most) to tell whether a TFDS download can work; pass `download=False` to stay offline.
    """
    return _resolve(_entry(name), data_dir, download).description


def load(
    name: str,
    split: str,
    *,
    data_dir: str | None = None,
    batch_size: int = 128,
    shuffle: bool | None = None,
    augment: bool | None = None,
    seed: int = 0,
    max_examples: int | None = None,
    drop_remainder: bool | None = None,
    repeat: bool = False,
    start_batch: int = 0,
    download: bool = True,
) -> tf.data.Dataset:
    """Batches of (float32 NHWC images in [0, 1], int32 labels) of one split, prefetched.

    `shuffle`, `augment` and `drop_remainder` default to True for "train"/"train_full" and to
    False otherwise. `max_examples` keeps the first N examples of the split (after the 90/10
    cut, before shuffling). `seed` fixes the shuffle order and the augmentation; successive
    passes over the returned dataset differ from each other, identically on every run.
    `repeat=True` gives the endless stream of passes 0, 1, 2, ... (each of
    `len(split) // batch_size` batches when dropping the remainder), pass p shuffled and
    augmented from (seed, p) alone; `start_batch=n` starts that stream at its n-th batch, which
    is how a resumed run reads on exactly where it stopped. Datasets without augmentation
    (SVHN, MNIST, Fashion-MNIST) ignore `augment`.
    """
    entry = _entry(name)
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r} for {name!r}; valid splits: {list(SPLITS)}")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    if max_examples is not None and (not isinstance(max_examples, int) or max_examples < 1):
        raise ValueError(f"max_examples must be a positive integer or None, got {max_examples!r}")
    if not isinstance(start_batch, int) or start_batch < 0:
        raise ValueError(f"start_batch must be a non-negative integer, got {start_batch!r}")
    training = split in ("train", "train_full")
    shuffle = training if shuffle is None else shuffle
    augment = training if augment is None else augment
    drop_remainder = training if drop_remainder is None else drop_remainder

    source = _resolve(entry, data_dir, download)
    if source.needs_download:
        _download(entry, source, data_dir)
    options = dict(
        batch_size=batch_size,
        shuffle=shuffle,
        seed=seed,
        drop_remainder=drop_remainder,
        repeat=repeat,
        start_batch=start_batch,
    )
    if not entry.in_memory:
        return _load_streamed(entry, source, split, max_examples, augment=augment, **options)

    images, labels = _arrays(entry, source, "test" if split == "test" else "train")
    start, stop = split_range(len(labels), split, max_examples)
    images, labels = images[start:stop], labels[start:stop]
    if images.shape[1:] != entry.info.image_shape:
        raise ValueError(
            f"{source.description} holds images of shape {images.shape[1:]}, "
            f"but {entry.info.name} images are {entry.info.image_shape}"
        )
    _check_batchable(entry.info.name, split, stop - start, batch_size, drop_remainder)
    return pipeline.from_arrays(
        images, labels, augment_fn=entry.augment_fn if augment else None, **options
    )


def split_range(count: int, split: str, max_examples: int | None = None) -> tuple[int, int]:
    """[start, stop) of `split` within its source split of `count` examples.

    "train" and "validation" cut the training split at count - count // 10; "train_full" and
    "test" take all of their split. `max_examples` then keeps the first N of the range.
    """
    cut = count - count // _VALIDATION_DIVISOR
    start, stop = {
        "train": (0, cut),
        "validation": (cut, count),
        "train_full": (0, count),
        "test": (0, count),
    }[split]
    if max_examples is not None:
        stop = min(stop, start + max_examples)
    return start, stop


# ------------------------------------------------------------------------------- internals


def _entry(name: str) -> _Entry:
    if name not in _REGISTRY:
        raise ValueError(f"unknown dataset {name!r}; valid names: {names()}")
    return _REGISTRY[name]


def _tfds_source() -> ModuleType:
    # Imported on first use: importing TFDS takes seconds, and local-file datasets never need it.
    from fbat_tf.data import tfds_source

    return tfds_source


@dataclasses.dataclass(frozen=True)
class _Source:
    description: str
    local_files: local.LocalFiles | None = None
    builder: object | None = None  # tfds.core.DatasetBuilder
    mocked: bool = False
    needs_download: bool = False


def _local_dirs(entry: _Entry, data_dir: str | None) -> list[str]:
    roots = [data_dir] if data_dir else list(entry.default_dirs)
    dirs = []
    for root in roots:
        root = os.path.expanduser(root)
        dirs.extend(os.path.join(root, sub) for sub in entry.local_subdirs)
        dirs.append(root)
    return dirs


def _resolve(entry: _Entry, data_dir: str | None, download: bool) -> _Source:
    name, tfds_name = entry.info.name, entry.tfds_name
    searched = _local_dirs(entry, data_dir) if entry.local_format else []
    for directory in searched:
        found = local.find(entry.local_format, directory)
        if found is not None:
            return _Source(found.description, local_files=found)
    if tfds_name is None:
        raise DatasetNotFoundError(
            _not_found_message(entry, searched, None, f"{name} has no TFDS version.")
        )

    tfds_source = _tfds_source()
    data_dir = os.path.expanduser(data_dir) if data_dir else None
    builder = tfds_source.builder(tfds_name, data_dir)
    # Mocked first: a mock can also make a builder look prepared (MockPolicy.USE_FILES), and
    # its examples must never land in the decoded-array cache.
    if tfds_source.is_mocked():
        return _Source(f"TFDS {tfds_name} (tfds.testing.mock_data)", builder=builder, mocked=True)
    prepared_path = tfds_source.prepared_path(builder)
    if tfds_source.is_prepared(builder):
        return _Source(f"TFDS {tfds_name} in {prepared_path}", builder=builder)
    if tfds_source.needs_manual_download(builder):
        manual_dir = tfds_source.manual_dir(builder)
        if download and tfds_source.has_manual_files(builder):
            return _Source(
                f"TFDS {tfds_name}, to be prepared in {prepared_path} from {manual_dir}",
                builder=builder,
                needs_download=True,
            )
        reason = (
            "Downloading is disabled (download=False)."
            if not download
            else f"TFDS cannot download {tfds_name}: its archives must be fetched by hand "
            f"into {manual_dir} (see below)."
        )
        raise DatasetNotFoundError(_not_found_message(entry, searched, builder, reason))
    if not download:
        reason = "Downloading is disabled (download=False)."
        raise DatasetNotFoundError(_not_found_message(entry, searched, builder, reason))
    if not tfds_source.internet_reachable():
        reason = "No internet connection, so TFDS cannot download it here."
        raise DatasetNotFoundError(_not_found_message(entry, searched, builder, reason))
    return _Source(
        f"TFDS {tfds_name}, to be downloaded and prepared in {prepared_path}",
        builder=builder,
        needs_download=True,
    )


def _not_found_message(
    entry: _Entry, searched: list[str], builder: object | None, reason: str
) -> str:
    name, tfds_name = entry.info.name, entry.tfds_name
    lines = [f"Dataset {name!r} not found."]
    if searched:
        lines.append(f"  Looked for local files in: {', '.join(searched)}")
    if builder is not None:
        prepared_path = _tfds_source().prepared_path(builder)
        lines.append(f"  Looked for prepared TFDS data ({tfds_name}) in: {prepared_path}")
    lines.append(f"  {reason}")
    accepted = []
    if entry.local_format:
        accepted.append(local.DESCRIPTIONS[entry.local_format])
    if tfds_name:
        accepted.append(f"a TFDS data dir in which {tfds_name} is prepared")
    lines.append(f"Pass --data_dir=DIR where DIR holds {'; or '.join(accepted)}.")
    if tfds_name is None:
        lines.append(f"{name} is local only: download {_TINY_IMAGENET_URL} and unzip it in DIR.")
    elif builder is not None and _tfds_source().needs_manual_download(builder):
        lines.append(
            f"TFDS prepares {tfds_name} from ILSVRC2012_img_train.tar and ILSVRC2012_img_val.tar "
            f"(from image-net.org) placed in {_tfds_source().manual_dir(builder)}."
        )
    else:
        lines.append(
            f"On a machine with internet TFDS downloads and prepares it, e.g. "
            f'python -c "import tensorflow_datasets as tfds; '
            f"tfds.builder('{tfds_name}', data_dir='DIR').download_and_prepare()\"; "
            f"then copy DIR here."
        )
    return "\n".join(lines)


def _download(entry: _Entry, source: _Source, data_dir: str | None) -> None:
    try:
        _tfds_source().download_and_prepare(source.builder)
    except OSError as err:  # ConnectionError, requests' errors and disk errors are OSErrors
        reason = f"Download of {entry.tfds_name} failed: {err}"
        searched = _local_dirs(entry, data_dir) if entry.local_format else []
        message = _not_found_message(entry, searched, source.builder, reason)
        raise DatasetNotFoundError(message) from err


# Decoded splits, so that "train" and "validation" in one process decode the files once.
# A few entries at most: each holds a whole split (CIFAR: 150 MB, Tiny-ImageNet: 1.2 GB).
_ARRAY_CACHE: collections.OrderedDict[tuple, tuple[np.ndarray, np.ndarray]] = (
    collections.OrderedDict()
)
_ARRAY_CACHE_SIZE = 4


def _arrays(entry: _Entry, source: _Source, part: str) -> tuple[np.ndarray, np.ndarray]:
    def read() -> tuple[np.ndarray, np.ndarray]:
        if source.local_files is not None:
            return local.read(source.local_files, part)
        tfds_split = entry.tfds_test_split if part == "test" else "train"
        return _tfds_source().read_arrays(source.builder, tfds_split)

    if source.mocked:  # mock data depends on the mock's arguments: never reuse it
        return read()
    if source.local_files is not None:
        key = ("local", source.local_files.format_name, source.local_files.path, part)
    else:
        key = ("tfds", entry.tfds_name, _tfds_source().prepared_path(source.builder), part)
    if key not in _ARRAY_CACHE:
        images, labels = read()
        images.flags.writeable = False
        labels.flags.writeable = False
        _ARRAY_CACHE[key] = (images, labels)
        while len(_ARRAY_CACHE) > _ARRAY_CACHE_SIZE:
            _ARRAY_CACHE.popitem(last=False)
    _ARRAY_CACHE.move_to_end(key)
    return _ARRAY_CACHE[key]


def _check_batchable(
    name: str, split: str, count: int, batch_size: int, drop_remainder: bool
) -> None:
    if count == 0:
        raise ValueError(f"split {split!r} of {name!r} is empty")
    if drop_remainder and count < batch_size:
        raise ValueError(
            f"split {split!r} of {name!r} has {count} examples, fewer than batch_size "
            f"{batch_size}: with drop_remainder=True it would yield no batch"
        )


def _load_streamed(
    entry: _Entry,
    source: _Source,
    split: str,
    max_examples: int | None,
    *,
    batch_size: int,
    shuffle: bool,
    augment: bool,
    seed: int,
    drop_remainder: bool,
    repeat: bool,
    start_batch: int,
) -> tf.data.Dataset:
    tfds_source = _tfds_source()
    tfds_split = entry.tfds_test_split if split == "test" else "train"
    count = tfds_source.num_examples(source.builder, tfds_split)
    batches_per_pass = None
    if count is None:
        # Mocked TFDS knows no split sizes (and ignores slices); the fake data stands in.
        split_spec = {"train": "train[:90%]", "validation": "train[90%:]"}.get(split, tfds_split)
    else:
        start, stop = split_range(count, split, max_examples)
        _check_batchable(entry.info.name, split, stop - start, batch_size, drop_remainder)
        split_spec = f"{tfds_split}[{start}:{stop}]"
        batches_per_pass = (stop - start) // batch_size
        if not drop_remainder:
            batches_per_pass = -(-(stop - start) // batch_size)
    examples = tfds_source.read_encoded(
        source.builder, split_spec, shuffle_files=shuffle, seed=seed
    )
    if max_examples is not None:
        examples = examples.take(max_examples)  # a no-op unless mocked
    return pipeline.from_encoded(
        examples,
        train_view=augment_lib.imagenet_train_crop,
        eval_view=augment_lib.imagenet_eval_crop,
        batch_size=batch_size,
        shuffle=shuffle,
        augment=augment,
        seed=seed,
        drop_remainder=drop_remainder,
        repeat=repeat,
        start_batch=start_batch,
        batches_per_pass=batches_per_pass,
    )
