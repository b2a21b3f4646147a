"""A training run small enough for a test: real Fashion-MNIST, small_cnn at width 4, 256 training
images in batches of 64 (4 steps an epoch), no AutoAttack, no TensorBoard, no XLA."""

from __future__ import annotations

from fbat_tf.training import TrainConfig

FASHION_MNIST = "/usr/share/datasets/fashion-mnist"


def fashion_mnist_config(workdir: str, **overrides) -> TrainConfig:
    settings = dict(
        workdir=workdir,
        method="fastat",
        dataset="fashion_mnist",
        model="small_cnn",
        width=4,
        epochs=1,
        batch_size=64,
        max_train_examples=256,
        val_examples=64,
        val_attack_steps=1,
        eval_examples=64,
        eval_pgd_steps=1,
        eval_pgd_restarts=1,
        eval_autoattack=False,
        jit_compile=False,
        download=False,
        tensorboard_every=0,
        verbose=0,
    )
    settings.update(overrides)
    return TrainConfig(**settings)
