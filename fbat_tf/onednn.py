"""Whether TensorFlow's oneDNN CPU kernels are on, decided before TensorFlow loads.

    onednn.choose("fashion_mnist")     # sets TF_ENABLE_ONEDNN_OPTS unless the environment has

TensorFlow 2.21 leaves its oneDNN kernels off on x86 CPUs without AVX-512 VNNI or AMX, where
they still make AutoAttack 1.5× and a training epoch 1.4–1.6× faster on Fashion-MNIST's small CNN
(bench/README.md), so train.py and evaluate.py turn them on for the datasets of 28×28 images
(MNIST, Fashion-MNIST) and for a model whose dataset is not known. Not for the others: a
PreActResNet-18 training step with them on crashed the process (a segmentation fault, or
glibc's "double free or corruption") in 5 of 5 runs on Tiny-ImageNet and in none of 5 with them
off (bench/records/onednn_crash.py, bench/results/onednn_crash.json); on CIFAR-10, Table 2's kit
cell (Fast-BAT at ε = 16/255, two attack steps, tests/test_paper_kits.py) crashed the same way
(a segmentation fault, or "malloc_consolidate(): invalid chunk size") in 6 of 6 runs of that
test on a 2-core AMD EPYC with them on (two of them in the whole suite beside other work) and in
none of 2 with them off. The trigger is not isolated: the cell's own train.py command, killed
and resumed by hand as the test does, did not crash in 3 runs with them on, nor did 5 one-step
Fast-BAT runs (bench/results/onednn_crash_fastbat.json). A GPU runs its
convolutions without them either way. The environment's TF_ENABLE_ONEDNN_OPTS, where set, always
wins. This module imports no TensorFlow.
"""

from __future__ import annotations

import os

VARIABLE = "TF_ENABLE_ONEDNN_OPTS"
# Datasets of 28×28 images: the kernels are on for these (and for an unknown dataset) alone.
ON_FOR = ("mnist", "fashion_mnist")


def choose(dataset: str | None) -> str:
    """Set TF_ENABLE_ONEDNN_OPTS for `dataset` unless it is set; return its value."""
    if VARIABLE not in os.environ:
        os.environ[VARIABLE] = "1" if dataset in (*ON_FOR, None) else "0"
    return os.environ[VARIABLE]
