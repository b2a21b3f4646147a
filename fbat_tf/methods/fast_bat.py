"""Fast-BAT (Zhang et al., ICML 2022): bi-level adversarial training with an implicit gradient.

The steps are numbered as in DESIGN.md §3 (the paper's Algorithm 1 with the Hessian-free
implicit gradient, eq. (10)):

    method = methods.create("fastbat", eps=8 / 255)             # a = 1/λ = 5000/255, c = 0.1
    grads, logs = method.gradients(model, x, y, seed)           # g1 + c·g2

`ig="none"` (or `ig_coef=0`, which means the same) is first-order Fast-BAT: steps 1–3 only,
with no tape over θ at step 2, no mask and no step 5, so it costs two input gradients and one
weight gradient per batch.

`ig="hessian_aware"` replaces λI by the lower-level Hessian λI + ∇²δδ ℓ_atk on the inactive
coordinates (conjugate gradient with Hessian-vector products, stopped on non-positive curvature).

`implicit_autodiff` picks how step 5's mixed second derivative (and hessian_aware's
Hessian-vector products) are computed; both are exact. "backward_over_backward" differentiates
step 2's recorded backward pass again (nested tapes); "forward_over_backward" takes the
forward-mode derivative along u of a weight gradient at z (a ForwardAccumulator), which records
nothing over θ at step 2. "auto" (default) picks forward-over-backward where a GPU or TPU is
visible and backward-over-backward on CPUs, where each is the faster one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from fbat_tf import catalog
from fbat_tf.catalog import (
    IMPLICIT_AUTODIFF,
    IMPLICIT_GRADIENTS,
    LINEARIZATIONS,
    counts,
    implicit_gradient,
)
from fbat_tf.lazy import later
from fbat_tf.methods.base import Method, input_gradient, per_example_scale, scaled, unscaled
from fbat_tf.methods.declarations import Entry, Option, defaults
from fbat_tf.records import units

if TYPE_CHECKING:
    import keras

tf = later("tensorflow")
losses = later("fbat_tf.attacks.losses")
constraints = later("fbat_tf.constraints")
device = later("fbat_tf.device")


def default_lambda_inv(eps: float) -> float:
    """a = 1/λ: 5000/255 for ε ≤ 8/255 and 2500/255 above (the paper's CIFAR settings)."""
    return 5000.0 / 255 if eps <= 8.0 / 255 + 1e-12 else 2500.0 / 255


def _per_example_sum(t: tf.Tensor) -> tf.Tensor:
    return tf.reduce_sum(tf.reshape(t, [tf.shape(t)[0], -1]), axis=1)


def _broadcast_per_example(values: tf.Tensor, like: tf.Tensor) -> tf.Tensor:
    shape = tf.concat([tf.shape(values), tf.ones([tf.rank(like) - 1], tf.int32)], axis=0)
    return tf.reshape(values, shape)


def _settle_implicit_autodiff(value: str, on_cpu: bool) -> str:
    from fbat_tf import device  # loads TensorFlow where it asks this machine's devices

    return device.resolve_implicit_autodiff(value, ["CPU"] if on_cpu else None)


OPTIONS = (
    Option(
        "lambda_inv",
        float,
        None,
        "Fast-BAT lower-level step 1/λ in 1/255 units (default 5000 for eps <= 8, 2500 above).",
        "lambda_inv",
        lower_bound=0.0,
        from_flag=lambda value: None if value is None else units.from_per_255(value),
    ),
    Option(
        "ig_coef",
        float,
        0.1,
        "Fast-BAT implicit-gradient coefficient c = α2/(λ·α1).",
        "ig_coef",
        lower_bound=0.0,
    ),
    Option("ig", str, "hessian_free", "Fast-BAT implicit gradient.", "ig", IMPLICIT_GRADIENTS),
    Option(
        "linearization",
        str,
        "pgd_nosign",
        "Fast-BAT linearization point z.",
        "linearization",
        LINEARIZATIONS,
    ),
    Option(
        "cg_steps", int, 3, "Conjugate-gradient steps of --ig=hessian_aware.", "cg_steps", None, 1
    ),
    Option(
        "tau",
        float,
        None,
        "Fast-BAT margin of the inactive-constraint mask in pixel units (default: 1e-7 in "
        "float32).",
        "tau",
        lower_bound=0.0,
    ),
    Option(
        "implicit_autodiff",
        str,
        "auto",
        "How Fast-BAT differentiates its implicit term (both exact). auto: "
        "forward_over_backward on GPU/TPU, backward_over_backward on CPU.",
        "implicit_autodiff",
        IMPLICIT_AUTODIFF,
        on_device=_settle_implicit_autodiff,
    ),
)
_DEFAULT = defaults(OPTIONS)


class FastBAT(Method):
    name = "fastbat"
    linf_only_because = (
        "its lower-level solution and implicit term are derived for the L∞ ball ∩ box (the "
        "inactive-constraint mask of its linearized box-constrained problem)"
    )

    @staticmethod
    def check_options(
        *,
        lambda_inv: float | None,
        ig_coef: float,
        ig: str,
        linearization: str,
        cg_steps: int,
        tau: float | None,
        implicit_autodiff: str,
    ) -> None:
        device.check_implicit_autodiff(implicit_autodiff)
        if ig not in IMPLICIT_GRADIENTS:
            raise ValueError(f"ig must be one of {IMPLICIT_GRADIENTS}, got {ig!r}")
        if linearization not in LINEARIZATIONS:
            raise ValueError(
                f"linearization must be one of {LINEARIZATIONS}, got {linearization!r}"
            )
        # None: the default for ε, which is positive.
        if lambda_inv is not None and not float(lambda_inv) > 0:
            raise ValueError(f"lambda_inv must be > 0, got {lambda_inv!r}")
        if ig_coef < 0:
            raise ValueError(f"ig_coef must be >= 0, got {ig_coef!r}")
        if cg_steps < 1:
            raise ValueError(f"cg_steps must be >= 1, got {cg_steps!r}")

    # Its name, why it has no L2 form and the option values it refuses: rules.FastBAT.

    def __init__(
        self,
        eps: float,
        lambda_inv: float | None = _DEFAULT["lambda_inv"],
        ig_coef: float = _DEFAULT["ig_coef"],
        ig: str = _DEFAULT["ig"],
        linearization: str = _DEFAULT["linearization"],
        cg_steps: int = _DEFAULT["cg_steps"],
        tau: float | None = _DEFAULT["tau"],
        implicit_autodiff: str = _DEFAULT["implicit_autodiff"],
    ):
        super().__init__(eps)
        self.check_options(
            lambda_inv=lambda_inv,
            ig_coef=ig_coef,
            ig=ig,
            linearization=linearization,
            cg_steps=cg_steps,
            tau=tau,
            implicit_autodiff=implicit_autodiff,
        )
        self.implicit_autodiff = device.resolve_implicit_autodiff(implicit_autodiff)
        self.lambda_inv = default_lambda_inv(self.eps) if lambda_inv is None else float(lambda_inv)
        ig = implicit_gradient(ig, ig_coef)
        if ig == IMPLICIT_GRADIENTS[2]:
            ig_coef = 0.0
        self.ig_coef = float(ig_coef)
        self.ig = ig
        # Only the implicit term differentiates an input gradient again.
        self.second_order = ig != "none"
        self.linearization = linearization
        self.cg_steps = int(cg_steps)
        self.tau = tau

    @property
    def log_names(self) -> tuple[str, ...]:
        if self.ig == "none":
            return ("loss", "adv_accuracy")
        names = ("loss", "adv_accuracy", "ig_norm_ratio", "inactive_fraction")
        return names + (("cg_negative_curvature",) if self.ig == "hessian_aware" else ())

    @property
    def title(self) -> str:
        return "first-order Fast-BAT" if self.ig == "none" else "Fast-BAT"

    def config(self) -> dict:
        return {
            **super().config(),
            "lambda_inv": self.lambda_inv,
            "ig_coef": self.ig_coef,
            "ig": self.ig,
            "linearization": self.linearization,
            "cg_steps": self.cg_steps,
            "implicit_autodiff": self.implicit_autodiff,
        }

    def linearization_point(self, model: keras.Model, x, y, seed, loss_scale=None) -> tf.Tensor:
        """Step 1: z, the point where the lower-level objective is linearized."""
        eps = self.eps
        if self.linearization == "corner":
            corner = eps * tf.sign(constraints.uniform_noise(x, eps, seed))
            return constraints.project(corner, x, eps)
        delta0 = constraints.random_init(x, eps, seed)
        if self.linearization == "uniform":
            return delta0
        grad = input_gradient(model, x, delta0, y, loss_scale)
        if self.linearization == "pgd_sign":
            return constraints.project(delta0 + 1.25 * eps * tf.sign(grad), x, eps)
        return constraints.project(delta0 + self.lambda_inv * grad, x, eps)

    def perturb(self, model: keras.Model, x, y, seed, loss_scale=None) -> tf.Tensor:
        z = self.linearization_point(model, x, y, seed, loss_scale)
        g_z = input_gradient(model, x, z, y, loss_scale)
        return x + constraints.project(z + self.lambda_inv * g_z, x, self.eps)

    def gradients(self, model: keras.Model, x, y, seed, loss_scale=None):
        if self.ig == "none":
            # Steps 1–3: the upper-level gradient at δ*, the point `perturb` returns.
            return super().gradients(model, x, y, seed, loss_scale)
        upper_grads, implicit_grads, logs = self.terms(model, x, y, seed, loss_scale)

        # Step 6: g1 + c·g2.
        grads = []
        for upper, implicit in zip(upper_grads, implicit_grads, strict=True):
            if implicit is None:
                grads.append(upper)
            elif upper is None:
                grads.append(self.ig_coef * implicit)
            else:
                grads.append(upper + self.ig_coef * implicit)
        upper_norm = tf.linalg.global_norm([g for g in upper_grads if g is not None])
        implicit_norm = self.ig_coef * tf.linalg.global_norm(
            [g for g in implicit_grads if g is not None]
        )
        ratio = tf.math.divide_no_nan(implicit_norm, upper_norm)
        return grads, {**logs, "ig_norm_ratio": tf.cast(ratio, tf.float32)}

    def terms(self, model: keras.Model, x, y, seed, loss_scale=None):
        """Steps 1–5 of the full method: (g1, g2, logs) with g1 the first-order term and g2 the
        implicit term before its coefficient."""
        if self.ig == "none":
            raise ValueError("first-order Fast-BAT (ig='none') computes no implicit term")
        weights = model.trainable_variables
        batch = tf.cast(tf.shape(x)[0], tf.float32)
        z = tf.stop_gradient(self.linearization_point(model, x, y, seed, loss_scale))
        sum_scale = per_example_scale(loss_scale, x)

        # Step 2: the lower-level gradient g_z(θ); backward-over-backward keeps it on a tape
        # over θ for step 5, forward-over-backward records nothing over θ.
        forward = self.implicit_autodiff == "forward_over_backward"
        with tf.GradientTape(watch_accessed_variables=not forward) as weight_tape:
            with tf.GradientTape(watch_accessed_variables=False) as input_tape:
                input_tape.watch(z)
                lower_loss = tf.reduce_sum(losses.cross_entropy(model(x + z, training=True), y))
                lower_loss = scaled(lower_loss, sum_scale)
            lower_grad = unscaled(input_tape.gradient(lower_loss, z), sum_scale)
        delta_star = tf.stop_gradient(
            constraints.project(z + self.lambda_inv * lower_grad, x, self.eps)
        )

        # Step 3: upper level at δ*; one backward pass gives g1 and v = B·∇δ L.
        with tf.GradientTape() as upper_tape:
            upper_tape.watch(delta_star)
            logits = model(x + delta_star, training=True)
            loss = tf.reduce_mean(losses.cross_entropy(logits, y))
            objective = scaled(loss, loss_scale)
        *upper_grads, delta_grad = upper_tape.gradient(objective, weights + [delta_star])
        v = unscaled(delta_grad, loss_scale) * tf.cast(batch, delta_grad.dtype)

        # Step 4: inactive constraints at δ*.
        mask = constraints.inactive_mask(delta_star, x, self.eps, self.tau)
        logs = {}
        if self.ig == "hessian_free":
            direction = mask * v
        else:
            direction, logs["cg_negative_curvature"] = self._hessian_aware_direction(
                model, x, y, z, mask, v, loss_scale
            )
        direction = tf.stop_gradient(direction)

        # Step 5: g2 = ∇θ (1/B) Σ_i ⟨g_z,i(θ), H_i ⊙ v_i⟩, a mixed second derivative ∇²θδ.
        if forward:
            # By the symmetry of mixed partials, the derivative along u = H ⊙ v (forward mode,
            # at z) of the weight gradient of (1/B) Σ_i CE_i(θ, x + z).
            with tf.autodiff.ForwardAccumulator(z, direction) as accumulator:
                with tf.GradientTape() as tape:
                    lower_mean = tf.reduce_sum(losses.cross_entropy(model(x + z, training=True), y))
                    lower_mean = scaled(lower_mean / tf.cast(batch, lower_mean.dtype), loss_scale)
                weight_grads = tape.gradient(lower_mean, weights)
            implicit_grads = [None if g is None else accumulator.jvp(g) for g in weight_grads]
        else:
            with weight_tape:
                implicit_objective = tf.reduce_sum(lower_grad * direction) / tf.cast(
                    batch, lower_grad.dtype
                )
                implicit_objective = scaled(implicit_objective, loss_scale)
            implicit_grads = weight_tape.gradient(implicit_objective, weights)

        _check_second_derivatives(weights, upper_grads, implicit_grads)
        logs.update(
            loss=loss,
            adv_accuracy=tf.reduce_mean(losses.correct(logits, y)),
            inactive_fraction=tf.cast(tf.reduce_mean(mask), tf.float32),
        )
        return upper_grads, implicit_grads, logs

    def _hessian_aware_direction(self, model, x, y, z, mask, v, loss_scale):
        """Solve (λI − ∇²δδ Σ CE(x+z)) u = λ·v on each example's inactive coordinates by CG.

        The lower-level objective is ℓ_atk = −CE plus the proximal term, so its Hessian is
        λI − ∇²CE; it can be indefinite. CG stops per example on non-positive curvature; the
        returned fraction counts those stops. Scaled by λ so that a zero Hessian gives H ⊙ v;
        an example that stops before its first step keeps H ⊙ v.
        """
        lam = 1.0 / self.lambda_inv
        loss_scale = per_example_scale(loss_scale, x)

        def hessian_vector(p):
            if self.implicit_autodiff == "forward_over_backward":
                with tf.autodiff.ForwardAccumulator(z, p) as accumulator:
                    with tf.GradientTape(watch_accessed_variables=False) as tape:
                        tape.watch(z)
                        loss = tf.reduce_sum(losses.cross_entropy(model(x + z, training=True), y))
                        loss = scaled(loss, loss_scale)
                    grad = tape.gradient(loss, z)
                return unscaled(accumulator.jvp(grad), loss_scale)
            with tf.GradientTape(watch_accessed_variables=False) as outer:
                outer.watch(z)
                with tf.GradientTape(watch_accessed_variables=False) as inner:
                    inner.watch(z)
                    loss = tf.reduce_sum(losses.cross_entropy(model(x + z, training=True), y))
                    loss = scaled(loss, loss_scale)
                grad = inner.gradient(loss, z)
                along = tf.reduce_sum(grad * p)
            return unscaled(outer.gradient(along, z), loss_scale)

        def operator(p):
            return mask * (lam * p - hessian_vector(mask * p))

        solution = tf.zeros_like(v)
        residual = mask * v  # solve A u' = H ⊙ v; u = λ u' (below)
        direction = residual
        rr = _per_example_sum(residual * residual)
        running = tf.cast(rr > 0, v.dtype)
        negative = tf.zeros_like(rr)
        for _ in range(self.cg_steps):
            image = operator(direction)
            curvature = _per_example_sum(direction * image)
            positive = tf.cast(curvature > 0, v.dtype)
            negative += running * (1.0 - positive)
            running *= positive
            alpha = running * tf.math.divide_no_nan(rr, curvature)
            solution += _broadcast_per_example(alpha, v) * direction
            residual -= _broadcast_per_example(alpha, v) * image
            rr_new = _per_example_sum(residual * residual)
            beta = tf.math.divide_no_nan(rr_new, rr)
            direction = residual + _broadcast_per_example(beta, v) * direction
            rr = rr_new
            running *= tf.cast(rr > 0, v.dtype)
        # An example stopped before its first step keeps the Hessian-free direction.
        stalled = _per_example_sum(solution * solution) == 0
        solution = tf.where(_broadcast_per_example(stalled, v), mask * v, lam * solution)
        return solution, tf.cast(tf.reduce_mean(negative), tf.float32)


def _check_second_derivatives(weights, upper_grads, implicit_grads) -> None:
    """Refuse, when the step is traced, weights the loss reaches but the implicit term does
    not: the input gradient depends on every weight the logits do, so a None there means an op
    between the input and those weights whose gradient TensorFlow does not differentiate again
    (tf.image.resize in a layer of the user's, bilinear UpSampling2D). Fast-BAT would then
    train first-order for them, silently."""
    cut = [
        weight.path
        for weight, upper, implicit in zip(weights, upper_grads, implicit_grads, strict=True)
        if upper is not None and implicit is None
    ]
    if cut:
        raise ValueError(
            f"Fast-BAT's implicit term has no gradient for {len(cut)} of the model's weights "
            f"({', '.join(cut[:3])}{', ...' if len(cut) > 3 else ''}): an op between the input "
            "and them has no second derivative in TensorFlow (a tf.image.resize or bilinear "
            "UpSampling2D of your own, say); use keras.layers.Resizing, which the trainer "
            "switches to an exact one, resize in the data pipeline, or train first-order "
            "Fast-BAT (--ig=none)"
        )


def _fastbat_passes(config: Mapping[str, Any]) -> dict[str, int]:
    config = {**_DEFAULT, "implicit_autodiff": IMPLICIT_AUTODIFF[1], **config}
    ig = catalog.implicit_gradient(config["ig"], config["ig_coef"])
    # Step 1's gradient at the random start (none for a uniform or corner z); step 2's
    # lower-level gradient at z and step 3's upper level at δ*.
    gradient_start = config["linearization"] in LINEARIZATIONS[:2]
    parts = [counts(1, 1) if gradient_start else counts(), counts(2, 2)]
    forward_mode = config["implicit_autodiff"] == IMPLICIT_AUTODIFF[2]
    # Step 5's mixed derivative along H ⊙ v, and each conjugate-gradient step's Hessian-vector
    # product: forward and weight passes at z carrying tangents, or back through a recorded
    # backward pass (and, for a product, the forward and backward pass it records).
    implicit = counts(1, 1, tangent=2) if forward_mode else counts(backward=1, second_order=1)
    product = counts(1, 1, tangent=2) if forward_mode else counts(1, 2, 1)
    products = int(config["cg_steps"]) if ig == IMPLICIT_GRADIENTS[1] else 0
    if ig != IMPLICIT_GRADIENTS[2]:
        parts += [implicit, *[product] * products]
    return catalog.added(*parts)


ENTRY = Entry(FastBAT, OPTIONS, passes=_fastbat_passes, cost_options={"ig": "hessian_free"})
