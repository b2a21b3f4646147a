"""Whether TensorFlow's oneDNN CPU kernels are on, decided before TensorFlow loads.

    onednn.choose("fashion_mnist")     # sets TF_ENABLE_ONEDNN_OPTS unless the environment has

TensorFlow 2.21 leaves its oneDNN kernels off on x86 CPUs without AVX-512 VNNI or AMX, where
they still make AutoAttack 1.5× faster (bench/README.md), so train.py and evaluate.py turn them
on. Not for the datasets of 64×64 images and larger: there, on this stack, a training step with
them on crashed the process (a segmentation fault, or glibc's "double free or corruption") in
5 of 5 PreActResNet-18 runs on Tiny-ImageNet, and in none of 5 with them off nor of 5 on
CIFAR-10 with them on (bench/records/onednn_crash.py, bench/results/onednn_crash.json). A GPU
runs its convolutions without them either way. The environment's
TF_ENABLE_ONEDNN_OPTS, where set, always wins. This module imports no TensorFlow.
"""

from __future__ import annotations

import os

VARIABLE = "TF_ENABLE_ONEDNN_OPTS"
# Datasets whose images are 64×64 or larger.
OFF_FOR = ("tiny_imagenet", "imagenet")


def choose(dataset: str | None) -> str:
    """Set TF_ENABLE_ONEDNN_OPTS for `dataset` unless it is set; return its value."""
    if VARIABLE not in os.environ:
        os.environ[VARIABLE] = "0" if dataset in OFF_FOR else "1"
    return os.environ[VARIABLE]
