"""Datasets by name: static facts, where the data comes from, augmentation and splits.

    from fbat_tf import data

    data.names()                              # ['cifar10', 'cifar100', 'svhn', ...]
    data.info("cifar10").mean                 # (0.4914, 0.4822, 0.4465), for the model's
                                              # normalization layer
    data.check_available("cifar10", "/data")  # 'local CIFAR python tarball /data/...' or raises
    data.needs_tensorflow("cifar10", "/data") # False: local files found, TFDS not asked
    train = data.load("cifar10", "train", data_dir="/data", batch_size=128, seed=0)
    val = data.load("cifar10", "validation", data_dir="/data", batch_size=256)
    test = data.load("cifar10", "test", data_dir="/data", max_examples=1000)

`load` yields (images, labels): float32 NHWC in [0, 1] and int32 [batch]. Splits:
"train" is the first 90% of the training split and "validation" the last 10%, in file order;
"train_full" is all of it; "test" is the test split (Tiny-ImageNet's labelled val set,
ImageNet's validation set). `validation_from="test"` draws validation from the test split
instead, as the paper's released code does for Tiny-ImageNet: training gets the whole training
split, and the test split is halved class by class by a fixed seed (`held_out`). Training splits are
shuffled, augmented and drop the last partial batch unless told otherwise; evaluation splits
are in file order, so "the first N test examples" (`max_examples=N`) means the same N
everywhere.

Where the data comes from, first match wins (`check_available` says which, without decoding):
1. local files in `data_dir` (or, with no `data_dir`, in ~/.keras/datasets and, for
   Fashion-MNIST, /usr/share/datasets/fashion-mnist from Debian's dataset-fashion-mnist);
   formats in `fbat_tf.data.local`;
2. TFDS data already prepared in `data_dir` (or TFDS's default data dir);
3. a TFDS download, if `download` and the machine is online (ImageNet: from hand-downloaded
   archives only). Otherwise `DatasetNotFoundError`, at once, saying where it looked.

TFDS is read through a `tfds_source.TFDSSource`; `use_tfds_source(source)` reads it through
another one inside a block (e.g. one that treats the builders of `tfds.testing.mock_data` as
prepared).

Everything but ImageNet is decoded once per process into memory (uint8) and batched from there.

Importing the package loads no TensorFlow, and neither do `names`, `info`, `check_available` and
`check_local_files` where local files are found: `load` and the splits' names come from `loader`
on first use, and TFDS is imported when it is asked.

Modules: `registry` (the datasets and their static facts; adding a dataset is one entry there,
and a reader in `local` for a new local file format), `sources` (where the data comes from,
downloads, not-found messages), `loader` (`load` and the splits), `local` and `tfds_source`
(the readers), `pipeline` (tf.data batching) and `augment`.
"""

from fbat_tf.data.registry import DatasetInfo, info, names
from fbat_tf.data.sources import (
    DatasetNotFoundError,
    check_available,
    check_local_files,
    needs_tensorflow,
    use_tfds_source,
)

# The loader's names, imported from it on first use: it reads the data with TensorFlow, which
# the static facts and `check_available` on local files need not load.
_LOADER = (
    "HELD_OUT_SEED",
    "SPLITS",
    "VALIDATION_SOURCES",
    "examples",
    "held_out",
    "load",
    "points",
    "split_range",
)


def __getattr__(name: str):
    if name in _LOADER:
        from fbat_tf.data import loader

        return getattr(loader, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "HELD_OUT_SEED",
    "SPLITS",
    "VALIDATION_SOURCES",
    "DatasetInfo",
    "DatasetNotFoundError",
    "check_available",
    "check_local_files",
    "examples",
    "held_out",
    "info",
    "load",
    "names",
    "needs_tensorflow",
    "points",
    "split_range",
    "use_tfds_source",
]
