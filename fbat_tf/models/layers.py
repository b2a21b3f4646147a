"""Pieces shared by the model constructors: input normalization, conv/BN/activation, the head.

Every model in this package is a functional `keras.Model` assembled from these helpers:

    inputs, h = normalized_input((32, 32, 3), mean=(0.49, 0.48, 0.45), std=(0.25, 0.24, 0.26))
    h = conv(h, 64, 3, stride=1, name="stem_conv", kernel_initializer=torch_default_init)
    h = batch_norm(h, name="stem_bn")
    h = activate(h, "softplus", name="stem_act")   # "relu" | "softplus" | "swish"
    logits = classifier_head(h, num_classes=10, kernel_initializer=torch_default_init)
    model = keras.Model(inputs, logits, name="my_model")

Conventions kept here so that every architecture agrees on them:
- the first layer after the input is `keras.layers.Normalization` computing (x - mean) / std
  per channel, in float32, so attacks work in pixel units and an exported model takes raw pixels;
- batch norm uses PyTorch's defaults (momentum 0.1 in PyTorch terms = 0.9 in Keras terms,
  epsilon 1e-5) and exact second derivatives of its batch statistics (`BatchNormalization`
  below; Keras's own layer gets them wrong); convolutions before batch norm have no bias;
- the final Dense layer is float32 under any mixed-precision policy, so logits are float32;
- max pooling is `MaxPooling2D` below, a maximum over the window's strided slices: XLA's own
  second derivative of max pooling (MaxPoolGradGrad) picks each window's maximum by its value
  rounded to bfloat16 and so routes Fast-BAT's implicit term and GradAlign's regularizer wrongly
  (5-7% on small_cnn; bench/README.md, "Max pooling under XLA"), and has no 16-bit kernel. It
  runs in float32 under the mixed policies, which changes no value (the maximum of 16-bit numbers
  is one of them); that every device has 16-bit kernels for its second derivative outside XLA is
  not checked here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import keras
import numpy as np
import tensorflow as tf
from tensorflow.python.ops import control_flow_util

from fbat_tf.catalog import ACTIVATIONS
from fbat_tf.models.resizing import Resizing

# A zero-argument factory of initializers. Each layer needs its own instance: an unseeded Keras
# initializer fixes its seed when constructed, so one shared instance would give every layer
# of the same shape the same initial weights.
InitializerFactory = Callable[[], keras.initializers.Initializer]

# The Fast-BAT reference code uses nn.Softplus(beta=10) wherever it swaps ReLU for softplus:
# a smooth activation that stays close to ReLU (softplus_β(0) = log(2)/β).
SOFTPLUS_BETA = 10.0

BN_MOMENTUM = 0.9
BN_EPSILON = 1e-5


@keras.saving.register_keras_serializable(package="fbat_tf")
def softplus_beta10(x):
    """softplus_β(x) = log(1 + exp(β·x)) / β with β = 10, PyTorch's nn.Softplus(beta=10)."""
    return keras.ops.softplus(SOFTPLUS_BETA * x) / SOFTPLUS_BETA


_ACTIVATION_FUNCTIONS = {"relu": "relu", "softplus": softplus_beta10, "swish": "silu"}


def check_activation(activation: str) -> str:
    """Returns `activation` if it is one of ACTIVATIONS, else raises ValueError naming both."""
    if activation not in _ACTIVATION_FUNCTIONS:
        raise ValueError(f"unknown activation {activation!r}; valid activations: {ACTIVATIONS}")
    return activation


def check_width(width: int | None, default: int) -> int:
    """The base channel count: `default` when `width` is None, else a positive int."""
    if width is None:
        return default
    if isinstance(width, bool) or not isinstance(width, (int, np.integer)) or width < 1:
        raise ValueError(f"width must be a positive integer or None, got {width!r}")
    return int(width)


def check_num_classes(num_classes: int) -> int:
    if isinstance(num_classes, bool) or not isinstance(num_classes, (int, np.integer)):
        raise ValueError(f"num_classes must be a positive integer, got {num_classes!r}")
    if num_classes < 1:
        raise ValueError(f"num_classes must be a positive integer, got {num_classes!r}")
    return int(num_classes)


def torch_default_init() -> keras.initializers.Initializer:
    """PyTorch's default Conv2d/Linear weight init, kaiming_uniform(a=√5) = U(±1/√fan_in).

    VarianceScaling(scale, "fan_in", "uniform") draws from U(±√(3·scale/fan_in)); scale = 1/3
    gives U(±1/√fan_in). Used where the reference code keeps PyTorch's default (PreActResNet).
    """
    return keras.initializers.VarianceScaling(1.0 / 3.0, mode="fan_in", distribution="uniform")


def he_normal_fan_in() -> keras.initializers.Initializer:
    """kaiming_normal_(mode="fan_in", nonlinearity="relu"): N(0, 2/fan_in), untruncated (the
    released Fast-BAT code's WideResNet)."""
    return keras.initializers.VarianceScaling(2.0, mode="fan_in", distribution="untruncated_normal")


def he_normal_fan_out() -> keras.initializers.Initializer:
    """kaiming_normal_(mode="fan_out", nonlinearity="relu"): N(0, 2/fan_out), untruncated.

    The init of the standard WideResNet and of torchvision's ResNet-50.
    """
    return keras.initializers.VarianceScaling(
        2.0, mode="fan_out", distribution="untruncated_normal"
    )


def _per_channel(values, channels: int, what: str) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64).reshape(-1)
    if array.size == 1:
        array = np.repeat(array, channels)
    if array.size != channels:
        raise ValueError(
            f"{what} must be a scalar or have one value per channel ({channels}), "
            f"got {np.asarray(values).tolist()!r}"
        )
    return array


def normalized_input(
    input_shape: Sequence[int | None], mean, std
) -> tuple[keras.KerasTensor, keras.KerasTensor]:
    """`keras.Input` for raw pixels in [0, 1] and its per-channel standardization (x - mean)/std.

    mean and std: a scalar or one value per channel. Returns (inputs, normalized).
    """
    input_shape = tuple(input_shape)
    if len(input_shape) != 3 or input_shape[-1] is None:
        raise ValueError(
            f"input_shape must be (height, width, channels) with known channels, "
            f"got {input_shape!r}"
        )
    channels = int(input_shape[-1])
    mean = _per_channel(mean, channels, "mean")
    std = _per_channel(std, channels, "std")
    if not np.all(std > 0):
        raise ValueError(f"std must be positive, got {std.tolist()!r}")
    inputs = keras.Input(shape=input_shape, name="pixels")
    # Normalization divides by sqrt(variance); float32 even under a mixed policy so the
    # standardized input (and the input-gradients attacks take through it) keep full precision.
    normalized = keras.layers.Normalization(
        axis=-1,
        mean=mean.tolist(),
        variance=(std**2).tolist(),
        dtype="float32",
        name="normalize",
    )(inputs)
    return inputs, normalized


def conv(
    x: keras.KerasTensor,
    filters: int,
    kernel_size: int,
    stride: int,
    name: str,
    kernel_initializer: InitializerFactory,
) -> keras.KerasTensor:
    """Bias-free 2-D convolution with "same" padding (a batch norm or an addition follows)."""
    return keras.layers.Conv2D(
        filters,
        kernel_size,
        strides=stride,
        padding="same",
        use_bias=False,
        kernel_initializer=kernel_initializer(),
        name=name,
    )(x)


@keras.saving.register_keras_serializable(package="fbat_tf")
class BatchNormalization(keras.layers.BatchNormalization):
    """keras.layers.BatchNormalization whose batch statistics have exact second derivatives.

    Keras (through tf.nn.moments) computes the batch variance as mean((x - stop_gradient(μ))²).
    The first derivative is right (∂var/∂μ = 0 at μ = mean(x)), but a second differentiation
    then misses how μ moves with x, so ∇θ⟨∇x L, v⟩ in training mode (Fast-BAT's implicit term,
    GradAlign) comes out wrong: off by 10-75% on a width-4 PreActResNet-18 against finite
    differences (tests/test_models.py). Here μ stays differentiable. Only `_moments`
    changes (weights, updates, config and distribution behaviour are Keras's).
    """

    def _moments(self, inputs, mask):
        if mask is not None or self.synchronized:
            return super()._moments(inputs, mask)
        axes = self._reduction_axes
        mean = keras.ops.mean(inputs, axis=axes, keepdims=True)
        variance = keras.ops.mean(keras.ops.square(inputs - mean), axis=axes, keepdims=True)
        return keras.ops.squeeze(mean, axis=axes), keras.ops.squeeze(variance, axis=axes)


def use_exact_second_derivatives(model: keras.Layer) -> list[str]:
    """Give every `keras.layers.BatchNormalization`, `keras.layers.MaxPooling2D` and
    `keras.layers.Resizing` in `model` (nested layers included) the exact second derivatives of
    this module's `BatchNormalization`, `MaxPooling2D` and `Resizing`, in place: the same layer
    objects, weights and config, only their derivatives change. Returns the converted layers,
    each as "name (Keras class)". Raises ValueError for another subclass of these Keras layers,
    which it cannot vouch for.

    Fast-BAT's implicit term and GradAlign differentiate an input gradient again, with batch
    norm in training mode and often under XLA; with Keras' own layers they come out wrong
    without an error (through a bilinear resize, as zero: fbat_tf/models/resizing.py).
    """
    exact = {
        keras.layers.BatchNormalization: BatchNormalization,
        keras.layers.MaxPooling2D: MaxPooling2D,
        keras.layers.Resizing: Resizing,
    }
    # Keras has no public walk over a layer's nested layers (Model.layers stops at custom layers).
    found = list(model._flatten_layers(include_self=True, recursive=True))
    unknown = [
        f"{layer.name} ({type(layer).__name__})"
        for layer in found
        for keras_class, ours in exact.items()
        if isinstance(layer, keras_class)
        and type(layer) is not keras_class
        and not isinstance(layer, ours)
    ]
    if unknown:
        raise ValueError(
            f"{', '.join(unknown)}: a batch-normalization, max-pooling or resizing class that "
            "second derivatives are not checked for; build the model with fbat_tf.models.layers."
            "BatchNormalization, MaxPooling2D or Resizing (Keras' arguments, exact second "
            "derivatives) instead"
        )
    converted = []
    for layer in found:
        if type(layer) in exact:
            converted.append(f"{layer.name} ({type(layer).__name__})")
            layer.__class__ = exact[type(layer)]
    return converted


def batch_norm(x: keras.KerasTensor, name: str) -> keras.KerasTensor:
    """Batch norm with PyTorch's defaults (γ = 1, β = 0, momentum 0.1 there, eps 1e-5)."""
    return BatchNormalization(momentum=BN_MOMENTUM, epsilon=BN_EPSILON, name=name)(x)


def activate(x: keras.KerasTensor, activation: str, name: str) -> keras.KerasTensor:
    """The network's nonlinearity: relu, softplus with β = 10 (as the reference), or swish."""
    return keras.layers.Activation(_ACTIVATION_FUNCTIONS[check_activation(activation)], name=name)(
        x
    )


def _compiled_by_xla() -> bool:
    """Whether the graph being built is compiled by XLA (inside `tf.function(jit_compile=True)`),
    as TensorFlow's own gradients ask it."""
    return control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())


@keras.saving.register_keras_serializable(package="fbat_tf")
class MaxPooling2D(keras.layers.MaxPooling2D):
    """keras.layers.MaxPooling2D with derivatives of every order exact under XLA.

    XLA's kernel for the second derivative (MaxPoolGradGrad) compares the values rounded to
    bfloat16 and takes a window's wrong element where two agree to about three digits. Compiled
    by XLA, this layer takes the maximum over the pool's strided slices of the input (its edges
    repeated where "same" pads), one `maximum` at a time, so that its derivatives are selections
    by exact comparisons: the first routes each window's gradient to its maximum (the first one
    on ties, as TensorFlow's kernel does), the second routes the same way. Under XLA that is
    also faster than Keras' layer (0.75-0.85× small_cnn's gradient time). Outside XLA it is Keras'
    layer: TensorFlow's kernels are exact there, and the slices would take about twice a small
    CNN's gradient time (bench/README.md, "Max pooling under XLA").
    Only `call` changes (config, output shape and saving are Keras's).
    """

    def call(self, inputs):
        if not _compiled_by_xla():
            # TensorFlow's own kernels differentiate it twice exactly, and faster.
            return super().call(inputs)
        return self.maximum_over_slices(inputs)

    def maximum_over_slices(self, inputs):
        """The pooled maximum with every derivative a selection by exact comparisons."""
        channels_last = self.data_format == "channels_last"
        x = inputs if channels_last else keras.ops.transpose(inputs, (0, 2, 3, 1))
        sizes = []
        for axis, (pool, stride) in enumerate(
            zip(self.pool_size, self.strides, strict=True), start=1
        ):
            size = x.shape[axis] if x.shape[axis] is not None else keras.ops.shape(x)[axis]
            if self.padding == "same":
                out = -(-size // stride)
                total = (out - 1) * stride + pool - size
                before = total // 2
                if not isinstance(total, int) or total > 0:
                    # Edge rows repeated instead of −∞: a window reaching past the edge holds the
                    # edge row too, so its maximum is the same; and unlike padding (whose
                    # gradient XLA slices with an op that has no gradient) a gather can be
                    # differentiated forward over backward.
                    rows = keras.ops.arange(-before, size + total - before)
                    x = keras.ops.take(x, keras.ops.clip(rows, 0, size - 1), axis=axis)
            else:
                out = (size - pool) // stride + 1
            sizes.append(out)
        (pool_h, pool_w), (stride_h, stride_w), (out_h, out_w) = self.pool_size, self.strides, sizes
        pooled = None
        for a in range(pool_h):
            for b in range(pool_w):
                part = x[
                    :,
                    a : a + (out_h - 1) * stride_h + 1 : stride_h,
                    b : b + (out_w - 1) * stride_w + 1 : stride_w,
                    :,
                ]
                # maximum's gradient goes to its first argument on ties: the earlier element.
                pooled = part if pooled is None else keras.ops.maximum(pooled, part)
        return pooled if channels_last else keras.ops.transpose(pooled, (0, 3, 1, 2))


def max_pool(x: keras.KerasTensor, pool_size: int, stride: int, name: str) -> keras.KerasTensor:
    """Max pooling with exact second derivatives under XLA (`MaxPooling2D`), in float32 (see the
    module docstring)."""
    return MaxPooling2D(pool_size, strides=stride, padding="same", dtype="float32", name=name)(x)


def classifier_head(
    x: keras.KerasTensor,
    num_classes: int,
    kernel_initializer: InitializerFactory,
) -> keras.KerasTensor:
    """Global average pooling + Dense to float32 logits.

    Global pooling makes every model accept any spatial size (32x32 CIFAR, 64x64 Tiny-ImageNet).
    The bias starts at zero (PyTorch draws it from U(±1/√fan_in); the difference is negligible).
    """
    pooled = keras.layers.GlobalAveragePooling2D(name="avg_pool")(x)
    return keras.layers.Dense(
        num_classes, kernel_initializer=kernel_initializer(), dtype="float32", name="logits"
    )(pooled)


def preact_basic_block(
    x: keras.KerasTensor,
    filters: int,
    stride: int,
    activation: str,
    name: str,
    kernel_initializer: InitializerFactory,
    shortcut_from_preactivation: bool,
    dropout_rate: float = 0.0,
) -> keras.KerasTensor:
    """Pre-activation basic block: BN-act-conv3x3-BN-act-[dropout]-conv3x3, plus the shortcut.

    The shortcut is the identity when shape is kept, else a bias-free 1x1 conv with the stride.
    That conv reads the pre-activated input (BN-act(x)) when `shortcut_from_preactivation`
    (He et al. 2016 and the standard WideResNet), or the raw block input x otherwise (the
    PreActBlock of the Fast-AT / Fast-BAT reference code). Same parameters either way.
    """
    in_filters = x.shape[-1]
    preactivated = activate(batch_norm(x, f"{name}_bn1"), activation, f"{name}_act1")
    if stride != 1 or in_filters != filters:
        shortcut_source = preactivated if shortcut_from_preactivation else x
        shortcut = conv(shortcut_source, filters, 1, stride, f"{name}_shortcut", kernel_initializer)
    else:
        shortcut = x
    h = conv(preactivated, filters, 3, stride, f"{name}_conv1", kernel_initializer)
    h = activate(batch_norm(h, f"{name}_bn2"), activation, f"{name}_act2")
    if dropout_rate > 0:
        h = keras.layers.Dropout(dropout_rate, name=f"{name}_dropout")(h)
    h = conv(h, filters, 3, 1, f"{name}_conv2", kernel_initializer)
    return keras.layers.Add(name=f"{name}_add")([h, shortcut])
