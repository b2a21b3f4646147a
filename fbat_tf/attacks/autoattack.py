"""AutoAttack (Croce & Hein, 2020): a fixed ensemble of attacks, each run on what is still robust.

    attack = AutoAttack(eps=8 / 255)                  # "standard": APGD-CE, APGD-T, FAB-T, Square
    x_adv, breakdown = attack(model, x, y, seed=0)    # the interface of every attack
    breakdown["robust"]["apgd-ce"]                    # bool [batch]: still robust after APGD-CE
    breakdown["seconds"]["apgd-ce"]                   # the time it took

    custom = AutoAttack(8 / 255, version="custom", attacks={"apgd-ce": APGD(8 / 255)})
    l2 = AutoAttack(eps=0.5, norm="l2")               # ε in [0, 1]-pixel units, per image

Versions, as the public reference (fra31/auto-attack, autoattack/autoattack.py, set_version):
"standard" is APGD-CE (100 iterations, 1 restart), APGD-T (targeted DLR, 9 target classes,
100 iterations, 1 restart each), FAB-T (9 target classes, 100 iterations) and Square (5000
queries, p_init 0.8), in that order; "rand" (for randomized defenses) is APGD-CE and APGD-DLR
with 1 restart and 20 EOT draws each; "custom" takes any `{name: attack}` in order. The
reference's `_set_version` gives "standard" the same parts and settings for L2 as for L∞; with
`norm="l2"` each part is its L2 form (APGD, FAB and Square take `norm`) and the points are
checked against the L2 ball. A "custom" part must be for the ensemble's norm (its `norm`).

Every attack of the ensemble gets the call's seed, as the reference seeds each of them alike.
Each attack sees only the examples still robust (a clean-misclassified example is non-robust
from the start), always starting from the clean input; the final point of an example is the
one from the first attack that broke it, or the clean input. Robust accuracy is the per-example
worst case over the attacks.

Cost: "standard" is model evaluations, about 1,910 forward-backward passes (APGD-CE 101, APGD-T
9 × 101, FAB-T 9 × 100) and 5,910 forward passes (FAB-T's checks, Square's 5000 queries) per
example that stays robust, so its time grows with the robust accuracy. Each attack's iterations
run in one tf.function, traced once or twice per attack (not per subset size), and cost a fixed
few milliseconds per iteration besides the model: give it large calls (`in_slices`;
`evaluation.evaluate` gives it all its batches at once). bench/autoattack_time.py times it
through evaluate.py.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Mapping

import keras
import numpy as np
import tensorflow as tf

from fbat_tf import constraints
from fbat_tf.attacks.apgd import APGD
from fbat_tf.attacks.base import Attack, Breakdown, padded_rows, progress_bar
from fbat_tf.attacks.losses import correct
from fbat_tf.attacks.masking import masking_gap  # noqa: F401  (its home before attacks.masking)
from fbat_tf.constraints import check_in_ball

VERSIONS = ("standard", "rand", "custom")


# Each part's `jit_compile`: True or False, or None for the part's own choice (APGD: XLA on a
# GPU; FAB-T and Square: on a GPU, and on a CPU for a model without convolutions).


def apgd_ce(eps: float, jit_compile: bool | None = None, norm: str = "linf") -> Attack:
    """APGD-CE as the "standard" ensemble runs it: 100 iterations, 1 restart."""
    return APGD(eps, loss="ce", steps=100, restarts=1, jit_compile=jit_compile, norm=norm)


def apgd_t(eps: float, jit_compile: bool | None = None, norm: str = "linf") -> Attack:
    """APGD-T: targeted DLR, 9 target classes, 100 iterations, 1 restart each."""
    return APGD(
        eps,
        "dlr_targeted",
        steps=100,
        restarts=1,
        n_target_classes=9,
        jit_compile=jit_compile,
        norm=norm,
    )


def fab_t(eps: float, jit_compile: bool | None = None, norm: str = "linf") -> Attack:
    """FAB-T: 9 target classes, 100 iterations, 1 restart."""
    from fbat_tf.attacks.fab import FAB  # APGD-only ("rand", "custom") runs need no FAB

    return FAB(eps, n_target_classes=9, steps=100, jit_compile=jit_compile, norm=norm)


def square(
    eps: float,
    n_queries: int = 5000,
    restarts: int = 1,
    jit_compile: bool | None = None,
    norm: str = "linf",
) -> Attack:
    """Square: 5000 queries, p_init 0.8, 1 restart (the reference's `n_restarts`); the
    registry's `square` with other `n_queries` and `restarts` is a stronger black-box check,
    the ensemble's own keeps these."""
    from fbat_tf.attacks.square import Square

    return Square(
        eps,
        n_queries=n_queries,
        p_init=0.8,
        restarts=restarts,
        jit_compile=jit_compile,
        norm=norm,
    )


def standard_attacks(
    eps: float, jit_compile: bool | None = None, norm: str = "linf"
) -> dict[str, Attack]:
    """The reference's "standard" ensemble, in its order: for L∞ and L2 alike."""
    return {
        "apgd-ce": apgd_ce(eps, jit_compile, norm),
        "apgd-t": apgd_t(eps, jit_compile, norm),
        "fab-t": fab_t(eps, jit_compile, norm),
        "square": square(eps, jit_compile=jit_compile, norm=norm),
    }


def rand_attacks(
    eps: float, jit_compile: bool | None = None, norm: str = "linf"
) -> dict[str, Attack]:
    """The reference's "rand" ensemble: APGD-CE and APGD-DLR with EOT over 20 draws."""
    return {
        name: APGD(
            eps, loss, steps=100, restarts=1, eot_iter=20, jit_compile=jit_compile, norm=norm
        )
        for name, loss in (("apgd-ce", "ce"), ("apgd-dlr", "dlr"))
    }


def _check_in_ball(x_adv: tf.Tensor, x: tf.Tensor, eps: float, name: str, norm: str) -> None:
    try:
        check_in_ball(x_adv, x, eps, norm=norm)
    except AssertionError as error:
        raise AssertionError(f"attack {name!r} returned points outside C: {error}") from None


class AutoAttack(Attack):
    keeps_adversarial = True  # its kept point per example is the first or best adversarial one
    # evaluate() gives it many batches joined, as in_slices(its batch size).
    pools = True

    def __init__(
        self,
        eps: float,
        version: str = "standard",
        attacks: Mapping[str, Attack] | None = None,
        batch_size: int | None = None,
        progress: bool = False,
        jit_compile: bool | None = None,
        norm: str = "linf",
    ):
        """`batch_size` bounds what one call of a part (and the clean pass) is given: each part
        attacks the examples still robust in consecutive slices of at most that many, as the
        reference does (None: all of them at once), as few slices as that allows and all of one
        length (`_equal_slices`: 180 survivors in calls of 128 are two slices of 90; the last
        padded with repeats of its first row, whose results are dropped). Slice k of
        every part gets the seed stateless_fold_in(seed, k) for k ≥ 1 and the call's seed for
        k = 0, so one slice is attacked exactly as the whole batch. `progress` shows a bar over
        each part's calls and the robust accuracy after it. `jit_compile` is given to each part
        of "standard" and "rand" (None: each part's own choice), and so is `norm`
        (constraints.NORMS: the ball of ε, in which every part's points are checked)."""
        if not eps >= 0:
            raise ValueError(f"eps must be >= 0, got {eps!r}")
        if version not in VERSIONS:
            raise ValueError(f"version must be one of {VERSIONS}, got {version!r}")
        if version != "custom" and attacks is not None:
            raise ValueError(f"attacks= is only for version='custom', got version={version!r}")
        if version == "custom" and not attacks:
            raise ValueError("version='custom' needs a non-empty {name: attack} mapping")
        if attacks is not None and "clean" in attacks:
            raise ValueError("'clean' is the name of the clean-accuracy mask; rename that attack")
        self.eps = float(eps)
        self.norm = constraints.check_norm(norm)
        self.version = version
        if version == "standard":
            self.attacks = standard_attacks(self.eps, jit_compile, self.norm)
        elif version == "rand":
            self.attacks = rand_attacks(self.eps, jit_compile, self.norm)
        else:
            self.attacks = dict(attacks)
            norms = {name: getattr(part, "norm", "linf") for name, part in self.attacks.items()}
            other = {name: norm for name, norm in norms.items() if norm != self.norm}
            if other:
                raise ValueError(
                    f"AutoAttack for norm {self.norm!r} was given parts for another norm: {other}"
                )
        self.batch_size = batch_size
        self.progress = progress

    def without_gradients(self) -> AutoAttack | None:
        """The ensemble of its parts that need no input gradient of the model (Square), in
        their order, for a model that has none; None where no part is such."""
        kept = {
            name: part
            for name, part in self.attacks.items()
            if not getattr(part, "needs_gradients", True)
        }
        if not kept:
            return None
        reduced = copy.copy(self)
        reduced.attacks = kept
        return reduced

    def in_slices(self, size: int, progress: bool = False) -> AutoAttack:
        sliced = copy.copy(self)
        sliced.batch_size, sliced.progress = size, progress
        return sliced

    def __call__(
        self, model: keras.Model, x: tf.Tensor, y: tf.Tensor, seed: int | tf.Tensor
    ) -> tuple[tf.Tensor, Breakdown]:
        """(x_adv, {"robust": {"clean" and each attack: bool [n]}, "seconds": {attack: s}})."""
        seed = constraints.as_seed(seed)
        x = tf.convert_to_tensor(x)
        y = tf.cast(tf.convert_to_tensor(y), tf.int32)
        n = int(x.shape[0])
        size = max(self.batch_size or n, 1)
        robust = np.concatenate(
            [
                correct(model(x[i : i + size], training=False), y[i : i + size]).numpy() > 0.5
                for i in range(0, n, size)
            ]
            or [np.zeros([0], bool)]
        )
        masks = {"clean": robust.copy()}
        seconds = {}
        x_adv = x.numpy().copy()
        if self.progress:
            budget = f"{self.eps * 255:g}/255" if self.norm == "linf" else f"{self.eps:g} (L2)"
            print(
                f"AutoAttack ({self.version}) at ε = {budget}, {n} examples: "
                f"clean {_percent(robust)}"
            )
        for name, attack in self.attacks.items():
            start = time.perf_counter()
            still_robust = np.flatnonzero(robust)
            bar = None
            if self.progress and still_robust.size:
                print(f"{name} on the {still_robust.size} examples still robust")
                calls = -(-still_robust.size // size)
                bar = progress_bar(calls, unit_name="call", stateful_metrics=["robust"])
            slices = _equal_slices(still_robust, size)
            for k, rows in enumerate(slices):
                # One length for every call of the part: an XLA-compiled part compiles once.
                padded = padded_rows(rows, slices[0].size)
                x_sub, y_sub = tf.gather(x, padded), tf.gather(y, padded)
                slice_seed = seed if k == 0 else tf.random.experimental.stateless_fold_in(seed, k)
                candidate, _ = attack(model, x_sub, y_sub, slice_seed)
                _check_in_ball(candidate, x_sub, self.eps, name, self.norm)
                broken = correct(model(candidate, training=False), y_sub).numpy() < 0.5
                broken, candidate = broken[: rows.size], np.asarray(candidate)[: rows.size]
                x_adv[rows[broken]] = candidate[broken]
                robust[rows[broken]] = False
                if bar is not None:
                    bar.add(1, values=[("robust", robust.mean())])
            seconds[name] = time.perf_counter() - start
            masks[name] = robust.copy()
            if self.progress:
                print(f"  after {name}: {_percent(robust)} robust ({seconds[name]:.1f} s)")
        return tf.convert_to_tensor(x_adv), {"robust": masks, "seconds": seconds}


def _equal_slices(rows: np.ndarray, size: int) -> list[np.ndarray]:
    """`rows` in consecutive slices of at most `size`, as few as that allows, all as long as the
    first but the last, which is shorter by less than one row per slice (180 rows in slices of
    at most 128: two of 90)."""
    count = -(-rows.size // size)
    length = -(-rows.size // max(count, 1))
    return [rows[k * length : (k + 1) * length] for k in range(count)]


def _percent(mask: np.ndarray) -> str:
    return f"{100 * mask.mean():.2f}%" if mask.size else "no examples"
