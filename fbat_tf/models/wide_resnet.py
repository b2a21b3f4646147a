"""Wide residual networks WRN-depth-k (Zagoruyko & Komodakis 2016), the standard CIFAR variant.

    model = fbat_tf.models.build("wide_resnet28_10", num_classes=10, input_shape=(32, 32, 3),
                                 mean=0.5, std=0.25)        # WRN-28-10, 36,479,194 parameters
    logits = model(x)                                       # raw pixels in [0, 1], NHWC
    wrn40_2 = fbat_tf.models.build("wide_resnet", 10, (32, 32, 3), 0.5, 0.25,
                                   depth=40, widen_factor=2)

`wide_resnet(x, num_classes, activation, width, depth, widen_factor, dropout_rate)` returns the
logits of the normalized input tensor x; `build` checks the common arguments (width None: 16),
makes the normalizing input and wraps the model.

Architecture: normalization, 3x3 stem conv with `width` channels (16 by default), three groups
of n = (depth - 4) / 6 pre-activation basic blocks with width·k, 2·width·k, 4·width·k channels
and strides 1, 2, 2, final BN + activation, global average pooling, Dense. A block whose shape
changes gets a 1x1 projection shortcut on its pre-activated input (the standard WRN).
Convolutions start from kaiming_normal(fan_out), as in the standard WRN code.

`wide_resnet22_8_fastbat` is the network the released Fast-BAT code trains as "WRN_16_8"
(its Table 3): that code builds a group as a downsampling unit plus (depth − 4)/6 basic units,
three units a group at depth 16, which is the layout of WRN-22-8 here (17.16 M parameters at 10
classes, where WRN-16-8 has 10.96 M); with dropout 0.1 between each unit's convolutions,
kaiming_normal(fan_in) convolutions and a zero-initialized classifier, as that code has it.
"""

from __future__ import annotations

import keras

from fbat_tf.models import layers

_GROUP_STRIDES = (1, 2, 2)


def wide_resnet(
    x: keras.KerasTensor,
    num_classes: int,
    activation: str,
    width: int,
    depth: int = 28,
    widen_factor: int = 10,
    dropout_rate: float = 0.0,
    kernel_init: str = "fan_out",
    zero_head: bool = False,
) -> keras.KerasTensor:
    """WRN-depth-widen_factor logits of x. depth must be 6n + 4 (n blocks per group).

    dropout_rate: dropout between the two convolutions of each block (the WRN paper's option;
    0 by default, as in most adversarial-training work). Note that Keras dropout draws from its
    own seed generator, not from the trainer's stateless step seed.
    kernel_init: the convolutions' kaiming_normal mode, "fan_out" (the standard WRN) or
    "fan_in" (the released Fast-BAT code's). zero_head: the classifier's weights and bias start
    at zero (the released Fast-BAT code's), else PyTorch's default.
    """
    if kernel_init not in ("fan_in", "fan_out"):
        raise ValueError(f"kernel_init must be 'fan_in' or 'fan_out', got {kernel_init!r}")
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 10 or (depth - 4) % 6:
        raise ValueError(
            f"WideResNet depth should be 6n+4 with n >= 1 (10, 16, 22, 28, 34, ...), "
            f"got depth={depth!r}"
        )
    if isinstance(widen_factor, bool) or not isinstance(widen_factor, int) or widen_factor < 1:
        raise ValueError(f"widen_factor must be a positive integer, got {widen_factor!r}")
    if not 0.0 <= dropout_rate < 1.0:
        raise ValueError(f"dropout_rate must be in [0, 1), got {dropout_rate!r}")
    blocks_per_group = (depth - 4) // 6
    init = layers.he_normal_fan_out if kernel_init == "fan_out" else layers.he_normal_fan_in

    h = layers.conv(x, width, 3, 1, "stem_conv", init)
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
    head = keras.initializers.Zeros if zero_head else layers.torch_default_init
    return layers.classifier_head(h, num_classes, head)
