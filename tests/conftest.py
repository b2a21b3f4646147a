"""Shared test set-up: quiet TensorFlow logs, a float32 policy around every test, and the
process environment's oneDNN choice left as each test found it."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _float32_policy():
    keras.mixed_precision.set_global_policy("float32")
    yield
    keras.mixed_precision.set_global_policy("float32")


@pytest.fixture(autouse=True)
def _onednn_choice_left_as_found():
    # Child processes inherit the environment, and TF_ENABLE_ONEDNN_OPTS overrides train.py's
    # choice by dataset: a value a test leaves behind turns oneDNN on for a later test's
    # Tiny-ImageNet run, which then crashes (fbat_tf/onednn.py).
    before = os.environ.get("TF_ENABLE_ONEDNN_OPTS")
    yield
    after = os.environ.get("TF_ENABLE_ONEDNN_OPTS")
    assert after == before, f"the test left TF_ENABLE_ONEDNN_OPTS={after!r} (was {before!r})"
