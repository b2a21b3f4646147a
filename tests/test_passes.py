"""What a training step costs in passes through the model, counted on the model itself for every
method and compared with what the method declares (its registry entry, fbat_tf.methods).

A probe at the model's output counts, in eager execution: each forward pass (a call of the
model); each backward pass (the gradient of a loss of the outputs flowing back into them); and
each second-order pass (a gradient flowing back through a recorded backward pass, as double
backpropagation makes one), since the probe's own backward step is recorded by an outer tape.
A pass is a batch of B examples: a call on k·B examples (ELLE's three triplet points in one
batch) counts as k passes of each kind it makes.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from fbat_tf import catalog, methods

EPS = 8.0 / 255
SHAPE = (6, 6, 2)
BATCH = 4


class Probe(keras.layers.Layer):
    """The identity, counting the passes that go through it."""

    def __init__(self, counts: dict[str, int], **kwargs):
        super().__init__(**kwargs)
        # Held by a plain function, so that Keras does not track (and copy) the dict.
        self.tally = lambda: counts

    def call(self, logits):
        counts = self.tally()
        batches = _batches(logits)
        counts["forward"] += batches

        @tf.custom_gradient
        def through_backward(cotangent):
            def second_order(upstream):
                counts["second_order"] += batches
                return upstream

            return tf.identity(cotangent), second_order

        @tf.custom_gradient
        def through_forward(outputs):
            def backward(cotangent):
                counts["backward"] += batches
                return through_backward(cotangent)

            return tf.identity(outputs), backward

        return through_forward(logits)


def _batches(logits) -> int:
    """How many batches of BATCH examples a call carries (1 while Keras builds the model on a
    symbolic batch; steps run eagerly, their shapes known)."""
    if logits.shape[0] is None:
        return 1
    examples = int(logits.shape[0])
    assert examples % BATCH == 0, examples
    return examples // BATCH


def counted_model(counts: dict[str, int]) -> keras.Model:
    keras.utils.set_random_seed(2)
    inputs = keras.Input(SHAPE)
    h = keras.layers.Conv2D(3, 3, padding="same", activation="softplus")(inputs)
    h = keras.layers.GlobalAveragePooling2D()(h)
    return keras.Model(inputs, Probe(counts)(keras.layers.Dense(3)(h)))


VARIANTS = [
    ("standard", {}),
    ("fastat", {}),
    ("nfgsm", {}),
    ("fastat_ga", {}),
    ("pgd", {"steps": 2}),
    ("pgd", {"steps": 5}),
    ("free", {"replays": 4}),
    ("fastbat", {"implicit_autodiff": "backward_over_backward"}),
    ("fastbat", {"ig": "none"}),
    ("fastbat", {"ig": "hessian_aware", "cg_steps": 2}),
    ("fastbat", {"linearization": "uniform"}),
    ("fastbat", {"ig": "none", "linearization": "corner"}),
    ("elle", {}),
    ("elle", {"schedule": "constant", "attack": "nfgsm"}),
    ("elle", {"attack": "none"}),
    ("fgsm_pgi", {}),
]


@pytest.mark.parametrize(("name", "options"), VARIANTS, ids=[f"{n}{o}" for n, o in VARIANTS])
def test_each_methods_step_makes_the_passes_it_declares(name, options):
    counts = dict.fromkeys(catalog.PASS_KINDS, 0)
    model = counted_model(counts)
    rng = np.random.default_rng(0)
    x = tf.constant(rng.uniform(0, 1, (BATCH, *SHAPE)).astype(np.float32))
    y = tf.constant(rng.integers(0, 3, BATCH), tf.int32)
    method = methods.create(name, eps=EPS, **options)
    method.build((BATCH, *SHAPE))
    counts.update(dict.fromkeys(catalog.PASS_KINDS, 0))  # building the model called it
    grads, _ = method.gradients(model, x, y, tf.constant([1, 2], tf.int32))
    assert all(g is not None for g in grads)
    assert counts == method.passes, (name, options)


def test_forward_over_backward_makes_the_forward_passes_it_declares():
    """Forward mode carries tangents the probe cannot see; its model calls are counted."""
    counts = dict.fromkeys(catalog.PASS_KINDS, 0)
    model = counted_model(counts)
    x = tf.random.stateless_uniform((BATCH, *SHAPE), [0, 1])
    y = tf.constant([0, 1, 2, 0], tf.int32)
    for options, declared in (({}, (4, 4, 0, 2)), ({"ig": "hessian_aware", "cg_steps": 2}, None)):
        method = methods.create(
            "fastbat", eps=EPS, implicit_autodiff="forward_over_backward", **options
        )
        counts.update(dict.fromkeys(catalog.PASS_KINDS, 0))
        method.gradients(model, x, y, tf.constant([1, 2], tf.int32))
        assert counts["forward"] == method.passes["forward"], options
        if declared is not None:
            assert tuple(method.passes[k] for k in catalog.PASS_KINDS) == declared


def test_a_runs_recorded_config_prices_as_the_method_itself():
    """The report prices runs by their recorded method config, older ones included: the same
    counts as the method object gives, and the counts behind the cost ratios."""
    assert {name for name, _ in VARIANTS} == set(methods.names())  # every method is counted
    for name, options in VARIANTS:
        method = methods.create(name, eps=EPS, **options)
        assert methods.passes(name, method.config()) == method.passes
    variants = [
        ("fastat", {}),
        ("pgd", {"steps": 2}),
        ("fastbat", {"ig": "none"}),
        ("fastbat", {}),
        ("elle", {"attack": "none"}),
        ("elle", {}),
        ("fgsm_pgi", {}),
    ]
    totals = [catalog.total_passes(methods.passes(name, config)) for name, config in variants]
    assert totals == [4, 6, 6, 8, 8, 10, 5]
