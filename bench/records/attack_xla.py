"""FAB-T and Square on a CPU with and without XLA, on a dense model and a convolutional one:
why their `jit_compile=None` (evaluate.py's `--jit_compile=auto`) compiles on a CPU only for a
model without convolutions (fbat_tf/attacks/base.py, `xla_pays`).

    python bench/records/attack_xla.py --json=bench/results/attack_xla.json

Models, folded as evaluate.py folds them: fmnist_mlp.py's MLP (784-256-128-10, PGD-3 AT at
ε = `--eps`) and the small CNN of the README's demo (small_cnn width 16, its initial weights:
the time does not depend on them). On the first `--n_examples` Fashion-MNIST test images, all
labelled with the model's own prediction (every row attacked): FAB-T with one target and
`--fab_steps` iterations, Square with `--queries` queries. Per model, attack and mode, the
first call (tracing and compiling) and then `--rounds` turns of plain, XLA; medians.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/

from fmnist_mlp import mlp  # noqa: E402
from harness import command_line, describe, machine, publish, table  # noqa: E402

_N = flags.DEFINE_integer("n_examples", 128, "Test images attacked, in one call.", lower_bound=1)
_EPS = flags.DEFINE_float("eps", 24.0, "ε in 1/255 units.")
_EPOCHS = flags.DEFINE_integer("train_epochs", 4, "PGD-3 AT epochs of the MLP.", lower_bound=0)
_FAB_STEPS = flags.DEFINE_integer("fab_steps", 20, "FAB-T iterations.", lower_bound=1)
_QUERIES = flags.DEFINE_integer("queries", 300, "Square queries.", lower_bound=1)
_ROUNDS = flags.DEFINE_integer("rounds", 3, "Timed turns of plain, XLA.", lower_bound=1)
_JSON = flags.DEFINE_string("json", None, "Write the results here.")


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    import keras
    import tensorflow as tf

    from fbat_tf import classifiers, data, models
    from fbat_tf.attacks.base import xla_pays
    from fbat_tf.attacks.fab import FAB
    from fbat_tf.attacks.square import Square

    eps = _EPS.value / 255
    keras.utils.set_random_seed(0)
    cnn = models.build("small_cnn", 10, (28, 28, 1), 0.286, 0.353, width=16)
    networks = {"MLP": mlp(eps, _EPOCHS.value), "small CNN (width 16)": cnn}
    x, _ = next(
        iter(data.load("fashion_mnist", "test", batch_size=_N.value, max_examples=_N.value))
    )
    builders = {
        f"FAB-T (1 target, {_FAB_STEPS.value} iterations)": lambda jit: FAB(
            eps, n_target_classes=1, steps=_FAB_STEPS.value, jit_compile=jit
        ),
        f"Square ({_QUERIES.value} queries)": lambda jit: Square(
            eps, n_queries=_QUERIES.value, jit_compile=jit
        ),
    }
    rows = []
    for network, keras_model in networks.items():
        model = classifiers.InferenceGraph(keras_model)
        y = tf.argmax(model(x), -1, output_type=tf.int32)
        for label, build in builders.items():
            attacks = {"plain": build(False), "XLA": build(True)}
            first, seconds = {}, {mode: [] for mode in attacks}
            for mode, attack in attacks.items():
                start = time.perf_counter()
                attack(model, x, y, 0)[0].numpy()
                first[mode] = time.perf_counter() - start
            for _ in range(_ROUNDS.value):
                for mode, attack in attacks.items():
                    start = time.perf_counter()
                    attack(model, x, y, 0)[0].numpy()
                    seconds[mode].append(time.perf_counter() - start)
            median = {mode: statistics.median(s) for mode, s in seconds.items()}
            rows.append(
                {
                    "model": network,
                    "attack": label,
                    "first_call_s": first,
                    "call_s": median,
                    "round_seconds": seconds,
                    "xla_over_plain": median["XLA"] / median["plain"],
                    "auto_compiles": bool(xla_pays(model, x)),
                }
            )
            print(rows[-1], flush=True)
    report = {
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
        f"First {report['examples']} Fashion-MNIST test images in one call, ε = "
        f"{report['eps_255']:g}/255, {describe(report['machine'])}; medians of "
        f"{report['rounds']} turns (s)"
    )
    columns = ["model", "attack", "first call plain / XLA", "call plain", "call XLA"]
    columns += ["XLA / plain", "auto compiles"]
    rows = [
        [
            r["model"],
            r["attack"],
            f"{r['first_call_s']['plain']:.2f} / {r['first_call_s']['XLA']:.2f}",
            f"{r['call_s']['plain']:.2f}",
            f"{r['call_s']['XLA']:.2f}",
            f"{r['xla_over_plain']:.2f}",
            "yes" if r["auto_compiles"] else "no",
        ]
        for r in report["rows"]
    ]
    return table(heading, columns, rows)


if __name__ == "__main__":
    app.run(main)
