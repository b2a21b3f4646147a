"""The perturbation set C = {δ : ‖δ‖∞ ≤ ε, 0 ≤ x + δ ≤ 1}.

One projection for the whole project: every method and attack draws its random start with
`random_init`, projects with `project`, and Fast-BAT reads the inactive-constraint mask H_C
with `inactive_mask`.

    delta = random_init(x, eps, seed)            # P_C(U[-ε, ε]^d)
    delta = project(delta + step * grad, x, eps)
    mask = inactive_mask(delta, x, eps)          # 1 where neither bound is active
    check_in_ball(x_adv, x, eps)                 # raise unless x_adv lies in x + C
    seed = as_seed(3)                            # [3, 0]: a stateless seed from an int
"""

from __future__ import annotations

import tensorflow as tf


def project(delta: tf.Tensor, x: tf.Tensor, eps: float | tf.Tensor) -> tf.Tensor:
    """P_C: clip δ to [-ε, ε], then to [-x, 1 - x] so that x + δ stays in [0, 1]."""
    delta = tf.clip_by_value(delta, -eps, eps)
    return tf.clip_by_value(delta, -x, 1.0 - x)


def delta_bounds(x: tf.Tensor, eps: float | tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """(lower, upper) with P_C(δ) = clip(δ, lower, upper), exactly: the two clips of `project`
    are one clip to the intersection of [-ε, ε] and [-x, 1 - x], which holds 0. For a loop
    that projects onto the same C many times."""
    return tf.maximum(-x, -eps), tf.minimum(1.0 - x, eps)


def ball_bounds(x: tf.Tensor, eps: float | tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """(lower, upper) with x + C = [lower, upper] per pixel: the projection of a point p onto
    x + C, min(max(p, x − ε), x + ε) clamped to [0, 1] (as the reference attacks write it), is
    clip(p, lower, upper) exactly, the two intervals sharing x. For a loop that projects points
    onto the same ball many times; `delta_bounds` is its form for δ."""
    return tf.maximum(x - eps, 0.0), tf.minimum(x + eps, 1.0)


def as_seed(seed: int | tf.Tensor) -> tf.Tensor:
    """A stateless seed (int32 tensor of shape [2]): an int s becomes [s, 0], a seed tensor is
    kept."""
    if isinstance(seed, int):
        return tf.constant([seed, 0], tf.int32)
    return tf.convert_to_tensor(seed, tf.int32)


def random_init(x: tf.Tensor, eps: float | tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    """δ0 = P_C(U[-ε, ε]^d), drawn from a stateless seed (int32 tensor of shape [2])."""
    return project(uniform_noise(x, eps, seed), x, eps)


def uniform_noise(x: tf.Tensor, eps: float | tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    """U[-ε, ε]^d in the shape and dtype of x, before any projection."""
    return tf.random.stateless_uniform(
        tf.shape(x), seed=seed, minval=-eps, maxval=eps, dtype=x.dtype
    )


def default_tau(dtype: tf.DType) -> float:
    """Margin τ of the inactive mask: 1e-7 in float32/64, about one ulp of 1 in 16-bit types.

    δ is float32 under every policy in this project (inputs are float32 pixels), so 1e-7 is
    what runs; the 16-bit values keep the mask meaningful if δ is ever kept in half precision.
    """
    return {tf.float16: 1e-3, tf.bfloat16: 8e-3}.get(tf.as_dtype(dtype), 1e-7)


def inactive_mask(
    delta: tf.Tensor, x: tf.Tensor, eps: float | tf.Tensor, tau: float | None = None
) -> tf.Tensor:
    """H_C: 1 where max(-ε, -x) + τ < δ < min(ε, 1 - x) - τ, else 0 (DESIGN.md §3, step 4)."""
    if tau is None:
        tau = default_tau(delta.dtype)
    lower = tf.maximum(-eps, -x) + tau
    upper = tf.minimum(eps, 1.0 - x) - tau
    inside = tf.logical_and(delta > lower, delta < upper)
    return tf.cast(inside, delta.dtype)


def check_in_ball(x_adv: tf.Tensor, x: tf.Tensor, eps: float, tol: float = 1e-6) -> None:
    """Raise if ‖x_adv − x‖∞ > ε + tol, x_adv leaves [0, 1] or is not finite: such a batch must
    not count (NaN fails no comparison, so it is tested on its own)."""
    finite = tf.math.is_finite(tf.cast(x_adv, tf.float32))
    if not bool(tf.reduce_all(finite)):
        bad = int(tf.size(finite)) - int(tf.reduce_sum(tf.cast(finite, tf.int32)))
        raise AssertionError(f"adversarial batch outside C: {bad} values are NaN or infinite")
    distance = float(tf.reduce_max(tf.abs(tf.cast(x_adv, tf.float32) - tf.cast(x, tf.float32))))
    low, high = float(tf.reduce_min(x_adv)), float(tf.reduce_max(x_adv))
    if distance > eps + tol or low < -tol or high > 1 + tol:
        raise AssertionError(
            f"adversarial batch outside C: ‖δ‖∞ = {distance:.3g} (ε = {eps:.3g}), "
            f"range [{low:.3g}, {high:.3g}]"
        )
