"""Put on PYTHONPATH by tests: every Python process started with it reads TFDS through
`tfds.testing.mock_data` (random examples, no download), injected into `fbat_tf.data` as its TFDS
source (mocked_tfds.py), so that the entry points can be run as programs on datasets this machine
does not have. FBAT_MOCK_EXAMPLES sets the examples per split."""

import os

from mocked_tfds import mock_tfds

_mock = mock_tfds(num_examples=int(os.environ.get("FBAT_MOCK_EXAMPLES", "40")))
_mock.__enter__()
