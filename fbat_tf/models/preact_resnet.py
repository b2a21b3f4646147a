"""Pre-activation ResNets (He et al. 2016) as in the Fast-AT / Fast-BAT reference CIFAR code.

    model = fbat_tf.models.build("preact_resnet18", num_classes=10, input_shape=(32, 32, 3),
                                 mean=(0.4914, 0.4822, 0.4465), std=(0.2471, 0.2435, 0.2616))
    logits = model(x)          # x: raw pixels in [0, 1], NHWC

`preact_resnet(x, num_classes, activation, width, depth)` returns the logits of the normalized
input tensor x; `build` checks the common arguments (width None: 64), makes the normalizing
input and wraps the model.

Architecture: normalization, 3x3 stem conv (stride 1, no bias), four stages of widths
w, 2w, 4w, 8w (times 4 for the bottleneck) with strides 1, 2, 2, 2, final BN + activation,
global average pooling, Dense. Depth 18 and 34 use the basic block ([2,2,2,2] / [3,4,6,3]),
depth 50 the pre-activation bottleneck ([3,4,6,3], expansion 4). At w = 64 and 10 classes
PreActResNet-18 has 11,172,170 trainable parameters (the reference's count; the often-quoted
11,173,962 is the post-activation ResNet-18's). Inputs larger than 32x32 (64x64 Tiny-ImageNet)
work unchanged thanks to the global pooling.
"""

from __future__ import annotations

import keras

from fbat_tf.models import layers

# depth -> (block kind, blocks per stage)
_STAGES = {
    18: ("basic", (2, 2, 2, 2)),
    34: ("basic", (3, 4, 6, 3)),
    50: ("bottleneck", (3, 4, 6, 3)),
}
_BOTTLENECK_EXPANSION = 4
_STAGE_STRIDES = (1, 2, 2, 2)


def _preact_bottleneck(
    x: keras.KerasTensor, planes: int, stride: int, activation: str, name: str
) -> keras.KerasTensor:
    """BN-act-conv1x1-BN-act-conv3x3(stride)-BN-act-conv1x1(4·planes), plus the shortcut.

    As in the reference PreActBottleneck, a projection shortcut reads the pre-activated input.
    """
    init = layers.torch_default_init
    out_filters = _BOTTLENECK_EXPANSION * planes
    preactivated = layers.activate(layers.batch_norm(x, f"{name}_bn1"), activation, f"{name}_act1")
    if stride != 1 or x.shape[-1] != out_filters:
        shortcut = layers.conv(preactivated, out_filters, 1, stride, f"{name}_shortcut", init)
    else:
        shortcut = x
    h = layers.conv(preactivated, planes, 1, 1, f"{name}_conv1", init)
    h = layers.activate(layers.batch_norm(h, f"{name}_bn2"), activation, f"{name}_act2")
    h = layers.conv(h, planes, 3, stride, f"{name}_conv2", init)
    h = layers.activate(layers.batch_norm(h, f"{name}_bn3"), activation, f"{name}_act3")
    h = layers.conv(h, out_filters, 1, 1, f"{name}_conv3", init)
    return keras.layers.Add(name=f"{name}_add")([h, shortcut])


def preact_resnet(
    x: keras.KerasTensor, num_classes: int, activation: str, width: int, depth: int
) -> keras.KerasTensor:
    """PreActResNet-{18, 34, 50} logits of x; `width` is the stem/first-stage channel count."""
    if depth not in _STAGES:
        raise ValueError(f"PreActResNet depth must be one of {sorted(_STAGES)}, got {depth!r}")
    block_kind, blocks_per_stage = _STAGES[depth]
    # The reference keeps PyTorch's default init everywhere (no custom init loop).
    init = layers.torch_default_init

    h = layers.conv(x, width, 3, 1, "stem_conv", init)
    for stage, (num_blocks, stage_stride) in enumerate(
        zip(blocks_per_stage, _STAGE_STRIDES, strict=True), start=1
    ):
        planes = width * 2 ** (stage - 1)
        for block in range(1, num_blocks + 1):
            stride = stage_stride if block == 1 else 1
            block_name = f"stage{stage}_block{block}"
            if block_kind == "basic":
                h = layers.preact_basic_block(
                    h,
                    planes,
                    stride,
                    activation,
                    block_name,
                    init,
                    # The reference PreActBlock feeds the raw x to its projection shortcut.
                    shortcut_from_preactivation=False,
                )
            else:
                h = _preact_bottleneck(h, planes, stride, activation, block_name)
    h = layers.activate(layers.batch_norm(h, "final_bn"), activation, "final_act")
    return layers.classifier_head(h, num_classes, init)
