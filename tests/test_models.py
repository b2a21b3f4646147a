"""Tests for the model registry `fbat_tf.models`.

    python -m pytest tests/test_models.py -q

Shapes and dtypes of every model at tiny widths, the in-model normalization against numpy, the
activations against their formulas, parameter counts against the published PyTorch numbers,
second derivatives under XLA against finite differences, mixed precision, and argument errors.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from fbat_tf import models
from fbat_tf.models import layers
from fbat_tf.models.layers import BatchNormalization
from tests.reference import assert_grads_close, mixed_second_derivative_fn

CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2471, 0.2435, 0.2616)

# name -> (input shape, width, activation, extra kwargs). Each activation is used by several
# models; resnet50 runs at 64x64 (Tiny-ImageNet size) with width 4 to stay fast.
TINY = {
    "preact_resnet18": ((32, 32, 3), 4, "relu", {}),
    "preact_resnet34": ((32, 32, 3), 4, "softplus", {}),
    "preact_resnet50": ((32, 32, 3), 4, "swish", {}),
    "wide_resnet16_8": ((32, 32, 3), 2, "softplus", {}),
    "wide_resnet22_8_fastbat": ((32, 32, 3), 1, "relu", {}),
    "wide_resnet28_10": ((32, 32, 3), 1, "relu", {}),
    "wide_resnet34_10": ((32, 32, 3), 1, "swish", {}),
    "wide_resnet": ((32, 32, 3), 4, "relu", {"depth": 10, "widen_factor": 2}),
    "resnet50": ((64, 64, 3), 4, "swish", {}),
    "small_cnn": ((28, 28, 1), 8, "softplus", {}),
}

# The base width each name gets with width=None (the module docstring's numbers).
DEFAULT_WIDTHS = {
    "preact_resnet18": 64,
    "preact_resnet34": 64,
    "preact_resnet50": 64,
    "wide_resnet16_8": 16,
    "wide_resnet22_8_fastbat": 16,
    "wide_resnet28_10": 16,
    "wide_resnet34_10": 16,
    "wide_resnet": 16,
    "resnet50": 64,
    "small_cnn": 32,
}

ACTIVATION_FORMULAS = {
    "relu": lambda z: np.maximum(z, 0.0),
    # The Fast-BAT code's nn.Softplus(beta=10).
    "softplus": lambda z: np.logaddexp(0.0, 10.0 * z) / 10.0,
    "swish": lambda z: z / (1.0 + np.exp(-z)),
}


def trainable_parameter_count(model: keras.Model) -> int:
    """What PyTorch's sum(p.numel() for p in model.parameters()) counts (no BN moving stats)."""
    return int(sum(np.prod(w.shape) for w in model.trainable_weights))


def random_pixels(shape, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(0.0, 1.0, size=shape).astype(np.float32)


@pytest.fixture
def mixed_policy(request):
    keras.mixed_precision.set_global_policy(request.param)
    try:
        yield request.param
    finally:
        keras.mixed_precision.set_global_policy("float32")


def test_names_cover_the_registry():
    expected = {
        "preact_resnet18",
        "preact_resnet34",
        "preact_resnet50",
        "wide_resnet16_8",
        "wide_resnet22_8_fastbat",
        "wide_resnet28_10",
        "wide_resnet34_10",
        "wide_resnet",
        "resnet50",
        "small_cnn",
    }
    assert set(models.names()) == expected
    assert set(TINY) == expected
    assert set(DEFAULT_WIDTHS) == expected


class FirstConvolution(Exception):
    pass


@pytest.mark.parametrize("name", sorted(DEFAULT_WIDTHS))
def test_default_width_is_the_documented_one(name, monkeypatch):
    # The first convolution of every model has the base width; stopping there spares building
    # the full-width model.
    def first_convolution(x, filters, *args, **kwargs):
        raise FirstConvolution(filters)

    monkeypatch.setattr(layers, "conv", first_convolution)
    with pytest.raises(FirstConvolution) as stop:
        models.build(name, 10, (32, 32, 3), 0.5, 0.25, width=None)
    assert stop.value.args == (DEFAULT_WIDTHS[name],)


@pytest.mark.parametrize("name", sorted(TINY))
def test_every_model_gives_float32_logits(name):
    input_shape, width, activation, kwargs = TINY[name]
    model = models.build(name, 7, input_shape, 0.5, 0.25, activation, width, **kwargs)
    assert model.name == name
    logits = model(random_pixels((2, *input_shape)), training=False)
    assert logits.shape == (2, 7)
    assert logits.dtype == tf.float32
    assert np.all(np.isfinite(logits.numpy()))
    # Training mode runs too (batch statistics, moving averages updated).
    assert model(random_pixels((2, *input_shape), seed=1), training=True).shape == (2, 7)


@pytest.mark.parametrize("activation", ["relu", "softplus", "swish"])
def test_activation_is_used_in_every_nonlinearity(activation):
    model = models.build(
        "preact_resnet18", 10, (16, 16, 3), CIFAR_MEAN, CIFAR_STD, activation, width=4
    )
    nonlinearities = [layer for layer in model.layers if isinstance(layer, keras.layers.Activation)]
    # Two per basic block (8 blocks) plus the one after the final batch norm.
    assert len(nonlinearities) == 2 * 8 + 1
    z = np.linspace(-3.0, 3.0, 61, dtype=np.float32)
    for layer in nonlinearities:
        np.testing.assert_allclose(
            layer(z).numpy(), ACTIVATION_FORMULAS[activation](z.astype(np.float64)), atol=1e-6
        )
    assert np.all(np.isfinite(model(random_pixels((2, 16, 16, 3))).numpy()))


@pytest.mark.parametrize(
    "name,input_shape,mean,std",
    [
        ("preact_resnet18", (8, 8, 3), CIFAR_MEAN, CIFAR_STD),
        ("small_cnn", (8, 8, 1), 0.2860, 0.3530),
    ],
)
def test_normalization_is_the_first_layer(name, input_shape, mean, std):
    model = models.build(name, 10, input_shape, mean, std, width=4)
    first = model.layers[1]
    assert first.name == "normalize"
    normalized = keras.Model(model.input, first.output)
    x = random_pixels((3, *input_shape))
    expected = (x.astype(np.float64) - np.asarray(mean)) / np.asarray(std)
    np.testing.assert_allclose(normalized(x).numpy(), expected, rtol=1e-5, atol=1e-5)


def test_preact_resnet18_parameter_count():
    # Independent closed form of the Fast-AT / Fast-BAT PreActResNet-18: BN γ, β count; the
    # moving statistics are buffers, not parameters.
    def conv(k, c_in, c_out):
        return k * k * c_in * c_out

    count = conv(3, 3, 64)
    c_in = 64
    for stage, stride in enumerate((1, 2, 2, 2)):
        planes = 64 * 2**stage
        for block in range(2):
            count += 2 * c_in + conv(3, c_in, planes) + 2 * planes + conv(3, planes, planes)
            if (block == 0 and stride != 1) or c_in != planes:
                count += conv(1, c_in, planes)
            c_in = planes
    count += 2 * 512 + 512 * 10 + 10
    # 11,171,146 is the published count of kuangliu's PreActResNet18 (no final BN); the Fast-AT
    # version adds BatchNorm2d(512) = 1,024 parameters. (11,173,962 is the post-activation
    # ResNet-18, which has BN on the stem and on every projection shortcut.)
    assert count == 11_171_146 + 1_024 == 11_172_170

    model = models.build("preact_resnet18", 10, (32, 32, 3), CIFAR_MEAN, CIFAR_STD)
    assert trainable_parameter_count(model) == 11_172_170
    # The non-trainable weights are exactly the BN moving mean and variance (one per γ, β).
    bn_affine = sum(
        np.prod(w.shape)
        for layer in model.layers
        if isinstance(layer, keras.layers.BatchNormalization)
        for w in layer.trainable_weights
    )
    assert sum(np.prod(w.shape) for w in model.non_trainable_weights) == bn_affine


@pytest.mark.parametrize(
    "name,num_classes,input_shape,published",
    [
        ("wide_resnet28_10", 10, (32, 32, 3), 36_479_194),  # the PyTorch WRN-28-10
        ("resnet50", 1000, (224, 224, 3), 25_557_032),  # torchvision resnet50
    ],
)
def test_published_parameter_counts(name, num_classes, input_shape, published):
    model = models.build(name, num_classes, input_shape, 0.5, 0.25)
    assert trainable_parameter_count(model) == published


def _released_wrn_16_8_parameters(num_classes: int) -> int:
    """The parameters of the released Fast-BAT code's WRN_16_8, counted from its definition:
    a 3x3 stem of 16 channels; per group (128, 256, 512 channels) a downsampling unit (BN and
    3x3 conv from the group's input, BN, 3x3 conv, 1x1 shortcut conv) and (16 - 4) / 6 = 2 basic
    units (BN, 3x3 conv, BN, 3x3 conv); a final BN and the linear classifier."""
    total, c_in = 3 * 16 * 9, 16
    for c in (128, 256, 512):
        total += 2 * c_in + c_in * c * 9 + 2 * c + c * c * 9 + c_in * c
        total += 2 * (2 * c + c * c * 9 + 2 * c + c * c * 9)
        c_in = c
    return total + 2 * 512 + 512 * num_classes + num_classes


def test_the_released_wide_resnet_is_what_the_paper_trained_as_wrn_16_8():
    """17.16 M parameters at 10 classes (WRN-16-8 has 10.96 M), three units a group (22
    convolutions with the shortcuts), dropout 0.1 in each of the nine units,
    kaiming_normal(fan_in) convolutions and a classifier that starts at zero."""
    model = models.build("wide_resnet22_8_fastbat", 10, (32, 32, 3), 0.5, 0.25)
    assert trainable_parameter_count(model) == _released_wrn_16_8_parameters(10) == 17_158_106
    standard = models.build("wide_resnet16_8", 10, (32, 32, 3), 0.5, 0.25)
    assert trainable_parameter_count(standard) == 10_961_370
    convolutions = [layer for layer in model.layers if isinstance(layer, keras.layers.Conv2D)]
    assert len(convolutions) == 1 + 3 * (3 * 2 + 1)
    dropouts = [layer for layer in model.layers if isinstance(layer, keras.layers.Dropout)]
    assert len(dropouts) == 9 and {layer.rate for layer in dropouts} == {0.1}
    head = model.get_layer("logits")
    assert not any(np.any(w) for w in head.get_weights())
    kernel = model.get_layer("group3_block2_conv2").kernel.numpy()  # 3x3, 512 -> 512
    assert np.std(kernel) == pytest.approx(np.sqrt(2 / (9 * 512)), rel=0.02)


def test_small_cnn_is_small():
    model = models.build("small_cnn", 10, (28, 28, 1), 0.2860, 0.3530)
    assert 100_000 <= trainable_parameter_count(model) <= 300_000


@pytest.mark.slow
def test_small_cnn_second_order_gradient_under_xla_is_what_tensorflow_computes_eagerly():
    # (preact_resnet18 gets the same check, and more, in the finite-difference test below.)
    # The reference: the same model and weights with Keras' max pooling, run eagerly, where
    # TensorFlow's kernel differentiates max pooling twice exactly; under XLA that kernel
    # compares at bfloat16 precision and is off by 5-7% (bench/README.md, "Max pooling under
    # XLA").
    model = models.build("small_cnn", 10, (28, 28, 1), 0.5, 0.25, "softplus", width=8)
    x = random_pixels((4, 28, 28, 1))
    v = np.random.default_rng(1).normal(size=x.shape).astype(np.float32)
    _, grads = mixed_second_derivative_fn(model, training=True)(x, np.arange(4), v)
    pools = [layer for layer in model.layers if isinstance(layer, layers.MaxPooling2D)]
    assert len(pools) == 2
    for layer in pools:
        layer.__class__ = keras.layers.MaxPooling2D
    with tf.GradientTape() as outer:
        with tf.GradientTape() as inner:
            inner.watch(x := tf.constant(x))
            loss = tf.reduce_sum(
                tf.nn.sparse_softmax_cross_entropy_with_logits(
                    np.arange(4), model(x, training=True)
                )
            )
        product = tf.reduce_sum(inner.gradient(loss, x) * v)
    eager = outer.gradient(product, model.trainable_variables)
    assert_grads_close(grads, eager, rtol=1e-5)


POOLS = [(2, 2, "same"), (3, 2, "same"), (2, 2, "valid"), (3, 2, "valid"), (3, 1, "same")]


@pytest.mark.slow
@pytest.mark.parametrize("pool,stride,padding", POOLS)
def test_max_pooling_is_keras_max_pooling_with_exact_second_derivatives_under_xla(
    pool, stride, padding
):
    # Keras' layer, run eagerly (TensorFlow's own kernels), is the reference: the same outputs
    # for odd and even sizes, the same input gradient, and the same Hessian-vector products of
    # Σ w·pool(x)² both ways Fast-BAT takes them (backward and forward over backward), which
    # under XLA Keras' layer gets wrong (its second derivative compares at bfloat16 precision).
    rng = np.random.default_rng(0)
    ours = layers.MaxPooling2D(pool, strides=stride, padding=padding)
    keras_own = keras.layers.MaxPooling2D(pool, strides=stride, padding=padding)

    def products(layer, x, u):
        weights = tf.cast(tf.range(tf.size(layer(x))), x.dtype)

        def f(t):
            out = layer(t)
            return tf.reduce_sum(tf.reshape(weights, tf.shape(out)) * out**2)

        with tf.GradientTape() as outer:
            outer.watch(x)
            with tf.GradientTape() as inner:
                inner.watch(x)
                value = f(x)
            gradient = inner.gradient(value, x)
            backward = tf.reduce_sum(gradient * u)
        with tf.autodiff.ForwardAccumulator(x, u) as accumulator:
            with tf.GradientTape() as tape:
                tape.watch(x)
                value = f(x)
            forward = accumulator.jvp(tape.gradient(value, x))
        return gradient, outer.gradient(backward, x), forward

    for height, width in ((9, 8), (8, 7), (28, 28)):
        x = tf.constant(rng.normal(size=(2, height, width, 3)), tf.float32)
        u = tf.constant(rng.normal(size=x.shape), tf.float32)
        np.testing.assert_array_equal(ours(x), keras_own(x))
        expected = products(keras_own, x, u)
        for computed in (products(ours, x, u), tf.function(products, jit_compile=True)(ours, x, u)):
            for got, want in zip(computed, expected, strict=True):
                np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * np.abs(want).max())
    # Channels first, and a spatial size known only when it runs.
    x = tf.constant(rng.normal(size=(2, 3, 9, 8)), tf.float32)
    first = layers.MaxPooling2D(pool, strides=stride, padding=padding, data_format="channels_first")
    np.testing.assert_array_equal(
        first(x), tf.transpose(keras_own(tf.transpose(x, (0, 2, 3, 1))), (0, 3, 1, 2))
    )
    unknown = tf.function(ours, input_signature=[tf.TensorSpec([None, None, None, 3])])
    x = tf.constant(rng.normal(size=(1, 11, 6, 3)), tf.float32)
    np.testing.assert_array_equal(unknown(x), keras_own(x))


@pytest.mark.slow
def test_second_order_gradient_matches_finite_differences():
    # Directional derivative of f(θ) = ⟨∇x Σ CE, v⟩ along a random unit direction u, against a
    # central difference, with batch norm in training mode as the training-time attacks run it.
    # Swish makes f smooth in θ; PreActResNet has no max pooling, whose kinks would spoil the
    # difference quotient. With keras.layers.BatchNormalization instead the error is 10-75%
    # (seeds 0-3): its batch variance stops the gradient through the mean.
    keras.utils.set_random_seed(0)
    model = models.build("preact_resnet18", 10, (16, 16, 3), 0.5, 0.25, "swish", width=4)
    compute = mixed_second_derivative_fn(model, training=True)
    rng = np.random.default_rng(2)
    x = random_pixels((4, 16, 16, 3))
    y = np.arange(4)
    v = rng.normal(size=x.shape).astype(np.float32)
    _, grads = compute(x, y, v)
    assert len(grads) == len(model.trainable_variables)
    assert all(np.all(np.isfinite(g.numpy())) for g in grads)
    variables = model.trainable_variables
    direction = [rng.normal(size=w.shape) for w in variables]
    norm = np.sqrt(sum(np.sum(d**2) for d in direction))
    direction = [d / norm for d in direction]
    analytic = sum(
        np.sum(g.numpy().astype(np.float64) * d) for g, d in zip(grads, direction, strict=True)
    )

    originals = [w.numpy() for w in variables]
    step = 1e-2

    def f_at(offset: float) -> float:
        for w, w0, d in zip(variables, originals, direction, strict=True):
            w.assign((w0 + offset * d).astype(np.float32))
        return float(compute(x, y, v)[0])

    numeric = (f_at(step) - f_at(-step)) / (2 * step)
    for w, w0 in zip(variables, originals, strict=True):
        w.assign(w0)
    assert abs(analytic) > 1e-4
    np.testing.assert_allclose(analytic, numeric, rtol=1e-2)


@pytest.mark.parametrize("mixed_policy", ["mixed_float16", "mixed_bfloat16"], indirect=True)
def test_mixed_precision_logits_are_float32(mixed_policy):
    for name, first_conv in (("preact_resnet18", "stem_conv"), ("small_cnn", "block1_conv")):
        input_shape, width, activation, kwargs = TINY[name]
        model = models.build(name, 10, input_shape, 0.5, 0.25, activation, width, **kwargs)
        # The policy took effect (16-bit convolutions), yet the logits are float32.
        assert model.get_layer(first_conv).compute_dtype == mixed_policy.removeprefix("mixed_")
        assert model(random_pixels((2, *input_shape))).dtype == tf.float32


@pytest.mark.slow
@pytest.mark.parametrize("mixed_policy", ["mixed_float16", "mixed_bfloat16"], indirect=True)
def test_second_order_gradient_under_mixed_precision(mixed_policy):
    # small_cnn has max pooling, which stays in float32 under the mixed policies.
    model = models.build("small_cnn", 10, (28, 28, 1), 0.5, 0.25, "swish", width=4)
    x = random_pixels((4, 28, 28, 1))
    _, grads = mixed_second_derivative_fn(model, training=True)(x, np.arange(4), np.ones_like(x))
    grads = [tf.cast(g, tf.float32) for g in grads]
    assert all(np.all(np.isfinite(g.numpy())) for g in grads)
    assert float(tf.linalg.global_norm(grads)) > 0.0


def test_batch_norm_second_derivative_matches_finite_differences():
    # Hessian-vector product of L(x) = Σ c ⊙ sin(BN(x)) with training-mode batch statistics,
    # in float64, against a central difference of the gradient.
    layer = BatchNormalization(epsilon=1e-5, dtype="float64")
    rng = np.random.default_rng(3)
    x = tf.constant(rng.normal(size=(6, 3)))
    c = tf.constant(rng.normal(size=(6, 3)))
    v = tf.constant(rng.normal(size=(6, 3)))

    def gradient(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(c * tf.sin(layer(x, training=True)))
        return tape.gradient(loss, x)

    with tf.GradientTape() as outer:
        outer.watch(x)
        directional = tf.reduce_sum(gradient(x) * v)
    hessian_vector = outer.gradient(directional, x)
    step = 1e-5
    numeric = (gradient(x + step * v) - gradient(x - step * v)) / (2 * step)
    np.testing.assert_allclose(hessian_vector.numpy(), numeric.numpy(), rtol=1e-6, atol=1e-8)


def test_batch_norm_matches_keras_to_first_order():
    # Same outputs, moving statistics and input-gradients as keras.layers.BatchNormalization.
    x = tf.constant(np.random.default_rng(4).normal(size=(5, 4, 4, 3)), tf.float32)
    ours = BatchNormalization(momentum=0.9, epsilon=1e-5)
    reference = keras.layers.BatchNormalization(momentum=0.9, epsilon=1e-5)
    results = []
    for layer in (ours, reference):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x, training=True)
            loss = tf.reduce_sum(tf.sin(y))
        results.append([y, tape.gradient(loss, x), layer.moving_mean, layer.moving_variance])
    for a, b in zip(*results, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)


def test_softplus_model_round_trips_through_its_config():
    model = models.build("small_cnn", 10, (12, 12, 1), 0.5, 0.25, "softplus", width=4)
    clone = keras.Model.from_config(model.get_config())
    clone.set_weights(model.get_weights())
    x = random_pixels((2, 12, 12, 1))
    np.testing.assert_allclose(clone(x).numpy(), model(x).numpy(), rtol=1e-6, atol=1e-6)


def test_unknown_name_is_rejected():
    with pytest.raises(ValueError, match="resnet_9000") as error:
        models.build("resnet_9000", 10, (32, 32, 3), 0.5, 0.25)
    assert "preact_resnet18" in str(error.value)


def test_unknown_activation_is_rejected():
    with pytest.raises(ValueError, match="gelu") as error:
        models.build("small_cnn", 10, (28, 28, 1), 0.5, 0.25, activation="gelu")
    assert "softplus" in str(error.value)


@pytest.mark.parametrize("depth", [27, 4, 30])
def test_wide_resnet_depth_must_be_6n_plus_4(depth):
    with pytest.raises(ValueError, match=f"6n\\+4.*{depth}"):
        models.build("wide_resnet", 10, (32, 32, 3), 0.5, 0.25, depth=depth, widen_factor=1)


def test_named_wide_resnet_rejects_a_conflicting_depth():
    with pytest.raises(ValueError, match="depth=34"):
        models.build("wide_resnet28_10", 10, (32, 32, 3), 0.5, 0.25, depth=34)


def test_mean_and_std_must_match_the_channels():
    with pytest.raises(ValueError, match="mean"):
        models.build("small_cnn", 10, (28, 28, 1), CIFAR_MEAN, 0.25)
    with pytest.raises(ValueError, match="std"):
        models.build("small_cnn", 10, (28, 28, 1), 0.5, 0.0)
