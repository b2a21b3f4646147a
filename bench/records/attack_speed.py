"""Each evaluation attack as it is now beside its module at an earlier revision, in one process:
the time of a call, in turns, and how far apart their adversarial points are.

    python bench/records/attack_speed.py --json=bench/results/attack_speed.json
    python bench/records/attack_speed.py --before=8f904c9 --attacks=PGD-50-10 \
        --json=bench/results/attack_speed_pgd.json     # PGD's restarts side by side

The earlier modules (fbat_tf/attacks/<name>.py at `--before`, read with `git show`) run with
today's rest of the package, on fmnist_mlp.py's MLP folded as evaluate.py folds it, on the
first `--n_examples` Fashion-MNIST test images in calls of 128: PGD-50-10, APGD-CE, APGD-T and
FAB-T with 3 target classes, and Square with 1000 queries on the examples APGD-CE leaves
robust (where AutoAttack runs it). Each call after an untimed first one; `--rounds` turns of
before, now; medians. Why the attacks' element-wise work changed (bench/README.md, "Evaluation
against PyTorch").
"""

from __future__ import annotations

import importlib
import os
import statistics
import sys
import time

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/

from fmnist_mlp import mlp  # noqa: E402
from harness import command_line, describe, machine, module_at, publish, table  # noqa: E402

_BEFORE = flags.DEFINE_string(
    "before", "5160020", "Git revision whose attack modules are the 'before' column."
)
_N = flags.DEFINE_integer("n_examples", 500, "Test images attacked.", lower_bound=1)
_EPS = flags.DEFINE_float("eps", 24.0, "ε in 1/255 units.")
_EPOCHS = flags.DEFINE_integer("train_epochs", 4, "PGD-3 AT epochs of the MLP.", lower_bound=0)
_ROUNDS = flags.DEFINE_integer("rounds", 5, "Timed turns of before, now.", lower_bound=1)
_ONLY = flags.DEFINE_list("attacks", None, "Only these rows (labels as in ATTACKS).")
_JSON = flags.DEFINE_string("json", None, "Write the results here.")

BATCH = 128
# name: (module, how to build it from the module at ε, whether it runs on APGD-CE's survivors)
ATTACKS = {
    "PGD-50-10": ("pgd", lambda m, eps: m.PGD(eps, 50, 10), False),
    "APGD-CE": ("apgd", lambda m, eps: m.APGD(eps, loss="ce"), False),
    "APGD-T (3 targets)": (
        "apgd",
        lambda m, eps: m.APGD(eps, loss="dlr_targeted", n_target_classes=3),
        False,
    ),
    "FAB-T (3 targets)": ("fab", lambda m, eps: m.FAB(eps, n_target_classes=3), False),
    "Square (1000 queries)": ("square", lambda m, eps: m.Square(eps, n_queries=1000), True),
}


def load(module: str, revision: str | None):
    """fbat_tf/attacks/<module>.py at a git revision (None: the working tree)."""
    if revision is None:
        return importlib.import_module(f"fbat_tf.attacks.{module}")
    return module_at(f"fbat_tf/attacks/{module}.py", revision)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    import numpy as np
    import tensorflow as tf

    from fbat_tf import classifiers, data
    from fbat_tf.attacks.autoattack import AutoAttack

    eps = _EPS.value / 255
    model = classifiers.InferenceGraph(mlp(eps, _EPOCHS.value))
    x, y = next(
        iter(data.load("fashion_mnist", "test", batch_size=_N.value, max_examples=_N.value))
    )
    robust = AutoAttack(eps).attacks["apgd-ce"]
    survivors = np.flatnonzero(
        AutoAttack(eps, "custom", {"apgd-ce": robust}).in_slices(BATCH)(model, x, y, 0)[1][
            "robust"
        ]["apgd-ce"]
    )
    rows = []
    unknown = sorted(set(_ONLY.value or []) - set(ATTACKS))
    if unknown:
        raise app.UsageError(f"unknown --attacks {unknown}; known: {sorted(ATTACKS)}")
    for label, (module, build, on_survivors) in ATTACKS.items():
        if _ONLY.value and label not in _ONLY.value:
            continue
        xs, ys = (tf.gather(x, survivors), tf.gather(y, survivors)) if on_survivors else (x, y)
        attacks = {
            "before": build(load(module, _BEFORE.value), eps),
            "now": build(load(module, None), eps),
        }

        def call(attack, xs=xs, ys=ys):
            return np.concatenate(
                [
                    attack(model, xs[i : i + BATCH], ys[i : i + BATCH], [0, i])[0].numpy()
                    for i in range(0, int(xs.shape[0]), BATCH)
                ]
            )

        points = {name: call(attack) for name, attack in attacks.items()}  # untimed: tracing
        seconds = {name: [] for name in attacks}
        for _ in range(_ROUNDS.value):
            for name, attack in attacks.items():
                start = time.perf_counter()
                call(attack)
                seconds[name].append(time.perf_counter() - start)
        median = {name: statistics.median(s) for name, s in seconds.items()}
        rows.append(
            {
                "attack": label,
                "examples": int(xs.shape[0]),
                "seconds": median,
                "round_seconds": seconds,
                "ratio_now_over_before": median["now"] / median["before"],
                "max_abs_point_difference": float(np.abs(points["now"] - points["before"]).max()),
            }
        )
        print(rows[-1], flush=True)
    report = {
        "before_revision": _BEFORE.value,
        "examples": _N.value,
        "eps_255": _EPS.value,
        "rounds": _ROUNDS.value,
        "rows": rows,
        "machine": machine(),
        "command": command_line(),
    }
    publish(markdown_table(report), report, _JSON.value)


def markdown_table(report: dict) -> str:
    heading = (
        f"fmnist_mlp.py's MLP, first {report['examples']} Fashion-MNIST test images, ε = "
        f"{report['eps_255']:g}/255, calls of {BATCH}, {describe(report['machine'])}; medians "
        f"of {report['rounds']} turns; before = {report['before_revision']}"
    )
    columns = ["attack", "examples", "before (s)", "now (s)", "now / before", "max |Δ point|"]
    rows = [
        [
            r["attack"],
            r["examples"],
            f"{r['seconds']['before']:.2f}",
            f"{r['seconds']['now']:.2f}",
            f"{r['ratio_now_over_before']:.2f}",
            f"{r['max_abs_point_difference']:.1e}",
        ]
        for r in report["rows"]
    ]
    return table(heading, columns, rows)


if __name__ == "__main__":
    app.run(main)
