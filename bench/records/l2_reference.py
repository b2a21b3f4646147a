"""The L2 threat model against the reference: fbat-tf's AutoAttack (standard) and PGD-50-10 under
L2 beside pyautoattack's AutoAttack (norm='L2', version 'standard') and a plain PyTorch PGD-50-10
L2 loop, on the same trained model and points; the reference's per-point outcomes are kept for
tests/test_l2_reference.py, which attacks the committed model again with evaluate.py in CI.

    python bench/records/l2_reference.py --out=tests/data/l2_reference --overwrite
    python bench/records/l2_reference.py --keep_model --overwrite   # the committed model again

The model: a 784-64-10 ReLU MLP (fmnist_mlp.py, `hidden=(64,)`) after `--train_epochs` epochs
of L2 PGD-3 AT at ε = `--eps` (pixel units, the L2 norm over the image) on the first 10,000
Fashion-MNIST training images, saved as `<out>/mlp.keras` (about 200 kB). The points: the first
`--n_examples` Fashion-MNIST test images. fbat-tf's side is evaluate.py as a user types it
(`--norm=l2`); the PyTorch side runs in a child process on a torch copy of the weights
(torch_reference.mlp, its logits checked against Keras'), PGD by torch_reference.pgd
(norm="l2"), AutoAttack by pyautoattack. Writes `<out>/reference.json` (the reference's
accuracies and per-point outcomes, "1" robust (right clean and attacked), "0" not, one
character a point in file order;
fbat-tf's beside them; versions and the command) and prints a Markdown table. Needs the `bench`
extra (torch, pyautoattack).
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")  # as evaluate.py sets it

from absl import app, flags  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/

import torch_reference as reference  # noqa: E402
from fmnist_mlp import mlp  # noqa: E402
from harness import (  # noqa: E402
    command_line,
    describe,
    machine,
    publish,
    report,
    run_child,
    run_evaluate,
    table,
)

BATCH_SIZE = 128
HIDDEN = (64,)

_N = flags.DEFINE_integer("n_examples", 1000, "Test images attacked.", lower_bound=1)
_EPS = flags.DEFINE_float("eps", 1.5, "L2 ε in [0, 1]-pixel units, of training and attacks.")
_EPOCHS = flags.DEFINE_integer("train_epochs", 4, "L2 PGD-3 AT epochs.", lower_bound=0)
_OUT = flags.DEFINE_string("out", "tests/data/l2_reference", "Where mlp.keras and JSON go.")
_OVERWRITE = flags.DEFINE_bool(
    "overwrite", False, "Replace the model and record --out holds (else refused)."
)
_KEEP_MODEL = flags.DEFINE_bool(
    "keep_model",
    False,
    "Attack the mlp.keras --out holds again (both sides, with today's code) instead of training "
    "a new one; with --overwrite, only reference.json is replaced.",
)
_CHILD = flags.DEFINE_bool("torch_child", False, "Internal: run the PyTorch side on --out.")


def bits(robust) -> str:
    return "".join("1" if r else "0" for r in robust)


def torch_side(out: str) -> dict:
    """PGD-50-10 L2 and AutoAttack standard L2 in PyTorch on the saved model and points."""
    import keras
    import numpy as np
    import pyautoattack
    import torch
    from pyautoattack import AutoAttack

    model = keras.models.load_model(os.path.join(out, "mlp.keras"), safe_mode=True)
    x_nhwc, y_int = (v.numpy() for v in next(iter(points())))
    net = reference.mlp(model)
    x, y = reference.to_torch(x_nhwc, y_int)
    with torch.no_grad():
        diff = float(np.abs(net(x).numpy() - model(x_nhwc, training=False).numpy()).max())
    assert diff < 1e-4, f"the torch copy does not compute the Keras MLP: logits differ by {diff}"
    eps = _EPS.value
    generator = torch.Generator().manual_seed(0)
    x_pgd = torch.cat(
        [
            reference.pgd(
                net, x[i : i + BATCH_SIZE], y[i : i + BATCH_SIZE], eps, 50, 10, generator, "l2"
            )
            for i in range(0, len(x), BATCH_SIZE)
        ]
    )
    reference.check_in_ball(x_pgd, x, eps, "PyTorch PGD", "l2")
    adversary = AutoAttack(net, eps=eps, norm="L2", version="standard", seed=0, device="cpu")
    x_aa, _ = adversary.run_standard_evaluation(x, y, batch_size=BATCH_SIZE)
    reference.check_in_ball(x_aa, x, eps, "pyautoattack", "l2")
    with torch.no_grad():
        # Robust: right clean and at the attack's point (a point wrong clean is not robust).
        clean = net(x).argmax(1) == y
        outcomes = {
            "clean": bits(clean),
            "pgd": bits(clean & (net(x_pgd).argmax(1) == y)),
            "autoattack": bits(clean & (net(x_aa).argmax(1) == y)),
        }
    return {
        "logits_max_abs_diff": diff,
        "accuracy": {k: v.count("1") / len(v) for k, v in outcomes.items()},
        "outcomes": outcomes,
        "versions": {"torch": torch.__version__, "pyautoattack": pyautoattack.__version__},
    }


def points():
    from fbat_tf import data

    return data.load("fashion_mnist", "test", batch_size=_N.value, max_examples=_N.value)


def evaluate_arguments(model_path: str) -> list[str]:
    """evaluate.py's flags, as tests/test_l2_reference.py types them too."""
    return [
        f"--model_path={model_path}",
        "--dataset=fashion_mnist",
        "--attacks=pgd,autoattack",
        "--norm=l2",
        f"--eps={_EPS.value:g}",
        f"--n_examples={_N.value}",
        f"--batch_size={BATCH_SIZE}",
    ]


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    out = os.path.abspath(_OUT.value)
    if _CHILD.value:
        report(torch_side(out))
        return
    model_path = os.path.join(out, "mlp.keras")
    replaced = ("reference.json",) if _KEEP_MODEL.value else ("mlp.keras", "reference.json")
    held = [n for n in replaced if os.path.exists(os.path.join(out, n))]
    if held and not _OVERWRITE.value:
        sys.exit(f"error: {out} holds {', '.join(held)}; pass --overwrite to replace them")
    if _KEEP_MODEL.value:
        if not os.path.isfile(model_path):
            sys.exit(f"error: --keep_model: {model_path} does not exist")
    else:
        import tempfile

        from fbat_tf.records import files

        os.makedirs(out, exist_ok=True)
        # Keras saves by name: into a folder of its own, then renamed into place, never
        # through a link at mlp.keras.
        files.refuse_links(model_path)
        staging = tempfile.mkdtemp(dir=out, prefix=".mlp-")
        try:
            staged = os.path.join(staging, "mlp.keras")
            mlp(_EPS.value, _EPOCHS.value, "l2", HIDDEN).save(staged)
            files.refuse_links(model_path)
            os.replace(staged, model_path)
        finally:
            files.remove_tree(staging)
    torch = run_child(
        [sys.executable, os.path.abspath(__file__), "--torch_child", *sys.argv[1:]],
        "the PyTorch side",
        dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
    )
    wall, _, evaluated = run_evaluate(
        evaluate_arguments(model_path), dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    )
    fbat = {
        "clean": evaluated.outcomes["clean"],
        "pgd": evaluated.outcomes[f"pgd@l2:{_EPS.value:g}"],
        "autoattack": evaluated.outcomes[f"autoattack@l2:{_EPS.value:g}"],
    }
    payload = {
        "model": f"MLP 784-{'-'.join(map(str, HIDDEN))}-10 ReLU",
        "train": f"L2 PGD-3 AT at ε = {_EPS.value:g}, {_EPOCHS.value} epochs, first 10,000 "
        "Fashion-MNIST training images",
        "norm": "l2",
        "eps": _EPS.value,
        "eps_units": "[0, 1] pixels, L2 norm over the image",
        "examples": _N.value,
        "reference": torch,
        "fbat_tf": {
            "accuracy": {k: v.count("1") / len(v) for k, v in fbat.items()},
            "outcomes": fbat,
            "wall_time_s": wall,
            "time_s": {r.attack: r.seconds for r in evaluated.robust},
        },
        "evaluate_command": "python evaluate.py "
        + " ".join(evaluate_arguments(os.path.relpath(model_path))),
        "machine": machine(),
        "command": command_line(),
    }
    rows = [
        [
            name,
            f"{100 * payload['fbat_tf']['accuracy'][key]:.1f}%",
            f"{100 * torch['accuracy'][key]:.1f}%",
            f"{100 * (payload['fbat_tf']['accuracy'][key] - torch['accuracy'][key]):+.1f}",
            f"{sum(a == b for a, b in zip(fbat[key], torch['outcomes'][key], strict=True))}",
        ]
        for key, name in (
            ("clean", "clean"),
            ("pgd", "PGD-50-10 (L2)"),
            ("autoattack", "AutoAttack standard (L2)"),
        )
    ]
    heading = (
        f"{payload['model']} ({payload['train']}), first {_N.value} Fashion-MNIST test images, "
        f"ε = {_EPS.value:g} (L2), {describe(payload['machine'], torch=True)}, pyautoattack "
        f"{torch['versions']['pyautoattack']}; logits of the torch copy within "
        f"{torch['logits_max_abs_diff']:.1e} of Keras'."
    )
    columns = ["", "fbat-tf", "reference", "difference (points)", f"same outcome (of {_N.value})"]
    publish(table(heading, columns, rows), payload, os.path.join(out, "reference.json"))


if __name__ == "__main__":
    app.run(main)
