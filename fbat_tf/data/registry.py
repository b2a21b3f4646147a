"""The datasets by name: static facts (`DatasetInfo`) and where each one's data can be found.

One `Entry` per dataset in `_REGISTRY`: its `DatasetInfo`, its TFDS name, its local file format
(read by `local.py`) with the folders searched for it, its augmentation, and whether it is held
in memory. Adding a dataset is one `Entry` here (and a reader in `local.py` for a new local file
format); `fbat_tf.catalog.DATASETS` lists the same names without importing TensorFlow.
"""

from __future__ import annotations

import dataclasses
import os

from fbat_tf.data import class_names

_KERAS_CACHE = os.path.join("~", ".keras", "datasets")
_FASHION_MNIST_DEBIAN = "/usr/share/datasets/fashion-mnist"


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
    # names[k] is label k's name; empty where only indices are kept (class_names.py says why)
    class_names: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Entry:
    """Everything the package knows about one dataset (internal: `info` is the public part)."""

    info: DatasetInfo
    tfds_name: str | None  # None: local files only
    tfds_test_split: str = "test"
    local_format: str | None = None  # a format of local.find
    local_subdirs: tuple[str, ...] = ()  # subfolders of a data dir that may hold the files
    default_dirs: tuple[str, ...] = (_KERAS_CACHE,)  # searched when no data_dir is given
    # its training augmentation: the name of a function of augment.py, which the loader imports
    # (TensorFlow) when it reads the data, so that looking a dataset up loads no TensorFlow
    augmentation: str | None = None
    in_memory: bool = True  # False: streamed and decoded per example (ImageNet)
    # TFDS prepares it only from archives fetched by hand (ImageNet), never downloads it
    tfds_manual: bool = False


_CIFAR10_STATS = ((0.4914, 0.4822, 0.4465), (0.2471, 0.2435, 0.2616))
_CIFAR100_STATS = ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762))
_SVHN_STATS = ((0.4377, 0.4438, 0.4728), (0.198, 0.201, 0.197))
_IMAGENET_STATS = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))

_REGISTRY: dict[str, Entry] = {
    entry.info.name: entry
    for entry in [
        Entry(
            DatasetInfo(
                "cifar10", 10, (32, 32, 3), *_CIFAR10_STATS, 50_000, 10_000, class_names.CIFAR10
            ),
            tfds_name="cifar10",
            local_format="cifar10",
            augmentation="pad_crop_flip",
        ),
        Entry(
            DatasetInfo(
                "cifar100", 100, (32, 32, 3), *_CIFAR100_STATS, 50_000, 10_000, class_names.CIFAR100
            ),
            tfds_name="cifar100",
            local_format="cifar100",
            augmentation="pad_crop_flip_rotate",
        ),
        Entry(
            DatasetInfo("svhn", 10, (32, 32, 3), *_SVHN_STATS, 73_257, 26_032, class_names.DIGITS),
            tfds_name="svhn_cropped",
        ),
        Entry(
            DatasetInfo("tiny_imagenet", 200, (64, 64, 3), *_IMAGENET_STATS, 100_000, 10_000),
            tfds_name=None,
            local_format="tiny_imagenet",
            augmentation="pad_crop_flip",
        ),
        Entry(
            DatasetInfo("imagenet", 1000, (224, 224, 3), *_IMAGENET_STATS, 1_281_167, 50_000),
            tfds_name="imagenet2012",
            tfds_test_split="validation",
            in_memory=False,
            tfds_manual=True,
        ),
        Entry(
            DatasetInfo(
                "mnist", 10, (28, 28, 1), (0.1307,), (0.3081,), 60_000, 10_000, class_names.DIGITS
            ),
            tfds_name="mnist",
            local_format="idx",
            local_subdirs=("mnist",),
            default_dirs=(os.path.join(_KERAS_CACHE, "mnist"),),
        ),
        Entry(
            DatasetInfo(
                "fashion_mnist",
                10,
                (28, 28, 1),
                (0.2860,),
                (0.3530,),
                60_000,
                10_000,
                class_names.FASHION_MNIST,
            ),
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
    return lookup(name).info


def lookup(name: str) -> Entry:
    """The entry of `name`; ValueError, listing the valid names, for an unknown one."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown dataset {name!r}; valid names: {names()}")
    return _REGISTRY[name]
