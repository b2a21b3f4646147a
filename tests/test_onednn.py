"""The oneDNN choice by dataset (fbat_tf/onednn.py): on for the 28×28 datasets alone; the
environment's choice wins. That train.py and evaluate.py make it before TensorFlow loads is
shown by tests/test_paper_kits.py, whose Tiny-ImageNet cell crashed in most runs with the kernels
on, and whose CIFAR-10 Table 2 cell in 6 of 6 runs on a 2-core AMD EPYC."""

from __future__ import annotations

import pytest

from fbat_tf import onednn


@pytest.mark.parametrize(
    ("dataset", "environment", "expected"),
    [
        ("cifar10", None, "0"),
        ("cifar100", None, "0"),
        ("svhn", None, "0"),
        ("mnist", None, "1"),
        ("fashion_mnist", None, "1"),
        (None, None, "1"),
        ("tiny_imagenet", None, "0"),
        ("imagenet", None, "0"),
        ("tiny_imagenet", "1", "1"),
        ("cifar10", "0", "0"),
    ],
)
def test_onednn_follows_the_dataset_unless_the_environment_says(
    dataset, environment, expected, monkeypatch
):
    # setenv first, so that the test leaves the process's environment as it found it: choose()
    # writes os.environ itself, and a value left behind would reach every later test's child
    # processes (Tiny-ImageNet's train.py with oneDNN on crashes).
    monkeypatch.setenv(onednn.VARIABLE, "unset")
    monkeypatch.delenv(onednn.VARIABLE)
    if environment is not None:
        monkeypatch.setenv(onednn.VARIABLE, environment)
    assert onednn.choose(dataset) == expected
