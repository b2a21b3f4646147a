"""The cyclic momentum against the closed form of PyTorch's CyclicLR with its defaults
(triangular, cycle_momentum from max_momentum 0.9 down to base_momentum 0.8), step by step."""

from __future__ import annotations

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from fbat_tf import schedules


def cyclic_lr_closed_form(t, *, up, down, base_lr, max_lr, base_momentum, max_momentum):
    """CyclicLR's learning rate and momentum after t scheduler steps (its documented formula)."""
    total = up + down
    ratio = up / total
    cycle = math.floor(1 + t / total)
    x = 1.0 + t / total - cycle
    scale = x / ratio if x <= ratio else (x - 1) / (ratio - 1)
    lr = base_lr + (max_lr - base_lr) * scale
    momentum = max_momentum - (max_momentum - base_momentum) * scale
    return lr, momentum


def test_cyclic_momentum_follows_pytorch_cyclic_lr_at_every_step():
    steps_per_epoch, epochs, lr_max = 7, 4, 0.2
    total = steps_per_epoch * epochs
    optimizer = schedules.CyclicMomentumSGD(
        schedules.Cyclic(lr_max, total), momentum=0.9, momentum_at_peak=0.8
    )
    weights = keras.Variable(np.zeros(3), dtype="float64")
    optimizer.build([weights])
    gradients = np.random.default_rng(0).normal(size=(total, 3))

    velocity = np.zeros(3)
    expected = np.zeros(3)
    momenta = []
    for t in range(total):
        lr, momentum = cyclic_lr_closed_form(
            t,
            up=total // 2,
            down=total - total // 2,
            base_lr=0.0,
            max_lr=lr_max,
            base_momentum=0.8,
            max_momentum=0.9,
        )
        momenta.append(momentum)
        assert float(optimizer.momentum_at(tf.constant(lr, tf.float64))) == pytest.approx(momentum)
        # v ← μ(t)·v − lr(t)·g, θ ← θ + v, with CyclicLR's lr(t) and μ(t).
        velocity = momentum * velocity - lr * gradients[t]
        expected = expected + velocity
        optimizer.apply([tf.constant(gradients[t])], [weights])
        np.testing.assert_allclose(weights.numpy(), expected, rtol=1e-6, atol=1e-12)
    # The schedule reaches both ends: 0.9 at lr 0, 0.8 at the peak.
    assert momenta[0] == pytest.approx(0.9) and min(momenta) == pytest.approx(0.8)


def test_cyclic_momentum_needs_the_cyclic_schedule():
    with pytest.raises(ValueError, match="cyclic"):
        schedules.CyclicMomentumSGD(0.1, momentum=0.9, momentum_at_peak=0.8)
