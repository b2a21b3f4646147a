"""The indicators of attack failure's cost against AutoAttack's, on the same evaluated points.

    python bench/indicators.py --model_path=study/results/deploy/fmnist-fastbat --n_examples=256 \
        --json=bench/results/indicators.json --markdown=bench/results/indicators.md

On the committed Fast-BAT small CNN (Fashion-MNIST, ε = 8/255) by default: evaluates PGD-50-10
and AutoAttack (standard) on the first `--n_examples` test points as evaluate.py does (folded
weights), then the reference AutoAttack's checks and the six indicators (fbat_tf/indicators.py)
on the first `--indicator_points` clean-correct ones, and reports each time, the indicators' as a
share of AutoAttack's, and what fired (DESIGN.md §4.5 aims at a tenth at most).
"""

from __future__ import annotations

import time

from absl import app, flags
from harness import command_line, describe, load_average, machine, publish, table

_MODEL_PATH = flags.DEFINE_string("model_path", "study/results/deploy/fmnist-fastbat", "A run.")
_N_EXAMPLES = flags.DEFINE_integer("n_examples", 256, "Evaluated test points.", lower_bound=1)
_BATCH = flags.DEFINE_integer("batch_size", 256, "Evaluation batch size.", lower_bound=1)
_POINTS = flags.DEFINE_integer("indicator_points", 32, "The indicators' sample.", lower_bound=1)
_DATA_DIR = flags.DEFINE_string("data_dir", "/usr/share/datasets/fashion-mnist", "Data.")
_JSON = flags.DEFINE_string("json", None, "Write the results here.")
_MARKDOWN = flags.DEFINE_string("markdown", None, "Write the table here.")


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from fbat_tf import classifiers, data, evaluation, indicators
    from fbat_tf.checks import reference_checks

    classifier, config = classifiers.load_classifier(_MODEL_PATH.value)
    classifier = classifiers.fold_weights(classifier)
    split = data.load(
        config.dataset,
        "test",
        data_dir=_DATA_DIR.value,
        batch_size=_BATCH.value,
        max_examples=_N_EXAMPLES.value,
    )
    attacks = evaluation.registry_attacks(["pgd", "autoattack"], [config.eps], norm=config.norm)
    with load_average() as load:
        result = evaluation.evaluate(classifier, split, attacks)
        start = time.perf_counter()
        x, y = next(iter(split))[:2]
        checks = reference_checks(classifier, x[:64], y[:64], attacks)
        checks_seconds = time.perf_counter() - start
        sample = indicators.sample(split, result.clean_outcomes, _POINTS.value)
        found = indicators.compute(classifier, *sample, attacks, result, checks=checks)
    pgd, aa = (result.attacked(name) for name in ("pgd", "autoattack"))
    spent = checks_seconds + found.seconds
    share = spent / aa.seconds
    rows = [
        ["PGD-50-10", result.examples, f"{pgd.robust_accuracy:.4f}", f"{pgd.seconds:.1f}", ""],
        [
            "AutoAttack (standard)",
            result.examples,
            f"{aa.robust_accuracy:.4f}",
            f"{aa.seconds:.1f}",
            "1",
        ],
        ["reference checks", min(64, result.examples), "", f"{checks_seconds:.2f}", ""],
        ["indicators", found.points, "", f"{found.seconds:.1f}", ""],
        ["checks + indicators", "", "", f"{spent:.1f}", f"{share:.3f}"],
    ]
    fired = {key: sorted(found.fired(key)) for key in found.attacks}
    markdown = table(
        f"Indicators of attack failure against AutoAttack on {_MODEL_PATH.value}, "
        f"{describe(machine(), load)}",
        ["what", "points", "robust accuracy", "time (s)", "share of AutoAttack's time"],
        rows,
    )
    markdown += "\n\nfired: " + (
        "; ".join(f"{k}: {', '.join(v) or 'none'}" for k, v in fired.items())
    )
    payload = {
        "model_path": _MODEL_PATH.value,
        "examples": result.examples,
        "indicator_points": found.points,
        "pgd_seconds": pgd.seconds,
        "autoattack_seconds": aa.seconds,
        "checks_seconds": checks_seconds,
        "indicators_seconds": found.seconds,
        "share_of_autoattack": share,
        "indicators": found.to_dict(),
        "machine": machine(),
        "load": load,
        "command": command_line(),
    }
    publish(markdown, payload, _JSON.value, _MARKDOWN.value)


if __name__ == "__main__":
    app.run(main)
