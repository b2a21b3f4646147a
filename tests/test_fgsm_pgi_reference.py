"""FGSM-PGI's step, regularizer and per-example prior against a closed-form NumPy computation
(DESIGN.md §3.2).

The model is linear, z = flatten(x)·W + b, so everything the step needs is known in closed form:
∇x Σ_i CE_i = (softmax(z) − onehot(y))·Wᵀ, the CE's weight gradient (1/B)·(x + δ)ᵀ(p − onehot),
and the regularizer's, (2/(B·K))·(δ − δ0)ᵀ(z − z0) for the kernel and 0 for the bias (both
outputs depend on W; a regularizer that held the logits at the prior constant would give
(2/(B·K))·(x + δ)ᵀ(z − z0)). From `fbat_tf` only `methods.create`, the method and the trainer
are used; the released constants are written here as the release states them
(jiaxiaojunQAQ/FGSM-PGI, FGSM_MEP.py lines 22, 29, 32, 41, 42): λ = 10, μ = 0.3, α = ε, a
restart every 40 epochs.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from fbat_tf import methods
from fbat_tf.trainer import AdversarialTrainer

EPS = 8 / 255
IMAGE = (2, 3, 2)
D = int(np.prod(IMAGE))
K = 3
RELEASED = {"weight": 10.0, "decay": 0.3, "alpha": EPS, "reset": 40}


def _linear(seed: int = 0) -> keras.Model:
    model = keras.Sequential([keras.Input(IMAGE), keras.layers.Flatten(), keras.layers.Dense(K)])
    rng = np.random.default_rng(seed)
    model.layers[-1].set_weights(
        [2 * rng.normal(size=(D, K)).astype(np.float32), rng.normal(size=K).astype(np.float32)]
    )
    return model


def _images(n: int, seed: int = 1) -> np.ndarray:
    """n images in [0, 1], a fifth of the pixels at 0 and a fifth at 1 (the box clips)."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(0.05, 0.95, (n, *IMAGE))
    where = rng.uniform(size=x.shape)
    x[where < 0.2], x[where > 0.8] = 0.0, 1.0
    return x.astype(np.float32)


def _project(delta, x):
    return np.clip(np.clip(delta, -EPS, EPS), -x, 1 - x)


def _softmax(z):
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _reference_step(W, b, x, y, prior, momentum, visits, noise, c):
    """One step in closed form (float64), x and the rows flattened to [B, D]; `noise` the
    U[−ε, ε] draw of a restart; `c` the constants. Returns the step's values and new rows."""
    onehot = np.eye(K)[y]
    fresh = (visits % c["reset"] == 0)[:, None]
    start = _project(np.where(fresh, c["alpha"] * np.sign(noise), prior), x)
    momentum = np.where(fresh, 0.0, momentum)
    z0 = (x + start) @ W + b
    g = (_softmax(z0) - onehot) @ W.T
    m = g / np.abs(g).sum() + c["decay"] * momentum  # the L1 norm of the batch's gradient
    delta = _project(start + c["alpha"] * np.sign(g), x)
    following = _project(start + c["alpha"] * np.sign(m), x)
    z = (x + delta) @ W + b
    p = _softmax(z)
    batch = len(y)
    ce = np.mean(-np.log(p[np.arange(batch), y]))
    penalty = np.mean((z - z0) ** 2)
    kernel = (x + delta).T @ (p - onehot) / batch + c["weight"] * 2 / (batch * K) * (
        (delta - start).T @ (z - z0)
    )
    return {
        "delta": delta,
        "loss": ce + c["weight"] * penalty,
        "penalty": penalty,
        "grads": [kernel, np.mean(p - onehot, axis=0)],
        "rows": {"prior": following, "momentum": m, "visits": visits + 1},
    }


def _noise(shape, seed):
    """The restart's U[−ε, ε] draw of the step seed, flattened per example."""
    draw = tf.random.stateless_uniform(shape, seed, minval=-EPS, maxval=EPS)
    return draw.numpy().reshape(shape[0], -1).astype(np.float64)


def _flat(t) -> np.ndarray:
    t = np.asarray(t, np.float64)
    return t.reshape(t.shape[0], -1)


def test_a_step_and_its_regularizer_match_the_closed_form_at_the_released_defaults():
    """A batch of 4 of a split of 6, with priors beyond the ball (the projection matters),
    momenta as large as a step's normalized gradient (μ moves their signs), and visits 0, 39,
    40 and 1: the first and third restart at the released R = 40, the others not."""
    model = _linear()
    x_split = _images(6)
    rng = np.random.default_rng(2)
    method = methods.create("fgsm_pgi", eps=EPS)
    method.build((4, *IMAGE), examples=6)
    priors = rng.uniform(-1.5 * EPS, 1.5 * EPS, (6, *IMAGE)).astype(np.float32)
    momenta = (rng.normal(size=(6, *IMAGE)) / (4 * D)).astype(np.float32)
    visits = np.array([3, 7, 39, 0, 40, 1], np.int32)
    for name, value in (("prior", priors), ("momentum", momenta), ("visits", visits)):
        method.variables()[name].assign(value)
    indices = np.array([3, 2, 4, 5])
    x, y = tf.constant(x_split[indices]), tf.constant([0, 2, 1, 2], tf.int32)
    seed = tf.constant([4, 9], tf.int32)

    grads, logs = method.gradients(model, x, y, seed, indices=tf.constant(indices, tf.int64))
    W, b = (w.numpy().astype(np.float64) for w in model.trainable_variables)
    ref = _reference_step(
        W,
        b,
        _flat(x),
        y.numpy(),
        _flat(priors[indices]),
        _flat(momenta[indices]),
        visits[indices],
        _noise(tuple(x.shape), seed),
        RELEASED,
    )
    assert list(visits[indices] % 40 == 0) == [True, False, True, False]
    # Neither term is negligible: each default would show above the tolerances.
    assert 0.1 < RELEASED["weight"] * ref["penalty"] / ref["loss"] < 0.9
    for got, expected in zip(grads, ref["grads"], strict=True):
        np.testing.assert_allclose(got.numpy(), expected, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(float(logs["loss"]), ref["loss"], rtol=1e-5)
    np.testing.assert_allclose(float(logs["pgi_penalty"]), ref["penalty"], rtol=1e-5)
    x_adv = method.perturb(model, x, y, seed, indices=tf.constant(indices, tf.int64))
    np.testing.assert_allclose(_flat(x_adv - x), ref["delta"], atol=1e-6)
    assert np.abs(ref["delta"]).max() == pytest.approx(EPS)

    # The rows wait for the step to be applied; committed, they are the split's rows.
    state = {name: v.numpy().copy() for name, v in method.variables().items()}
    np.testing.assert_array_equal(state["visits"], visits)
    method.commit()
    rows = {name: _flat(v.numpy()[indices]) for name, v in method.variables().items()}
    np.testing.assert_allclose(rows["prior"], ref["rows"]["prior"], atol=1e-6)
    np.testing.assert_allclose(rows["momentum"], ref["rows"]["momentum"], rtol=1e-5, atol=1e-9)
    np.testing.assert_array_equal(rows["visits"][:, 0], ref["rows"]["visits"])
    others = [0, 1]  # not in the batch: untouched
    for name, value in method.variables().items():
        np.testing.assert_array_equal(value.numpy()[others], state[name][others])
    # The momentum's direction differs from the gradient's somewhere: the next prior is not the
    # training point.
    assert not np.allclose(ref["rows"]["prior"], ref["delta"])


def test_priors_over_visits_follow_a_numpy_loop_with_restarts():
    """Nine steps over a split of 5 in batches of 2 (each example visited three or four times),
    R = 3 (a restart at visits 0 and 3), the weights moved by each step's gradient (SGD, rate 1)
    on both sides: every row of the state after every step, and each step's loss, equal the
    closed-form loop's."""
    model = _linear(seed=3)
    x_split = _images(5, seed=4)
    y_split = np.array([0, 1, 2, 1, 0])
    method = methods.create("fgsm_pgi", eps=EPS, reset=3)
    method.build((2, *IMAGE), examples=5)
    constants = {**RELEASED, "reset": 3}
    W, b = (w.numpy().astype(np.float64) for w in model.trainable_variables)
    prior, momentum = np.zeros((5, D)), np.zeros((5, D))
    visits = np.zeros(5, np.int64)
    optimizer = keras.optimizers.SGD(1.0)
    order = [[0, 1], [2, 3], [4, 0], [1, 2], [3, 4], [0, 1], [2, 3], [4, 0], [1, 2]]
    restarts = 0
    for step, rows in enumerate(order):
        seed = tf.constant([step, 1], tf.int32)
        x = tf.constant(x_split[rows])
        grads, logs = method.gradients(
            model, x, tf.constant(y_split[rows], tf.int32), seed, indices=tf.constant(rows)
        )
        ref = _reference_step(
            W,
            b,
            _flat(x),
            y_split[rows],
            prior[rows],
            momentum[rows],
            visits[rows],
            _noise(tuple(x.shape), seed),
            constants,
        )
        restarts += int(np.sum(visits[rows] % 3 == 0))
        np.testing.assert_allclose(float(logs["loss"]), ref["loss"], rtol=1e-5)
        method.commit()
        optimizer.apply(grads, model.trainable_variables)
        W, b = W - ref["grads"][0], b - ref["grads"][1]
        prior[rows] = ref["rows"]["prior"]
        momentum[rows] = ref["rows"]["momentum"]
        visits[rows] = ref["rows"]["visits"]
        state = method.variables()
        np.testing.assert_allclose(_flat(state["prior"].numpy()), prior, atol=1e-6)
        np.testing.assert_allclose(_flat(state["momentum"].numpy()), momentum, rtol=1e-4, atol=1e-8)
        np.testing.assert_array_equal(state["visits"].numpy(), visits)
    assert restarts == 5 + 3  # every first visit, and the fourth of examples 0, 1 and 2
    assert list(visits) == [4, 4, 4, 3, 3]


def test_a_zero_input_gradient_adds_nothing_to_the_momentum():
    """Where the batch's whole input gradient is 0 (a model constant in x), the momentum stays
    0 (not 0/0) and the prior is the restart's corner, unchanged."""
    model = keras.Sequential([keras.Input(IMAGE), keras.layers.Flatten(), keras.layers.Dense(K)])
    model.layers[-1].set_weights([np.zeros((D, K), np.float32), np.ones(K, np.float32)])
    method = methods.create("fgsm_pgi", eps=EPS)
    method.build((2, *IMAGE))
    x = tf.constant(_images(2))
    grads, logs = method.gradients(model, x, tf.constant([0, 1]), tf.constant([1, 1]))
    method.commit()
    assert np.isfinite(float(logs["loss"]))
    assert np.all(method.variables()["momentum"].numpy() == 0.0)
    prior = method.variables()["prior"].numpy()
    corner = np.sign(_noise(tuple(x.shape), tf.constant([1, 1]))).reshape(prior.shape) * EPS
    np.testing.assert_allclose(prior, _project(corner, x.numpy()), atol=1e-7)


def test_the_trainer_hands_over_the_batch_s_indices_and_writes_only_applied_rows():
    """Three batches of a split of 6 whose indices come with them, in shuffled order; the
    second batch (examples 1 and 0) holds a NaN pixel, so it is skipped: its two examples keep
    visits 0 and their zero prior, the four others are visited once and carry a prior."""
    x_split = _images(6)
    indices = np.array([5, 3, 1, 0, 2, 4])
    x = x_split[indices].copy()
    x[2, 0, 0, 0] = np.nan  # example 1's, in the second batch
    y = np.array([0, 1, 2, 0, 1, 2], np.int32)
    dataset = tf.data.Dataset.from_tensor_slices((x, y, indices.astype(np.int64))).batch(2)
    method = methods.create("fgsm_pgi", eps=EPS)
    method.build((2, *IMAGE), examples=6)
    trainer = AdversarialTrainer(_linear(), method, weight_decay=0.0, jit_compile=False)
    trainer.compile(optimizer=keras.optimizers.SGD(0.1))
    trainer.fit(dataset, epochs=1, verbose=0)
    assert int(trainer.nonfinite_batches.numpy()) == 1
    state = {name: v.numpy() for name, v in method.variables().items()}
    np.testing.assert_array_equal(state["visits"], [0, 0, 1, 1, 1, 1])
    assert np.all(np.isfinite(state["prior"])) and np.all(np.isfinite(state["momentum"]))
    for example in range(6):
        assert (np.abs(state["prior"][example]).max() > 0) == (example not in (0, 1)), example
