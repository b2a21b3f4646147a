"""PGD's first call (trace, compile and run) against its later calls, for PGD-5-1 and PGD-50-10,
today's graph loops beside the unrolled PGD of an earlier revision, in one process.

    python bench/records/pgd_trace.py --json=bench/results/pgd_trace.json
    python bench/records/pgd_trace.py --before=9728a09~1 --n_examples=500 --eps=24

The model is the 784-256-128-10 ReLU MLP of the evaluation-speed measurements, on the first
`--n_examples` real Fashion-MNIST test images at ε = `--eps`/255. Its weights come from
`--train_epochs` epochs of PGD-3 adversarial training on the first 10,000 training images
(the cost of a call depends on how many examples survive the restarts; the cost of tracing does
not). "trace" is the first call's time minus the median of the later calls, so it holds tracing,
graph optimization and (with --jit) XLA compilation. The earlier revision's pgd.py is read with
`git show`, so both versions run on the same model, data and machine state.
"""

from __future__ import annotations

import inspect
import os
import statistics
import sys
import time

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")  # as evaluate.py

from absl import app, flags  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/

from fmnist_mlp import mlp  # noqa: E402
from harness import command_line, describe, machine, module_at, publish, table  # noqa: E402

_BEFORE = flags.DEFINE_string(
    "before", "9728a09~1", "Git revision whose fbat_tf/attacks/pgd.py is the 'before' row."
)
_N = flags.DEFINE_integer("n_examples", 500, "Test images attacked.", lower_bound=1)
_EPS = flags.DEFINE_float("eps", 24.0, "ε in 1/255 units.")
_EPOCHS = flags.DEFINE_integer("train_epochs", 4, "PGD-3 AT epochs of the MLP.", lower_bound=0)
_CALLS = flags.DEFINE_integer("calls", 3, "Timed calls after the first.", lower_bound=1)
_JIT = flags.DEFINE_list("jit", ["false", "true"], "jit_compile settings to measure.")
_JSON = flags.DEFINE_string("json", None, "Write the results here.")

SETTINGS = ((5, 1), (50, 10))


def load_pgd(revision: str | None):
    """The PGD class of fbat_tf/attacks/pgd.py at a git revision (None: the working tree)."""
    if revision is None:
        from fbat_tf.attacks.pgd import PGD

        return PGD
    return module_at("fbat_tf/attacks/pgd.py", revision).PGD


def adversarial(attack, model, x, y):
    """x_adv under either interface: `attack(model, x, y, seed) -> (x_adv, breakdown)`, or
    `attack(model, x, y) -> x_adv` at revisions before attacks took their seed per call."""
    if "seed" in inspect.signature(attack.__call__).parameters:
        return attack(model, x, y, 0)[0]
    return attack(model, x, y)


def time_calls(attack, model, x, y, calls: int) -> tuple[float, float, float]:
    """(first call, median later call, robust accuracy) in seconds."""
    import numpy as np

    start = time.perf_counter()
    x_adv = adversarial(attack, model, x, y)
    first = time.perf_counter() - start
    later = []
    for _ in range(calls):
        start = time.perf_counter()
        x_adv = adversarial(attack, model, x, y)
        later.append(time.perf_counter() - start)
    robust = float(np.mean(np.argmax(model(x_adv).numpy(), -1) == y.numpy()))
    return first, statistics.median(later), robust


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    import tensorflow as tf

    from fbat_tf import data

    eps = _EPS.value / 255
    model = mlp(eps, _EPOCHS.value)
    x, y = next(
        iter(data.load("fashion_mnist", "test", batch_size=_N.value, max_examples=_N.value))
    )
    y = tf.cast(y, tf.int32)
    clean = float(
        tf.reduce_mean(tf.cast(tf.argmax(model(x), -1, output_type=tf.int32) == y, tf.float32))
    )
    versions = {"before": load_pgd(_BEFORE.value), "after": load_pgd(None)}
    rows = []
    for jit in (value.lower() == "true" for value in _JIT.value):
        for version, pgd in versions.items():
            for steps, restarts in SETTINGS:
                attack = pgd(eps, steps, restarts, jit_compile=jit)
                first, later, robust = time_calls(attack, model, x, y, _CALLS.value)
                rows.append(
                    {
                        "version": version,
                        "jit_compile": jit,
                        "steps": steps,
                        "restarts": restarts,
                        "first_call_s": first,
                        "later_call_s": later,
                        "trace_s": first - later,
                        "robust_accuracy": robust,
                    }
                )
                print(rows[-1], flush=True)
    report = {
        "model": "MLP 784-256-128-10 ReLU",
        "train": f"PGD-3 AT, {_EPOCHS.value} epochs, first 10,000 Fashion-MNIST training images",
        "examples": _N.value,
        "eps_255": _EPS.value,
        "clean_accuracy": clean,
        "before_revision": _BEFORE.value,
        "machine": machine(),
        "command": command_line(),
        "rows": rows,
    }
    publish(markdown_table(report), report, _JSON.value)


def markdown_table(report: dict) -> str:
    heading = (
        f"{report['model']} ({report['train']}; clean {100 * report['clean_accuracy']:.1f}%), "
        f"first {report['examples']} Fashion-MNIST test images, ε = {report['eps_255']:g}/255, "
        f"{describe(report['machine'])}; before = {report['before_revision']}"
    )
    columns = ["PGD", "XLA", "version", "first call (s)", "later call (s)", "trace (s)"]
    rows = [
        [
            f"{row['steps']}-{row['restarts']}",
            "yes" if row["jit_compile"] else "no",
            row["version"],
            *(f"{row[key]:.2f}" for key in ("first_call_s", "later_call_s", "trace_s")),
            f"{100 * row['robust_accuracy']:.1f}%",
        ]
        for row in report["rows"]
    ]
    return table(heading, [*columns, "robust acc."], rows)


if __name__ == "__main__":
    app.run(main)
