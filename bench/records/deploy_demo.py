"""BUILD.md's deployment figures, from the demo model: each exported file's size, its classes over
the whole test split beside the SavedModel's, and evaluate.py's re-check of it on the first 256
test images.

    python bench/records/deploy_demo.py   # the committed run, study/results/deploy/fmnist-fastbat
    python bench/records/deploy_demo.py --workdir=runs/fmnist-fastbat   # another run

The committed run is README's first command (`--flagfile=configs/fashion_mnist_demo.flags`, with
--noexport), its record, flags and selected weights kept in study/results/deploy/fmnist-fastbat/ so
that anyone can export and attack it again. The script exports it (`python -m export`, every format)
into a temporary folder, compares each ONNX and LiteRT file with the SavedModel on every test image
(`fbat_tf.artifacts.compare`), and runs `python evaluate.py
--model_path=<file> --n_examples=256` on the SavedModel and each file, as a user types it. Writes
bench/results/deploy_demo.json and .md, and each evaluation's JSON into
bench/results/deploy_demo/.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)  # fbat_tf, run from a checkout without installing it
sys.path.insert(0, os.path.join(ROOT, "bench"))

from harness import publish  # noqa: E402

from fbat_tf.records import EvaluationResult, files  # noqa: E402
from fbat_tf.run import Run  # noqa: E402

DEMO = os.path.join(ROOT, "study", "results", "deploy", "fmnist-fastbat")
OUT = os.path.join(ROOT, "bench", "results")
FILES = ("model.onnx", "model.tflite", "model_int8.tflite")
RECHECK_EXAMPLES = 256


def export(workdir: str, directory: str) -> str:
    """The SavedModel version directory of the run's export, with every file beside it."""
    command = [sys.executable, "-m", "export", f"--workdir={workdir}"]
    command += [f"--export_dir={directory}", "--export_formats=saved_model,onnx,litert"]
    subprocess.run(command, cwd=ROOT, check=True)
    (name,) = os.listdir(directory)
    (version,) = os.listdir(os.path.join(directory, name))
    return os.path.join(directory, name, version)


def whole_split(version: str) -> dict[str, dict]:
    """Per file: its agreement with the SavedModel over the test split and both accuracies."""
    from fbat_tf import startup

    startup.load_tensorflow()
    from fbat_tf import artifacts, data
    from fbat_tf.classifiers import SavedModelClassifier

    source = SavedModelClassifier(version)
    test = data.load("fashion_mnist", "test", batch_size=1000)
    found = {}
    for name in FILES:
        target = artifacts.load_artifact(os.path.join(version, name))
        agree, source_right, target_right = artifacts.compare(source, target, test)
        found[name] = {
            "examples": int(agree.size),
            "disagreeing": int((~agree).sum()),
            "agreement": float(agree.mean()),
            "source_clean_accuracy": float(source_right.mean()),
            "clean_accuracy": float(target_right.mean()),
        }
    return found


def recheck(path: str, results: str, kept: str) -> dict:
    """evaluate.py's accuracies for the model at `path` on the first 256 test images (its JSON
    written at `results`, to be kept at `kept`)."""
    command = [sys.executable, "evaluate.py", f"--model_path={path}"]
    command += [f"--n_examples={RECHECK_EXAMPLES}", f"--results={results}"]
    subprocess.run(command, cwd=ROOT, check=True)
    found = EvaluationResult.load(results)
    return {
        "results": os.path.relpath(kept, ROOT),
        "examples": found.examples,
        "clean_accuracy": found.clean_accuracy,
        "robust_accuracy": {r.key: r.robust_accuracy for r in found.robust},
    }


def weights(workdir: str) -> dict[str, str]:
    """The selected weights the export was made from, and their SHA-256: the figures belong to
    that file, and to no other put in its place."""
    path = Run(workdir).best_weights  # what `python -m export --workdir` exports
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    return {"path": os.path.relpath(os.path.abspath(path), ROOT), "sha256": digest}


def sizes(version: str) -> dict[str, int]:
    return {
        name: os.path.getsize(os.path.join(version, name)) for name in (*FILES, "saved_model.pb")
    }


def _cell(row: dict | None, accuracy: float) -> str:
    """An accuracy, with the file's agreement with its source in parentheses where it has one."""
    text = f"{100 * accuracy:.2f}%"
    if row is not None and row.get("agreement") is not None:
        text += f" ({100 * row['agreement']:.2f}%)"
    return text


def table(payload: dict) -> str:
    """BUILD.md's re-check table: per model, clean accuracy and each attack's, and for a file its
    agreement with the SavedModel on the same points (replayed attacks), from the evaluations'
    JSONs."""
    lines = [
        "| file | clean (agreement) | PGD-50-10 replayed (agreement) | "
        "AutoAttack replayed (agreement) | Square-5000 on the file |",
        "|---|---|---|---|---|",
    ]
    for name in ("SavedModel", *FILES):
        found = EvaluationResult.load(os.path.join(ROOT, payload["recheck"][name]["results"]))
        # A file's re-check row (export/recheck.py): per attack, its agreement with the source.
        rows = found.extra.get("deployment", {}).get("accuracy", {})
        cells = [_cell(rows.get("clean"), found.clean_accuracy)]
        for attack in ("pgd", "autoattack"):
            attacked = found.attacked(attack, 8)
            cells.append(_cell(rows.get(attacked.key), attacked.robust_accuracy))
        square = found.get("square", 8)
        cells.append("" if square is None else _cell(None, square.robust_accuracy))
        label = "SavedModel (source)" if name == "SavedModel" else name
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", default=DEMO, help="the run to export and check")
    parser.add_argument(
        "--markdown_only",
        action="store_true",
        help="rewrite deploy_demo.md from deploy_demo.json and the evaluations' JSONs alone",
    )
    args = parser.parse_args()
    if args.markdown_only:
        with open(os.path.join(OUT, "deploy_demo.json")) as f:
            payload = json.load(f)
        files.write_atomic(os.path.join(OUT, "deploy_demo.md"), table(payload) + "\n", OUT)
        return
    evaluations = os.path.join(OUT, "deploy_demo")
    directory = tempfile.mkdtemp(prefix="deploy_demo_")
    # evaluate.py never overwrites a result: each writes into the temporary folder, and the
    # run's evaluations replace the committed ones once every one of them is in.
    written = os.path.join(directory, "evaluations")
    os.makedirs(written)
    try:
        version = export(args.workdir, os.path.join(directory, "export"))
        payload = {"workdir": os.path.relpath(os.path.abspath(args.workdir), ROOT)}
        payload["weights"] = weights(args.workdir)
        payload["bytes"] = sizes(version)
        payload["whole_split"] = whole_split(version)
        (source,) = {v["source_clean_accuracy"] for v in payload["whole_split"].values()}
        payload["source_clean_accuracy"] = source
        payload["recheck"] = {}
        for name, path in (
            ("SavedModel", version),
            *((n, os.path.join(version, n)) for n in FILES),
        ):
            results, kept = (os.path.join(d, f"{name}.json") for d in (written, evaluations))
            payload["recheck"][name] = recheck(path, results, kept)
        files.make_dirs(evaluations, inside=OUT)  # never a link's folder
        for name in os.listdir(written):  # each written whole, never through a link
            with open(os.path.join(written, name), "rb") as f:
                files.write_atomic(os.path.join(evaluations, name), f.read(), OUT)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    publish(
        table(payload),
        payload,
        os.path.join(OUT, "deploy_demo.json"),
        markdown_path=os.path.join(OUT, "deploy_demo.md"),
    )


if __name__ == "__main__":
    main()
