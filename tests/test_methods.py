"""Every training method: a step moves the weights, its adversarial examples lie in C, XLA agrees
with eager execution, and each dtype policy runs under XLA.

The exact Fast-BAT and GradAlign numerics are checked against independent computations in
test_fastbat_reference.py and test_gradalign_reference.py.
"""

from __future__ import annotations

import importlib

import keras
import numpy as np
import pytest
import tensorflow as tf

from fbat_tf import constraints, methods
from fbat_tf.catalog import LINEARIZATIONS
from fbat_tf.methods.base import Method
from fbat_tf.methods.fast_at_ga import default_ga_coef

EPS = 8.0 / 255
SHAPE = (8, 8, 3)
BATCH = 6

# Every method with its non-default variants.
VARIANTS = [
    ("standard", {}),
    ("fastat", {}),
    ("fastat_ga", {}),
    ("pgd", {"steps": 3}),
    ("free", {"replays": 2}),
    ("fastbat", {}),
    ("fastbat", {"ig": "hessian_aware", "cg_steps": 2}),
    ("fastbat", {"implicit_autodiff": "forward_over_backward"}),
    ("fastbat", {"ig": "none"}),
    *[("fastbat", {"linearization": name}) for name in LINEARIZATIONS if name != "pgd_nosign"],
    ("nfgsm", {}),
    ("nfgsm", {"clip": 1.0}),
    ("elle", {}),
    ("elle", {"schedule": "constant", "attack": "nfgsm"}),
    ("fgsm_pgi", {}),
]
IDS = [f"{name}-{'-'.join(map(str, opts.values())) or 'default'}" for name, opts in VARIANTS]


def tiny_model(num_classes: int = 4) -> keras.Model:
    keras.utils.set_random_seed(1)
    return keras.Sequential(
        [
            keras.Input(SHAPE),
            keras.layers.Conv2D(4, 3, padding="same", use_bias=False),
            keras.layers.BatchNormalization(),
            keras.layers.Activation("softplus"),
            keras.layers.Conv2D(4, 3, strides=2, padding="same"),
            keras.layers.Activation("softplus"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(num_classes, dtype="float32"),
        ]
    )


def batch(seed: int = 0) -> tuple[tf.Tensor, tf.Tensor]:
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 1, (BATCH, *SHAPE)).astype(np.float32)
    x[:, :2] = 0.0  # pixels at the box bounds make the [0, 1] constraint active
    x[:, -2:] = 1.0
    return tf.constant(x), tf.constant(rng.integers(0, 4, BATCH), tf.int32)


def make(name: str, options: dict) -> Method:
    method = methods.create(name, eps=EPS, **options)
    method.build((BATCH, *SHAPE))
    return method


SEED = tf.constant([3, 7], tf.int32)


def _bound(name: str, options: dict) -> float:
    """How far a method's training point may lie from x: ε, but N-FGSM's (k + 1)·ε unclipped
    (also as ELLE's base attack)."""
    if name == "nfgsm" and options.get("clip") is None:
        return (options.get("noise", 2.0) + 1) * EPS
    if name == "elle" and options.get("attack") == "nfgsm":
        return 3 * EPS
    return EPS


@pytest.mark.parametrize(("name", "options"), VARIANTS, ids=IDS)
def test_adversarial_examples_lie_in_C(name, options):
    model, (x, y) = tiny_model(), batch()
    x_adv = make(name, options).perturb(model, x, y, SEED)
    delta = (x_adv - x).numpy()
    assert np.abs(delta).max() <= _bound(name, options) + 1e-6
    assert x_adv.numpy().min() >= 0.0 and x_adv.numpy().max() <= 1.0
    if name not in ("standard", "free"):  # Free-AT starts from δ = 0
        assert np.abs(delta).max() > EPS / 2, "the attack did not move"


@pytest.mark.parametrize(("name", "options"), VARIANTS, ids=IDS)
def test_one_step_changes_weights_and_logs_are_finite(name, options):
    model, (x, y) = tiny_model(), batch()
    method = make(name, options)
    before = [w.numpy().copy() for w in model.trainable_variables]
    grads, logs = method.gradients(model, x, y, SEED)
    assert set(method.log_names) <= set(logs)
    assert all(np.isfinite(float(v)) for v in logs.values())
    optimizer = keras.optimizers.SGD(0.1)
    optimizer.apply(grads, model.trainable_variables)
    moved = [
        not np.allclose(b, w.numpy())
        for b, w in zip(before, model.trainable_variables, strict=True)
    ]
    assert sum(moved) >= len(moved) - 1  # the conv bias under batch-norm may get ~0 gradient


def _global_relative_error(a: list[tf.Tensor], b: list[tf.Tensor]) -> float:
    diff = tf.linalg.global_norm([x - y for x, y in zip(a, b, strict=True)])
    return float(diff / tf.linalg.global_norm(a))


def _same_noise_everywhere(x, eps, seed):
    """U[-ε, ε] from numpy: XLA's stateless RNG draws another stream than TF's kernels for the
    same seed, so the comparison of the deterministic math shares one draw."""
    rng = np.random.default_rng(5)
    return tf.constant(rng.uniform(-eps, eps, x.shape).astype(x.dtype.as_numpy_dtype))


@pytest.mark.slow
@pytest.mark.parametrize(("name", "options"), VARIANTS, ids=IDS)
def test_xla_matches_eager_in_float32(name, options, monkeypatch):
    monkeypatch.setattr(constraints, "uniform_noise", _same_noise_everywhere)
    model, (x, y) = tiny_model(), batch()
    method = make(name, options)
    state = None if method.name != "free" else method.delta.numpy()
    eager, eager_logs = method.gradients(model, x, y, SEED)
    if state is not None:
        method.delta.assign(state)  # Free-AT moved δ; replay from the same state
    # FGSM-PGI's rows of the batch, which the step leaves for the trainer to write.
    pending = method.step_state() if method.per_example_state else []
    rows = [v.numpy().copy() for v in pending]
    compiled = tf.function(method.gradients, jit_compile=True, autograph=False)
    xla, xla_logs = compiled(model, x, y, SEED)
    assert _global_relative_error(eager, xla) < 1e-4
    np.testing.assert_allclose(float(eager_logs["loss"]), float(xla_logs["loss"]), rtol=1e-4)
    for eager_rows, variable in zip(rows, pending, strict=True):
        np.testing.assert_allclose(eager_rows, variable.numpy(), rtol=1e-4, atol=1e-7)


POLICY_VARIANTS = [
    *range(6),
    7,
    IDS.index("nfgsm-default"),
    IDS.index("elle-default"),
    IDS.index("fgsm_pgi-default"),
]


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize(
    ("name", "options"),
    [VARIANTS[i] for i in POLICY_VARIANTS],
    ids=[IDS[i] for i in POLICY_VARIANTS],
)
def test_each_policy_runs_under_xla(policy, name, options):
    keras.mixed_precision.set_global_policy(policy)
    try:
        model, (x, y) = tiny_model(), batch()
        method = make(name, options)
        scale = tf.constant(1024.0) if policy == "mixed_float16" else None
        step = tf.function(method.gradients, jit_compile=True, autograph=False)
        grads, logs = step(model, x, y, SEED, scale)
        assert all(
            g.dtype == w.dtype for g, w in zip(grads, model.trainable_variables, strict=True)
        )
        assert all(np.all(np.isfinite(g.numpy())) for g in grads)
        assert np.isfinite(float(logs["loss"]))
        x_adv = method.perturb(model, x, y, SEED, scale)
        assert np.abs((x_adv - x).numpy()).max() <= _bound(name, options) + 1e-6
    finally:
        keras.mixed_precision.set_global_policy("float32")


def test_loss_scale_returns_scaled_weight_gradients_and_the_same_attack():
    model, (x, y) = tiny_model(), batch()
    method = make("fastbat", {})
    plain, _ = method.gradients(model, x, y, SEED)
    scaled, _ = method.gradients(model, x, y, SEED, tf.constant(256.0))
    assert _global_relative_error([256.0 * g for g in plain], scaled) < 1e-5


def test_fastat_is_one_fgsm_step_from_the_random_start():
    # Against a brute-force recomputation of the docs/DESIGN.md §3.2 table entry.
    model, (x, y) = tiny_model(), batch()
    x_adv = make("fastat", {}).perturb(model, x, y, SEED)
    delta0 = constraints.project(
        tf.random.stateless_uniform(tf.shape(x), SEED, minval=-EPS, maxval=EPS), x, EPS
    )
    with tf.GradientTape() as tape:
        tape.watch(delta0)
        loss = tf.reduce_sum(
            tf.keras.losses.sparse_categorical_crossentropy(
                y, model(x + delta0, training=True), from_logits=True
            )
        )
    step = delta0 + 1.25 * EPS * tf.sign(tape.gradient(loss, delta0))
    expected = x + tf.clip_by_value(tf.clip_by_value(step, -EPS, EPS), -x, 1 - x)
    np.testing.assert_allclose(x_adv.numpy(), expected.numpy(), atol=1e-7)


@pytest.mark.parametrize("clip", [None, 1.0])
def test_nfgsm_is_a_signed_step_of_eps_from_noise_of_twice_eps_without_projection(clip):
    """N-FGSM against a brute-force recomputation: η ~ U[−2ε, 2ε] (the seed's draw), x + η
    clipped to [0, 1]; δ = η + ε·sign(∇η Σ CE(x + η)), x + δ clipped to [0, 1]; no projection onto
    the ε-ball, unless clip=c clips δ to [−cε, cε]."""
    model, (x, y) = tiny_model(), batch()
    x_adv = make("nfgsm", {"clip": clip}).perturb(model, x, y, SEED).numpy()
    noise = tf.random.stateless_uniform(tf.shape(x), SEED, minval=-2 * EPS, maxval=2 * EPS)
    xn = x.numpy()
    eta = np.clip(xn + noise.numpy(), 0.0, 1.0) - xn
    assert np.abs(noise.numpy()).max() > 1.9 * EPS  # the noise reaches past the ε-ball
    grad, _ = _brute_input_gradient(model, x, y, tf.constant(eta))
    expected = np.clip(xn + eta + EPS * np.sign(grad.numpy()), 0.0, 1.0)
    if clip is not None:
        expected = xn + np.clip(expected - xn, -clip * EPS, clip * EPS)
    np.testing.assert_allclose(x_adv, expected, atol=1e-6)
    assert x_adv.min() >= 0.0 and x_adv.max() <= 1.0
    distance = np.abs(x_adv - xn).max()
    if clip is None:
        assert 2 * EPS < distance <= 3 * EPS + 1e-6  # no projection: beyond ε
    else:
        assert distance <= EPS + 1e-6


def _brute_input_gradient(model, x, y, delta, mean=False):
    """∇δ of the summed (or mean) cross-entropy at x + δ, batch norm in train mode."""
    with tf.GradientTape() as tape:
        tape.watch(delta)
        ce = tf.keras.losses.sparse_categorical_crossentropy(
            y, model(x + delta, training=True), from_logits=True
        )
        loss = tf.reduce_mean(ce) if mean else tf.reduce_sum(ce)
    return tape.gradient(loss, delta), float(tf.reduce_sum(ce))


def _clip_to_C(delta, x):
    return tf.clip_by_value(tf.clip_by_value(delta, -EPS, EPS), -x, 1 - x)


def test_pgd_at_is_k_signed_ascent_steps_from_the_random_start():
    """PGD-3 against a brute-force loop; each step raises the loss."""
    model, (x, y) = tiny_model(), batch()
    method = make("pgd", {"steps": 3})
    x_adv = method.perturb(model, x, y, SEED)
    delta = constraints.project(
        tf.random.stateless_uniform(tf.shape(x), SEED, minval=-EPS, maxval=EPS), x, EPS
    )
    losses = []
    for _ in range(3):
        grad, loss = _brute_input_gradient(model, x, y, delta)
        losses.append(loss)
        delta = _clip_to_C(delta + method.alpha * tf.sign(grad), x)
    losses.append(_brute_input_gradient(model, x, y, delta)[1])
    np.testing.assert_allclose(x_adv.numpy(), (x + delta).numpy(), atol=1e-6)
    assert losses == sorted(losses) and losses[-1] > losses[0], losses


def test_free_at_steps_delta_up_its_own_gradient_across_replays():
    """Free-AT's δ over three replays against a brute-force loop: δ ← P_C(δ + ε·sign(∇δ L)) with
    the gradient of the batch-mean loss at x + δ, carried from replay to replay; the weight
    gradient is that of the same pass. The loss at the new δ exceeds the loss at the old one."""
    model, (x, y) = tiny_model(), batch()
    method = make("free", {"replays": 3})
    delta = tf.zeros_like(x)
    for _ in range(3):
        grads, _ = method.gradients(model, x, y, SEED)
        with tf.GradientTape() as tape:
            tape.watch(delta)
            loss = tf.reduce_mean(
                tf.keras.losses.sparse_categorical_crossentropy(
                    y, model(x + delta, training=True), from_logits=True
                )
            )
        weight_grads, grad = tape.gradient(loss, [model.trainable_variables, delta])
        assert _global_relative_error(grads, weight_grads) < 1e-5
        new_delta = _clip_to_C(delta + EPS * tf.sign(grad), x)
        np.testing.assert_allclose(method.delta.numpy(), new_delta.numpy(), atol=1e-6)
        before = _brute_input_gradient(model, x, y, delta)[1]
        after = _brute_input_gradient(model, x, y, new_delta)[1]
        assert after > before
        delta = new_delta


def test_pgd_step_size_defaults():
    assert make("pgd", {}).steps == 2  # PGD-2-AT, the paper's baseline
    assert make("pgd", {"steps": 2}).alpha == pytest.approx(EPS / 2)
    assert make("pgd", {"steps": 10}).alpha == pytest.approx(2 / 255)


def test_free_carries_delta_across_replays():
    model, (x, y) = tiny_model(), batch()
    method = make("free", {"replays": 4})
    assert float(tf.reduce_max(tf.abs(method.delta))) == 0.0
    method.gradients(model, x, y, SEED)
    first = method.delta.numpy().copy()
    assert np.abs(first).max() == pytest.approx(EPS, rel=1e-5)  # one step of size ε
    method.gradients(model, x, y, SEED)
    assert not np.allclose(first, method.delta.numpy())
    assert np.abs(method.delta.numpy()).max() <= EPS + 1e-7


def test_default_hyper_parameters_follow_the_paper():
    """The defaults no reference test reads (those tests set each option themselves), against
    their sources: Fast-BAT's paper settings, GradAlign's and Free-AT's authors' values."""
    fastbat = make("fastbat", {})
    assert fastbat.lambda_inv == pytest.approx(5000 / 255)
    assert methods.create("fastbat", eps=16 / 255).lambda_inv == pytest.approx(2500 / 255)
    assert fastbat.ig_coef == 0.1
    assert (fastbat.ig, fastbat.linearization, fastbat.cg_steps) == (
        "hessian_free",
        "pgd_nosign",
        3,
    )
    assert default_ga_coef(4 / 255) == 0.2 and default_ga_coef(32 / 255) == 2.0
    assert default_ga_coef(12 / 255) == pytest.approx(0.2 * 10**0.5)
    assert make("fastat_ga", {}).alpha == pytest.approx(1.25 * EPS)
    assert make("free", {}).replays == 8


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("fastbatt", {}, "fastbatt"),
        ("fastbat", {"ig": "exact"}, "exact"),
        ("fastbat", {"linearization": "newton"}, "newton"),
        ("fastbat", {"bogus": 1}, "bogus"),
        ("pgd", {"steps": 0}, "steps"),
        ("elle", {"schedule": "ramp"}, "ramp"),
        ("elle", {"attack": "pgd"}, "pgd"),
        ("elle", {"decay": 1.5}, "decay"),
    ],
)
def test_bad_options_name_the_bad_value(name, options, message):
    with pytest.raises(ValueError, match=message):
        methods.create(name, eps=EPS, **options)


def test_inactive_mask_against_a_brute_force_loop():
    """The default margin τ = 1e-7: a coordinate 3e-7 inside a bound is inactive, one 3e-8
    inside is not (τ ten times larger or smaller would tell them otherwise)."""
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, (50,)).astype(np.float32)
    x[:10] = 0.0
    x[20:24] = 0.5  # the ε-ball's bounds bind
    delta = rng.uniform(-EPS, EPS, (50,)).astype(np.float32)
    delta[10:20] = EPS
    delta[:5] = 0.0  # at the lower bound -x = 0
    delta[20:22] = np.float32(EPS) - np.float32([3e-7, 3e-8])  # just inside the upper bound
    delta[22:24] = np.float32(-EPS) + np.float32([3e-7, 3e-8])  # and the lower one
    delta = np.clip(delta, -x, 1 - x)
    mask = constraints.inactive_mask(tf.constant(delta), tf.constant(x), EPS).numpy()
    for i in range(50):
        low, high = max(-EPS, -x[i]), min(EPS, 1 - x[i])
        assert mask[i] == float(low + 1e-7 < delta[i] < high - 1e-7), i
    assert list(mask[20:24]) == [1.0, 0.0, 1.0, 0.0]
    assert 0 < mask.sum() < 50


def test_loss_scale_keeps_float16_input_gradients_from_underflowing():
    """A model whose input gradient (~1e-9) is below float16's smallest subnormal (~6e-8): the
    unscaled float16 backward pass flushes it to zero, the scaled one recovers the float32
    value (computed independently with the same weights in float32)."""
    from fbat_tf.methods.base import input_gradient

    def build() -> keras.Model:
        model = keras.Sequential(
            [keras.Input((6,)), keras.layers.Dense(3, use_bias=False), keras.layers.Dense(2)]
        )
        model.layers[0].set_weights([np.full((6, 3), 1e-6, np.float32)])
        model.layers[1].set_weights(
            [np.array([[1e-3, -1e-3]] * 3, np.float32), np.zeros(2, np.float32)]
        )
        return model

    x = tf.constant(np.random.default_rng(0).uniform(0, 1, (4, 6)), tf.float32)
    y = tf.constant([0, 1, 0, 1], tf.int32)
    delta = tf.zeros_like(x)
    reference = input_gradient(build(), x, delta, y).numpy()
    assert 1e-10 < np.abs(reference).min() and np.abs(reference).max() < 6e-8
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = build()
        plain = input_gradient(model, x, delta, y).numpy()
        scaled = input_gradient(model, x, delta, y, tf.constant(2.0**15)).numpy()
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert np.all(plain == 0.0)
    np.testing.assert_allclose(scaled, reference, rtol=0.05)


def test_pgd_at_graph_does_not_grow_with_steps():
    from tests.test_attacks import graph_size

    model = tiny_model()
    x, y = batch()
    seed = tf.constant([0, 0], tf.int32)
    sizes = []
    for steps in (2, 20):
        method = methods.create("pgd", eps=EPS, steps=steps)
        perturb = tf.function(lambda x, y, s, m=method: m.perturb(model, x, y, s))
        sizes.append(graph_size(perturb.get_concrete_function(x, y, seed)))
    assert sizes[0] == sizes[1]


def test_attack_gradients_do_not_overflow_float16_at_the_weight_pass_scale():
    """A loss scale of 2^14 keeps this model's weight pass finite in float16 (checked), the
    largest such power of two a dynamic loss scale settles at. The attack losses are sums over
    the batch of 128, so scaled by s they overflowed; scaled by s/B they stay finite and match
    float32 (the same weights, no loss scale)."""
    from fbat_tf.attacks.losses import cross_entropy
    from fbat_tf.methods.base import input_gradient

    rng = np.random.default_rng(0)
    weights = [
        rng.normal(0, 0.3, (64, 32)).astype(np.float32),
        np.zeros(32, np.float32),
        rng.normal(0, 3.0, (32, 10)).astype(np.float32),
        np.zeros(10, np.float32),
    ]

    def build() -> keras.Model:
        model = keras.Sequential(
            [
                keras.Input((8, 8, 1)),
                keras.layers.Flatten(),
                keras.layers.Dense(32),
                keras.layers.ReLU(),
                keras.layers.Dense(10),
            ]
        )
        model.set_weights(weights)
        return model

    x = tf.constant(rng.uniform(0, 1, (128, 8, 8, 1)), tf.float32)
    y = tf.constant(rng.integers(0, 10, 128), tf.int32)
    delta = tf.zeros_like(x)
    scale = tf.constant(2.0**14)
    fastbat = methods.create("fastbat", eps=EPS)
    seed = tf.constant([0, 1], tf.int32)
    reference_model = build()
    reference = input_gradient(reference_model, x, delta, y).numpy()
    reference_adv = fastbat.perturb(reference_model, x, y, seed).numpy()
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = build()
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            loss = tf.reduce_mean(cross_entropy(logits, y))
            weight_grads = tape.gradient(
                loss * tf.cast(scale, loss.dtype), model.trainable_variables
            )
        grad = input_gradient(model, x, delta, y, scale).numpy()
        adv = fastbat.perturb(model, x, y, seed, scale).numpy()
        grads, _ = fastbat.gradients(model, x, y, seed, scale)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert all(np.isfinite(g.numpy()).all() for g in weight_grads)
    assert np.isfinite(grad).all()
    np.testing.assert_allclose(grad, reference, atol=0.01 * np.abs(reference).max())
    # δ* = P_C(z + λ⁻¹ g_z) from float16 gradients: equal up to float16 rounding of g_z.
    assert np.mean(np.abs(adv - reference_adv) < 1e-3) > 0.99
    assert all(np.isfinite(g.numpy()).all() for g in grads)


def test_a_method_that_carries_delta_across_batches_is_refused_off_a_single_device():
    """One rule, asked by train.py's flag check and by training alike."""
    from fbat_tf import methods

    with pytest.raises(ValueError, match="--method=free carries δ .* not --strategy=mirrored"):
        methods.check_strategy(methods.create("free"), "mirrored")
    methods.check_strategy(methods.create("free"), "default")
    for name in ("standard", "fastat", "fastbat"):
        methods.check_strategy(methods.create(name), "mirrored")


# What the registry checks without TensorFlow and what creating the method refuses: the norm, ε,
# each option value the constructors refuse, and the strategy.
REFUSALS = [
    ("fastbat", {"lambda_inv": 0.0}, {}),
    ("fastbat", {"lambda_inv": -1.0}, {}),
    ("fastbat", {"ig_coef": -0.1}, {}),
    ("fastbat", {"ig": "exact"}, {}),
    ("fastbat", {"linearization": "newton"}, {}),
    ("fastbat", {"cg_steps": 0}, {}),
    ("fastbat", {"implicit_autodiff": "backwards"}, {}),
    ("fastbat", {"ig": "exact", "lambda_inv": -1.0}, {}),  # the first refusal is told
    ("fastbat", {"bogus": 1}, {}),
    ("fastbat", {}, {"norm": "l2", "eps": 0.5}),
    ("fastbat", {}, {"eps": 1.5}),
    ("fastat", {"step": 0.0}, {}),
    ("fastat", {}, {"norm": "l3"}),
    ("fastat", {}, {"eps": -0.1, "norm": "l2"}),
    ("fastat_ga", {"ga_coef": -1.0}, {}),
    ("fastat_ga", {}, {"norm": "l2", "eps": 1.5}),
    ("nfgsm", {"noise": -1.0}, {}),
    ("nfgsm", {"clip": 0.0}, {}),
    ("nfgsm", {"step": 0.0}, {}),
    ("pgd", {"steps": 0}, {}),
    ("pgd", {"step": 0.0}, {"norm": "l2", "eps": 0.5}),
    ("free", {"replays": 0}, {}),
    ("free", {}, {"strategy": "mirrored"}),
    ("elle", {"schedule": "ramp"}, {}),
    ("elle", {"attack": "pgd"}, {}),
    ("elle", {"weight": -1.0}, {}),
    ("elle", {"decay": 1.5}, {}),
    ("elle", {"decay": 0.0}, {}),
    ("elle", {"sensitivity": -1.0}, {}),
    ("elle", {"step": -1.0}, {}),
    ("elle", {"step": 0.0, "attack": "nfgsm"}, {}),  # its N-FGSM point's step
    ("fgsm_pgi", {"weight": -1.0}, {}),
    ("fgsm_pgi", {"decay": -0.1}, {}),
    ("fgsm_pgi", {"step": 0.0}, {}),
    ("fgsm_pgi", {"reset": 0}, {}),
    ("fgsm_pgi", {}, {"norm": "l2", "eps": 0.5}),
    ("fgsm_pgi", {}, {"strategy": "mirrored"}),
    ("standard", {}, {"norm": "l3"}),
    ("standard", {}, {"eps": 2.0}),
]


def _refusal(ask) -> str:
    with pytest.raises(ValueError) as raised:
        ask()
    return str(raised.value)


@pytest.mark.parametrize(("name", "options", "where"), REFUSALS)
def test_the_registry_refuses_what_the_constructor_refuses_with_its_message(name, options, where):
    eps, norm = where.get("eps", EPS), where.get("norm", "linf")
    strategy = where.get("strategy", "default")

    def create():
        methods.check_strategy(methods.create(name, eps, norm, **options), strategy)

    said = _refusal(create)
    assert _refusal(lambda: methods.check(name, options, eps, norm, strategy)) == said


@pytest.mark.parametrize(("name", "options"), VARIANTS, ids=IDS)
def test_the_registry_passes_what_the_constructor_makes(name, options):
    methods.create(name, EPS, **options)
    methods.check(name, options, EPS)
    # An option given as None is at its default, as for `create`.
    methods.check(name, {**dict.fromkeys(methods.option_names(name)), **options}, EPS)


def test_elle_s_fgsm_step_may_be_zero_where_n_fgsm_s_may_not():
    """ELLE's FGSM point at step 0 is x itself, which its rule allows; only its N-FGSM point
    takes N-FGSM's rule (a positive step)."""
    for attack in ("fgsm", "none"):
        assert methods.create("elle", EPS, step=0.0, attack=attack).alpha == 0.0
        methods.check("elle", {"step": 0.0, "attack": attack}, EPS)
    with pytest.raises(ValueError, match=r"nfgsm step \(a multiple of eps\) must be > 0"):
        methods.check("elle", {"step": 0.0, "attack": "nfgsm"}, EPS)


def test_each_built_in_method_is_declared_whole_in_its_own_module():
    """One module per method holds its class (with its rules), its options and its cost; the
    registry names the class itself, never by a string."""
    for name in methods.names():
        found = methods.entry(name)
        cls = found.target
        assert isinstance(cls, type) and cls.name == name and found.rules is cls
        module = importlib.import_module(cls.__module__)
        assert module.ENTRY is found and cls.entry is found, name
        assert module.__name__.startswith("fbat_tf.methods."), name


def test_a_user_s_method_registered_by_its_class_is_checked_without_creating_it(monkeypatch):
    """A user's method: its entry names its class, whose rules `check` asks as it does a built-in
    method's, so its constructor's refusals stop a run before it starts."""
    from fbat_tf.methods.fast_at import FastAT

    class FastATCopy(FastAT):
        name = "fastat_copy"

    entry = methods.Entry(
        FastATCopy, (methods.Option("step", float, 1.25, "A step.", "fastat_copy_step"),)
    )
    monkeypatch.setitem(methods.REGISTRY, entry.name, entry)
    with pytest.raises(ValueError, match=r"fastat step \(a multiple of eps\) must be > 0"):
        methods.check("fastat_copy", {"step": -1.0})
    methods.check("fastat_copy", {"step": None}, 0.5, "l2", "mirrored")


def test_a_user_s_method_that_states_no_rules_refuses_no_option_value(monkeypatch):
    """A user's class without `check_options` (the toy method of test_registries): its options
    pass the pre-run check whatever their value, its norm and ε are still checked."""
    from fbat_tf.methods.base import Method

    class Toy(Method):
        name = "toy_rules"

    entry = methods.Entry(Toy, (methods.Option("scale", float, 0.5, "A scale."),))
    monkeypatch.setitem(methods.REGISTRY, entry.name, entry)
    methods.check("toy_rules", {"scale": -3.0})
    with pytest.raises(ValueError, match="has no L2 form"):
        methods.check("toy_rules", {}, 0.5, "l2")
