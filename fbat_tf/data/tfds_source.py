"""TensorFlow Datasets as a source: builders, whether their data is prepared, downloads, readers.

`fbat_tf.data` reads TFDS through one `TFDSSource`, this class unless another is put in its
place with `fbat_tf.data.use_tfds_source(source)` (a subclass overriding what it must, e.g.
`is_prepared` for builders whose examples come from elsewhere than a prepared data dir).

Nothing here downloads on its own: `fbat_tf.data` decides, and calls `download_and_prepare`
only after checking that no local or prepared copy exists, that downloads are allowed, and
(with `internet_reachable`) that one can succeed, because TFDS retries a download for
minutes on a machine without internet before it fails.

    from fbat_tf.data import tfds_source

    source = tfds_source.TFDSSource()
    builder = source.builder("cifar10", data_dir=None)      # ~/tensorflow_datasets
    if source.is_prepared(builder):
        images, labels = source.read_arrays(builder, "train")

The readers also serve builders that know no split sizes and ignore slices
(`tfds.testing.mock_data`): `num_examples` is then None and callers slice by percentages.
"""

from __future__ import annotations

import contextlib
import logging
import os

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from fbat_tf.data import online


@contextlib.contextmanager
def _quiet_tfds():
    """Hold back TFDS's warnings while it looks for prepared data (e.g. "Variant folder ... has
    no dataset_info.json" about a folder that is not there): whether the data is found is said
    once, by `fbat_tf.data`, with every place looked in."""
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


class TFDSSource:
    """TFDS builders and their data as `fbat_tf.data` uses them."""

    # Whether splits decoded through this source may be kept in memory and handed out again:
    # False where one builder's examples can change from one read to the next.
    cache_decoded: bool = True

    def builder(self, tfds_name: str, data_dir: str | None) -> tfds.core.DatasetBuilder:
        """The TFDS builder; `data_dir=None`: TFDS's default (TFDS_DATA_DIR or
        ~/tensorflow_datasets)."""
        with _quiet_tfds():
            return tfds.builder(tfds_name, data_dir=data_dir)

    def is_prepared(self, dataset_builder: tfds.core.DatasetBuilder) -> bool:
        """Whether the builder's data can be read as it is (cheap: a few stat calls)."""
        with _quiet_tfds():
            return dataset_builder.is_prepared()

    def describe(self, tfds_name: str, dataset_builder: tfds.core.DatasetBuilder) -> str:
        """Where prepared data is read from, for `check_available`."""
        return f"TFDS {tfds_name} in {self.prepared_path(dataset_builder)}"

    def prepared_path(self, dataset_builder: tfds.core.DatasetBuilder) -> str:
        """The folder TFDS reads prepared data from, e.g. ~/tensorflow_datasets/cifar10/3.0.2."""
        return os.fspath(dataset_builder.data_path)

    def needs_manual_download(self, dataset_builder: tfds.core.DatasetBuilder) -> bool:
        """True for datasets (ImageNet) whose source files the user must fetch by hand."""
        return bool(getattr(dataset_builder, "MANUAL_DOWNLOAD_INSTRUCTIONS", None))

    def manual_dir(self, dataset_builder: tfds.core.DatasetBuilder) -> str:
        """Where TFDS looks for hand-downloaded source files (its default DownloadConfig)."""
        return os.path.join(os.fspath(dataset_builder.data_dir_root), "downloads", "manual")

    def has_manual_files(self, dataset_builder: tfds.core.DatasetBuilder) -> bool:
        folder = self.manual_dir(dataset_builder)
        return os.path.isdir(folder) and bool(os.listdir(folder))

    def internet_reachable(self, timeout: float = 3.0) -> bool:
        """Whether a download host answers within `timeout` seconds (`online.reachable`)."""
        return online.reachable(timeout)

    def download_and_prepare(self, dataset_builder: tfds.core.DatasetBuilder) -> None:
        dataset_builder.download_and_prepare()

    def num_examples(
        self, dataset_builder: tfds.core.DatasetBuilder, tfds_split: str
    ) -> int | None:
        """Size of a prepared split from its metadata; None when unknown."""
        splits = dataset_builder.info.splits
        if tfds_split not in splits:
            return None
        return int(splits[tfds_split].num_examples)

    def read_arrays(
        self, dataset_builder: tfds.core.DatasetBuilder, tfds_split: str
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
        self,
        dataset_builder: tfds.core.DatasetBuilder,
        tfds_split: str,
        *,
        shuffle_files: bool,
        seed: int,
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
