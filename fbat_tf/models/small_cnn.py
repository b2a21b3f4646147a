"""A small, fast CNN for 28x28 grey-scale data (MNIST, Fashion-MNIST).

    model = fbat_tf.models.build("small_cnn", num_classes=10, input_shape=(28, 28, 1),
                                 mean=0.2860, std=0.3530)
    logits = model(x)                      # raw pixels in [0, 1], NHWC

`small_cnn(x, num_classes, activation, width)` returns the logits of the normalized input tensor
x; `build` checks the common arguments (width None: 32), makes the normalizing input and wraps
the model.

Layout (w = width, 32 by default; every conv 3x3, bias-free, followed by BN + activation):

    28x28: conv w -> max pool 2 -> 14x14: conv 2w, conv 2w -> max pool 2 -> 7x7: conv 4w
    -> global average pooling -> Dense

About 131k parameters and 15M multiply-adds per image at w = 32, so Fast-AT on Fashion-MNIST
takes minutes on two CPU cores. Any input size divisible by 4 works (global pooling).
"""

from __future__ import annotations

import keras

from fbat_tf.models import layers


def small_cnn(
    x: keras.KerasTensor, num_classes: int, activation: str, width: int
) -> keras.KerasTensor:
    """The small CNN's logits of x; `width` is the first conv's channel count."""
    init = layers.torch_default_init

    def conv_bn_act(h: keras.KerasTensor, filters: int, name: str) -> keras.KerasTensor:
        h = layers.conv(h, filters, 3, 1, f"{name}_conv", init)
        return layers.activate(layers.batch_norm(h, f"{name}_bn"), activation, f"{name}_act")

    h = conv_bn_act(x, width, "block1")
    h = layers.max_pool(h, 2, 2, "pool1")
    h = conv_bn_act(h, 2 * width, "block2")
    h = conv_bn_act(h, 2 * width, "block3")
    h = layers.max_pool(h, 2, 2, "pool2")
    h = conv_bn_act(h, 4 * width, "block4")
    return layers.classifier_head(h, num_classes, init)
