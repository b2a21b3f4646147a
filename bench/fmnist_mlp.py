"""The model of the evaluation-speed measurements (pgd_trace.py, eval_vs_torch.py): a
784-256-128-10 ReLU MLP after `epochs` epochs of PGD-3 adversarial training at ε on the first
10,000 real Fashion-MNIST training images (batch 128, SGD 0.05 with momentum 0.9, seed 0)."""

from __future__ import annotations


def mlp(eps: float, epochs: int):
    """The MLP at ε (not /255), trained for `epochs` epochs (0: the initial weights)."""
    import keras

    from fbat_tf import data, methods
    from fbat_tf.trainer import AdversarialTrainer

    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((28, 28, 1)),
            keras.layers.Flatten(),
            keras.layers.Dense(256, activation="relu"),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(10),
        ]
    )
    if epochs:
        train = data.load("fashion_mnist", "train", batch_size=128, max_examples=10_000, seed=0)
        trainer = AdversarialTrainer(
            model, methods.create("pgd", eps=eps, steps=3), weight_decay=0.0, jit_compile=False
        )
        trainer.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), jit_compile=False)
        trainer.fit(train, epochs=epochs, verbose=0)
    return model
