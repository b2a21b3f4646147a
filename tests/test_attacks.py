"""PGD against closed forms: on a linear two-class model the worst case in C is the projected
corner δ_j = −ε·sign(w_y − w_other)_j, and the evaluation loop's robust accuracy is the count of
examples whose worst-case margin is negative."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from fbat_tf.attacks.pgd import PGD
from fbat_tf.evaluation import check_in_ball, evaluate
from tests.helpers import linear_model

EPS = 8 / 255


def analytic_worst_case(model: keras.Model, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    kernel = model.layers[0].get_weights()[0]
    # Direction that lowers logit_y − logit_other, per coordinate, as far as C allows.
    towards = kernel[:, 1 - y].T - kernel[:, y].T
    delta = EPS * np.sign(towards)
    return np.clip(x + delta, 0.0, 1.0)


def test_pgd_finds_the_analytic_worst_case_of_a_linear_model():
    d, n = 20, 16
    rng = np.random.default_rng(1)
    x = rng.uniform(0, 1, (n, d)).astype(np.float32)
    x[:, :3] = 0.0  # box constraints active on some coordinates
    y = rng.integers(0, 2, n).astype(np.int32)
    model = linear_model(d)
    x_adv, _ = PGD(EPS, steps=10, restarts=1)(model, tf.constant(x), tf.constant(y), seed=0)
    x_adv = x_adv.numpy()
    worst = analytic_worst_case(model, x, y)
    # Where the worst case still classifies right, PGD's last iterate is the worst case; where
    # it does not, PGD keeps the first iterate it found wrong, which lies in C and is wrong.
    robust = model(worst).numpy().argmax(1) == y
    assert 0 < robust.sum() < n
    np.testing.assert_allclose(x_adv[robust], worst[robust], atol=1e-6)
    assert not np.any(model(x_adv[~robust]).numpy().argmax(1) == y[~robust])
    check_in_ball(tf.constant(x_adv), tf.constant(x), EPS)


def test_robust_accuracy_counts_examples_whose_worst_case_margin_is_positive():
    d, n = 20, 64
    rng = np.random.default_rng(2)
    x = rng.uniform(0, 1, (n, d)).astype(np.float32)
    model = linear_model(d, seed=3)
    logits = model(x).numpy()
    y = logits.argmax(1).astype(np.int32)  # all clean-correct
    worst = model(analytic_worst_case(model, x, y)).numpy()
    expected = float(np.mean(worst.argmax(1) == y))
    assert 0.0 < expected < 1.0
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    result = evaluate(model, dataset, {("pgd", EPS): PGD(EPS, steps=10, restarts=2)})
    assert result.clean_accuracy == 1.0
    assert result.robust_accuracy("pgd") == pytest.approx(expected)
    assert result.examples == n
    # Each batch's own figures: the closed form on its 16 examples.
    per_batch = [np.mean(worst[i : i + 16].argmax(1) == y[i : i + 16]) for i in range(0, n, 16)]
    assert [b.examples for b in result.per_batch] == [16] * 4
    assert [b.robust_accuracy("pgd") for b in result.per_batch] == pytest.approx(per_batch)


def test_zero_step_pgd_returns_a_random_start_inside_the_ball():
    model = linear_model(4)
    x = tf.constant(np.full((8, 4), 0.5, np.float32))
    y = tf.constant(np.zeros(8, np.int32))
    x_adv, _ = PGD(EPS, steps=0, restarts=3)(model, x, y, seed=1)
    check_in_ball(x_adv, x, EPS)
    distance = np.abs((x_adv - x).numpy())
    assert distance.max() <= EPS + 1e-7 and distance.mean() > EPS / 4


def test_check_in_ball_rejects_points_outside_C():
    x = tf.zeros((2, 3)) + 0.5
    with pytest.raises(AssertionError, match="outside C"):
        check_in_ball(x + 2 * EPS, x, EPS)
    with pytest.raises(AssertionError, match="outside C"):
        check_in_ball(x * 0 - 0.01, x * 0, EPS)


def graph_size(function: tf.types.experimental.ConcreteFunction) -> int:
    """Nodes of a traced graph, its loop bodies and other library functions included."""
    graph = function.graph.as_graph_def()
    return len(graph.node) + sum(len(f.node_def) for f in graph.library.function)


@pytest.mark.parametrize("jit_compile", [False, True])
def test_pgd_graph_does_not_grow_with_steps_and_restarts(jit_compile):
    model = linear_model(6)
    x = tf.constant(np.full((4, 6), 0.5, np.float32))
    y = tf.constant(np.zeros(4, np.int32))
    seed = tf.constant([0, 0], tf.int32)
    sizes = {}
    for steps, restarts in [(5, 1), (50, 10)]:
        attack = PGD(EPS, steps, restarts, jit_compile=jit_compile)
        sizes[steps, restarts] = graph_size(
            attack._run.function.get_concrete_function(model, x, y, seed)
        )
    assert sizes[5, 1] == sizes[50, 10]


def test_pgd_keeps_an_unknown_batch_size_graph_working():
    # A frozen inference graph traced for any batch gives gradients of unknown batch size; the
    # attack's loop must still run on it (evaluate.py attacks such graphs by default).
    from fbat_tf.classifiers import InferenceGraph

    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8), keras.layers.Dense(2)])
    x = tf.constant(np.random.default_rng(0).uniform(0, 1, (5, 6)).astype(np.float32))
    y = tf.constant(np.zeros(5, np.int32))
    on_graph, _ = PGD(EPS, 3, 2)(InferenceGraph(model), x, y, seed=4)
    on_model, _ = PGD(EPS, 3, 2)(model, x, y, seed=4)
    np.testing.assert_allclose(on_graph.numpy(), on_model.numpy(), atol=1e-6)


def brute_force_pgd(model, x, y, eps, steps, restarts, seed):
    """PGD-K-R as plain eager loops over restarts, steps and examples: per restart and example
    the first of its iterates (start included) the model gets wrong, else its last; per example
    the first restart that breaks it, else the first restart's point. Also which restarts break
    which examples ([restarts, batch] bool)."""
    from fbat_tf import constraints

    step_size = eps / 4
    kept = [None] * len(x)
    breaks = np.zeros((restarts, len(x)), bool)
    for restart in range(restarts):
        start_seed = tf.random.experimental.stateless_fold_in(seed, restart)
        delta = constraints.random_init(x, eps, start_seed)
        iterates = [x + delta]
        for _ in range(steps):
            with tf.GradientTape() as tape:
                tape.watch(delta)
                logits = model(x + delta, training=False)
                loss = tf.reduce_sum(
                    tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)
                )
            grad = tape.gradient(loss, delta)
            delta = constraints.project(delta + step_size * tf.sign(grad), x, eps)
            iterates.append(x + delta)
        x_adv = iterates[-1].numpy()
        for i in range(len(x)):
            for point in iterates:
                if model(point[i : i + 1], training=False).numpy().argmax(1)[0] != y.numpy()[i]:
                    breaks[restart, i] = True
                    x_adv[i] = point[i].numpy()
                    break
        for i in range(len(x)):
            if restart == 0 or (breaks[restart, i] and not breaks[:restart, i].any()):
                kept[i] = x_adv[i]
    return np.stack(kept), breaks


def test_pgd_keeps_per_example_the_first_restart_that_breaks_it():
    # A small ε and few steps: restarts break different examples, some only after the first.
    rng = np.random.default_rng(5)
    model = keras.Sequential(
        [keras.Input((12,)), keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(3)]
    )
    model.set_weights([rng.normal(size=w.shape).astype(np.float32) for w in model.get_weights()])
    x = tf.constant(rng.uniform(0, 1, (48, 12)).astype(np.float32))
    y = tf.argmax(model(x), -1, output_type=tf.int32)
    eps, steps, restarts = 4 / 255, 2, 6
    expected, breaks = brute_force_pgd(model, x, y, eps, steps, restarts, tf.constant([7, 0]))
    # The cases that tell first from last: examples broken by a later restart only, and
    # examples broken by more than one restart.
    assert (~breaks[0] & breaks[1:].any(0)).any()
    assert (breaks.sum(0) >= 2).any()
    assert (~breaks.any(0)).any()
    x_adv = PGD(eps, steps, restarts)(model, x, y, seed=7)[0].numpy()
    np.testing.assert_allclose(x_adv, expected, atol=1e-6)
    robust = np.mean(model(x_adv).numpy().argmax(1) == y.numpy())
    assert robust == pytest.approx(1 - breaks.any(0).mean())


class _CountCalls(keras.layers.Layer):
    """Identity that counts the model's calls and the rows they hold."""

    def build(self, input_shape):
        self.calls = self.add_weight(shape=(), initializer="zeros", trainable=False, dtype="int32")
        self.rows = self.add_weight(shape=(), initializer="zeros", trainable=False, dtype="int32")

    def call(self, x):
        self.calls.assign_add(1)
        self.rows.assign_add(tf.shape(x)[0])
        return x


def test_pgd_runs_later_restarts_side_by_side_on_the_survivors():
    # Restarts after the first run together, as many as fit with the survivors in the batch:
    # fewer model calls than one restart at a time, never more rows per call than the batch,
    # and the brute-force points (checked above on the same kind of model).
    rng = np.random.default_rng(5)
    counter = _CountCalls()
    model = keras.Sequential(
        [
            keras.Input((12,)),
            counter,
            keras.layers.Dense(16, activation="tanh"),
            keras.layers.Dense(3),
        ]
    )
    model.set_weights(
        counter.get_weights()
        + [rng.normal(size=w.shape).astype(np.float32) for w in model.get_weights()[2:]]
    )
    x = tf.constant(rng.uniform(0, 1, (48, 12)).astype(np.float32))
    y = tf.argmax(model(x), -1, output_type=tf.int32)
    eps, steps, restarts = 32 / 255, 2, 6
    expected, breaks = brute_force_pgd(model, x, y, eps, steps, restarts, tf.constant([7, 0]))
    survivors = int((~breaks[0]).sum())
    assert 0 < survivors <= 24  # at least two restarts fit side by side
    # Some survivors are broken by a later restart, some by more than one of them.
    assert (~breaks[0] & breaks[1:].any(0)).any()
    assert (~breaks[0] & (breaks[1:].sum(0) >= 2)).any()
    counter.calls.assign(0)
    counter.rows.assign(0)
    x_adv = PGD(eps, steps, restarts)(model, x, y, seed=7)[0].numpy()
    np.testing.assert_allclose(x_adv, expected, atol=1e-6)
    one_at_a_time = restarts * (steps + 1)  # each restart: its steps and a check
    assert int(counter.calls.numpy()) < one_at_a_time
    assert int(counter.rows.numpy()) <= int(counter.calls.numpy()) * 48


def test_check_in_ball_rejects_nan_and_infinite_points():
    x = tf.zeros((2, 3)) + 0.5
    for bad in (np.nan, np.inf):
        x_adv = tf.tensor_scatter_nd_update(x, [[1, 2]], [bad])
        with pytest.raises(AssertionError, match="NaN or infinite"):
            check_in_ball(x_adv, x, EPS)


@pytest.mark.slow
def test_each_attack_traces_its_graph_once_for_every_batch_size():
    # The last batch and a restart's survivors come in other sizes than the first batch: each
    # would cost a second trace of the attack's graph.
    from fbat_tf.attacks.apgd import APGD
    from fbat_tf.attacks.fab import FAB
    from fbat_tf.attacks.square import Square

    model = linear_model((4, 4, 1), classes=3)
    x = tf.random.stateless_uniform([7, 4, 4, 1], [0, 1])
    y = tf.argmax(model(x), -1, output_type=tf.int32)  # every example attacked
    attacks = {
        "pgd": PGD(0.1, steps=2, restarts=2),
        "apgd": APGD(0.1, steps=2),
        "fab": FAB(0.1, steps=2, n_target_classes=1),
        "square": Square(0.1, n_queries=2),
    }
    for name, attack in attacks.items():
        for size in (7, 5, 3):
            attack(model, x[:size], y[:size], seed=0)
        assert attack._run.function.experimental_get_tracing_count() == 1, name


def test_one_clip_to_the_delta_bounds_is_the_projection_onto_c_exactly():
    # Deltas far outside, on and inside the ball, at pixels on the box edges and inside it.
    from fbat_tf import constraints

    rng = np.random.default_rng(0)
    x = tf.constant(np.concatenate([[0.0, 1.0, 0.5, 1e-3], rng.uniform(0, 1, 996)]), tf.float32)
    for eps in (0.0, 8 / 255, 0.3, 2.0):
        delta = tf.constant(rng.uniform(-3, 3, 1000), tf.float32)
        lower, upper = constraints.delta_bounds(x, eps)
        clipped = tf.clip_by_value(delta, lower, upper)
        np.testing.assert_array_equal(clipped, constraints.project(delta, x, eps))


def test_one_clip_to_the_ball_bounds_is_the_reference_projection_of_a_point_exactly():
    # The reference attacks' min(max(p, x - eps), x + eps) clamped to [0, 1], at the box edges.
    from fbat_tf import constraints

    rng = np.random.default_rng(1)
    x = np.concatenate([[0.0, 1.0, 0.5, 1e-3], rng.uniform(0, 1, 996)]).astype(np.float32)
    for eps in (0.0, 8 / 255, 0.3, 2.0):
        point = rng.uniform(-2, 3, 1000).astype(np.float32)
        lower, upper = constraints.ball_bounds(tf.constant(x), eps)
        expected = np.clip(
            np.minimum(np.maximum(point, x - np.float32(eps)), x + np.float32(eps)), 0, 1
        )
        np.testing.assert_array_equal(tf.clip_by_value(point, lower, upper), expected)


class _NumpyRelu(keras.layers.Layer):
    """A ReLU computed by NumPy: an op (PyFunc) that XLA cannot compile."""

    def call(self, x):
        out = tf.numpy_function(lambda a: np.maximum(a, 0).astype(np.float32), [x], tf.float32)
        return tf.ensure_shape(out, x.shape)


def test_an_attack_xla_cannot_compile_says_so_and_runs_without_xla(caplog):
    from fbat_tf.attacks.square import Square

    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((4, 4, 1)), keras.layers.Flatten(), _NumpyRelu(), keras.layers.Dense(3)]
    )
    x = tf.random.stateless_uniform([6, 4, 4, 1], [0, 1])
    y = tf.argmax(model(x), -1, output_type=tf.int32)
    compiled = Square(0.2, n_queries=20, jit_compile=True)
    with caplog.at_level("WARNING"):
        x_adv, _ = compiled(model, x, y, seed=0)
    assert "XLA cannot compile" in caplog.text and "PyFunc" in caplog.text
    assert not compiled._run.jit_compile  # and it stays a plain graph: no second attempt
    plain, _ = Square(0.2, n_queries=20, jit_compile=False)(model, x, y, seed=0)
    np.testing.assert_array_equal(x_adv.numpy(), plain.numpy())
    caplog.clear()
    compiled(model, x, y, seed=1)
    assert "XLA" not in caplog.text


def test_under_xla_an_attack_s_subsets_are_padded_to_a_few_sizes():
    from fbat_tf.attacks.base import Loop

    compiled, plain = Loop(lambda: None, True, batched=0), Loop(lambda: None, False, batched=0)
    model, x = linear_model(4), tf.zeros([128, 4])
    sizes = set()
    for count in range(1, 129):
        index = tf.range(3, 3 + count)
        rows = compiled.padded(model, x, index).numpy()
        sizes.add(len(rows))
        # Its own rows first, then repeats of the first; fewer than twice as many rows.
        np.testing.assert_array_equal(rows[:count], index.numpy())
        assert set(rows[count:]) <= {3} and count <= len(rows) < max(2 * count, 2)
        np.testing.assert_array_equal(plain.padded(model, x, index).numpy(), index.numpy())
    assert sizes == {128, 64, 32, 16, 8, 4, 2, 1}
    assert compiled.padded(model, x, tf.range(0)).shape == [0]


@pytest.mark.slow
def test_fab_and_square_compile_on_a_cpu_only_for_a_model_without_convolutions():
    # XLA's CPU convolutions are far slower than TensorFlow's oneDNN kernels, while it fuses
    # the attacks' element-wise work: the attacks' own choice (jit_compile=None) follows that.
    from fbat_tf.attacks.base import has_convolutions
    from fbat_tf.attacks.fab import FAB
    from fbat_tf.attacks.square import Square
    from fbat_tf.classifiers import InferenceGraph

    keras.utils.set_random_seed(0)
    dense = keras.Sequential(
        [keras.Input((4, 4, 1)), keras.layers.Flatten(), keras.layers.Dense(3)]
    )
    conv = keras.Sequential(
        [
            keras.Input((4, 4, 1)),
            keras.layers.Conv2D(2, 3),
            keras.layers.Flatten(),
            keras.layers.Dense(3),
        ]
    )
    x = tf.random.stateless_uniform([5, 4, 4, 1], [0, 1])
    for model, convolutional in ((dense, False), (conv, True)):
        for form in (model, InferenceGraph(model)):
            assert has_convolutions(form, x) == convolutional
            y = tf.argmax(form(x), -1, output_type=tf.int32)
            for attack in (FAB(0.1, n_target_classes=1, steps=2), Square(0.1, n_queries=2)):
                attack(form, x, y, seed=0)
                assert attack._run.jit_compile == (not convolutional), (attack, convolutional)


def test_replays_sharing_kept_points_craft_each_batch_once():
    """Two replays of one source's attack (two exported files) share `kept`: the second takes
    the first's points for the same examples, labels and seed, and crafts for any other."""
    from fbat_tf.attacks.transfer import ReplayedAttack

    d, n = 20, 8
    rng = np.random.default_rng(3)
    x = tf.constant(rng.uniform(0, 1, (n, d)).astype(np.float32))
    y = tf.constant(rng.integers(0, 2, n).astype(np.int32))
    source, target = linear_model(d), linear_model(d)
    crafted = []

    class Counted(PGD):
        def __call__(self, model, x, y, seed):
            crafted.append(np.asarray(seed).tolist())
            return super().__call__(model, x, y, seed)

    kept: dict = {}
    first = ReplayedAttack(source, Counted(EPS, steps=3, restarts=1), kept)
    second = ReplayedAttack(source, Counted(EPS, steps=3, restarts=1), kept)
    seed = tf.constant([0, 0], tf.int32)
    x_first, _ = first(target, x, y, seed)
    x_second, _ = second(target, x, y, seed)
    assert crafted == [[0, 0]]
    np.testing.assert_array_equal(np.asarray(x_first), np.asarray(x_second))
    # Each replay keeps its own per-point records.
    assert len(first.agreement) == len(second.agreement) == 1
    # Another seed, other examples, other labels: crafted anew.
    second(target, x, y, tf.constant([0, 1], tf.int32))
    second(target, x[::-1], y, seed)
    second(target, x, 1 - y, seed)
    assert len(crafted) == 4 and len(kept) == 4
    # Without `kept`, every call crafts.
    alone = ReplayedAttack(source, Counted(EPS, steps=3, restarts=1))
    alone(target, x, y, seed)
    assert len(crafted) == 5
