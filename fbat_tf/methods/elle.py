"""ELLE and ELLE-A (Abad Rocamora et al., "Efficient local linearity regularization to overcome
catastrophic overfitting", ICLR 2024): single-step adversarial training plus a penalty on how far
the loss is from linear along a random segment inside the ε-ball, with no double backprop.

    x_a, x_b = x + P_C(U[−ε, ε]^d)  (two draws),  t_i ~ U[0, 1],  x_c = (1 − t)·x_a + t·x_b
    E_lin = (1/B) Σ_i (CE_i(x_c) − (1 − t_i)·CE_i(x_a) − t_i·CE_i(x_b))²
    loss  = (1/B) Σ_i CE_i(x + δ) + λ·E_lin

δ comes from the base attack: one FGSM step of α = ε from δ = 0 (default), N-FGSM's step from
noise of 2ε, or none (train on x). One weight gradient of the whole loss flows through the
training point and the three triplet points; the triplets go through the model as one batch of
3B examples (their batch-norm statistics shared), the training point as its own batch. The step
seed is split in three (`stateless_split`): the base attack's, x_a and x_b's (one draw over
[x; x]), and the t's. A step costs 5 forward and 5 backward passes, 4 and 4 on clean inputs.

ELLE keeps λ fixed. ELLE-A (the default) starts from λ = 0 and, after each step, compares the
step's E_lin with the mean μ and the population standard deviation σ of the E_lin of every
earlier step of the run: once at least three are known and E_lin > μ + s·σ, λ jumps to λ_max;
otherwise λ ← γ·λ. The step uses the λ from before its own E_lin. The state (λ, the count, mean
and sum of squared deviations of E_lin, Welford's) is a set of variables: checkpointed with the
weights and put back with them when a step is skipped. The trainer updates it through
`after_gradients`, outside XLA; under a distribution strategy the replicas' E_lin are averaged
first, the global batch's as the released (single-process) trainer computes it.

    method = methods.create("elle", eps=8 / 255)                       # ELLE-A, λ_max = 4000
    method = methods.create("elle", eps=8 / 255, schedule="constant")  # ELLE, λ = 1000

Where each default comes from (LIONS-EPFL/ELLE, the authors' released code, and the paper):

- E_lin, one triplet per example, the mean of squared gaps over the batch, added to the CE at the
  training point with the gradient through all three losses: the paper's definition of E_lin and
  `core/utils/train.py` (`Trainer.loss`, `reg == 'ELLE'`; the same lines as the README snippet).
- ELLE-A by default: `parser.py` (`--lambda_schedule` defaults to `onoff`, ELLE-A); the paper's
  abstract reports that adapting λ improves on a fixed λ.
- λ_max = 4000 at every ε: `scripts/run_elle-a_cifar10.sh` (`--lin_reg 4000`).
- Fixed λ (ELLE): `scripts/run_elle_cifar10.sh`: 1000 for ε ≤ 8/255, 5000 for 10–20/255, 10000
  for 22–26/255 (here: up to 8/255, up to 20/255, above).
- γ = 0.99 and s = 2: `parser.py` (`--decay_rate`, `--sensitivity`).
- The rule, its order (the step's λ first, then the update) and its statistic (every earlier
  value, numpy's population std, a jump only past two values): `core/utils/train.py`
  (`Trainer.train`); λ starts at 0 with λ_max set aside: `train.py` (`lambda_schedule ==
  'onoff'`). (`ImageNet/ImageNet/main_fast.py` uses the last 500 values and a smooth-L1 gap;
  not followed.)
- The base attack: one step (`--attack-iter 1`) of α = ε (`--attack-step` = `--attack-eps`) from
  x (`--input_noise_rate` 0, `parser.py`'s default): `scripts/run_elle*_cifar10.sh`; N-FGSM as
  the base, noise 2ε: `scripts/run_N-FGSM+elle-a_cifar10.sh` (`--input_noise_rate 2.0`).

Two departures from the released CIFAR trainer, both to this project's conventions: every point
is kept in [0, 1] (the FGSM point is projected onto C, x_a and x_b are P_C of their draws, as
`ImageNet/ImageNet/main_fast.py` clips its triplets; the CIFAR trainer clips neither), and an
optimizer step is taken once per batch (the CIFAR trainer's loop calls `optimizer.step()` twice).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from fbat_tf.catalog import ELLE_ATTACKS, ELLE_SCHEDULES, counts
from fbat_tf.lazy import later
from fbat_tf.methods.base import Method, fgsm_step, scaled
from fbat_tf.methods.declarations import Entry, Option, defaults
from fbat_tf.methods.n_fgsm import NFGSM

if TYPE_CHECKING:
    import keras

tf = later("tensorflow")
losses = later("fbat_tf.attacks.losses")
constraints = later("fbat_tf.constraints")

#: N-FGSM's noise as ELLE's base attack, a multiple of ε (scripts/run_N-FGSM+elle-a_cifar10.sh).
NFGSM_NOISE = 2.0
#: λ_max of ELLE-A at every ε (scripts/run_elle-a_cifar10.sh).
ADAPTIVE_LAMBDA_MAX = 4000.0


def default_weight(eps: float, schedule: str) -> float:
    """λ_max = 4000 for ELLE-A; ELLE's fixed λ: 1000 up to ε = 8/255, 5000 up to 20/255, 10000
    above (the released scripts' values, which name even ε only)."""
    if schedule == "adaptive":
        return ADAPTIVE_LAMBDA_MAX
    if eps <= 8.0 / 255 + 1e-9:
        return 1000.0
    if eps <= 20.0 / 255 + 1e-9:
        return 5000.0
    return 10000.0


def adaptive_update(
    lam: tf.Tensor,
    count: tf.Tensor,
    mean: tf.Tensor,
    m2: tf.Tensor,
    error: tf.Tensor,
    *,
    lambda_max: float,
    decay: float,
    sensitivity: float,
) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor]:
    """ELLE-A's step: λ_max where more than two earlier E_lin are known and `error` exceeds
    their mean + s·(population std), else γ·λ; then `error` joins the statistic (Welford's
    count, mean and sum of squared deviations). Returns the new (λ, count, mean, m2)."""
    std = tf.sqrt(tf.maximum(m2, 0.0) / tf.maximum(count, 1.0))
    jump = tf.logical_and(count > 2.0, error > mean + sensitivity * std)
    new_lam = tf.where(jump, tf.constant(lambda_max, lam.dtype), decay * lam)
    new_count = count + 1.0
    deviation = error - mean
    new_mean = mean + deviation / new_count
    new_m2 = m2 + deviation * (error - new_mean)
    return new_lam, new_count, new_mean, new_m2


def linearity_error(
    model: keras.Model,
    y: tf.Tensor,
    x_a: tf.Tensor,
    x_b: tf.Tensor,
    x_c: tf.Tensor,
    t: tf.Tensor,
) -> tf.Tensor:
    """E_lin = (1/B) Σ_i (CE_i(x_c) − (1 − t_i)·CE_i(x_a) − t_i·CE_i(x_b))², the three points
    through the model as one batch of 3B (batch norm in train mode), recorded on any tape."""
    batch = tf.shape(y)[0]
    logits = model(tf.concat([x_a, x_b, x_c], axis=0), training=True)
    ce = losses.cross_entropy(logits, tf.tile(y, [3]))
    ce_a, ce_b, ce_c = ce[:batch], ce[batch : 2 * batch], ce[2 * batch :]
    t = tf.cast(t, ce.dtype)
    return tf.reduce_mean(tf.square(ce_c - ((1.0 - t) * ce_a + t * ce_b)))


OPTIONS = (
    Option(
        "weight",
        float,
        None,
        "ELLE penalty weight λ; ELLE-A's λ_max (default: 4000 for ELLE-A; ELLE's "
        "1000 at eps <= 8, 5000 at eps <= 20, 10000 above).",
        "elle_lambda",
        lower_bound=0.0,
    ),
    Option(
        "schedule",
        str,
        "adaptive",
        "ELLE's λ: adaptive (ELLE-A: 0, raised to λ_max when the linearity error "
        "jumps, else decayed) or constant (ELLE).",
        choices=ELLE_SCHEDULES,
    ),
    Option(
        "decay",
        float,
        0.99,
        "ELLE-A: λ ← decay·λ on a step without a jump.",
        lower_bound=0.0,
    ),
    Option(
        "sensitivity",
        float,
        2.0,
        "ELLE-A: a jump is a linearity error above mean + this many std of the earlier ones.",
        lower_bound=0.0,
    ),
    Option(
        "attack",
        str,
        "fgsm",
        "ELLE's training point: one FGSM step from x, N-FGSM's step (noise 2·eps), "
        "or none (x itself).",
        choices=ELLE_ATTACKS,
    ),
    Option(
        "step",
        float,
        1.0,
        "ELLE's attack step alpha as a multiple of eps (the released 1).",
        lower_bound=0.0,
    ),
)
_DEFAULT = defaults(OPTIONS)


class ELLE(Method):
    name = "elle"

    @staticmethod
    def check_options(
        *,
        weight: float | None,
        schedule: str,
        decay: float,
        sensitivity: float,
        attack: str,
        step: float,
    ) -> None:
        if schedule not in ELLE_SCHEDULES:
            raise ValueError(f"elle schedule must be one of {ELLE_SCHEDULES}, got {schedule!r}")
        if attack not in ELLE_ATTACKS:
            raise ValueError(f"elle attack must be one of {ELLE_ATTACKS}, got {attack!r}")
        # None: the default for ε and the schedule, which is positive.
        if weight is not None and not float(weight) >= 0:
            raise ValueError(f"elle weight (λ) must be >= 0, got {weight!r}")
        if not 0 < decay <= 1:
            raise ValueError(f"elle decay (γ) must be in (0, 1], got {decay!r}")
        if not sensitivity >= 0:
            raise ValueError(f"elle sensitivity (s) must be >= 0, got {sensitivity!r}")
        if not step >= 0:
            raise ValueError(f"elle step (a multiple of eps) must be >= 0, got {step!r}")
        if attack == "nfgsm":  # its training point is N-FGSM's, with this step
            NFGSM.check_options(noise=NFGSM_NOISE, step=float(step), clip=None)

    log_names = ("loss", "adv_accuracy", "elle_error", "elle_lambda")

    def __init__(
        self,
        eps: float,
        weight: float | None = _DEFAULT["weight"],
        schedule: str = _DEFAULT["schedule"],
        decay: float = _DEFAULT["decay"],
        sensitivity: float = _DEFAULT["sensitivity"],
        attack: str = _DEFAULT["attack"],
        step: float = _DEFAULT["step"],
    ):
        super().__init__(eps)
        self.check_options(
            weight=weight,
            schedule=schedule,
            decay=decay,
            sensitivity=sensitivity,
            attack=attack,
            step=step,
        )
        self.schedule = schedule
        self.attack = attack
        self.weight = default_weight(self.eps, schedule) if weight is None else float(weight)
        self.decay = float(decay)
        self.sensitivity = float(sensitivity)
        self.step = float(step)
        self.alpha = self.step * self.eps
        self.title = ("ELLE-A" if self.adaptive else "ELLE") + {
            "fgsm": "",
            "nfgsm": " on N-FGSM",
            "none": " on clean inputs",
        }[attack]
        # N-FGSM's training point, made only where it is ELLE's attack.
        self._nfgsm = (
            NFGSM(self.eps, noise=NFGSM_NOISE, step=self.step) if attack == "nfgsm" else None
        )
        self.state: dict[str, tf.Variable] = {}

    @property
    def adaptive(self) -> bool:
        return self.schedule == "adaptive"

    # ------------------------------------------------------------------ state (ELLE-A)

    def build(
        self, batch_shape: tuple[int, ...], dtype: Any = "float32", examples: int | None = None
    ) -> None:
        if not self.adaptive or self.state:
            return
        # Under a distribution strategy each replica keeps its own copy and writes it without
        # a cross-replica merge (the trainer's put-back of a skipped step runs inside tf.cond,
        # where a merge cannot); every replica makes the same update from the averaged E_lin,
        # and a checkpoint saves the first replica's copy.
        for name in ("lambda", "count", "mean", "m2"):
            self.state[name] = tf.Variable(
                0.0,
                dtype=tf.float32,
                trainable=False,
                name=f"elle_{name}",
                synchronization=tf.VariableSynchronization.ON_READ,
                aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
            )

    def variables(self) -> dict[str, tf.Variable]:
        return dict(self.state)

    def current_lambda(self) -> tf.Tensor:
        """The λ of the next step (float32)."""
        if not self.adaptive:
            return tf.constant(self.weight, tf.float32)
        if not self.state:
            raise RuntimeError("ELLE.build(batch_shape) must be called before ELLE-A trains")
        return tf.identity(self.state["lambda"])

    def after_gradients(self, logs) -> None:
        if not self.adaptive:
            return
        error = tf.cast(logs["elle_error"], tf.float32)
        context = tf.distribute.get_replica_context()
        if context is not None and context.num_replicas_in_sync > 1:
            error = context.all_reduce("MEAN", error)
        s = self.state
        updated = adaptive_update(
            s["lambda"],
            s["count"],
            s["mean"],
            s["m2"],
            error,
            lambda_max=self.weight,
            decay=self.decay,
            sensitivity=self.sensitivity,
        )
        for name, value in zip(("lambda", "count", "mean", "m2"), updated, strict=True):
            s[name].assign(value)

    # ------------------------------------------------------------------ the step

    @staticmethod
    def _seeds(seed: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """The step seed's parts: the base attack's, the triplet points', the t's."""
        parts = tf.random.experimental.stateless_split(constraints.as_seed(seed), num=3)
        return parts[0], parts[1], parts[2]

    def triplet(self, x: tf.Tensor, seed: tf.Tensor):
        """(x_a, x_b, x_c, t) of the step with seed `seed`: x_a and x_b = x + P_C of U[−ε, ε]
        draws, t ~ U[0, 1] per example (shape [B]), x_c = (1 − t)·x_a + t·x_b."""
        _, point_seed, t_seed = self._seeds(seed)
        pair = tf.concat([x, x], axis=0)
        ends = pair + constraints.random_init(pair, self.eps, point_seed)
        batch = tf.shape(x)[0]
        x_a, x_b = ends[:batch], ends[batch:]
        t = 0.5 + constraints.uniform_noise(tf.zeros(tf.shape(x)[:1], x.dtype), 0.5, t_seed)
        t_b = tf.reshape(t, tf.concat([[batch], tf.ones([tf.rank(x) - 1], tf.int32)], 0))
        return x_a, x_b, (1.0 - t_b) * x_a + t_b * x_b, t

    def perturb(self, model: keras.Model, x, y, seed, loss_scale=None) -> tf.Tensor:
        attack_seed, _, _ = self._seeds(seed)
        if self.attack == "none":
            return tf.identity(x)
        if self.attack == "nfgsm":
            return self._nfgsm.perturb(model, x, y, attack_seed, loss_scale)
        delta = fgsm_step(model, x, tf.zeros_like(x), y, self.eps, self.alpha, loss_scale)
        return x + delta

    def gradients(self, model: keras.Model, x, y, seed, loss_scale=None):
        x_train = tf.stop_gradient(self.perturb(model, x, y, seed, loss_scale))
        x_a, x_b, x_c, t = (tf.stop_gradient(v) for v in self.triplet(x, seed))
        lam = self.current_lambda()
        with tf.GradientTape() as tape:
            logits = model(x_train, training=True)
            ce = tf.reduce_mean(losses.cross_entropy(logits, y))
            error = linearity_error(model, y, x_a, x_b, x_c, t)
            loss = ce + tf.cast(lam, ce.dtype) * tf.cast(error, ce.dtype)
            objective = scaled(loss, loss_scale)
        grads = tape.gradient(objective, model.trainable_variables)
        logs = {
            "loss": loss,
            "adv_accuracy": tf.reduce_mean(losses.correct(logits, y)),
            "elle_error": error,
            "elle_lambda": lam,
        }
        return grads, logs

    def config(self) -> dict:
        return {
            **super().config(),
            "weight": self.weight,
            "schedule": self.schedule,
            "decay": self.decay,
            "sensitivity": self.sensitivity,
            "attack": self.attack,
            "step": self.step,
            "alpha": self.alpha,
        }


def _elle_passes(config: Mapping[str, Any]) -> dict[str, int]:
    attack = config.get("attack", _DEFAULT["attack"])
    return counts(4, 4) if attack == ELLE_ATTACKS[2] else counts(5, 5)


# The attack's input gradient (none on clean inputs), then one weight pass through
# the training point's batch and the triplets' batch of 3B examples (3 passes).
ENTRY = Entry(ELLE, OPTIONS, passes=_elle_passes, cost_options={"attack": "fgsm"})
