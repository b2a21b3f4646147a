"""The model of the evaluation-speed measurements (pgd_trace.py, eval_vs_torch.py): a
784-256-128-10 ReLU MLP after `epochs` epochs of PGD-3 adversarial training at ε (in the L∞ or
the L2 ball) on the first 10,000 real Fashion-MNIST training images (batch 128, SGD 0.05 with
momentum 0.9, seed 0)."""

from __future__ import annotations


def mlp(eps: float, epochs: int, norm: str = "linf", hidden: tuple[int, ...] = (256, 128)):
    """The MLP at ε (pixel units, not /255), trained for `epochs` epochs (0: the initial
    weights) in the `norm` ball; `hidden`: its hidden layers' widths."""
    import keras

    from fbat_tf import data, methods
    from fbat_tf.trainer import AdversarialTrainer

    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((28, 28, 1)),
            keras.layers.Flatten(),
            *(keras.layers.Dense(width, activation="relu") for width in hidden),
            keras.layers.Dense(10),
        ]
    )
    if epochs:
        train = data.load("fashion_mnist", "train", batch_size=128, max_examples=10_000, seed=0)
        method = methods.create("pgd", eps=eps, steps=3, norm=norm)
        trainer = AdversarialTrainer(model, method, weight_decay=0.0, jit_compile=False)
        trainer.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), jit_compile=False)
        trainer.fit(train, epochs=epochs, verbose=0)
    return model
