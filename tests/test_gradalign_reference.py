"""Fast-AT + GradAlign's `gradients` against an independent computation of DESIGN.md §3.

What it is checked against:

- FGSM from δ0 = 0 (α = 1.25ε) plus the GradAlign term
  ga_coef · (1 − mean_i cos(∇x CE_i(x), ∇x CE_i(x+η))), recomputed here with plain
  `tf.GradientTape`s (double backprop through the noisy gradient), on a dense softplus model
  and a conv model with batch norm, in float64 and float32;
- the GradAlign term's θ-gradient against central finite differences (float64, every weight);
- the default ga_coef against the closed form: 0.2 at ε ≤ 8/255, 2.0 at ε ≥ 16/255,
  0.2·10^((255ε − 8)/8) in between.

Nothing from `fbat_tf` is used except `methods.create` and the method's `gradients`.

    python -m pytest tests/test_gradalign_reference.py -q
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import tensorflow as tf

from fbat_tf import methods
from tests.reference import (
    assert_grads_close,
    case_setup,
    finite_difference,
    global_norm,
    per_example_ce,
    project,
)

RTOL = {"float64": 1e-5, "float32": 1e-4}
SEED = (11, 5)
EPS = 0.1
GA_COEF = 5.0  # large enough that the GradAlign term is a good share of the gradient


# --------------------------------------------------------------------------- models, data


_setup = case_setup


def _seed(pair: tuple[int, int] = SEED) -> tf.Tensor:
    return tf.constant(pair, dtype=tf.int32)


# --------------------------------------------------------------------------- reference


def _input_gradient(model, inputs, y):
    """∇x Σ_i CE_i(θ, inputs); recorded on any enclosing tape."""
    with tf.GradientTape() as tape:
        tape.watch(inputs)
        ce, _ = per_example_ce(model, inputs, y)
        total = tf.reduce_sum(ce)
    return tape.gradient(total, inputs)


def _misalignment(clean_gradient, noisy_gradient):
    """1 − mean_i cos(flattened clean_i, flattened noisy_i)."""
    batch = tf.shape(clean_gradient)[0]
    a = tf.reshape(clean_gradient, [batch, -1])
    b = tf.reshape(noisy_gradient, [batch, -1])
    cos = tf.reduce_sum(a * b, axis=1) / (tf.norm(a, axis=1) * tf.norm(b, axis=1))
    return 1.0 - tf.reduce_mean(cos)


@dataclasses.dataclass
class Reference:
    clean_gradient: tf.Tensor
    noisy_input: tf.Tensor
    ce_loss: float
    misalignment: float
    loss: float
    ce_gradient: list
    misalignment_gradient: list
    adv_accuracy: float


def _reference(model, x, y, seed, *, eps, ga_coef) -> Reference:
    clean_gradient = _input_gradient(model, x, y)  # = ∇δ Σ CE(x+δ) at δ = 0; a constant
    delta = project(1.25 * eps * tf.sign(clean_gradient), x, eps)
    draw = tf.random.stateless_uniform(
        tf.shape(x), seed=seed, minval=-eps, maxval=eps, dtype=x.dtype
    )
    noisy_input = x + project(draw, x, eps)
    with tf.GradientTape(persistent=True) as tape:
        ce, logits = per_example_ce(model, x + delta, y)
        ce_loss = tf.reduce_mean(ce)
        misalignment = _misalignment(clean_gradient, _input_gradient(model, noisy_input, y))
    ce_gradient = tape.gradient(ce_loss, model.trainable_variables)
    misalignment_gradient = tape.gradient(misalignment, model.trainable_variables)
    del tape
    correct = tf.equal(tf.argmax(logits, axis=-1, output_type=tf.int32), y)
    return Reference(
        clean_gradient=clean_gradient,
        noisy_input=noisy_input,
        ce_loss=float(ce_loss),
        misalignment=float(misalignment),
        loss=float(ce_loss) + ga_coef * float(misalignment),
        ce_gradient=ce_gradient,
        misalignment_gradient=misalignment_gradient,
        adv_accuracy=float(tf.reduce_mean(tf.cast(correct, tf.float64))),
    )


def _as_arrays(grads):
    return [np.asarray(tf.convert_to_tensor(g)) for g in grads]


# --------------------------------------------------------------------------- tests


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("case", ["dense", "conv"])
def test_gradalign_matches_reference(case, dtype):
    model, x, y = _setup(case, dtype)
    ga_coef = GA_COEF
    method = methods.create("fastat_ga", eps=EPS, ga_coef=ga_coef)
    grads, logs = method.gradients(model, x, y, _seed())

    ref = _reference(model, x, y, _seed(), eps=EPS, ga_coef=ga_coef)
    # The GradAlign term must weigh in, or an error in it would hide under the tolerance.
    ratio = ga_coef * global_norm(ref.misalignment_gradient) / global_norm(ref.ce_gradient)
    assert ratio > 0.1, ratio
    assert ref.misalignment > 1e-3, ref.misalignment

    rtol = RTOL[dtype]
    expected = [
        a + ga_coef * b for a, b in zip(ref.ce_gradient, ref.misalignment_gradient, strict=True)
    ]
    assert_grads_close(grads, expected, rtol)
    np.testing.assert_allclose(float(logs["loss"]), ref.loss, rtol=rtol)
    assert float(logs["adv_accuracy"]) == pytest.approx(ref.adv_accuracy, abs=1e-6)
    assert float(logs["ga_coef"]) == pytest.approx(ga_coef, rel=1e-6)


def test_conv_case_is_sensitive_to_training_mode():
    """Batch norm in train mode differs from inference mode here, so the conv comparison
    above also checks that every forward pass uses `training=True`."""
    model, x, _ = _setup("conv", "float64")
    difference = model(x, training=True) - model(x, training=False)
    assert float(tf.reduce_max(tf.abs(difference))) > 1e-2


def test_gradalign_term_matches_finite_difference():
    model, x, y = _setup("dense", "float64")

    def step(ga_coef):
        method = methods.create("fastat_ga", eps=EPS, ga_coef=ga_coef)
        grads, _ = method.gradients(model, x, y, _seed())
        return _as_arrays(grads)

    # The FGSM point and η do not depend on ga_coef, so the difference is the term alone.
    term_gradient = [b - a for a, b in zip(step(1.0), step(2.0), strict=True)]

    ref = _reference(model, x, y, _seed(), eps=EPS, ga_coef=1.0)

    def misalignment():
        # ∇x CE at x stays at its value for the unperturbed weights (a constant).
        noisy = _input_gradient(model, ref.noisy_input, y)
        return float(_misalignment(ref.clean_gradient, noisy))

    numeric = finite_difference(model, misalignment, step=1e-5)
    # The reference's own double backprop agrees with finite differences ...
    assert_grads_close(ref.misalignment_gradient, numeric, rtol=1e-6)
    # ... and so does the method's.
    assert_grads_close(term_gradient, numeric, rtol=1e-6)


@pytest.mark.parametrize(
    ("eps_255", "expected"),
    [
        (4, 0.2),
        (8, 0.2),
        (10, 0.2 * 10 ** (2 / 8)),
        (12, 0.2 * math.sqrt(10)),
        (16, 2.0),
        (32, 2.0),
    ],
)
def test_default_ga_coef(eps_255, expected):
    model, x, y = _setup("dense", "float32")
    method = methods.create("fastat_ga", eps=eps_255 / 255)
    _, logs = method.gradients(model, x, y, _seed())
    assert float(logs["ga_coef"]) == pytest.approx(expected, rel=1e-5)
