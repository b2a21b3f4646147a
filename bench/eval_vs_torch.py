"""fbat-tf's evaluation against PyTorch on the same model, weights and points: PGD-50-10 and
AutoAttack (standard), side by side in one run.

    python bench/eval_vs_torch.py --json=bench/results/eval_vs_torch.json
    python bench/eval_vs_torch.py --n_examples=20 --train_epochs=0 --pgd_steps=5 \
        --pgd_restarts=2                                                   # a smoke run
    python bench/eval_vs_torch.py --norm=l2 --eps=1.5 --n_examples=1000 \
        --json=bench/results/eval_vs_torch_l2.json                      # the L2 threat model

The model is fmnist_mlp.py's: the 784-256-128-10 ReLU MLP after `--train_epochs` epochs of
PGD-3 AT at ε = `--eps`/255 on the first 10,000 Fashion-MNIST training images, attacked on the
first `--n_examples` test images at the same ε. With `--norm=l2`, ε = `--eps` in [0, 1]-pixel
units, the L2 norm over the image, for the training and both sides' attacks (the reference's
norm='L2'). Needs the `bench` extra (torch, pyautoattack).

fbat-tf: the model is saved as a .keras file and evaluate.py runs on it in a child process,
exactly as a user would type it (batches of 128, its default); the table takes each attack's
time from evaluate.py's JSON (first-call tracing included), and the child's wall time (start-up
and loading too) is reported beside it.

PyTorch, in a child process of its own: the Keras weights are copied into an equal torch.nn
MLP (`torch_reference.mlp`; the logits are checked to agree), then, on the same batches of 128:
a plain PyTorch PGD-K-R loop finding what fbat_tf/attacks/pgd.py finds (`torch_reference.pgd`:
step ε/4, uniform start in C, signed steps on the summed cross-entropy, per example the first
restart that breaks it, later restarts only on the examples still robust, one at a time where
fbat-tf runs them side by side), and
pyautoattack's AutoAttack, the PyTorch reference, version "standard", L∞. The two sides run
one after the other, never at the same time (`--rounds=R`: R times in turns, medians
reported); the 1-minute load average before and after each is recorded, since other
processes skew CPU timings. Writes JSON and prints a Markdown table with
the targets: PGD-50-10 in at most the PyTorch loop's time, AutoAttack in at most half the
reference's. bench/eval_profile.py shows where each attack's time goes.

Each side has a process of its own because PyTorch's OpenMP threads keep spinning for a while
after their work (forever with OMP_WAIT_POLICY=ACTIVE): in the parent they would take a core
from evaluate.py while it runs, which made its AutoAttack 1.3× slower. PyTorch runs
`--torch_threads` threads (default: every core) with the OpenMP wait policy of the environment
(`--omp_wait_policy` to set one).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

import torch_reference as reference
from absl import app, flags
from fmnist_mlp import mlp
from harness import (
    command_line,
    define_rounds,
    describe,
    in_turns,
    load_average,
    machine,
    median_of,
    publish,
    report,
    run_child,
    run_evaluate,
    table,
)

# Both sides' batch size, passed to evaluate.py as --batch_size (also its default).
EVALUATE_BATCH_SIZE = 128
# The targets: fbat-tf's time over PyTorch's.
TARGETS = {"pgd": 1.0, "autoattack": 0.5}
AUTOATTACK_PARTS = ("apgd-ce", "apgd-t", "fab-t", "square")

_N = flags.DEFINE_integer("n_examples", 500, "Test images attacked.", lower_bound=1)
_EPS = flags.DEFINE_float(
    "eps",
    24.0,
    "ε of the training and the attacks: in 1/255 units, or in pixel units with --norm=l2.",
)
_NORM = flags.DEFINE_enum("norm", "linf", ["linf", "l2"], "Threat model of both sides.")
_EPOCHS = flags.DEFINE_integer("train_epochs", 4, "PGD-3 AT epochs of the MLP.", lower_bound=0)
_STEPS = flags.DEFINE_integer("pgd_steps", 50, "PGD steps K, both sides.", lower_bound=1)
_RESTARTS = flags.DEFINE_integer("pgd_restarts", 10, "PGD restarts R, both sides.", lower_bound=1)
_THREADS = flags.DEFINE_integer(
    "torch_threads", 0, "torch.set_num_threads (0: os.cpu_count()).", lower_bound=0
)
_OMP_WAIT = flags.DEFINE_enum(
    "omp_wait_policy",
    "environment",
    ["passive", "active", "environment"],
    "OMP_WAIT_POLICY of the PyTorch side's OpenMP threads (environment: as the environment "
    "has it, PyTorch's default). See the module docstring.",
)
_ROUNDS = define_rounds(
    "Times the two sides run, in turns (fbat-tf, PyTorch, fbat-tf, ...); the table gives the "
    "median of each time over the rounds, and each round's ratio."
)
_JSON = flags.DEFINE_string("json", None, "Write the results here.")
_TORCH_CHILD = flags.DEFINE_string(
    "torch_child", None, "Internal: run the PyTorch side on the model and points saved here."
)


def evaluate_arguments(model_path: str) -> list[str]:
    """evaluate.py's flags for the .keras file: the same attacks, points and batches."""
    return [
        f"--model_path={model_path}",
        "--dataset=fashion_mnist",
        "--attacks=pgd,autoattack",
        f"--pgd_steps={_STEPS.value}",
        f"--pgd_restarts={_RESTARTS.value}",
        f"--n_examples={_N.value}",
        f"--batch_size={EVALUATE_BATCH_SIZE}",
        f"--eps={_EPS.value:g}",
        f"--norm={_NORM.value}",
    ]


def time_parts(adversary, model) -> tuple[dict[str, float], dict[str, int]]:
    """Wrap the reference's four attacks' `perturb`: (seconds per attack, examples it broke),
    filled in as AutoAttack runs; the counting is outside the timed call."""
    import torch

    seconds = dict.fromkeys(AUTOATTACK_PARTS, 0.0)
    broken = dict.fromkeys(AUTOATTACK_PARTS, 0)
    attacks = (adversary.apgd, adversary.apgd_targeted, adversary.fab, adversary.square)
    for name, attack in zip(AUTOATTACK_PARTS, attacks, strict=True):

        def timed(x, y, *args, _perturb=attack.perturb, _name=name, **kwargs):
            start = time.perf_counter()
            x_adv = _perturb(x, y, *args, **kwargs)
            seconds[_name] += time.perf_counter() - start
            with torch.no_grad():
                broken[_name] += int((model(x_adv).argmax(1) != y).sum())
            return x_adv

        attack.perturb = timed
    return seconds, broken


def compare_logits(model, net, x_nhwc, y_int) -> dict:
    """The Keras MLP's logits against its torch copy's on the attacked images."""
    import torch

    x, _ = reference.to_torch(x_nhwc, y_int)
    with torch.no_grad():
        torch_logits = net(x).numpy()
    keras_logits = model(x_nhwc, training=False).numpy()
    diff = float(abs(torch_logits - keras_logits).max())
    # Only a near-tie of two logits could flip a prediction with logits this close.
    disagree = int((torch_logits.argmax(1) != keras_logits.argmax(1)).sum())
    print(f"max |logits_torch - logits_keras| = {diff:.2e}, {disagree} predictions differ")
    assert diff < 1e-4, f"the torch copy does not compute the Keras MLP: logits differ by {diff}"
    return {"logits_max_abs_diff": diff, "predictions_differing": disagree}


def run_torch(net, x_nhwc, y_int, eps: float) -> dict:
    """PGD-K-R and AutoAttack standard in PyTorch on the Keras model's copy."""
    import torch
    from pyautoattack import AutoAttack

    x, y = reference.to_torch(x_nhwc, y_int)
    batches = range(0, len(x), EVALUATE_BATCH_SIZE)
    generator = torch.Generator().manual_seed(0)
    with load_average() as pgd_load:
        start = time.perf_counter()
        x_pgd = torch.cat(
            [
                reference.pgd(
                    net,
                    x[i : i + EVALUATE_BATCH_SIZE],
                    y[i : i + EVALUATE_BATCH_SIZE],
                    eps,
                    _STEPS.value,
                    _RESTARTS.value,
                    generator,
                    _NORM.value,
                )
                for i in batches
            ]
        )
        pgd_seconds = time.perf_counter() - start
    reference.check_in_ball(x_pgd, x, eps, "PyTorch PGD", _NORM.value)
    print(f"PyTorch PGD: {pgd_seconds:.1f} s", flush=True)

    from fbat_tf.records import units

    norm = units.REFERENCE_NAMES[_NORM.value]
    adversary = AutoAttack(net, eps=eps, norm=norm, version="standard", seed=0, device="cpu")
    seconds, broken = time_parts(adversary, net)
    with load_average() as aa_load:
        start = time.perf_counter()
        x_aa, _ = adversary.run_standard_evaluation(x, y, batch_size=EVALUATE_BATCH_SIZE)
        aa_seconds = time.perf_counter() - start
    reference.check_in_ball(x_aa, x, eps, "pyautoattack", _NORM.value)
    print(f"pyautoattack: {aa_seconds:.1f} s", flush=True)

    clean = reference.accuracy(net, x, y)
    after, robust = {"clean": clean}, round(clean * len(x))
    for name in AUTOATTACK_PARTS:
        robust -= broken[name]
        after[name] = robust / len(x)
    return {
        "clean_accuracy": clean,
        "pgd_time_s": pgd_seconds,
        "pgd_robust_accuracy": reference.robust_accuracy(net, x, x_pgd, y),
        "pgd_load_average_1min": pgd_load,
        "autoattack_time_s": aa_seconds,
        "autoattack_robust_accuracy": reference.robust_accuracy(net, x, x_aa, y),
        "autoattack_seconds": seconds,
        "autoattack_per_attack": after,
        "autoattack_load_average_1min": aa_load,
        "threads": torch.get_num_threads(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "unset"),
    }


def run_fbat_tf(model_path: str, user_env: dict[str, str]) -> dict:
    """One evaluate.py run in a child process, as the report's fbat-tf side."""
    env = dict(user_env, TF_CPP_MIN_LOG_LEVEL="2")
    wall, load, evaluated = run_evaluate(evaluate_arguments(model_path), env)
    if evaluated.examples != _N.value:
        sys.exit(f"error: evaluate.py attacked {evaluated.examples} examples, not {_N.value}")
    pgd, aa = (evaluated.attacked(name, _EPS.value, _NORM.value) for name in ("pgd", "autoattack"))
    print(f"fbat-tf (evaluate.py): {wall:.1f} s wall", flush=True)
    return {
        "wall_time_s": wall,
        "clean_accuracy": evaluated.clean_accuracy,
        "pgd_time_s": pgd.seconds,
        "pgd_robust_accuracy": pgd.robust_accuracy,
        "autoattack_time_s": aa.seconds,
        "autoattack_robust_accuracy": aa.robust_accuracy,
        "autoattack_seconds": aa.part_seconds,
        "autoattack_per_attack": aa.parts,
        "load_average_1min": load,
        "device": evaluated.device,
    }


def median_side(rounds: list[dict], side: str) -> dict:
    """One side's report: every number the median over the rounds, its parts' times too."""
    import statistics

    merged = median_of([r[side] for r in rounds])
    merged["autoattack_seconds"] = {
        part: statistics.median(r[side]["autoattack_seconds"].get(part, 0.0) for r in rounds)
        for part in AUTOATTACK_PARTS
    }
    return merged


def torch_child(scratch: str) -> None:
    """The PyTorch side, in a process of its own: the saved model and points, both attacks."""
    import keras
    import numpy as np
    import pyautoattack
    import torch

    model = keras.models.load_model(os.path.join(scratch, "mlp.keras"), safe_mode=True)
    points = np.load(os.path.join(scratch, "points.npz"))
    x, y = points["x"], points["y"]
    torch.set_num_threads(_THREADS.value or os.cpu_count())
    net = reference.mlp(model)
    result = dict(compare_logits(model, net, x, y), **run_torch(net, x, y, pixels()))
    result["versions"] = {"torch": torch.__version__, "pyautoattack": pyautoattack.__version__}
    report(result)


def run_torch_child(scratch: str) -> dict:
    """`torch_child` in a child process, with the OpenMP wait policy asked for."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    if _OMP_WAIT.value != "environment":
        # Read when PyTorch's OpenMP runtime loads: set before the child imports torch.
        env["OMP_WAIT_POLICY"] = _OMP_WAIT.value.upper()
    passed = [a for a in sys.argv[1:] if not a.startswith(("--json", "--rounds"))]
    command = [sys.executable, os.path.abspath(__file__), f"--torch_child={scratch}", *passed]
    return run_child(command, "the PyTorch side", env, echo=True)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if _TORCH_CHILD.value:
        torch_child(_TORCH_CHILD.value)
        return
    load = os.getloadavg()[0]
    if load > os.cpu_count():
        print(f"warning: 1-min load average {load:.1f} on {os.cpu_count()} cores skews timings")
    import numpy as np

    from fbat_tf import data

    model = mlp(pixels(), _EPOCHS.value, _NORM.value)
    x, y = next(
        iter(data.load("fashion_mnist", "test", batch_size=_N.value, max_examples=_N.value))
    )
    x, y = x.numpy(), y.numpy()

    with tempfile.TemporaryDirectory() as scratch:
        model_path = os.path.join(scratch, "mlp.keras")
        model.save(model_path)
        np.savez(os.path.join(scratch, "points.npz"), x=x, y=y)
        sides = in_turns(
            {
                "fbat_tf": lambda: run_fbat_tf(model_path, dict(os.environ)),
                "torch": lambda: run_torch_child(scratch),
            },
            _ROUNDS.value,
        )
    rounds = [dict(zip(sides, pair, strict=True)) for pair in zip(*sides.values(), strict=True)]
    versions = rounds[0]["torch"]["versions"]
    for r in rounds:
        del r["torch"]["versions"]
    fbat, torch_side = median_side(rounds, "fbat_tf"), median_side(rounds, "torch")
    ratios = {
        attack: fbat[f"{attack}_time_s"] / torch_side[f"{attack}_time_s"] for attack in TARGETS
    }
    report = {
        "model": "MLP 784-256-128-10 ReLU",
        "train": f"PGD-3 AT ({_NORM.value}), {_EPOCHS.value} epochs, first 10,000 Fashion-MNIST "
        "training images",
        "examples": _N.value,
        "eps": _EPS.value,
        "norm": _NORM.value,
        "eps_units": "1/255" if _NORM.value == "linf" else "[0, 1] pixels, L2 norm over the image",
        "robust_accuracy_difference": {
            attack: fbat[f"{attack}_robust_accuracy"] - torch_side[f"{attack}_robust_accuracy"]
            for attack in TARGETS
        },
        "pgd_steps": _STEPS.value,
        "pgd_restarts": _RESTARTS.value,
        "batch_size": EVALUATE_BATCH_SIZE,
        "keras_clean_accuracy": float(np.mean(np.argmax(model(x).numpy(), -1) == y)),
        "rounds": len(rounds),
        "fbat_tf": fbat,
        "torch": torch_side,
        "ratio_fbat_tf_over_torch": ratios,
        "ratio_per_round": {
            attack: [
                r["fbat_tf"][f"{attack}_time_s"] / r["torch"][f"{attack}_time_s"] for r in rounds
            ]
            for attack in TARGETS
        },
        "per_round": rounds,
        "targets": TARGETS,
        "targets_met": {attack: ratios[attack] <= TARGETS[attack] for attack in TARGETS},
        "machine": machine(),
        "versions": versions,
        "evaluate_command": "python evaluate.py "
        + " ".join(evaluate_arguments("<tmp>/mlp.keras"))
        + " --results=<tmp>/eval.json",
        "command": command_line(),
    }
    publish(markdown_table(report), report, _JSON.value)


def pixels() -> float:
    """--eps in pixel units."""
    return _EPS.value / 255 if _NORM.value == "linf" else _EPS.value


def budget(report: dict) -> str:
    """The report's ε as a person reads it: "24/255" or "1.5 (L2)"; reports written before
    the norm was recorded are L∞, with their ε under "eps_255"."""
    if report.get("norm", "linf") == "l2":
        return f"{report['eps']:g} (L2)"
    return f"{report.get('eps', report.get('eps_255')):g}/255"


def markdown_table(report: dict) -> str:
    fbat, torch_side = report["fbat_tf"], report["torch"]
    pgd = f"PGD-{report['pgd_steps']}-{report['pgd_restarts']}"
    load = fbat["load_average_1min"]
    heading = (
        f"{report['model']} ({report['train']}; clean {100 * fbat['clean_accuracy']:.1f}%), "
        f"first {report['examples']} Fashion-MNIST test images, ε = {budget(report)}, "
        f"batches of {report['batch_size']}, {describe(report['machine'], torch=True)}, "
        f"pyautoattack {report['versions']['pyautoattack']}; times are medians of "
        f"{report['rounds']} round(s) run in turns. "
        f"`{report['evaluate_command']}`: "
        f"{fbat['wall_time_s']:.1f} s wall (1-min load average {load['before']:.1f} → "
        f"{load['after']:.1f}); logits of the torch copy within "
        f"{torch_side['logits_max_abs_diff']:.1e} of Keras'."
    )
    attacks = [
        [
            name,
            f"{fbat[f'{attack}_time_s']:.1f}",
            f"{torch_side[f'{attack}_time_s']:.1f}",
            f"{report['ratio_fbat_tf_over_torch'][attack]:.2f}",
            f"≤ {report['targets'][attack]:g}×",
            "yes" if report["targets_met"][attack] else "**no**",
            f"{100 * fbat[f'{attack}_robust_accuracy']:.1f}%",
            f"{100 * torch_side[f'{attack}_robust_accuracy']:.1f}%",
            ", ".join(f"{r:.2f}" for r in report["ratio_per_round"][attack]),
        ]
        for attack, name in (("pgd", pgd), ("autoattack", "AutoAttack standard"))
    ]
    parts = [
        [
            part,
            f"{fbat['autoattack_seconds'].get(part, 0.0):.1f}",
            f"{torch_side['autoattack_seconds'][part]:.1f}",
            f"{100 * fbat['autoattack_per_attack'][part]:.1f}%",
            f"{100 * torch_side['autoattack_per_attack'][part]:.1f}%",
        ]
        for part in AUTOATTACK_PARTS
    ]
    times = ["fbat-tf time (s)", "PyTorch time (s)"]
    columns = ["attack", *times, "fbat-tf / PyTorch", "target", "met", "fbat-tf robust acc."]
    columns += ["PyTorch robust acc.", "ratio per round"]
    after = ["fbat-tf robust acc. after", "PyTorch robust acc. after"]
    return (
        table(heading, columns, attacks)
        + "\n\n"
        + table(None, ["AutoAttack part", *times, *after], parts)
    )


if __name__ == "__main__":
    app.run(main)
