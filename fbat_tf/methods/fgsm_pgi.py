"""FGSM-PGI (Jia et al., "Prior-Guided Adversarial Initialization for Fast Adversarial Training",
ECCV 2022), in its FGSM-MEP form: FGSM starts from a prior kept per training example, the
momentum of that example's earlier gradients, and a regularizer keeps the logits at the
adversarial example near those at the prior.

For the batch's examples i, with their prior p_i and momentum m_i from their previous visit:

    δ0 = P_C(p)                                        (the prior, in this batch's C)
    g  = ∇δ Σ_i CE_i(x + δ0)
    m  ← g / ‖g‖₁ + μ·m                                (‖g‖₁ over the whole batch)
    δ  = P_C(δ0 + α·sign(g))                           (the training point x + δ)
    p  ← P_C(δ0 + α·sign(m))                           (the prior of the next visit)
    loss = (1/B) Σ_i CE_i(x + δ) + λ·(1/(B·K)) Σ_i ‖f(x + δ)_i − f(x + δ0)_i‖²

over K classes, its weight gradient through both forward passes (the logits at the prior are
not held constant). At an example's first visit, and every R-th after it, its prior restarts at
P_C(α·sign(U[−ε, ε]^d)) (a random corner for α ≥ ε) and its momentum at 0.

The state is three variables over the training split, indexed by an example's position in it:
the prior and the momentum (float32, one image each) and the visits (int32). A step reads its
rows (`indices=`, which the trainer takes from its training stream) and leaves the new rows in
batch-sized variables; the trainer writes them into the split's (`commit`) once the step is
applied, so a skipped step changes no row, and its checks and put-back cover the batch's rows
only. The three are checkpointed with the weights, so a resumed run goes on with every
example's prior. It runs on one device (`single_device`). Without `indices` a batch's positions
are its examples (a fixed batch, as `build` without `examples` sizes the state).

A step costs 2 forward and 3 backward passes: the forward at the prior, the input gradient
back through it, the forward at x + δ, and the weight gradient back through both forwards.

    method = methods.create("fgsm_pgi", eps=8 / 255)               # λ = 10, μ = 0.3, α = ε
    method.build((128, 28, 28, 1), examples=54000)

Where each default comes from: the authors' release, jiaxiaojunQAQ/FGSM-PGI at fc15cfe,
`FGSM_MEP.py` (the momentum-of-epochs prior the paper reports as FGSM-PGI; `utils.py` lines
19–20 set mean 0 and std 1, so its ε and α are in pixels), read beside the FastAT Benchmark's
`fast_at/fgsm_pgi.py` (fzjcdt/FastAT_Benchmark at b99c0de), which agrees on every one:

- λ = 10: `FGSM_MEP.py` line 41 (`--lamda`); the benchmark's line 19. The term is PyTorch's
  `MSELoss()` (a mean over the batch and the classes) between the two outputs, the output at the
  prior not detached: `FGSM_MEP.py` lines 276–277, the benchmark's line 112.
- μ = 0.3: `FGSM_MEP.py` line 42 (`--momentum_decay`); the benchmark's line 18. The momentum
  g/‖g‖₁ + μ·m with the L1 norm of the batch's whole input gradient: lines 253–254, the
  benchmark's 100–101.
- α = ε: `FGSM_MEP.py` lines 29 and 32 (`--epsilon 8`, `--alpha 8`); the benchmark steps by ε
  (lines 103, 106). The training point steps along sign(g), the next prior along sign(m), both
  from the prior and clamped to the ε-ball and the box: lines 256–260, the benchmark's 103–107.
- R = 40: `FGSM_MEP.py` line 22 (`--epochs_reset`), the reset at lines 187–197 (prior
  clamp(α·sign(U[−ε, ε]), −ε, ε), momentum 0); the benchmark's lines 17 and 80–83. The rows are
  stored after the optimizer step: lines 289 and 293, the benchmark's 122–123.

The paper's text was not at hand here; these are the released code's facts. Its training
recipe is not the method's and is set by train.py's flags as for every method: the release
trains 110 epochs of SGD (learning rate 0.1, ×0.1 at 100/110 and 105/110 of the iterations,
momentum 0.9, weight decay 5e-4: `FGSM_MEP.py` lines 21–27 and 133–135).

Departures, each to this project's conventions:
- plain cross-entropy, as every method here trains with: the release smooths the labels (0.6 on
  the true class, `--factor`, `FGSM_MEP.py` lines 40, 47–52, 233), the benchmark by 0.4 for every
  method it runs;
- the prior is projected onto this batch's C before the model sees it and the step starts from
  there: the release feeds x + prior unclipped (line 243), the benchmark clamps x + prior to
  [0, 1] (line 92) but steps from the unclamped prior (lines 103, 106);
- the restart counts each example's visits: the release restarts every example at epochs 0, R,
  2R, ..., each epoch visiting all of them; a training pass here drops its last partial batch,
  and an example left out of a pass restarts a pass later;
- a batch whose input gradient is zero everywhere adds nothing to the momentum (0/0 is NaN in the
  release, which would stay in the examples' priors).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fbat_tf.catalog import counts
from fbat_tf.lazy import later
from fbat_tf.methods.base import Method, input_gradient, per_example_scale, scaled, unscaled
from fbat_tf.methods.declarations import Entry, Option, defaults

if TYPE_CHECKING:
    import keras

tf = later("tensorflow")
losses = later("fbat_tf.attacks.losses")
constraints = later("fbat_tf.constraints")

#: The per-example state over the training split, and its dtype.
_STATE = {"prior": "float32", "momentum": "float32", "visits": "int32"}


def _per_example(mask: tf.Tensor, like: tf.Tensor) -> tf.Tensor:
    """A [B] mask shaped to broadcast over `like` ([B, ...])."""
    return tf.reshape(mask, tf.concat([tf.shape(mask), tf.ones([tf.rank(like) - 1], tf.int32)], 0))


OPTIONS = (
    Option(
        "weight",
        float,
        10.0,
        "FGSM-PGI regularizer weight λ on the squared gap between the logits at the "
        "adversarial example and at the prior (the released 10).",
        "fgsm_pgi_lambda",
        lower_bound=0.0,
    ),
    Option(
        "decay",
        float,
        0.3,
        "FGSM-PGI momentum decay μ of the per-example prior (the released 0.3).",
        lower_bound=0.0,
    ),
    Option(
        "step",
        float,
        1.0,
        "FGSM-PGI signed step alpha as a multiple of eps (the released 1).",
        lower_bound=0.0,
    ),
    Option(
        "reset",
        int,
        40,
        "FGSM-PGI: each example's prior restarts from a random corner every this "
        "many epochs (its visits; the released 40).",
        lower_bound=1,
    ),
)
_DEFAULT = defaults(OPTIONS)


class FGSMPGI(Method):
    name = "fgsm_pgi"
    # Its prior is one perturbation per training example, read and written by each step.
    single_device = True

    @staticmethod
    def check_options(*, weight: float, decay: float, step: float, reset: int) -> None:
        if not weight >= 0:
            raise ValueError(f"fgsm_pgi weight (λ) must be >= 0, got {weight!r}")
        if not decay >= 0:
            raise ValueError(f"fgsm_pgi decay (μ) must be >= 0, got {decay!r}")
        if not step > 0:
            raise ValueError(f"fgsm_pgi step (a multiple of eps) must be > 0, got {step!r}")
        if not reset >= 1:
            raise ValueError(f"fgsm_pgi reset must be >= 1 epochs, got {reset!r}")

    title = "FGSM-PGI"
    log_names = ("loss", "adv_accuracy", "pgi_penalty")
    per_example_state = True

    def __init__(
        self,
        eps: float,
        weight: float = _DEFAULT["weight"],
        decay: float = _DEFAULT["decay"],
        step: float = _DEFAULT["step"],
        reset: int = _DEFAULT["reset"],
    ):
        super().__init__(eps)
        self.check_options(weight=weight, decay=decay, step=step, reset=reset)
        self.weight = float(weight)
        self.decay = float(decay)
        self.step = float(step)
        self.alpha = self.step * self.eps
        self.reset = int(reset)
        # The split's rows, and the last step's rows with their indices until they are written.
        self.state: dict[str, tf.Variable] = {}
        self.pending: dict[str, tf.Variable] = {}

    # ------------------------------------------------------------------ state

    def build(
        self, batch_shape: tuple[int, ...], dtype: Any = "float32", examples: int | None = None
    ) -> None:
        if self.state:
            return
        batch, image = int(batch_shape[0]), tuple(batch_shape[1:])
        examples = batch if examples is None else int(examples)
        for name, kind in _STATE.items():
            shape = [examples, *image] if kind != "int32" else [examples]
            self.state[name] = tf.Variable(
                tf.zeros(shape, kind), trainable=False, name=f"fgsm_pgi_{name}"
            )
            self.pending[name] = tf.Variable(
                tf.zeros([batch, *shape[1:]], kind), trainable=False, name=f"fgsm_pgi_next_{name}"
            )
        self.pending["indices"] = tf.Variable(
            tf.range(batch, dtype=tf.int64), trainable=False, name="fgsm_pgi_next_indices"
        )

    def variables(self) -> dict[str, tf.Variable]:
        return dict(self.state)

    def step_state(self) -> list[tf.Variable]:
        return list(self.pending.values())

    def commit(self) -> None:
        rows = self.pending["indices"]
        for name in _STATE:
            self.state[name].scatter_update(tf.IndexedSlices(self.pending[name], rows))

    def _indices(self, x: tf.Tensor, indices: tf.Tensor | None) -> tf.Tensor:
        if not self.state:
            raise RuntimeError("FGSMPGI.build(batch_shape) must be called before it trains")
        if indices is None:
            return tf.range(tf.shape(x)[0], dtype=tf.int64)
        return tf.cast(indices, tf.int64)

    # ------------------------------------------------------------------ the step

    def prior(self, x: tf.Tensor, seed: tf.Tensor, indices: tf.Tensor):
        """(δ0, m, visits) of the batch's examples: their prior in this batch's C and their
        momentum, restarted (a random corner, 0) where an example's visits are a multiple of
        R, and their visits so far."""
        visits = tf.gather(self.state["visits"], indices)
        fresh = _per_example(tf.equal(visits % self.reset, 0), x)
        corner = self.alpha * tf.sign(constraints.uniform_noise(x, self.eps, seed))
        prior = tf.cast(tf.gather(self.state["prior"], indices), x.dtype)
        momentum = tf.cast(tf.gather(self.state["momentum"], indices), x.dtype)
        start = constraints.project(tf.where(fresh, corner, prior), x, self.eps)
        return start, tf.where(fresh, tf.zeros_like(momentum), momentum), visits

    def moved(self, x: tf.Tensor, start: tf.Tensor, momentum: tf.Tensor, grad: tf.Tensor):
        """(δ, the next prior, the next momentum) from δ0, m and the input gradient at δ0."""
        grad = tf.cast(grad, x.dtype)
        momentum = tf.math.divide_no_nan(grad, tf.reduce_sum(tf.abs(grad))) + self.decay * momentum
        delta = constraints.project(start + self.alpha * tf.sign(grad), x, self.eps)
        following = constraints.project(start + self.alpha * tf.sign(momentum), x, self.eps)
        return delta, following, momentum

    def perturb(self, model: keras.Model, x, y, seed, loss_scale=None, indices=None) -> tf.Tensor:
        indices = self._indices(x, indices)
        start, momentum, _ = self.prior(x, seed, indices)
        grad = input_gradient(model, x, start, y, loss_scale)
        return x + self.moved(x, start, momentum, grad)[0]

    def gradients(self, model: keras.Model, x, y, seed, loss_scale=None, indices=None):
        indices = self._indices(x, indices)
        start, momentum, visits = self.prior(x, seed, indices)
        attack_scale = per_example_scale(loss_scale, x)
        with tf.GradientTape() as tape:
            # The forward at the prior: its input gradient, and the regularizer's logits, whose
            # weight gradient flows back through this same pass.
            with tf.GradientTape(watch_accessed_variables=False) as inner:
                inner.watch(start)
                start_logits = model(x + start, training=True)
                attack = scaled(tf.reduce_sum(losses.cross_entropy(start_logits, y)), attack_scale)
            with tape.stop_recording():
                grad = unscaled(inner.gradient(attack, start), attack_scale)
                delta, following, momentum = self.moved(x, start, momentum, grad)
            logits = model(x + tf.stop_gradient(delta), training=True)
            ce = tf.reduce_mean(losses.cross_entropy(logits, y))
            gap = losses.as_loss_dtype(logits) - losses.as_loss_dtype(start_logits)
            penalty = tf.reduce_mean(tf.square(tf.cast(gap, ce.dtype)))
            loss = ce + tf.cast(self.weight, ce.dtype) * penalty
            objective = scaled(loss, loss_scale)
        grads = tape.gradient(objective, model.trainable_variables)
        rows = {"prior": following, "momentum": momentum, "visits": visits + 1}
        for name, value in rows.items():
            self.pending[name].assign(tf.cast(value, self.pending[name].dtype))
        self.pending["indices"].assign(indices)
        logs = {
            "loss": loss,
            "adv_accuracy": tf.reduce_mean(losses.correct(logits, y)),
            "pgi_penalty": penalty,
        }
        return grads, logs

    def config(self) -> dict:
        return {
            **super().config(),
            "weight": self.weight,
            "decay": self.decay,
            "step": self.step,
            "alpha": self.alpha,
            "reset": self.reset,
        }


# The input gradient at the prior, then one weight pass back through both forward
# passes (the regularizer reads the logits at the prior as well).
ENTRY = Entry(FGSMPGI, OPTIONS, passes=lambda c: counts(2, 3))
