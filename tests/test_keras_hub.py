"""A keras-hub image classifier through the library, as BUILD.md's "keras-hub" shows for a
preset: a small `keras_hub.models.ResNetImageClassifier` built from a config (random weights, no
download), with a preprocessor like a preset's (resize to the backbone's size, standardize
pixels in [0, 255]) put inside the model so that it takes raw pixels in [0, 1]. It trains a few
Fast-BAT steps with `AdversarialTrainer` on Fashion-MNIST (tiled to RGB), which switches its
nested batch norms, max pooling and resize; PGD evaluates it; it is exported as a SavedModel
that a fresh process loads without fbat_tf or keras-hub.

keras-hub is an optional extra (`pip install -e ".[hub]"`, also in `.[dev]`); without it this
file is skipped with the reason.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from export.savedmodel import export_model
from fbat_tf import data, methods
from fbat_tf.attacks.pgd import PGD
from fbat_tf.evaluation import evaluate
from fbat_tf.models import layers
from fbat_tf.trainer import AdversarialTrainer
from tests.reference import mixed_second_derivative_fn

keras_hub = pytest.importorskip(
    "keras_hub", reason='keras-hub is not installed (pip install -e ".[hub]")'
)

EPS = 8 / 255
# ImageNet's mean and standard deviation, as keras-hub's ResNet presets standardize.
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
# The backbone's input size; Fashion-MNIST's 28x28 images are resized to it inside the model, as
# a preset resizes to 224x224.
SIZE = 32


def hub_classifier():
    """A one-block ResNet (keras-hub's smallest: the first stack has 64 filters) with a
    preprocessor as a preset has one."""
    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.ResNetBackbone(
        input_conv_filters=[64],
        input_conv_kernel_sizes=[3],
        stackwise_num_filters=[64],
        stackwise_num_blocks=[1],
        stackwise_num_strides=[1],
        block_type="basic_block",
        image_shape=(SIZE, SIZE, 3),
    )
    converter = keras_hub.layers.ResNetImageConverter(
        image_size=(SIZE, SIZE),
        scale=[1 / (255 * s) for s in STD],
        offset=[-m / s for m, s in zip(MEAN, STD, strict=True)],
    )
    preprocessor = keras_hub.models.ResNetImageClassifierPreprocessor(converter)
    return keras_hub.models.ResNetImageClassifier(
        backbone=backbone, num_classes=10, preprocessor=preprocessor, activation=None
    )


def on_pixels(classifier) -> keras.Model:
    """BUILD.md's adapter: raw pixels in [0, 1] in, the classifier's preprocessing inside, logits
    out. keras-hub runs the preprocessor in its own fit and predict, not in the model's call,
    which is what the trainer and the attacks differentiate."""
    pixels = keras.Input((28, 28, 3))
    converted = classifier.preprocessor.image_converter(keras.layers.Rescaling(255.0)(pixels))
    return keras.Model(pixels, classifier(converted))


def fashion_mnist(split: str, batch_size: int, examples: int) -> tf.data.Dataset:
    dataset = data.load(
        "fashion_mnist", split, batch_size=batch_size, max_examples=examples, download=False
    )
    return dataset.map(lambda x, y: (tf.image.grayscale_to_rgb(x), y))


class Messages(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.text = []

    def emit(self, record):
        self.text.append(record.getMessage())


# The module's fixtures are built once for all its tests: pytest-xdist runs them on one worker
# (--dist loadgroup, pyproject.toml).
pytestmark = [pytest.mark.xdist_group("keras_hub"), pytest.mark.slow]


@pytest.fixture(scope="module")
def trained():
    """The model, its weights before, the trainer's warnings and the fit's history: four Fast-BAT
    steps, XLA on (the trainer's default)."""
    model = on_pixels(hub_classifier())
    before = [w.numpy().copy() for w in model.trainable_variables]
    messages = Messages()
    logging.getLogger().addHandler(messages)
    try:
        trainer = AdversarialTrainer(model, methods.create("fastbat", eps=EPS))
    finally:
        logging.getLogger().removeHandler(messages)
    trainer.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9))
    history = trainer.fit(fashion_mnist("train", 32, 128), epochs=1, shuffle=False, verbose=0)
    return model, before, messages.text, history.history


def test_the_classifier_answers_logits_of_the_head_it_was_given():
    classifier = hub_classifier()
    assert classifier.activation is None
    x = next(iter(fashion_mnist("test", 8, 8)))[0]
    logits = on_pixels(classifier)(x)
    assert logits.shape == (8, 10)
    assert not np.allclose(np.sum(np.exp(logits), axis=-1), 1.0)  # not probabilities


def test_the_trainer_switches_the_nested_layers_and_names_them(trained):
    model, _, warnings, _ = trained
    (warning,) = [text for text in warnings if "differentiates input gradients again" in text]
    classifier = model.layers[-1]
    backbone = classifier.backbone
    switched = {
        "conv1_bn": backbone.get_layer("conv1_bn"),
        "stack0_block0_1_bn": backbone.get_layer("stack0_block0_1_bn"),
        "stack0_block0_2_bn": backbone.get_layer("stack0_block0_2_bn"),
        "pool1_pool": backbone.get_layer("pool1_pool"),
        "resizing": classifier.preprocessor.image_converter.resizing,
    }
    for name, layer in switched.items():
        assert f"{name} ({type(layer).__bases__[0].__name__})" in warning
        assert type(layer).__module__.startswith("fbat_tf.models"), name
    assert "more" not in warning  # five layers, all named
    assert isinstance(switched["resizing"], layers.Resizing)


def test_fast_bat_trains_it_with_its_implicit_term(trained):
    model, before, _, history = trained
    assert np.isfinite(history["loss"][-1])
    assert history["nonfinite_batches"][-1] == 0
    # Through Keras' bilinear resize the implicit term was silently zero.
    assert history["ig_norm_ratio"][-1] > 1e-4
    after = [w.numpy() for w in model.trainable_variables]
    assert all(not np.array_equal(a, b) for a, b in zip(before, after, strict=True))


def second_derivative(model, x, y, v, jit_compile):
    """∇θ⟨∇x Σ CE, v⟩ in training mode, what Fast-BAT's implicit term differentiates; None
    where a weight does not reach it."""

    _, grads = mixed_second_derivative_fn(model, True, jit_compile)(x, y, v)
    return [None if g is None else np.asarray(g, np.float64).ravel() for g in grads]


def test_switched_layers_give_second_derivatives_keras_drops_and_xla_agrees():
    model = on_pixels(hub_classifier())
    x, y = next(iter(fashion_mnist("test", 16, 16)))
    v = tf.constant(np.random.default_rng(1).normal(size=x.shape), tf.float32)
    # Keras' layers: the resize's gradient is not differentiable, so nothing reaches any weight.
    assert second_derivative(model, x, y, v, jit_compile=False) == [None] * len(
        model.trainable_variables
    )
    AdversarialTrainer(model, methods.create("fastbat", eps=EPS), jit_compile=True)
    eager = second_derivative(model, x, y, v, jit_compile=False)
    assert all(g is not None for g in eager), "a weight does not reach the second derivative"
    eager = np.concatenate(eager)
    compiled = np.concatenate(second_derivative(model, x, y, v, jit_compile=True))
    assert np.linalg.norm(eager) > 0
    # Keras' max pooling under XLA was 7% off here (bfloat16 comparisons).
    assert np.linalg.norm(compiled - eager) <= 1e-4 * np.linalg.norm(eager)


def test_pgd_evaluates_it_inside_the_eps_ball(trained):
    model = trained[0]
    test = fashion_mnist("test", 64, 64)
    attack = PGD(EPS, steps=10, restarts=1)
    result = evaluate(model, test, {("pgd", EPS): attack})
    assert result.robust_accuracy("pgd") <= result.clean_accuracy
    x, y = next(iter(test))
    x_adv, _ = attack(model, x, y, 0)
    assert float(tf.reduce_max(tf.abs(x_adv - x))) <= EPS + 1e-6
    assert float(tf.reduce_min(x_adv)) >= 0.0 and float(tf.reduce_max(x_adv)) <= 1.0
    fooled = np.argmax(model(x_adv), -1) != np.argmax(model(x), -1)
    assert fooled.any()  # the attack's gradient goes through keras-hub's layers


LOAD = r"""
import sys

import numpy as np
import tensorflow as tf

sys.modules["fbat_tf"] = None  # from here on, importing fbat_tf or keras_hub fails
sys.modules["keras_hub"] = None
served = tf.saved_model.load(sys.argv[1]).signatures["serving_default"]
np.save(sys.argv[3], served(images=tf.constant(np.load(sys.argv[2])))["logits"].numpy())
"""


def test_the_export_serves_its_logits_without_fbat_tf_or_keras_hub(trained, tmp_path):
    model = trained[0]
    x = next(iter(fashion_mnist("test", 16, 16)))[0].numpy()
    path = export_model(model, str(tmp_path / "export"), "fashion_mnist-keras_hub_resnet")
    np.save(tmp_path / "images.npy", x)
    (tmp_path / "load.py").write_text(LOAD)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("PYTHONPATH", None)
    done = subprocess.run(
        [sys.executable, "load.py", path, "images.npy", "logits.npy"],
        cwd=tmp_path,  # not the repository: fbat_tf is not importable from here
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    served = np.load(tmp_path / "logits.npy")
    np.testing.assert_allclose(served, model(x, training=False), atol=1e-4, rtol=0)
