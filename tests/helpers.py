"""Models the tests share."""

from __future__ import annotations

import keras
import numpy as np


def linear_model(
    shape: int | tuple[int, ...], classes: int = 2, seed: int = 0, random_bias: bool = False
) -> keras.Model:
    """logits = W·flatten(x) + b with W ~ N(0, 1) (and b ~ N(0, 1), or 0) from `seed`: a model
    whose worst case in the ε-ball is known in closed form. The Dense layer is the last one."""
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    rng = np.random.default_rng(seed)
    d = int(np.prod(shape))
    flatten = [keras.layers.Flatten()] if len(shape) > 1 else []
    model = keras.Sequential([keras.Input(shape), *flatten, keras.layers.Dense(classes)])
    kernel = rng.normal(size=(d, classes)).astype(np.float32)
    bias = rng.normal(size=classes) if random_bias else np.zeros(classes)
    model.layers[-1].set_weights([kernel, bias.astype(np.float32)])
    return model
