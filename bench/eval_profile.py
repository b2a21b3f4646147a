"""Where evaluation time goes, attack by attack and by kind of operation, in fbat-tf and in
PyTorch, on eval_vs_torch.py's MLP and points.

    python bench/eval_profile.py --json=bench/results/eval_profile.json
    python bench/eval_profile.py --n_examples=64 --train_epochs=0 --pgd_steps=5   # a smoke run

Each attack runs on its own over the same points in calls of 128 (the evaluation batch):
PGD-K-R on every example (as evaluate.py gives it each batch), and each part of AutoAttack
standard on the clean-correct examples (inside AutoAttack a part gets the survivors of the parts
before it; here each part gets the same examples, so that the two sides' parts compare
alike). fbat-tf runs its attacks on the inference graph evaluate.py attacks (--fold_weights);
PyTorch runs torch_reference.pgd and pyautoattack's own attack objects, configured as its
AutoAttack "standard" configures them, on the copied MLP. Per attack and side: the first call's
wall time (fbat-tf traces its graphs there, and compiles FAB-T and Square with XLA, its
default) and the next call's; then a short run of the same attack (SHORT: PGD-5-1, APGD and FAB
with 10 iterations and one target, Square with 500 queries, on the first 128 examples) under the
framework's profiler, each kind of operation's share of its wall time (bench/profiles.py); the
profiler sees an XLA program as one launch, so FAB-T's and Square's short runs are profiled
without XLA, showing the work XLA fuses. A profiler keeps every kernel launch in memory, too
many for a whole AutoAttack part. "outside kernels" is the share the kernels do not
account for (Python, dispatch, the graph executor; negative where kernels ran in parallel).
Each side runs in a process of its own (`--rounds=R`: R times in turns, medians). Needs the
`bench` extra.
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
    machine,
    median_of,
    publish,
    report,
    run_child,
    table,
)

BATCH = 128  # evaluate.py's default batch, and eval_vs_torch.py's
ATTACKS = ("pgd", "apgd-ce", "apgd-t", "fab-t", "square")
# The profiled runs' lengths: PGD steps (one restart), APGD and FAB iterations (one target),
# Square queries.
SHORT = {"pgd_steps": 5, "iterations": 10, "queries": 500}

_N = flags.DEFINE_integer("n_examples", 500, "Test images attacked.", lower_bound=1)
_EPS = flags.DEFINE_float("eps", 24.0, "ε in 1/255 units, of the training and the attacks.")
_EPOCHS = flags.DEFINE_integer("train_epochs", 4, "PGD-3 AT epochs of the MLP.", lower_bound=0)
_STEPS = flags.DEFINE_integer("pgd_steps", 50, "PGD steps K, both sides.", lower_bound=1)
_RESTARTS = flags.DEFINE_integer("pgd_restarts", 10, "PGD restarts R, both sides.", lower_bound=1)
_ROUNDS = define_rounds("Times each side runs, in turns; every number is the median.")
_JSON = flags.DEFINE_string("json", None, "Write the results here.")
_CHILD = flags.DEFINE_enum(
    "child", None, ["fbat_tf", "torch"], "Internal: run one side on the points in --scratch."
)
_SCRATCH = flags.DEFINE_string("scratch", None, "Internal: the saved model and points.")


def measure(call, short, profile) -> dict:
    """The first call's and the next call's wall time, and `short` (run once untimed) under
    `profile`: each kind's share of its wall time."""
    start = time.perf_counter()
    call()
    first = time.perf_counter() - start
    start = time.perf_counter()
    call()
    again = time.perf_counter() - start
    short()
    profiled = profile(short, 1)
    wall = profiled["wall_s"]
    return {
        "first_call_s": first,
        "call_s": again,
        "kind_shares": {kind: s / wall for kind, s in profiled["kinds"].items()},
        "outside_kernels_share": 1 - sum(profiled["kinds"].values()) / wall,
        "profiled_wall_s": wall,
        "top_ops_s": dict(list(profiled["ops"].items())[:8]),
    }


def batches(x, y, size: int = BATCH):
    return [(x[i : i + size], y[i : i + size]) for i in range(0, len(x), size)]


def fbat_tf_side(x, y, model_path: str) -> dict:
    import keras
    import tensorflow as tf
    from profiles import tf_profile

    from fbat_tf import classifiers
    from fbat_tf.attacks.apgd import APGD
    from fbat_tf.attacks.autoattack import AutoAttack
    from fbat_tf.attacks.fab import FAB
    from fbat_tf.attacks.pgd import PGD
    from fbat_tf.attacks.square import Square

    eps = _EPS.value / 255
    model = classifiers.InferenceGraph(keras.models.load_model(model_path, safe_mode=True))
    x, y = tf.constant(x), tf.constant(y, tf.int32)
    standard = AutoAttack(eps).attacks
    short = {  # the profiled runs: the same attacks, shorter (SHORT in the module docstring)
        "pgd": PGD(eps, SHORT["pgd_steps"], 1),
        "apgd-ce": APGD(eps, "ce", steps=SHORT["iterations"]),
        "apgd-t": APGD(eps, "dlr_targeted", steps=SHORT["iterations"], n_target_classes=1),
        # Without XLA: the profiler sees a compiled program as one launch, not its kernels.
        "fab-t": FAB(eps, n_target_classes=1, steps=SHORT["iterations"], jit_compile=False),
        "square": Square(eps, n_queries=SHORT["queries"], jit_compile=False),
    }

    def on_batches(attack, x, y):
        return lambda: [
            attack(model, xb, yb, [0, b])[0].numpy() for b, (xb, yb) in enumerate(batches(x, y))
        ]

    def part(attack, x, y):
        # A part alone as AutoAttack runs it: the clean-correct examples, 128 per call.
        alone = AutoAttack(eps, "custom", {"part": attack}).in_slices(BATCH)
        return lambda: alone(model, x, y, [0, 0])[0].numpy()

    pgd = PGD(eps, _STEPS.value, _RESTARTS.value)
    calls = {"pgd": (on_batches(pgd, x, y), on_batches(short["pgd"], x[:BATCH], y[:BATCH]))}
    for name in ATTACKS[1:]:
        calls[name] = (part(standard[name], x, y), part(short[name], x[:BATCH], y[:BATCH]))
    return {name: measure(*pair, tf_profile) for name, pair in calls.items()}


def torch_side(x, y, model_path: str) -> dict:
    import keras
    import torch
    from profiles import torch_profile
    from pyautoattack import AutoAttack

    eps = _EPS.value / 255
    net = reference.mlp(keras.models.load_model(model_path, safe_mode=True))
    x, y = reference.to_torch(x, y)
    torch.set_num_threads(os.cpu_count())
    generator = torch.Generator().manual_seed(0)

    def run_pgd():
        for xb, yb in batches(x, y):
            reference.pgd(net, xb, yb, eps, _STEPS.value, _RESTARTS.value, generator)

    def configured(short: bool):
        adversary = AutoAttack(net, eps=eps, norm="Linf", version="standard", seed=0, device="cpu")
        adversary.apgd.loss = "ce"
        adversary.fab.targeted = True
        if short:  # SHORT in the module docstring
            for attack in (adversary.apgd, adversary.apgd_targeted, adversary.fab):
                attack.n_iter = SHORT["iterations"]
            adversary.apgd_targeted.n_target_classes = adversary.fab.n_target_classes = 1
            adversary.square.n_queries = SHORT["queries"]
        return {
            "apgd-ce": adversary.apgd,
            "apgd-t": adversary.apgd_targeted,
            "fab-t": adversary.fab,
            "square": adversary.square,
        }

    with torch.no_grad():
        clean = net(x).argmax(1) == y
    x_clean, y_clean = x[clean], y[clean]

    def part(attack, x, y):
        return lambda: [attack.perturb(xb, yb) for xb, yb in batches(x, y)]

    def short_pgd():
        reference.pgd(net, x[:BATCH], y[:BATCH], eps, SHORT["pgd_steps"], 1, generator)

    full, short = configured(False), configured(True)
    calls = {"pgd": (run_pgd, short_pgd)}
    for name in ATTACKS[1:]:
        calls[name] = (
            part(full[name], x_clean, y_clean),
            part(short[name], x_clean[:BATCH], y_clean[:BATCH]),
        )
    return {name: measure(*pair, torch_profile) for name, pair in calls.items()}


def child(side: str, scratch: str) -> None:
    import numpy as np

    points = np.load(os.path.join(scratch, "points.npz"))
    run = fbat_tf_side if side == "fbat_tf" else torch_side
    report(run(points["x"], points["y"], os.path.join(scratch, "mlp.keras")))


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if _CHILD.value:
        child(_CHILD.value, _SCRATCH.value)
        return
    import numpy as np

    from fbat_tf import data

    model = mlp(_EPS.value / 255, _EPOCHS.value)
    x, y = next(
        iter(data.load("fashion_mnist", "test", batch_size=_N.value, max_examples=_N.value))
    )
    passed = [a for a in sys.argv[1:] if not a.startswith(("--json", "--rounds"))]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    with tempfile.TemporaryDirectory() as scratch:
        model.save(os.path.join(scratch, "mlp.keras"))
        np.savez(os.path.join(scratch, "points.npz"), x=x.numpy(), y=y.numpy())
        script = [sys.executable, os.path.abspath(__file__), f"--scratch={scratch}", *passed]
        sides = in_turns(
            {
                side: lambda side=side: run_child([*script, f"--child={side}"], side, env)
                for side in ("fbat_tf", "torch")
            },
            _ROUNDS.value,
        )
    results = {
        side: {name: median_attack([r[name] for r in runs]) for name in ATTACKS}
        for side, runs in sides.items()
    }
    payload = {
        "model": "MLP 784-256-128-10 ReLU",
        "train": f"PGD-3 AT, {_EPOCHS.value} epochs, first 10,000 Fashion-MNIST training images",
        "examples": _N.value,
        "eps_255": _EPS.value,
        "pgd": f"PGD-{_STEPS.value}-{_RESTARTS.value}",
        "batch_size": BATCH,
        "rounds": _ROUNDS.value,
        "results": results,
        "machine": machine(),
        "command": command_line(),
    }
    publish(markdown_table(payload), payload, _JSON.value)


def median_attack(rounds: list[dict]) -> dict:
    merged = median_of(rounds)
    merged["kind_shares"] = median_of([r["kind_shares"] for r in rounds])
    return merged


def markdown_table(payload: dict) -> str:
    fbat, torch_side = payload["results"]["fbat_tf"], payload["results"]["torch"]
    heading = (
        f"{payload['model']} ({payload['train']}), first {payload['examples']} Fashion-MNIST "
        f"test images, ε = {payload['eps_255']:g}/255, calls of {payload['batch_size']}, "
        f"{describe(payload['machine'], torch=True)}; medians of {payload['rounds']} round(s). "
        "Seconds of the whole attack (first call, next call); the shares of a short run's wall "
        "time (module docstring) by kind, from each framework's profiler."
    )
    label = {"pgd": payload["pgd"]}
    rows = []
    for name in ATTACKS:
        for side, measured in (("fbat-tf", fbat[name]), ("PyTorch", torch_side[name])):
            rows.append(
                [
                    label.get(name, name),
                    side,
                    f"{measured['first_call_s']:.2f}",
                    f"{measured['call_s']:.2f}",
                    *(
                        f"{100 * measured['kind_shares'][kind]:.0f}%"
                        for kind in ("dense", "other", "copies and casts")
                    ),
                    f"{100 * measured['outside_kernels_share']:.0f}%",
                    f"{measured['call_s'] / torch_side[name]['call_s']:.2f}",
                ]
            )
    columns = ["attack", "side", "first call", "next call", "dense", "element-wise and other"]
    columns += ["copies and casts", "outside kernels", "next call / PyTorch's"]
    return table(heading, columns, rows)


if __name__ == "__main__":
    app.run(main)
