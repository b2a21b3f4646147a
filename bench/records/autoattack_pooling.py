"""What pooling the batches saves AutoAttack: each part over the survivors of every batch, against
each batch on its own, in one process, in turns.

    python bench/records/autoattack_pooling.py --rounds=2 \
        --json=bench/results/autoattack_pooling.json

`evaluation.evaluate` gives AutoAttack (standard) all the batches at once, and each of its parts
attacks the examples still robust across them, `batch_size` at a time ("pooled", the default).
With `evaluation.POOL_BYTES = 1` the pool never holds more than one batch, which is how every
batch was attacked on its own before ("per batch"). Both run on fmnist_mlp.py's MLP (as
eval_vs_torch.py: PGD-3 AT at ε = `--eps`/255 for `--train_epochs` epochs, its weights folded as
evaluate.py does) and the first `--n_examples` Fashion-MNIST test images in batches of
`--batch_size`. Each round runs both, in alternating order, with new attack objects (so every
run traces its graphs, as a new evaluate.py process would). Writes JSON and prints a Markdown
table of the medians: AutoAttack's time, each part's, and the robust accuracies (which must
agree: the same examples are attacked, only grouped otherwise, with other seeds per call).
"""

from __future__ import annotations

import os
import statistics
import sys

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")  # as evaluate.py sets it

from absl import app, flags  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/

from fmnist_mlp import mlp  # noqa: E402
from harness import command_line, describe, in_turns, machine, publish, table  # noqa: E402

PARTS = ("apgd-ce", "apgd-t", "fab-t", "square")

_N = flags.DEFINE_integer("n_examples", 500, "Test images attacked.", lower_bound=1)
_BATCH = flags.DEFINE_integer("batch_size", 128, "evaluate's batch size.", lower_bound=1)
_EPS = flags.DEFINE_float("eps", 24.0, "ε in 1/255 units, of the training and the attack.")
_EPOCHS = flags.DEFINE_integer("train_epochs", 4, "PGD-3 AT epochs of the MLP.", lower_bound=0)
_ROUNDS = flags.DEFINE_integer("rounds", 2, "Runs of each, in turns.", lower_bound=1)
_JSON = flags.DEFINE_string("json", None, "Write the results here.")


def run(classifier, dataset, eps: float, pool_bytes: int) -> dict:
    from fbat_tf import evaluation
    from fbat_tf.attacks.autoattack import AutoAttack

    default = evaluation.POOL_BYTES
    evaluation.POOL_BYTES = pool_bytes
    try:
        result = evaluation.evaluate(classifier, dataset, {("aa", eps): AutoAttack(eps)})
    finally:
        evaluation.POOL_BYTES = default
    attacked = result.attacked("aa")
    return {
        "time_s": attacked.seconds,
        "robust_accuracy": attacked.robust_accuracy,
        "seconds": attacked.part_seconds,
        "per_attack": attacked.parts,
    }


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from fbat_tf import classifiers, data, evaluation

    eps = _EPS.value / 255
    classifier = classifiers.InferenceGraph(mlp(eps, _EPOCHS.value))
    dataset = data.load(
        "fashion_mnist", "test", batch_size=_BATCH.value, max_examples=_N.value
    ).cache()
    modes = {"pooled": evaluation.POOL_BYTES, "per batch": 1}

    def call(mode: str):
        def one_run() -> dict:
            result = run(classifier, dataset, eps, modes[mode])
            print(f"{mode}: {result['time_s']:.1f} s", flush=True)
            return result

        return one_run

    runs = in_turns({mode: call(mode) for mode in modes}, _ROUNDS.value, alternate=True)
    summary = {
        "model": "fmnist_mlp.py's MLP 784-256-128-10, folded weights",
        "examples": _N.value,
        "batch_size": _BATCH.value,
        "eps_255": _EPS.value,
        "rounds": _ROUNDS.value,
        "machine": machine(),
        "command": command_line(),
        "runs": runs,
        "median": {
            mode: {
                "time_s": statistics.median(r["time_s"] for r in measured),
                "seconds": {
                    part: statistics.median(r["seconds"].get(part, 0.0) for r in measured)
                    for part in PARTS
                },
                "robust_accuracy": [r["robust_accuracy"] for r in measured],
            }
            for mode, measured in runs.items()
        },
    }
    publish(markdown_table(summary), summary, _JSON.value)


def markdown_table(summary: dict) -> str:
    median = summary["median"]
    heading = (
        f"AutoAttack standard, {summary['model']}, first {summary['examples']} Fashion-MNIST "
        f"test images, ε = {summary['eps_255']:g}/255, batches of {summary['batch_size']}, "
        f"{describe(summary['machine'])}; medians of "
        f"{summary['rounds']} rounds in turns (s)"
    )
    pooled, alone = median["pooled"]["time_s"], median["per batch"]["time_s"]
    rows = [["AutoAttack", f"{pooled:.1f}", f"{alone:.1f}", f"{alone / pooled:.2f}"]]
    for part in PARTS:
        pooled, alone = median["pooled"]["seconds"][part], median["per batch"]["seconds"][part]
        rows.append(
            [part, f"{pooled:.1f}", f"{alone:.1f}", f"{alone / pooled:.2f}" if pooled else ""]
        )
    accuracies = ", ".join(
        f"{mode} {' / '.join(f'{100 * a:.1f}%' for a in m['robust_accuracy'])}"
        for mode, m in median.items()
    )
    columns = ["", "pooled", "per batch", "per batch / pooled"]
    return table(heading, columns, rows) + f"\n\nRobust accuracy per round: {accuracies}."


if __name__ == "__main__":
    app.run(main)
