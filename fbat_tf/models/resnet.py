"""ResNet-50 for ImageNet-sized inputs (post-activation bottleneck, torchvision's layout).

    model = fbat_tf.models.build("resnet50", num_classes=1000, input_shape=(224, 224, 3),
                                 mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
    logits = model(x)                      # raw pixels in [0, 1], NHWC

`resnet50(x, num_classes, activation, width)` returns the logits of the normalized input tensor
x; `build` checks the common arguments (width None: 64), makes the normalizing input and wraps
the model.

Written here rather than taken from keras.applications so that `activation` and `width` apply.
Architecture: normalization, 7x7 stride-2 stem conv + BN + activation, 3x3 stride-2 max pool,
four stages of [3, 4, 6, 3] bottlenecks (1x1 w·2^s, 3x3 w·2^s with the stage's stride, 1x1
4·w·2^s; the stride sits on the 3x3 conv, "ResNet v1.5"), each conv followed by BN, the
activation after the residual addition, global average pooling, Dense. At w = 64 and 1000
classes it has torchvision's 25,557,032 trainable parameters. Padding is TensorFlow's "same"
(asymmetric for stride 2), so output shapes match torchvision's but pixel alignment differs.
"""

from __future__ import annotations

import keras

from fbat_tf.models import layers

_BLOCKS_PER_STAGE = (3, 4, 6, 3)
_STAGE_STRIDES = (1, 2, 2, 2)
_EXPANSION = 4


def _bottleneck(
    x: keras.KerasTensor, planes: int, stride: int, activation: str, name: str
) -> keras.KerasTensor:
    """conv1x1-BN-act-conv3x3(stride)-BN-act-conv1x1-BN, add the shortcut, then act."""
    init = layers.he_normal_fan_out
    out_filters = _EXPANSION * planes
    if stride != 1 or x.shape[-1] != out_filters:
        shortcut = layers.conv(x, out_filters, 1, stride, f"{name}_shortcut_conv", init)
        shortcut = layers.batch_norm(shortcut, f"{name}_shortcut_bn")
    else:
        shortcut = x
    h = layers.conv(x, planes, 1, 1, f"{name}_conv1", init)
    h = layers.activate(layers.batch_norm(h, f"{name}_bn1"), activation, f"{name}_act1")
    h = layers.conv(h, planes, 3, stride, f"{name}_conv2", init)
    h = layers.activate(layers.batch_norm(h, f"{name}_bn2"), activation, f"{name}_act2")
    h = layers.conv(h, out_filters, 1, 1, f"{name}_conv3", init)
    h = layers.batch_norm(h, f"{name}_bn3")
    h = keras.layers.Add(name=f"{name}_add")([h, shortcut])
    return layers.activate(h, activation, f"{name}_out_act")


def resnet50(
    x: keras.KerasTensor, num_classes: int, activation: str, width: int
) -> keras.KerasTensor:
    """ResNet-50 logits of x; `width` is the stem and first-stage bottleneck width."""
    # torchvision: kaiming_normal(fan_out) convs, BN γ = 1 / β = 0, default-init classifier.
    init = layers.he_normal_fan_out

    h = layers.conv(x, width, 7, 2, "stem_conv", init)
    h = layers.activate(layers.batch_norm(h, "stem_bn"), activation, "stem_act")
    h = layers.max_pool(h, 3, 2, "stem_pool")
    for stage, (num_blocks, stage_stride) in enumerate(
        zip(_BLOCKS_PER_STAGE, _STAGE_STRIDES, strict=True), start=1
    ):
        planes = width * 2 ** (stage - 1)
        for block in range(1, num_blocks + 1):
            stride = stage_stride if block == 1 else 1
            h = _bottleneck(h, planes, stride, activation, f"stage{stage}_block{block}")
    return layers.classifier_head(h, num_classes, layers.torch_default_init)
