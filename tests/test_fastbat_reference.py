"""Fast-BAT's `gradients` against an independent computation of DESIGN.md §3.

What it is checked against:

- the six Fast-BAT steps (linearization point, lower-level solution, upper-level loss,
  inactive mask, implicit-gradient term, combination), recomputed here with plain
  `tf.GradientTape`s, for every linearization, on a dense softplus model and on a conv
  model with batch norm, in float64 and float32;
- the implicit-gradient term against central finite differences of
  θ ↦ (1/B) Σ_i ⟨∇δ Σ_j CE_j(θ, x+z)_i, H_i ⊙ v_i⟩ (float64, every weight perturbed);
- `ig="hessian_aware"` against an explicit per-example Hessian, restricted to the
  inactive coordinates and solved with `numpy.linalg.solve`;
- the stateless seed: same seed, same step; another seed, another step.

Nothing from `fbat_tf` is used except `methods.create` and the method's `gradients`.

    python -m pytest tests/test_fastbat_reference.py -q
"""

from __future__ import annotations

import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf

from fbat_tf import methods
from tests.reference import (
    assert_grads_close,
    conv_model,
    finite_difference,
    global_norm,
    per_example_ce,
    project,
)

# Inactive-mask margin of DESIGN.md §3 step 4.
TAU = 1e-7
LINEARIZATIONS = ("pgd_nosign", "pgd_sign", "uniform", "corner")
RTOL = {"float64": 1e-5, "float32": 1e-4}
SEED = (3, 17)


# --------------------------------------------------------------------------- models, data


def _dense_model(dtype: str, input_dim: int = 12, hidden: int = 8, classes: int = 3):
    keras.utils.set_random_seed(1234)
    return keras.Sequential(
        [
            keras.Input((input_dim,), dtype=dtype),
            keras.layers.Dense(hidden, activation="softplus", dtype=dtype),
            keras.layers.Dense(classes, dtype=dtype),
        ]
    )


def _inputs(shape: tuple[int, ...], dtype: str, classes: int = 3, data_seed: int = 0):
    """Pixels in [0, 1], about a fifth exactly 0 and a sixth exactly 1 (box-active)."""
    rng = np.random.default_rng(data_seed)
    x = rng.uniform(0.05, 0.95, size=shape)
    where = rng.uniform(size=shape)
    x[where < 0.2] = 0.0
    x[where > 5 / 6] = 1.0
    y = rng.integers(0, classes, size=shape[0])
    return tf.constant(x, dtype=dtype), tf.constant(y, dtype=tf.int32)


def _seed(pair: tuple[int, int] = SEED) -> tf.Tensor:
    return tf.constant(pair, dtype=tf.int32)


# --------------------------------------------------------------------------- reference


def _input_gradient(model, x, y, delta):
    """∇δ Σ_i CE_i(θ, x+δ) at the current weights."""
    with tf.GradientTape() as tape:
        tape.watch(delta)
        ce, _ = per_example_ce(model, x + delta, y)
        total = tf.reduce_sum(ce)
    return tape.gradient(total, delta)


def _mixed_term_gradient(model, x, y, z, u):
    """∇θ (1/B) Σ_i ⟨∇δ Σ_j CE_j(θ, x+z)_i, u_i⟩ with z and u constant (nested tapes)."""
    batch = tf.cast(tf.shape(x)[0], x.dtype)
    with tf.GradientTape() as outer:
        with tf.GradientTape() as inner:
            inner.watch(z)
            ce, _ = per_example_ce(model, x + z, y)
            total = tf.reduce_sum(ce)
        g_z = inner.gradient(total, z)
        objective = tf.reduce_sum(g_z * u) / batch
    return outer.gradient(objective, model.trainable_variables)


@dataclasses.dataclass
class Reference:
    z: tf.Tensor
    delta_star: tf.Tensor
    upper_loss: float
    upper_gradient: list  # g1
    upper_input_gradient: tf.Tensor  # v
    mask: tf.Tensor  # H
    margin: np.ndarray  # distance of δ* to the nearer bound of C
    implicit_term: list  # g2 (Hessian-free)
    adv_accuracy: float


def _reference(model, x, y, seed, *, eps, lambda_inv, linearization, draw=None) -> Reference:
    """The five steps, eagerly; `draw` replaces the uniform noise the seed gives eagerly (XLA
    draws other numbers from the same stateless seed)."""
    if draw is None:
        draw = tf.random.stateless_uniform(
            tf.shape(x), seed=seed, minval=-eps, maxval=eps, dtype=x.dtype
        )
    delta0 = project(draw, x, eps)
    # Step 1: linearization point z.
    if linearization == "pgd_nosign":
        z = project(delta0 + lambda_inv * _input_gradient(model, x, y, delta0), x, eps)
    elif linearization == "pgd_sign":
        step = 1.25 * eps * tf.sign(_input_gradient(model, x, y, delta0))
        z = project(delta0 + step, x, eps)
    elif linearization == "uniform":
        z = delta0
    elif linearization == "corner":
        z = project(eps * tf.sign(draw), x, eps)
    else:
        raise ValueError(linearization)
    # Step 2: lower-level solution δ*, a constant.
    g_z = _input_gradient(model, x, y, z)
    delta_star = project(z + lambda_inv * g_z, x, eps)
    # Step 3: upper level at δ*.
    with tf.GradientTape() as tape:
        ce, logits = per_example_ce(model, x + delta_star, y)
        upper_loss = tf.reduce_mean(ce)
    upper_gradient = tape.gradient(upper_loss, model.trainable_variables)
    v = _input_gradient(model, x, y, delta_star)
    # Step 4: inactive mask H.
    lower = tf.maximum(-eps, -x)
    upper = tf.minimum(eps, 1.0 - x)
    mask = tf.cast((delta_star > lower + TAU) & (delta_star < upper - TAU), x.dtype)
    margin = np.minimum((delta_star - lower).numpy(), (upper - delta_star).numpy())
    # Step 5: implicit-gradient term.
    implicit_term = _mixed_term_gradient(model, x, y, z, mask * v)
    correct = tf.equal(tf.argmax(logits, axis=-1, output_type=tf.int32), y)
    return Reference(
        z=z,
        delta_star=delta_star,
        upper_loss=float(upper_loss),
        upper_gradient=upper_gradient,
        upper_input_gradient=v,
        mask=mask,
        margin=margin,
        implicit_term=implicit_term,
        adv_accuracy=float(tf.reduce_mean(tf.cast(correct, tf.float64))),
    )


def _combine(g1, g2, coef):
    return [a + coef * b for a, b in zip(g1, g2, strict=True)]


def _assert_mask_well_posed(ref: Reference, low=0.1, high=0.9):
    """Both kinds of coordinates occur and none sits so near a bound that τ decides it."""
    inactive = float(tf.reduce_mean(ref.mask))
    assert low < inactive < high, inactive
    on_bound = ref.margin == 0.0
    assert on_bound.any()
    ambiguous = (ref.margin > 0.0) & (ref.margin < 10 * TAU)
    assert not ambiguous.any(), ref.margin[ambiguous]


# --------------------------------------------------------------------------- configurations

# eps and a = 1/λ chosen so that both active and inactive coordinates are common at δ* for
# every linearization; ig_coef large enough that the implicit term is not lost in g1.
CASES = {
    "dense": dict(build=_dense_model, shape=(8, 12), eps=0.1, lambda_inv=0.1, ig_coef=1.0),
    "conv": dict(
        build=lambda dtype: conv_model(dtype, 4321),
        shape=(4, 6, 6, 2),
        eps=0.1,
        lambda_inv=1.0,
        ig_coef=4.0,
    ),
}


def _setup(case: str, dtype: str):
    cfg = CASES[case]
    model = cfg["build"](dtype)
    x, y = _inputs(cfg["shape"], dtype)
    return model, x, y, cfg


# --------------------------------------------------------------------------- tests


AUTODIFF = ["backward_over_backward", "forward_over_backward"]


@pytest.mark.parametrize("autodiff", AUTODIFF)
@pytest.mark.parametrize("linearization", LINEARIZATIONS)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("case", ["dense", "conv"])
def test_hessian_free_matches_reference(case, dtype, linearization, autodiff):
    model, x, y, cfg = _setup(case, dtype)
    eps, lambda_inv, ig_coef = cfg["eps"], cfg["lambda_inv"], cfg["ig_coef"]
    method = methods.create(
        "fastbat",
        eps=eps,
        lambda_inv=lambda_inv,
        ig_coef=ig_coef,
        ig="hessian_free",
        linearization=linearization,
        implicit_autodiff=autodiff,
    )
    grads, logs = method.gradients(model, x, y, _seed())

    ref = _reference(
        model, x, y, _seed(), eps=eps, lambda_inv=lambda_inv, linearization=linearization
    )
    _assert_mask_well_posed(ref)
    ratio = ig_coef * global_norm(ref.implicit_term) / global_norm(ref.upper_gradient)
    # The implicit term must weigh in, or an error in it would hide under the tolerance.
    assert ratio > 0.02, ratio

    rtol = RTOL[dtype]
    assert_grads_close(grads, _combine(ref.upper_gradient, ref.implicit_term, ig_coef), rtol)
    np.testing.assert_allclose(float(logs["loss"]), ref.upper_loss, rtol=rtol)
    assert float(logs["adv_accuracy"]) == pytest.approx(ref.adv_accuracy, abs=1e-6)
    inactive = float(tf.reduce_mean(ref.mask))
    assert float(logs["inactive_fraction"]) == pytest.approx(inactive, abs=1e-6)
    np.testing.assert_allclose(float(logs["ig_norm_ratio"]), ratio, rtol=10 * rtol)


@pytest.mark.parametrize("linearization", LINEARIZATIONS)
@pytest.mark.parametrize("case", ["dense", "conv"])
def test_first_order_fast_bat_is_the_reference_without_the_implicit_term(case, linearization):
    """`ig="none"` (and `ig_coef=0`) returns the full method's g1, bit for bit, and the
    reference's upper-level gradient."""
    model, x, y, cfg = _setup(case, "float64")
    eps, lambda_inv = cfg["eps"], cfg["lambda_inv"]
    options = dict(eps=eps, lambda_inv=lambda_inv, linearization=linearization)
    first_order = methods.create("fastbat", ig="none", **options)
    assert methods.create("fastbat", ig_coef=0.0, **options).config() == first_order.config()
    assert first_order.config()["title"] == "first-order Fast-BAT"
    assert not first_order.second_order
    grads, logs = first_order.gradients(model, x, y, _seed())
    assert sorted(logs) == ["adv_accuracy", "loss"]

    full = methods.create("fastbat", ig_coef=cfg["ig_coef"], **options)
    upper, implicit, _ = full.terms(model, x, y, _seed())
    for i, (a, b) in enumerate(zip(grads, upper, strict=True)):
        np.testing.assert_array_equal(a, b, err_msg=f"variable {i}")

    ref = _reference(
        model, x, y, _seed(), eps=eps, lambda_inv=lambda_inv, linearization=linearization
    )
    assert_grads_close(grads, ref.upper_gradient, RTOL["float64"])
    np.testing.assert_allclose(float(logs["loss"]), ref.upper_loss, rtol=RTOL["float64"])
    # The term left out is not negligible here, so g1 is not the full gradient by accident.
    ratio = cfg["ig_coef"] * global_norm(implicit) / global_norm(upper)
    assert ratio > 0.02, ratio


@pytest.mark.slow
@pytest.mark.parametrize("autodiff", AUTODIFF)
@pytest.mark.parametrize("case", ["dense", "conv"])
def test_xla_step_matches_reference_and_keeps_the_implicit_term(case, autodiff):
    """The step as the trainer runs it, under tf.function(jit_compile=True) without autograph,
    on the reference configurations (where the implicit term is a sizeable part of the
    gradient): the whole gradient, and the implicit term alone (the difference to ig_coef = 0,
    over ig_coef), match the eager reference computed from XLA's own noise."""
    model, x, y, cfg = _setup(case, "float32")
    eps, lambda_inv, ig_coef = cfg["eps"], cfg["lambda_inv"], cfg["ig_coef"]
    seed = _seed()

    def compiled_gradients(coef):
        method = methods.create(
            "fastbat", eps=eps, lambda_inv=lambda_inv, ig_coef=coef, implicit_autodiff=autodiff
        )
        step = tf.function(
            lambda: method.gradients(model, x, y, seed), jit_compile=True, autograph=False
        )
        return step()[0]

    draw = tf.function(
        lambda: tf.random.stateless_uniform(
            tf.shape(x), seed=seed, minval=-eps, maxval=eps, dtype=x.dtype
        ),
        jit_compile=True,
    )()
    ref = _reference(
        model, x, y, seed, eps=eps, lambda_inv=lambda_inv, linearization="pgd_nosign", draw=draw
    )
    ratio = ig_coef * global_norm(ref.implicit_term) / global_norm(ref.upper_gradient)
    assert ratio > 0.02, ratio
    grads = compiled_gradients(ig_coef)
    first_order = compiled_gradients(0.0)
    assert_grads_close(grads, _combine(ref.upper_gradient, ref.implicit_term, ig_coef), 1e-4)
    assert_grads_close(first_order, ref.upper_gradient, 1e-4)
    implicit = [(g - f) / ig_coef for g, f in zip(grads, first_order, strict=True)]
    assert_grads_close(implicit, ref.implicit_term, 1e-3)


def test_auto_autodiff_is_forward_mode_on_accelerators_only():
    from fbat_tf.device import resolve_implicit_autodiff

    assert resolve_implicit_autodiff("auto", ["CPU"]) == "backward_over_backward"
    assert resolve_implicit_autodiff("auto", ["CPU", "GPU", "GPU"]) == "forward_over_backward"
    assert resolve_implicit_autodiff("auto", ["CPU", "TPU"]) == "forward_over_backward"
    assert resolve_implicit_autodiff("backward_over_backward", ["GPU"]) == "backward_over_backward"
    with pytest.raises(ValueError, match="backwards"):
        resolve_implicit_autodiff("backwards")
    # This machine has no accelerator: the method resolves "auto" to the CPU mode, and says so.
    method = methods.create("fastbat", eps=0.1)
    assert method.implicit_autodiff == "backward_over_backward"
    assert method.config()["implicit_autodiff"] == "backward_over_backward"


def test_conv_case_is_sensitive_to_training_mode():
    """Batch norm in train mode differs from inference mode here, so the conv comparison
    above also checks that every forward pass uses `training=True`."""
    model, x, _, _ = _setup("conv", "float64")
    train = model(x, training=True)
    infer = model(x, training=False)
    assert float(tf.reduce_max(tf.abs(train - infer))) > 1e-2


def _implicit_objective(model, x, y, z, u) -> float:
    """θ ↦ (1/B) Σ_i ⟨∇δ Σ_j CE_j(θ, x+z)_i, u_i⟩ at the model's current weights."""
    g_z = _input_gradient(model, x, y, z)
    return float(tf.reduce_sum(g_z * u)) / int(x.shape[0])


@pytest.mark.parametrize("linearization", ["pgd_nosign", "corner"])
def test_implicit_term_matches_finite_difference(linearization):
    model, x, y, cfg = _setup("dense", "float64")
    eps, lambda_inv = cfg["eps"], cfg["lambda_inv"]

    def step(ig_coef):
        method = methods.create(
            "fastbat",
            eps=eps,
            lambda_inv=lambda_inv,
            ig_coef=ig_coef,
            ig="hessian_free",
            linearization=linearization,
        )
        grads, _ = method.gradients(model, x, y, _seed())
        return [np.asarray(tf.convert_to_tensor(g)) for g in grads]

    # z, δ*, H and v do not depend on ig_coef, so the difference is g2 alone.
    implicit_term = [b - a for a, b in zip(step(1.0), step(2.0), strict=True)]

    ref = _reference(
        model, x, y, _seed(), eps=eps, lambda_inv=lambda_inv, linearization=linearization
    )
    _assert_mask_well_posed(ref)
    u = ref.mask * ref.upper_input_gradient
    numeric = finite_difference(
        model, lambda: _implicit_objective(model, x, y, ref.z, u), step=1e-5
    )
    # The reference's own nested-tape g2 agrees with finite differences ...
    assert_grads_close(ref.implicit_term, numeric, rtol=1e-6)
    # ... and so does the method's.
    assert_grads_close(implicit_term, numeric, rtol=1e-6)
    # H matters: without it the term is measurably different.
    unmasked = _mixed_term_gradient(model, x, y, ref.z, ref.upper_input_gradient)
    diff = global_norm([a - b for a, b in zip(unmasked, numeric, strict=True)])
    assert diff > 0.1 * global_norm(numeric)


# --------------------------------------------------------------------------- hessian-aware


def _hessian_aware_direction(model, x, y, ref: Reference, lambda_inv):
    """u_i = λ (λI − ∇²δδ CE_i(θ, x+z))|_{S_i}^{-1} v_i|_{S_i}, zero off S_i, by brute force."""
    z = ref.z
    with tf.GradientTape() as outer:
        outer.watch(z)
        with tf.GradientTape() as inner:
            inner.watch(z)
            ce, _ = per_example_ce(model, x + z, y)
            total = tf.reduce_sum(ce)
        g_z = inner.gradient(total, z)
    full = outer.jacobian(g_z, z).numpy()  # [B, d, B, d]
    batch, dim = z.shape
    lam = 1.0 / lambda_inv
    mask = ref.mask.numpy().astype(bool)
    v = ref.upper_input_gradient.numpy()
    u = np.zeros_like(v)
    smallest_eig = np.inf
    for i in range(batch):
        for j in range(batch):
            if i != j:  # examples do not interact without batch norm
                assert np.max(np.abs(full[i, :, j, :])) == 0.0
        hessian = full[i, :, i, :]
        np.testing.assert_allclose(hessian, hessian.T, atol=1e-12)
        s = np.flatnonzero(mask[i])
        if s.size == 0:
            continue
        system = lam * np.eye(dim) - hessian
        block = system[np.ix_(s, s)]
        smallest_eig = min(smallest_eig, float(np.min(np.linalg.eigvalsh(block))))
        u[i, s] = lam * np.linalg.solve(block, v[i, s])
    return tf.constant(u, dtype=z.dtype), smallest_eig


@pytest.mark.parametrize("autodiff", AUTODIFF)
def test_hessian_aware_matches_explicit_solve(autodiff):
    dim = 6
    model = _dense_model("float64", input_dim=dim, hidden=5)
    # Larger first-layer weights so the input Hessian is not negligible next to λI.
    kernel = model.trainable_variables[0]
    kernel.assign(kernel * 3.0)
    x, y = _inputs((4, dim), "float64", data_seed=5)
    eps, lambda_inv, ig_coef = 0.1, 0.05, 0.5
    method = methods.create(
        "fastbat",
        eps=eps,
        lambda_inv=lambda_inv,
        ig_coef=ig_coef,
        ig="hessian_aware",
        linearization="pgd_nosign",
        cg_steps=dim,
        implicit_autodiff=autodiff,
    )
    grads, logs = method.gradients(model, x, y, _seed())

    ref = _reference(
        model, x, y, _seed(), eps=eps, lambda_inv=lambda_inv, linearization="pgd_nosign"
    )
    _assert_mask_well_posed(ref, low=0.1, high=0.9)
    u, smallest_eig = _hessian_aware_direction(model, x, y, ref, lambda_inv)
    assert smallest_eig > 0.5 / lambda_inv  # well-conditioned, so CG in `dim` steps is exact
    implicit_term = _mixed_term_gradient(model, x, y, ref.z, u)
    # The Hessian must change the answer, or this test would pass for the Hessian-free term.
    change = global_norm([a - b for a, b in zip(implicit_term, ref.implicit_term, strict=True)])
    assert change > 1e-3 * global_norm(implicit_term), change

    expected = _combine(ref.upper_gradient, implicit_term, ig_coef)
    assert_grads_close(grads, expected, rtol=1e-6)
    np.testing.assert_allclose(float(logs["loss"]), ref.upper_loss, rtol=1e-8)
    ratio = ig_coef * global_norm(implicit_term) / global_norm(ref.upper_gradient)
    np.testing.assert_allclose(float(logs["ig_norm_ratio"]), ratio, rtol=1e-5)


# --------------------------------------------------------------------------- seeds


def test_seed_determines_the_step():
    model, x, y, cfg = _setup("dense", "float64")
    method = methods.create(
        "fastbat",
        eps=cfg["eps"],
        lambda_inv=cfg["lambda_inv"],
        ig_coef=cfg["ig_coef"],
        ig="hessian_free",
        linearization="pgd_nosign",
    )

    def flat(seed):
        grads, _ = method.gradients(model, x, y, _seed(seed))
        return np.concatenate([np.ravel(tf.convert_to_tensor(g)) for g in grads])

    first = flat((1, 2))
    np.testing.assert_array_equal(flat((1, 2)), first)
    other = flat((7, 9))
    assert np.max(np.abs(other - first)) > 1e-3 * np.max(np.abs(first))
