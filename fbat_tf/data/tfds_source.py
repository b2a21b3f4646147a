"""TensorFlow Datasets as a source: builders, the prepared / mocked / download decision, readers.

Nothing here downloads on its own: `fbat_tf.data` decides, and calls `download_and_prepare`
only after checking that no local or prepared copy exists, that downloads are allowed, and
(with `internet_reachable`) that one can succeed, because TFDS retries a download for
minutes on a machine without internet before it fails.

    from fbat_tf.data import tfds_source

    builder = tfds_source.builder("cifar10", data_dir=None)      # ~/tensorflow_datasets
    if tfds_source.is_prepared(builder) or tfds_source.is_mocked():
        images, labels = tfds_source.read_arrays(builder, "train")

Under `tfds.testing.mock_data(policy=tfds.testing.MockPolicy.USE_CODE)` builders report
`is_prepared() == False`, ignore `data_dir`, and `as_dataset` yields random examples for any
split (slices included) while `download_and_prepare` does nothing: `is_mocked()` tells
callers to read anyway.
"""

from __future__ import annotations

import os
import socket

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

# A host TFDS downloads from; reaching it says the machine is online.
_PROBE_HOST = ("storage.googleapis.com", 443)
_PROXY_VARIABLES = ("https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY", "all_proxy")


def builder(tfds_name: str, data_dir: str | None) -> tfds.core.DatasetBuilder:
    """The TFDS builder; `data_dir=None`: TFDS's default (TFDS_DATA_DIR, ~/tensorflow_datasets)."""
    return tfds.builder(tfds_name, data_dir=data_dir)


def is_mocked() -> bool:
    """True inside `tfds.testing.mock_data`, which swaps DatasetBuilder methods for its own."""
    patched = tfds.core.DatasetBuilder.download_and_prepare
    return getattr(patched, "__module__", "").startswith("tensorflow_datasets.testing")


def is_prepared(dataset_builder: tfds.core.DatasetBuilder) -> bool:
    """Whether the builder's version is already prepared on disk (cheap: a few stat calls)."""
    return dataset_builder.is_prepared()


def prepared_path(dataset_builder: tfds.core.DatasetBuilder) -> str:
    """The folder TFDS reads prepared data from, e.g. ~/tensorflow_datasets/cifar10/3.0.2."""
    return os.fspath(dataset_builder.data_path)


def needs_manual_download(dataset_builder: tfds.core.DatasetBuilder) -> bool:
    """True for datasets (ImageNet) whose source files the user must fetch by hand."""
    return bool(getattr(dataset_builder, "MANUAL_DOWNLOAD_INSTRUCTIONS", None))


def manual_dir(dataset_builder: tfds.core.DatasetBuilder) -> str:
    """Where TFDS looks for hand-downloaded source files (its default DownloadConfig)."""
    return os.path.join(os.fspath(dataset_builder.data_dir_root), "downloads", "manual")


def has_manual_files(dataset_builder: tfds.core.DatasetBuilder) -> bool:
    folder = manual_dir(dataset_builder)
    return os.path.isdir(folder) and bool(os.listdir(folder))


def internet_reachable(timeout: float = 3.0) -> bool:
    """Whether a TCP connection to a TFDS download host opens within `timeout` seconds.

    Behind a proxy a direct connection may be refused while downloads work, so with a proxy
    configured this answers True and leaves the verdict to the download itself.
    """
    if any(os.environ.get(name) for name in _PROXY_VARIABLES):
        return True
    try:
        with socket.create_connection(_PROBE_HOST, timeout=timeout):
            return True
    except OSError:
        return False


def download_and_prepare(dataset_builder: tfds.core.DatasetBuilder) -> None:
    dataset_builder.download_and_prepare()


def num_examples(dataset_builder: tfds.core.DatasetBuilder, tfds_split: str) -> int | None:
    """Size of a prepared split from its metadata; None when unknown (mocked builders)."""
    splits = dataset_builder.info.splits
    if tfds_split not in splits:
        return None
    return int(splits[tfds_split].num_examples)


def read_arrays(
    dataset_builder: tfds.core.DatasetBuilder, tfds_split: str
) -> tuple[np.ndarray, np.ndarray]:
    """A whole split decoded into memory, in file order: uint8 images, int32 labels."""
    examples = _read_ordered(dataset_builder, tfds_split, decoders=None)
    # batch_size=-1 in as_dataset would batch by sys.maxsize, which the mock cannot; chunk.
    chunks = list(
        examples.map(lambda ex: (ex["image"], tf.cast(ex["label"], tf.int32)))
        .batch(4096)
        .as_numpy_iterator()
    )
    if not chunks:
        raise ValueError(f"TFDS {dataset_builder.name} split {tfds_split!r} is empty")
    images = np.concatenate([c[0] for c in chunks])
    labels = np.concatenate([c[1] for c in chunks])
    return images, labels


def read_encoded(
    dataset_builder: tfds.core.DatasetBuilder, tfds_split: str, *, shuffle_files: bool, seed: int
) -> tf.data.Dataset:
    """(JPEG bytes, label) examples, undecoded so the caller decodes in its parallel map.

    In file order unless `shuffle_files` (training: shard order shuffled from `seed`, shards
    interleaved for throughput).
    """
    decoders = {"image": tfds.decode.SkipDecoding()}
    if shuffle_files:
        examples = dataset_builder.as_dataset(
            split=tfds_split,
            shuffle_files=True,
            decoders=decoders,
            read_config=tfds.ReadConfig(shuffle_seed=seed),
        )
    else:
        examples = _read_ordered(dataset_builder, tfds_split, decoders=decoders)
    return examples.map(lambda ex: (ex["image"], ex["label"]))


def _read_ordered(
    dataset_builder: tfds.core.DatasetBuilder, tfds_split: str, decoders: dict | None
) -> tf.data.Dataset:
    # One shard at a time: "the first N test examples" must mean the same N on every run.
    return dataset_builder.as_dataset(
        split=tfds_split,
        shuffle_files=False,
        decoders=decoders,
        read_config=tfds.ReadConfig(interleave_cycle_length=1),
    )
