"""The perturbation set C = {δ : ‖δ‖ ≤ ε, 0 ≤ x + δ ≤ 1}, for the L∞ norm (the default) and
the L2 norm (per example: the norm over all of one image's pixels).

One projection for the whole project: every method and attack draws its random start with
`random_init`, projects with `project`, and Fast-BAT reads the inactive-constraint mask H_C
with `inactive_mask` (L∞ only: Fast-BAT is derived for the L∞ ball ∩ box).

    delta = random_init(x, eps, seed)            # P_C(U[-ε, ε]^d)
    delta = project(delta + step * grad, x, eps)
    delta = project(delta + step * grad / ‖grad‖, x, eps, norm="l2")
    delta = random_init(x, eps, seed, norm="l2") # uniform in the L2 ball, then in the box
    point = project_radial_l2(point, x, eps)     # the reference attacks' L2 step (not P_C)
    mask = inactive_mask(delta, x, eps)          # 1 where neither bound is active
    check_in_ball(x_adv, x, eps)                 # raise unless x_adv lies in x + C
    seed = as_seed(3)                            # [3, 0]: a stateless seed from an int
"""

from __future__ import annotations

import tensorflow as tf

from fbat_tf.catalog import check_norm

# Bisection steps of the L2 projection: the scale t ∈ [0, 1] is found to within 2^-40.
_L2_BISECTION_STEPS = 40


def project(
    delta: tf.Tensor, x: tf.Tensor, eps: float | tf.Tensor, norm: str = "linf"
) -> tf.Tensor:
    """P_C, the nearest point of C to δ (per example).

    L∞: clip δ to [-ε, ε], then to [-x, 1 - x] so that x + δ stays in [0, 1] (exact: the two
    clips are one clip to their intersection, per coordinate). L2: `project_l2`."""
    if check_norm(norm) == "l2":
        return project_l2(delta, x, eps)
    delta = tf.clip_by_value(delta, -eps, eps)
    return tf.clip_by_value(delta, -x, 1.0 - x)


def project_l2(delta: tf.Tensor, x: tf.Tensor, eps: float | tf.Tensor) -> tf.Tensor:
    """The exact projection onto {‖δ‖₂ ≤ ε} ∩ [-x, 1 - x], per example.

    The box holds 0, and for a multiplier μ ≥ 0 of the ball the problem separates by
    coordinate: the nearest point is clip(δ / (1 + μ), -x, 1 - x), whose norm falls as μ grows.
    So it is clip(t·δ, -x, 1 - x) with t = 1 where that clip lies in the ball, else the t in
    [0, 1] at which its norm is ε, found by bisection. (Clipping the ball's projection to the
    box, as reference attacks step, stays in C but is not always the nearest point of it.)"""
    lower, upper = -x, 1.0 - x
    axes = list(range(1, len(delta.shape)))

    def norm_at(t: tf.Tensor) -> tf.Tensor:
        clipped = tf.clip_by_value(t * delta, lower, upper)
        return tf.sqrt(tf.reduce_sum(tf.square(clipped), axis=axes, keepdims=True))

    ones = tf.ones(tf.concat([tf.shape(delta)[:1], [1] * len(axes)], 0), delta.dtype)
    # A Python ε is taken at δ's precision (a cast of it would round it to float32 first).
    eps = tf.cast(eps, delta.dtype) if tf.is_tensor(eps) else tf.constant(eps, delta.dtype)

    def halve(_, bounds):
        low, high = bounds
        middle = (low + high) / 2
        inside = norm_at(middle) <= eps
        return _ + 1, (tf.where(inside, middle, low), tf.where(inside, high, middle))

    _, (low, _) = tf.while_loop(
        lambda step, _: step < _L2_BISECTION_STEPS,
        halve,
        (tf.constant(0), (tf.zeros_like(ones), ones)),
    )
    t = tf.where(norm_at(ones) <= eps, ones, low)
    return tf.clip_by_value(t * delta, lower, upper)


def project_radial_l2(point: tf.Tensor, x: tf.Tensor, eps: float | tf.Tensor) -> tf.Tensor:
    """The reference attacks' L2 step onto x + C (autopgd_base.py, the L2 branch of APGD's
    update): the ball's radial projection of the point, then a clip to the box,

        clip(x + (p − x)/(‖p − x‖₂ + 1e-12)·min(ε, ‖p − x‖₂), 0, 1)   per example.

    It stays in x + C (the clip shortens each coordinate of δ, x being in the box), but it is
    not the nearest point of it where the box binds (`project_l2` is): an attack that follows
    the reference uses this, one that wants P_C uses `project`."""
    delta = point - x
    lengths = tf.reshape(l2_norms(delta), [-1] + [1] * (len(delta.shape) - 1))
    eps = tf.cast(eps, delta.dtype) if tf.is_tensor(eps) else tf.constant(eps, delta.dtype)
    return tf.clip_by_value(x + delta / (lengths + 1e-12) * tf.minimum(eps, lengths), 0.0, 1.0)


def l2_norms(delta: tf.Tensor) -> tf.Tensor:
    """‖δ‖₂ of each example of a batch, shape [N]."""
    return tf.norm(tf.reshape(delta, [tf.shape(delta)[0], -1]), axis=1)


def normalized(grad: tf.Tensor, norm: str = "linf") -> tf.Tensor:
    """The steepest-ascent direction of unit norm for a gradient: sign(g) for L∞ (its dual
    norm's unit step), g / ‖g‖₂ per example for L2 (0 where g is 0)."""
    if check_norm(norm) == "linf":
        return tf.sign(grad)
    lengths = tf.reshape(l2_norms(grad), [-1] + [1] * (len(grad.shape) - 1))
    return tf.math.divide_no_nan(grad, lengths)


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


def random_init(
    x: tf.Tensor, eps: float | tf.Tensor, seed: tf.Tensor, norm: str = "linf"
) -> tf.Tensor:
    """δ0 drawn from a stateless seed (int32 tensor of shape [2]): P_C(U[-ε, ε]^d) for L∞; for
    L2 a point uniform in the ball (a Gaussian's direction, radius ε·U^(1/d)) clipped to the
    box, which keeps it in the ball (the box holds 0: clipping shortens each coordinate)."""
    if check_norm(norm) == "linf":
        return project(uniform_noise(x, eps, seed), x, eps)
    direction_seed, radius_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    gaussian = tf.random.stateless_normal(tf.shape(x), direction_seed, dtype=x.dtype)
    direction = normalized(gaussian, norm)
    size = tf.cast(tf.reduce_prod(tf.shape(x)[1:]), x.dtype)
    u = tf.random.stateless_uniform([tf.shape(x)[0]], radius_seed, dtype=x.dtype)
    radius = tf.cast(eps, x.dtype) * u ** (1.0 / size)
    delta = direction * tf.reshape(radius, [-1] + [1] * (len(x.shape) - 1))
    return tf.clip_by_value(delta, -x, 1.0 - x)


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


def check_in_ball(
    x_adv: tf.Tensor, x: tf.Tensor, eps: float, tol: float = 1e-6, norm: str = "linf"
) -> None:
    """Raise if ‖x_adv − x‖ > ε + tol (the L∞ norm, or the L2 norm of each example), x_adv
    leaves [0, 1] or is not finite: such a batch must not count (NaN fails no comparison, so it
    is tested on its own)."""
    finite = tf.math.is_finite(tf.cast(x_adv, tf.float32))
    if not bool(tf.reduce_all(finite)):
        bad = int(tf.size(finite)) - int(tf.reduce_sum(tf.cast(finite, tf.int32)))
        raise AssertionError(f"adversarial batch outside C: {bad} values are NaN or infinite")
    delta = tf.cast(x_adv, tf.float32) - tf.cast(x, tf.float32)
    if check_norm(norm) == "l2":
        # float32 sums over a whole image: its rounding grows with the norm.
        distance, tol, name = float(tf.reduce_max(l2_norms(delta))), tol * (1 + eps), "‖δ‖₂"
    else:
        distance, name = float(tf.reduce_max(tf.abs(delta))), "‖δ‖∞"
    low, high = float(tf.reduce_min(x_adv)), float(tf.reduce_max(x_adv))
    if distance > eps + tol or low < -tol or high > 1 + tol:
        raise AssertionError(
            f"adversarial batch outside C: {name} = {distance:.3g} (ε = {eps:.3g}), "
            f"range [{low:.3g}, {high:.3g}]"
        )
