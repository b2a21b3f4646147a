"""Wide residual networks WRN-depth-k (Zagoruyko & Komodakis 2016), the standard CIFAR variant.

    model = wide_resnet(num_classes=10, input_shape=(32, 32, 3), mean=0.5, std=0.25,
                        depth=28, widen_factor=10)          # WRN-28-10, 36,479,194 parameters
    logits = model(x)                                       # raw pixels in [0, 1], NHWC

Usually built through the registry: `build("wide_resnet28_10", ...)` or
`build("wide_resnet", ..., depth=40, widen_factor=2)`.

Architecture: normalization, 3x3 stem conv with `width` channels (16 by default), three groups
of n = (depth - 4) / 6 pre-activation basic blocks with width·k, 2·width·k, 4·width·k channels
and strides 1, 2, 2, final BN + activation, global average pooling, Dense. A block whose shape
changes gets a 1x1 projection shortcut on its pre-activated input (the standard WRN).
Convolutions start from kaiming_normal(fan_out), as in the standard WRN code.
"""

from __future__ import annotations

import keras

from fbat_tf.models import layers

_GROUP_STRIDES = (1, 2, 2)


def wide_resnet(
    num_classes: int,
    input_shape: tuple[int, int, int],
    mean,
    std,
    depth: int = 28,
    widen_factor: int = 10,
    activation: str = "relu",
    width: int | None = None,
    dropout_rate: float = 0.0,
    name: str | None = None,
) -> keras.Model:
    """WRN-depth-widen_factor. depth must be 6n + 4 (n blocks per group).

    dropout_rate: dropout between the two convolutions of each block (the WRN paper's option;
    0 by default, as in most adversarial-training work). Note that Keras dropout draws from its
    own seed generator, not from the trainer's stateless step seed.
    """
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 10 or (depth - 4) % 6:
        raise ValueError(
            f"WideResNet depth should be 6n+4 with n >= 1 (10, 16, 22, 28, 34, ...), "
            f"got depth={depth!r}"
        )
    if isinstance(widen_factor, bool) or not isinstance(widen_factor, int) or widen_factor < 1:
        raise ValueError(f"widen_factor must be a positive integer, got {widen_factor!r}")
    if not 0.0 <= dropout_rate < 1.0:
        raise ValueError(f"dropout_rate must be in [0, 1), got {dropout_rate!r}")
    layers.check_activation(activation)
    num_classes = layers.check_num_classes(num_classes)
    width = layers.check_width(width, default=16)
    blocks_per_group = (depth - 4) // 6
    init = layers.he_normal_fan_out

    inputs, h = layers.normalized_input(input_shape, mean, std)
    h = layers.conv(h, width, 3, 1, "stem_conv", init)
    for group, group_stride in enumerate(_GROUP_STRIDES, start=1):
        filters = width * widen_factor * 2 ** (group - 1)
        for block in range(1, blocks_per_group + 1):
            h = layers.preact_basic_block(
                h,
                filters,
                group_stride if block == 1 else 1,
                activation,
                f"group{group}_block{block}",
                init,
                shortcut_from_preactivation=True,
                dropout_rate=dropout_rate,
            )
    h = layers.activate(layers.batch_norm(h, "final_bn"), activation, "final_act")
    # The standard WRN keeps PyTorch's default init for the classifier weights.
    logits = layers.classifier_head(h, num_classes, layers.torch_default_init)
    return keras.Model(inputs, logits, name=name or f"wide_resnet{depth}_{widen_factor}")
