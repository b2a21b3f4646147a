"""Measure the robustness of a trained model: clean accuracy and PGD-K-R robust accuracy.

    python evaluate.py --model_path=runs/fmnist-fastbat --n_examples=1000 --eps=4,8

The dataset and the default ε are those of the training run. Prints a table and writes JSON
(never over an existing file).
"""

from __future__ import annotations

import os
import sys

from absl import app

from flags import common
from flags import evaluate as eval_flags


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from fbat_tf import data, device, evaluation
    from fbat_tf.callbacks import write_json_atomic

    model_path = eval_flags.MODEL_PATH.value
    results_path = eval_flags.RESULTS.value or os.path.join(
        model_path, f"eval-{eval_flags.SPLIT.value}.json"
    )
    if os.path.exists(results_path):
        sys.exit(f"error: {results_path} exists; pass another --results")
    try:
        classifier, config = evaluation.load_classifier(model_path)
        dataset = config["dataset"]
        data_dir = common.DATA_DIR.value or config.get("data_dir")
        data.check_available(dataset, data_dir, common.DOWNLOAD.value)
    except (ValueError, FileNotFoundError) as error:
        sys.exit(f"error: {error}")
    eps_values = [float(v) / 255 for v in eval_flags.EPS.value or [config["eps"] * 255]]
    split = data.load(
        dataset,
        eval_flags.SPLIT.value,
        data_dir=data_dir,
        batch_size=common.BATCH_SIZE.value,
        max_examples=eval_flags.N_EXAMPLES.value or None,
        download=common.DOWNLOAD.value,
    )
    attacks = evaluation.pgd_attacks(
        eps_values,
        steps=eval_flags.PGD_STEPS.value,
        restarts=eval_flags.PGD_RESTARTS.value,
        seed=common.SEED.value,
        jit_compile=device.resolve_jit_compile(common.JIT_COMPILE.value),
    )
    results = evaluation.evaluate(classifier, split, attacks)
    results.update(
        model_path=model_path,
        dataset=dataset,
        split=eval_flags.SPLIT.value,
        pgd_steps=eval_flags.PGD_STEPS.value,
        pgd_restarts=eval_flags.PGD_RESTARTS.value,
        device=device.describe(),
    )
    write_json_atomic(results_path, results)
    print(f"{dataset} {eval_flags.SPLIT.value}, {results['examples']} examples")
    print("| attack | ε (/255) | accuracy | time (s) |\n|---|---|---|---|")
    print(f"| clean | 0 | {results['clean_accuracy']:.4f} | |")
    for name, accuracy in results["robust_accuracy"].items():
        attack, eps = name.split("@")
        label = f"PGD-{eval_flags.PGD_STEPS.value}-{eval_flags.PGD_RESTARTS.value}"
        print(f"| {label} | {eps} | {accuracy:.4f} | {results['time_s'][name]:.1f} |")
    print(f"results in {results_path}")


if __name__ == "__main__":
    app.run(main)
