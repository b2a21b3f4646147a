"""Time `evaluate.py --attacks=autoattack` end to end: the whole command and each attack.

    python bench/autoattack_time.py --model_path=runs/fmnist-fastbat --n_examples=1000 \
        --batch_size=1000 --json=bench/results/autoattack_time.json
    python bench/autoattack_time.py --nofold_weights --onednn=off      # the Keras model, no oneDNN

Runs evaluate.py in a child process exactly as a user would (AutoAttack standard at the run's
training ε on the first `--n_examples` test examples, batches of `--batch_size`) and reports the
child's wall time (start-up, loading and tracing included), AutoAttack's time and each attack's
from evaluate.py's JSON, the robust accuracy after each attack, the machine's load average
(other processes skew CPU timings) and the command. Writes JSON and prints a Markdown table.
"""

from __future__ import annotations

import os

from absl import app, flags
from harness import command_line, describe, machine, publish, run_evaluate, table

_MODEL_PATH = flags.DEFINE_string(
    "model_path", "runs/fmnist-fastbat", "Training run directory, .keras file or SavedModel."
)
_N_EXAMPLES = flags.DEFINE_integer(
    "n_examples", 1000, "Evaluate the first N test examples.", lower_bound=1
)
_BATCH = flags.DEFINE_integer("batch_size", 1000, "Evaluation batch size.", lower_bound=1)
_FOLD = flags.DEFINE_bool("fold_weights", True, "evaluate.py's --fold_weights.")
_ONEDNN = flags.DEFINE_enum(
    "onednn",
    "default",
    ["default", "on", "off"],
    "TF_ENABLE_ONEDNN_OPTS for the child: evaluate.py's default (on), 1 or 0.",
)
_JSON = flags.DEFINE_string("json", None, "Write the results here.")


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_ENABLE_ONEDNN_OPTS", None)
    if _ONEDNN.value != "default":
        env["TF_ENABLE_ONEDNN_OPTS"] = "1" if _ONEDNN.value == "on" else "0"
    arguments = [
        f"--model_path={_MODEL_PATH.value}",
        "--attacks=autoattack",
        f"--n_examples={_N_EXAMPLES.value}",
        f"--batch_size={_BATCH.value}",
        f"--{'' if _FOLD.value else 'no'}fold_weights",
    ]
    wall, load, evaluated = run_evaluate(arguments, env)
    (attacked,) = evaluated.robust
    report = {
        "model_path": _MODEL_PATH.value,
        "dataset": evaluated.dataset,
        "examples": evaluated.examples,
        "batch_size": _BATCH.value,
        "eps_255": attacked.eps,
        "fold_weights": _FOLD.value,
        "onednn": _ONEDNN.value,
        "wall_time_s": wall,
        "autoattack_time_s": attacked.seconds,
        "seconds_per_attack": attacked.part_seconds,
        "clean_accuracy": evaluated.clean_accuracy,
        "robust_accuracy": attacked.robust_accuracy,
        "robust_accuracy_after": attacked.parts,
        "device": evaluated.device,
        "machine": machine(),
        "load_average_1min": load,
        "evaluate_command": "python evaluate.py " + " ".join(arguments),
        "command": command_line(),
    }
    publish(markdown_table(report), report, _JSON.value)


def markdown_table(report: dict) -> str:
    heading = (
        f"`{report['evaluate_command']}`: AutoAttack standard at ε = {report['eps_255']:g}/255 "
        f"on the first {report['examples']} {report['dataset']} test examples; "
        f"{report['device']}, oneDNN {report['onednn']}, "
        + describe(report["machine"], report["load_average_1min"])
    )
    rows = [["clean", f"{report['clean_accuracy']:.4f}", ""]]
    for name, seconds in report["seconds_per_attack"].items():
        rows.append(
            [f"after {name}", f"{report['robust_accuracy_after'][name]:.4f}", f"{seconds:.1f}"]
        )
    rows.append(
        [
            "**AutoAttack**",
            f"**{report['robust_accuracy']:.4f}**",
            f"**{report['autoattack_time_s']:.1f}**",
        ]
    )
    rows.append(["whole evaluate.py run (wall)", "", f"{report['wall_time_s']:.1f}"])
    return table(heading, ["stage", "robust accuracy", "time (s)"], rows)


if __name__ == "__main__":
    app.run(main)
