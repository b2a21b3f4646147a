"""One evaluation run: clean accuracy and robust accuracy per attack and ε, with timing.

classifier, config = classifiers.load_classifier("runs/fmnist")   # the run's selected weights
test = data.load("fashion_mnist", "test", max_examples=1000)
result = evaluate(classifier, test, pgd_attacks([8 / 255], steps=50, restarts=10))
result.robust_accuracy("pgd", 8)                         # RA under PGD-50-10 at 8/255

strategy = distribute.create_strategy("mirrored")        # each batch split over the local GPUs
with strategy.scope():
    classifier, config = classifiers.load_classifier("runs/fmnist")
result = evaluate(classifier, test, pgd_attacks([8 / 255]), strategy=strategy)

transfer_robust_accuracy(source, target, PGD(8 / 255), test, eps=8 / 255)   # crafted on source
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import keras
import tensorflow as tf

from fbat_tf import attacks, catalog, classifiers
from fbat_tf.attacks import losses
from fbat_tf.attacks.base import Attack, progress_bar
from fbat_tf.attacks.losses import correct, cross_entropy, robust_hits
from fbat_tf.attacks.transfer import TransferAttack
from fbat_tf.constraints import check_in_ball
from fbat_tf.records import EvaluationResult
from fbat_tf.tally import (  # noqa: F401 (NonFiniteError: raised here, caught by callers)
    NonFiniteError,
    Tally,
    placed,
    placed_outcomes,
    positioned,
)

# Inputs pooled for an attack that batches itself (AutoAttack) before it runs over them.
POOL_BYTES = 1 << 30


def _nonfinite_rows(values: tf.Tensor) -> tf.Tensor:
    """How many examples (rows) of a batch hold a NaN or an infinity, as float32."""
    flat = tf.reshape(tf.cast(values, tf.float32), [tf.shape(values)[0], -1])
    finite = tf.reduce_all(tf.math.is_finite(flat), axis=1)
    return tf.reduce_sum(tf.cast(tf.logical_not(finite), tf.float32))


# The attacks of an evaluation: each by its name and ε (pixel units).
Attacks = Mapping[tuple[str, float], Attack]


def pgd_attacks(
    eps_values: Sequence[float],
    steps: int = catalog.PGD_STEPS,
    restarts: int = catalog.PGD_RESTARTS,
    jit_compile: bool = False,
    norm: str = "linf",
) -> dict[tuple[str, float], Attack]:
    """PGD-K-R at each ε (pixel units) in the ball of `norm`, named "pgd"."""
    options = {"pgd": {"steps": steps, "restarts": restarts}}
    return registry_attacks(
        ["pgd"], eps_values, norm=norm, options=options, jit_compile=jit_compile
    )


def registry_attacks(
    names: Sequence[str],
    eps_values: Sequence[float],
    *,
    norm: str,
    options: Mapping[str, Mapping[str, Any]] | None = None,
    jit_compile: bool | None = None,
    source: Any = None,
) -> dict[tuple[str, float], Attack]:
    """Each attack of the registry named, at each ε (pixel units) in that order, in the ball of
    `norm` (constraints.NORMS), with its options by attack name (the rest at their defaults).
    `jit_compile` (None: each attack's own choice) and `source` (a transfer attack's model) go
    to the attacks that use them. The one way the project builds its attacks: the threat model
    is a required argument, and options for an attack not named (a context's key given as an
    attack's options, say) are refused rather than dropped."""
    options = dict(options or {})
    stray = sorted(set(options) - set(names))
    if stray:
        raise ValueError(f"options given for {stray}, which are not among the attacks {names}")
    context = {"norm": norm, "jit_compile": jit_compile, "source": source}
    return {
        (name, eps): attacks.create(name, eps, context, **options.get(name, {}))
        for eps in eps_values
        for name in names
    }


def validation_attack(
    eps: float,
    norm: str,
    steps: int,
    restarts: int,
    square_queries: int = 0,
    jit_compile: bool | None = None,
) -> Attack:
    """Robust validation's attack: PGD-K-R, and where `square_queries` is set, Square with
    that many queries on the points PGD left robust (AutoAttack's "custom" ensemble of the two,
    its parts "pgd" and "square"), so that a point counts robust only where it survives both."""
    options = {"pgd": {"steps": steps, "restarts": restarts}}
    pgd = registry_attacks(["pgd"], [eps], norm=norm, options=options, jit_compile=jit_compile)
    if not square_queries:
        return pgd[("pgd", eps)]
    options = {"square": {"n_queries": square_queries}}
    square = registry_attacks(["square"], [eps], norm=norm, options=options)[("square", eps)]
    from fbat_tf.attacks.autoattack import AutoAttack

    return AutoAttack(eps, "custom", {"pgd": pgd[("pgd", eps)], "square": square}, norm=norm)


def check_distributable(strategy: tf.distribute.Strategy) -> None:
    """Raise ValueError for a strategy whose replicas cannot run the attacks.

    The attacks mix graphs with Python and NumPy bookkeeping between them (subsets of the
    examples still robust, AutoAttack's masks), so a replica runs them eagerly,
    which a TPU replica cannot: there, evaluate on the host with the default strategy.
    """
    if isinstance(strategy, (tf.distribute.TPUStrategy, tf.distribute.experimental.TPUStrategy)):
        raise ValueError(
            "evaluation cannot run its attacks inside a TPU replica (they run Python and NumPy "
            "between graph calls); evaluate with the default strategy"
        )


def gradient_problem(classifier: Callable, x: tf.Tensor, y: tf.Tensor) -> str | None:
    """Why the classifier's input gradient is unavailable on the batch (x, y), in one line
    (losses.UnavailableGradientError: the graph does not differentiate), or None where it
    exists. Zero or non-finite gradients are the indicators' to tell (fbat_tf/indicators.py)."""
    try:
        losses.input_gradient(lambda x: cross_entropy(classifier(x, training=False), y), x)
    except losses.UnavailableGradientError as error:
        return str(error)
    return None


def applicable(
    attacks: Attacks, problem: str | None, key: Callable[[tuple[str, float]], str]
) -> tuple[dict, dict[str, str]]:
    """The attacks that can run on a model whose input gradients are unavailable for the reason
    `problem` (None: all of them), and why the others cannot, by result key (`key` of an
    attack's name and ε) and "<key>/<part>" for an ensemble's parts: an attack that needs the
    gradients (`Attack.needs_gradients`, an attack of the user's own is taken to) does not run,
    and an ensemble runs its parts that need none (`without_gradients`), if it has any."""
    if problem is None:
        return dict(attacks), {}
    running, skipped = {}, {}
    for name, attack in attacks.items():
        if not getattr(attack, "needs_gradients", True):
            running[name] = attack
            continue
        reduced = getattr(attack, "without_gradients", lambda: None)()
        if reduced is None:
            skipped[key(name)] = problem
            continue
        running[name] = reduced
        for part in attack.attacks:
            if part not in reduced.attacks:
                skipped[f"{key(name)}/{part}"] = problem
    return running, skipped


def _pools(attack: Callable) -> bool:
    # An attack is any callable of the interface (attacks/base.py); one that is no Attack
    # does not pool.
    return getattr(attack, "pools", False)


class _Pool:
    """The global batches an attack has been given and not yet run over: one for an attack
    given each batch on its own, up to POOL_BYTES of inputs for one that pools (`Attack.pools`).
    Each entry: (batch b, (x, y, positions) as distributed, and their local values per
    replica)."""

    def __init__(self, attack: Attack):
        self.capacity = POOL_BYTES if _pools(attack) else 0
        self.batches: list[tuple[int, tuple, list[tuple]]] = []

    def add(self, batch: int, values: tuple, strategy: tf.distribute.Strategy) -> None:
        local = strategy.experimental_local_results
        self.batches.append((batch, values, [local(v) for v in values]))

    def full(self) -> bool:
        held = sum(
            v.shape.num_elements() * v.dtype.size for *_, (xs, *_) in self.batches for v in xs
        )
        return held >= self.capacity

    def take(self, strategy: tf.distribute.Strategy) -> tuple[list, tuple]:
        """[(batch b, shard size per local replica)], and x, y and positions of them joined, per
        replica; the pool is then empty."""
        batches, self.batches = self.batches, []
        index = [(batch, [int(v.shape[0]) for v in local[0]]) for batch, _, local in batches]
        if len(batches) == 1:
            return index, batches[0][1]
        local = len(index[0][1])  # this worker's replicas

        def joined(values: list[tuple]):
            per_replica = [tf.concat([v[i] for v in values], 0) for i in range(local)]
            return strategy.experimental_distribute_values_from_function(
                lambda context: per_replica[context.replica_id_in_sync_group % local]
            )

        parts = len(batches[0][1])
        return index, tuple(joined([b[2][k] for b in batches]) for k in range(parts))


def _clean_counts(classifier: Callable, x: tf.Tensor, y: tf.Tensor) -> dict[str, tf.Tensor]:
    """The clean counts of this replica's shard, and whether each of its examples is classified
    correctly ("hits": per example, not to be summed)."""
    logits = classifier(x, training=False)
    hits = correct(logits, y)
    return {
        "hits": hits,
        "correct": tf.reduce_sum(hits),
        "loss": tf.reduce_sum(cross_entropy(logits, y)),
        "examples": tf.cast(tf.shape(x)[0], tf.float32),
        "nonfinite_inputs": _nonfinite_rows(x),
        "nonfinite_logits": _nonfinite_rows(logits),
    }


def _robust_counts(
    classifier: Callable,
    eps: float,
    attack: Attack,
    index: list,
    seed: int,
    progress: bool,
    span: tuple[int, int],
    x: tf.Tensor,
    y: tf.Tensor,
    positions: tf.Tensor,
    clean: tf.Tensor,
) -> dict[str, tf.Tensor]:
    """`attack` on this replica's shards of the global batches in `index`, [(batch b, shard
    size per local replica)], given joined: the robust count of each batch, and an ensemble's
    robust count and seconds after each part. Seeded as batch b's first of them. And the
    outcomes of the examples at `positions` of the global batches' `span` [start, stop) (see
    tally.placed)."""
    context = tf.distribute.get_replica_context()
    replica, replicas = int(context.replica_id_in_sync_group), context.num_replicas_in_sync
    local = len(index[0][1])  # this worker's replicas
    shards = [sizes[replica % local] for _, sizes in index]
    # The largest shard of this worker: the batch per replica (1 where all are empty).
    size = max(1, *(max(sizes) for _, sizes in index))
    if _pools(attack):
        attack = attack.in_slices(size, progress and replicas == 1)
    batch_seed = tf.constant([seed, index[0][0] * replicas + replica], tf.int32)
    x_adv, breakdown = attack(classifier, x, y, batch_seed)
    nonfinite = int(_nonfinite_rows(x_adv))
    if nonfinite:
        raise NonFiniteError(
            f"the attack's points are not finite for {nonfinite} examples (NaN or infinite "
            "input gradients of the model there)",
            nonfinite,
        )
    # An attack of the user's own need not derive from Attack: L∞ unless it says otherwise.
    check_in_ball(x_adv, x, eps, norm=getattr(attack, "norm", "linf"))
    logits = [
        classifier(x_adv[i : i + size], training=False) for i in range(0, int(x.shape[0]), size)
    ]
    nonfinite = sum(int(_nonfinite_rows(v)) for v in logits)
    if nonfinite:
        raise NonFiniteError(
            f"{nonfinite} adversarial examples give non-finite logits (NaN or infinite)", nonfinite
        )
    # Robust: right at the attack's point and on the clean input, the clean pass's `clean`
    # (robust_hits).
    rows = [slice(i * size, (i + 1) * size) for i in range(len(logits))]
    hits = [robust_hits(clean[r], v, y[r]) for r, v in zip(rows, logits, strict=True)]
    hits = tf.concat(hits, 0) if hits else tf.zeros([0])
    robust = tf.math.segment_sum(hits, tf.repeat(tf.range(len(shards)), shards))
    counts = {"robust": tf.pad(robust, [[0, len(shards) - robust.shape[0]]])}  # empty last shards
    outcomes = {"hits": hits}
    for part, mask in breakdown.get("robust", {}).items():
        counts[f"robust/{part}"] = tf.constant(mask.sum(), tf.float32)
        if part != "clean":  # the ensemble's clean pass: the evaluation's own is kept
            outcomes[part] = mask
    counts.update(placed(span, positions, outcomes))
    for part, spent in breakdown.get("seconds", {}).items():
        counts[f"seconds/{part}"] = tf.constant(spent, tf.float32)
    return counts


def _summed(strategy: tf.distribute.Strategy, fn: Callable, *args) -> dict[str, Any]:
    """fn run on every replica, its counts summed over replicas (and workers), as NumPy."""
    return _reduced(strategy, strategy.run(fn, args=args))


def _reduced(strategy: tf.distribute.Strategy, per_replica: dict[str, Any]) -> dict[str, Any]:
    """Values of every replica summed over replicas (and workers), as NumPy."""
    reduced = {
        key: strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None).numpy()
        for key, value in per_replica.items()
    }
    return {key: float(v) if v.ndim == 0 else v.astype(float) for key, v in reduced.items()}


def evaluate(
    classifier: keras.Model,
    dataset: tf.data.Dataset,
    attacks: Attacks,
    progress: bool = False,
    strategy: tf.distribute.Strategy | None = None,
    seed: int = 0,
    labels: Mapping[tuple[str, float], str] | None = None,
) -> EvaluationResult:
    """Clean loss and accuracy, and robust accuracy and time of each attack, given by its name
    and ε (pixel units): {("pgd", 8 / 255): PGD(8 / 255)}.

    A classifier whose outputs are probabilities, or labels that are not its class indices,
    are refused first, on the first batch (ValueError, `classifiers.check_data`). Every
    adversarial batch is checked to lie in C before it counts. An example whose clean
    input, clean logits, adversarial point or adversarial logits are not finite raises
    NonFiniteError, naming how many, before its batch is attacked or counted. `progress` shows a bar
    over the batches with the running accuracies, an attack by its `labels` entry ("PGD-20-1")
    or its key ("pgd@8"). For an attack with parts (AutoAttack), its AttackResult's `parts`
    give the accuracy after each part and `part_seconds` the time each took. `per_batch` holds
    each global batch's own examples and accuracies (the first: the overfitting guard's).

    Global batch b is attacked with the seed [seed, b·R + r] on replica r of R, so the numbers
    are a function of the arguments alone (the same at every call, e.g. every epoch's
    validation), and on one device batch b gets [seed, b].

    On a classifier without input gradients (`gradient_problem` on the first batch), the
    attacks that need them are not run: their robust accuracy is None and the result's
    `not_applicable` says why (an ensemble runs its gradient-free parts, `applicable`).

    An attack that pools (AutoAttack, `Attack.pools`) is instead given the batches of a pool
    (all of them, up to POOL_BYTES of inputs) joined, in one call per replica, with the seed
    [seed, b·R + r] of the pool's first batch b, as `attack.in_slices(the replica's batch
    size)`: each of its parts then attacks the examples still robust across the pool, a batch at
    a time, as the reference re-batches its survivors before every attack. Its per-batch
    counts are kept.

    `strategy` (default: the current one) splits each global batch of `dataset` over its
    replicas: each replica runs the clean pass and every attack on its shard, and the counts are
    summed over replicas (and workers), so that an attack that is deterministic per example gives
    the counts of one device. An attack's `seconds` are wall time, whatever the number of
    replicas; `part_seconds` sum the replicas' (and workers') times. Load the classifier under
    `strategy.scope()`, so that each replica reads its own copy of the weights.
    """
    strategy = strategy or tf.distribute.get_strategy()
    check_distributable(strategy)
    every = Tally(attacks)
    problem = None
    first = next(iter(dataset.take(1)), None)  # read once for both checks
    if first is not None:
        classifiers.check_data(classifier, first[0], first[1])  # logits, class-index labels
        if any(getattr(attack, "needs_gradients", True) for attack in attacks.values()):
            problem = gradient_problem(classifier, first[0], first[1])
    attacks, not_applicable = applicable(attacks, problem, lambda name: every.named(name).key)
    batches = int(dataset.cardinality())
    bar = progress_bar(batches if batches > 0 else None, unit_name="batch") if progress else None
    tally = Tally(attacks, labels)
    pools = {name: _Pool(attack) for name, attack in attacks.items()}
    clean_counts = functools.partial(_clean_counts, classifier)

    def run(name: tuple[str, float]) -> None:
        eps, attack = name[1], attacks[name]
        index, values = pools[name].take(strategy)
        span = tally.span(index)
        start = time.perf_counter()
        fn = functools.partial(_robust_counts, classifier, eps, attack, index, seed, progress, span)
        counts = _summed(strategy, fn, *values)
        outcomes = placed_outcomes(span, counts)
        tally.add_robust(name, index, counts, time.perf_counter() - start)
        tally.add_outcomes(span[0], outcomes, name)

    # Workers split the batches of the one pipeline (not its files), so that together they see
    # exactly the examples one device would: the first N, say.
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    for batch, (x, y, positions) in enumerate(
        strategy.experimental_distribute_dataset(positioned(dataset).with_options(options))
    ):
        per_replica = strategy.run(clean_counts, args=(x, y))
        hits = per_replica.pop("hits")
        tally.add_clean(batch, _reduced(strategy, per_replica))
        # Its examples' places are known now that their number is.
        span = (tally.starts[batch], int(tally.total))
        here = strategy.run(functools.partial(placed, span), args=(positions, {"clean": hits}))
        tally.add_outcomes(span[0], placed_outcomes(span, _reduced(strategy, here)))
        for name, pool in pools.items():
            pool.add(batch, (x, y, positions, hits), strategy)
            if pool.full():
                run(name)
        if bar is not None:
            bar.add(1, values=tally.running())
    for name, pool in pools.items():
        if pool.batches:
            run(name)
    result = tally.result(strategy.num_replicas_in_sync)
    if not_applicable:
        ran = {attacked.key: attacked for attacked in result.robust}
        # Every attack asked for, in its order; one that could not run has no robust accuracy.
        result.robust = [ran.get(every.named(name).key, every.named(name)) for name in every.norms]
        result.not_applicable = not_applicable
    return result


def transfer_robust_accuracy(
    source_model: keras.Model,
    target_model: keras.Model,
    attack: Attack,
    dataset: tf.data.Dataset,
    eps: float,
    seed: int = 0,
) -> float:
    """Accuracy of `target_model` on the points `attack` crafts against `source_model`.

    `evaluate` with a TransferAttack: every crafted batch is checked to lie in C (radius `eps`)
    before it counts, and batch b is attacked with the seed [seed, b].
    """
    transfer = {("transfer", eps): TransferAttack(source_model, attack)}
    return evaluate(target_model, dataset, transfer, seed=seed).robust_accuracy("transfer")


def seconds_per_pass(classifier, x: tf.Tensor, y: tf.Tensor, repeats: int = 3) -> float:
    """The seconds of one forward-backward pass per example (the input gradient of the
    cross-entropy, as an attack step computes it), measured on the batch x after one warm-up
    call: the unit of an evaluation's time estimate. On a classifier without input gradients,
    three forward passes (the registry's passes count a forward pass as a third of one)."""
    step = tf.function(
        lambda x, y: losses.input_gradient(
            lambda x: cross_entropy(classifier(x, training=False), y), x
        )[1],
        autograph=False,  # so that UnavailableGradientError comes out as itself
    )
    try:
        step(x, y).numpy()
    except losses.UnavailableGradientError:
        forward = tf.function(lambda x, y: classifier(x, training=False))
        forward(x, y).numpy()
        start = time.perf_counter()
        for _ in range(repeats):
            forward(x, y).numpy()
        return 3 * (time.perf_counter() - start) / repeats / int(x.shape[0])
    start = time.perf_counter()
    for _ in range(repeats):
        step(x, y).numpy()
    return (time.perf_counter() - start) / repeats / int(x.shape[0])
