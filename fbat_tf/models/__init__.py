"""Model registry: build a classifier by name.

    from fbat_tf import models

    model = models.build("preact_resnet18", num_classes=10, input_shape=(32, 32, 3),
                         mean=(0.4914, 0.4822, 0.4465), std=(0.2471, 0.2435, 0.2616))
    logits = model(x, training=False)        # x: raw pixels in [0, 1], NHWC -> float32 logits

    models.build("small_cnn", 10, (28, 28, 1), mean=0.2860, std=0.3530, activation="softplus")
    models.build("wide_resnet", 10, (32, 32, 3), 0.5, 0.25, depth=40, widen_factor=2)
    models.names()                           # every registered name

Every model is a functional `keras.Model` named after its registry name that
- takes raw pixels in [0, 1] and standardizes them in its first layer, "normalize"
  ((x - mean) / std per channel), so attacks work in pixel units;
- uses `activation` ("relu", "softplus" with β = 10 as in the Fast-BAT code, or "swish") in every
  nonlinearity;
- returns float32 logits [batch, num_classes] under any mixed-precision policy;
- runs inside `tf.function(jit_compile=True)` and under nested gradient tapes.

`width` is the base channel count (None: the architecture's default in `_REGISTRY`, 64 for
PreActResNet and ResNet-50, 16 for WideResNet, times the widen factor per group, 32 for
small_cnn). Extra keyword arguments go to the architecture: `depth`, `widen_factor` (only with
"wide_resnet") and `dropout_rate` for the WideResNets.

`build` does what every model shares: it checks the activation, num_classes and width, makes
the normalizing input (`layers.normalized_input`) and wraps the logits in a `keras.Model` named
`name`. An architecture is a function `(x, num_classes, activation, width, **options) -> logits`
of the normalized input tensor x, with the already checked arguments. Adding a model is one
such module plus one line in `_REGISTRY`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras

from fbat_tf.models.layers import (
    ACTIVATIONS,
    check_activation,
    check_num_classes,
    check_width,
    normalized_input,
)
from fbat_tf.models.preact_resnet import preact_resnet
from fbat_tf.models.resnet import resnet50
from fbat_tf.models.small_cnn import small_cnn
from fbat_tf.models.wide_resnet import wide_resnet

__all__ = ["ACTIVATIONS", "build", "names"]

# name -> (architecture, its default width, the arguments the name fixes)
_REGISTRY: dict[str, tuple[Callable[..., keras.KerasTensor], int, dict[str, Any]]] = {
    "preact_resnet18": (preact_resnet, 64, {"depth": 18}),
    "preact_resnet34": (preact_resnet, 64, {"depth": 34}),
    "preact_resnet50": (preact_resnet, 64, {"depth": 50}),
    "wide_resnet16_8": (wide_resnet, 16, {"depth": 16, "widen_factor": 8}),
    # What the released Fast-BAT code trains as WRN_16_8 (fbat_tf/models/wide_resnet.py).
    "wide_resnet22_8_fastbat": (
        wide_resnet,
        16,
        {
            "depth": 22,
            "widen_factor": 8,
            "dropout_rate": 0.1,
            "kernel_init": "fan_in",
            "zero_head": True,
        },
    ),
    "wide_resnet28_10": (wide_resnet, 16, {"depth": 28, "widen_factor": 10}),
    "wide_resnet34_10": (wide_resnet, 16, {"depth": 34, "widen_factor": 10}),
    # Any WRN-depth-k through depth=/widen_factor= (default WRN-28-10).
    "wide_resnet": (wide_resnet, 16, {}),
    "resnet50": (resnet50, 64, {}),
    "small_cnn": (small_cnn, 32, {}),
}


def names() -> list[str]:
    """Every name `build` accepts, in registry order."""
    return list(_REGISTRY)


def build(
    name: str,
    num_classes: int,
    input_shape: tuple[int, int, int],
    mean,
    std,
    activation: str = "relu",
    width: int | None = None,
    **kwargs: Any,
) -> keras.Model:
    """Builds the model registered as `name` (see the module docstring).

    mean, std: a scalar or one value per input channel, in pixel units ([0, 1] scale).
    Raises ValueError for an unknown name or activation, a bad num_classes, width, mean, std or
    depth, or a keyword argument that the name already fixes (e.g. depth= with
    "wide_resnet28_10").
    """
    if name not in _REGISTRY:
        raise ValueError(f"unknown model {name!r}; valid models: {names()}")
    check_activation(activation)
    architecture, default_width, fixed = _REGISTRY[name]
    clashes = sorted(set(fixed) & set(kwargs))
    if clashes:
        raise ValueError(
            f"model {name!r} fixes {', '.join(f'{k}={fixed[k]}' for k in clashes)}; "
            f"got {', '.join(f'{k}={kwargs[k]!r}' for k in clashes)} "
            "(use 'wide_resnet' to choose depth and widen_factor)"
        )
    num_classes = check_num_classes(num_classes)
    width = check_width(width, default=default_width)
    inputs, normalized = normalized_input(input_shape, mean, std)
    logits = architecture(normalized, num_classes, activation, width, **fixed, **kwargs)
    return keras.Model(inputs, logits, name=name)
