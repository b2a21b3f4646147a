"""Put on PYTHONPATH by tests: every Python process started with it reads TFDS through
`tfds.testing.mock_data` (random examples, no download), so that the entry points can be run as
programs on datasets this machine does not have. FBAT_MOCK_EXAMPLES sets the examples per split."""

import os

import tensorflow_datasets as tfds

_mock = tfds.testing.mock_data(
    policy=tfds.testing.MockPolicy.USE_CODE,
    num_examples=int(os.environ.get("FBAT_MOCK_EXAMPLES", "40")),
)
_mock.__enter__()
