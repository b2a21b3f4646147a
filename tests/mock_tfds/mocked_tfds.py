"""TFDS's mock data read through `fbat_tf.data`: `tfds.testing.mock_data` (random examples, no
download) with a TFDS source that reads the mocked builders as prepared data.

    with mock_tfds(num_examples=20):
        train = data.load("cifar10", "train", data_dir=str(tmp_path), download=False)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import tensorflow_datasets as tfds

from fbat_tf import data
from fbat_tf.data import tfds_source


class MockedTFDSSource(tfds_source.TFDSSource):
    """The builders of `tfds.testing.mock_data(policy=MockPolicy.USE_CODE)`, read as prepared.

    Such a builder reports `is_prepared() == False` and ignores `data_dir`, while `as_dataset`
    yields random examples for any split (slices included) and `download_and_prepare` does
    nothing; the mock can also make a builder look prepared on disk (MockPolicy.USE_FILES).
    """

    # The mock's examples depend on its arguments: decoded splits must never be reused.
    cache_decoded = False

    def is_prepared(self, dataset_builder: tfds.core.DatasetBuilder) -> bool:
        return True

    def describe(self, tfds_name: str, dataset_builder: tfds.core.DatasetBuilder) -> str:
        return f"TFDS {tfds_name} (tfds.testing.mock_data)"


@contextlib.contextmanager
def mock_tfds(num_examples: int) -> Iterator[None]:
    """TFDS mocked with `num_examples` examples per split, and read through MockedTFDSSource."""
    with tfds.testing.mock_data(policy=tfds.testing.MockPolicy.USE_CODE, num_examples=num_examples):
        with data.use_tfds_source(MockedTFDSSource()):
            yield
