"""Measure the robustness of a trained model: clean accuracy and robust accuracy under PGD-K-R,
AutoAttack (and its parts) and transfer attacks, at one or several ε.

    python evaluate.py --model_path=runs/fmnist-fastbat --n_examples=1000
    python evaluate.py --model_path=runs/fmnist-fastbat --eps=2,4,8 --attacks=pgd,apgd-ce
    python evaluate.py --model_path=runs/a --attacks=transfer --source_model_path=runs/b
    python evaluate.py --model_path=runs/fmnist-fastbat --strategy=mirrored --batch_size=1024

`--model_path` is a training run directory, a .keras file or an exported SavedModel version
directory. Prints a Markdown table, writes JSON (never over an existing file) and, with several
ε, a robustness-vs-ε plot next to it. Every adversarial batch is checked to lie in C. A model
that gives NaN or infinite logits, on clean inputs (told before any attack, with how many
examples) or on adversarial ones, is refused with a message and nothing is written.
`--strategy` splits each global batch over the replicas of a tf.distribute strategy and sums the
counts (BUILD.md); only the chief of several workers writes.

A .keras file that holds code (a Python lambda, as a Lambda layer's, or a TFSMLayer) is refused
before TensorFlow loads unless `--trust_model_code` says the file is trusted. A SavedModel is a
TensorFlow program: evaluate only SavedModels from sources you trust.

TensorFlow leaves its oneDNN CPU kernels off on x86 CPUs without AVX-512 VNNI or AMX, where they
still make AutoAttack 1.5× faster (bench/README.md); this script turns them on, except for
datasets of 64×64 images and larger where they crashed (fbat_tf/onednn.py), unless
TF_ENABLE_ONEDNN_OPTS says otherwise (it must be set before TensorFlow loads).
"""

from __future__ import annotations

import os
import sys

from absl import app, logging
from absl import flags as absl_flags

from fbat_tf import attacks, onednn, startup, trust
from fbat_tf import run as run_files
from fbat_tf.run import Run
from flags import common, errors, usage
from flags import evaluate as eval_flags

FLAGS = absl_flags.FLAGS


def build_attacks(names, eps_values, jit_compile, source=None):
    """{"<attack>@<ε/255>": (ε, attack)} in the order asked, each with its flags' options."""
    context = {"jit_compile": jit_compile, "source": source}
    return {
        f"{name}@{eps * 255:g}": (
            eps,
            attacks.create(name, eps, context, **eval_flags.attack_options(name)),
        )
        for eps in eps_values
        for name in names
    }


def label(name: str) -> str:
    return attacks.label(name, eval_flags.attack_options(name))


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    model_path = eval_flags.MODEL_PATH.value.rstrip("/")
    # Beside the model: in the run (or SavedModel) directory, or the .keras file's directory.
    home = model_path if os.path.isdir(model_path) else os.path.dirname(model_path) or "."
    results_path = eval_flags.RESULTS.value or Run(home).eval_path(eval_flags.SPLIT.value)
    multi_worker = common.STRATEGY.value == "multi_worker"
    if os.path.exists(results_path) and not multi_worker:  # told before TensorFlow loads
        sys.exit(f"error: {results_path} exists; pass another --results")
    problem = run_files.unwritable(results_path)
    if problem:  # before any attack: a finished evaluation must have somewhere to go
        sys.exit(f"error: --results={results_path}: {problem}")
    for flag in (eval_flags.MODEL_PATH, eval_flags.SOURCE_MODEL_PATH):
        if flag.value and flag.value.endswith(".keras") and os.path.isfile(flag.value):
            try:
                trust.check_keras_file(flag.value, eval_flags.TRUST_MODEL_CODE.value)
            except ValueError as error:
                sys.exit(f"error: --{flag.name}: {error}")
    # The data the model is attacked on decides the oneDNN kernels (fbat_tf/onednn.py).
    named = eval_flags.DATASET.value or (common.DATASET.value if FLAGS["dataset"].present else None)
    run = Run(model_path)
    onednn.choose(named or (run.config().dataset if run.is_run() else None))

    if not FLAGS["verbosity"].present:
        startup.load_tensorflow()
    import tempfile

    import keras

    from fbat_tf import classifiers, data, device, distribute, evaluation, plots, provenance
    from fbat_tf.records import write_json_atomic

    # Created first: a multi-worker strategy must exist before other TensorFlow work.
    strategy = distribute.create_strategy(common.STRATEGY.value)
    if not distribute.is_chief(strategy):
        # Every worker computes the same results; only the chief writes them where asked.
        results_path = os.path.join(tempfile.mkdtemp(prefix="fbat_worker_"), "eval.json")
    elif multi_worker and os.path.exists(results_path):  # the chief, now that it is known
        sys.exit(f"error: {results_path} exists; pass another --results")
    try:
        # Under the strategy's scope each replica gets its own copy of the weights.
        with strategy.scope():
            trusted = eval_flags.TRUST_MODEL_CODE.value
            classifier, known = classifiers.load_model(model_path, trusted)
            source = None
            if eval_flags.SOURCE_MODEL_PATH.value:
                source, _ = classifiers.load_model(eval_flags.SOURCE_MODEL_PATH.value, trusted)
        dataset = eval_flags.DATASET.value or known.get("dataset")
        if FLAGS["dataset"].present:
            # train.py's spelling of --eval_dataset.
            if eval_flags.DATASET.value and eval_flags.DATASET.value != common.DATASET.value:
                raise ValueError(
                    f"--dataset={common.DATASET.value} and --eval_dataset="
                    f"{eval_flags.DATASET.value} disagree; give one of them"
                )
            dataset = common.DATASET.value
        if dataset is None:
            raise ValueError(f"--dataset is needed: {model_path} does not say its dataset")
        data_dir = common.DATA_DIR.value
        data.check_available(dataset, data_dir, common.DOWNLOAD.value)
        # A run that selected on half the test split is tested on the other half.
        validation_from = (
            common.VALIDATION_FROM.value
            if FLAGS["validation_from"].present
            else known.get("validation_from", "train")
        )
        if eval_flags.EPS.value:
            eps_values = [float(v) / 255 for v in eval_flags.EPS.value]
        elif "eps" in known:
            eps_values = [known["eps"]]
        else:
            raise ValueError(f"--eps is needed: {model_path} does not say its training ε")
    except (ValueError, FileNotFoundError) as error:
        sys.exit(f"error: {error}")
    if eval_flags.FOLD_WEIGHTS.value:
        # Folded weights are constants without a device: each replica runs the graph on its own.
        if isinstance(classifier, keras.Model):
            classifier = classifiers.InferenceGraph(classifier)
        if isinstance(source, keras.Model):
            source = classifiers.InferenceGraph(source)

    split = data.load(
        dataset,
        eval_flags.SPLIT.value,
        data_dir=data_dir,
        batch_size=common.BATCH_SIZE.value,
        max_examples=eval_flags.N_EXAMPLES.value or None,
        download=common.DOWNLOAD.value,
        validation_from=validation_from,
    )
    try:
        classifiers.check_logits(classifier, next(iter(split))[0][:64])
        classifiers.check_finite(classifier, split)
    except ValueError as error:
        sys.exit(f"error: {model_path}: {error}")
    batches = int(split.cardinality())
    examples = (
        min(eval_flags.N_EXAMPLES.value or 10**12, batches * common.BATCH_SIZE.value)
        if batches > 0
        else eval_flags.N_EXAMPLES.value or data.info(dataset).test_examples
    )
    say_estimate(classifier, split, eval_flags.ATTACKS.value, len(eps_values), examples)
    # auto: each attack's own choice (XLA on a GPU; FAB-T and Square also on a CPU for a model
    # without convolutions).
    jit = {"auto": None, "true": True, "false": False}[common.JIT_COMPILE.value]
    built = build_attacks(eval_flags.ATTACKS.value, eps_values, jit, source)
    try:
        results = evaluation.evaluate(
            classifier, split, built, progress=True, strategy=strategy, seed=common.SEED.value
        )
    except evaluation.NonFiniteError as error:  # met under attack: nothing is written
        sys.exit(f"\nerror: {model_path}: {error}")
    # Summed over every replica and worker.
    breakdown = results.pop("per_attack")
    seconds = results.pop("per_attack_seconds")
    results.update(
        model_path=model_path,
        dataset=dataset,
        split=eval_flags.SPLIT.value,
        validation_from=validation_from,
        attacks=eval_flags.ATTACKS.value,
        **{name: holder.value for name, holder in eval_flags.OPTION_FLAGS.items()},
        autoattack_per_attack=breakdown,
        autoattack_seconds=seconds,
        seed=common.SEED.value,
        fold_weights=eval_flags.FOLD_WEIGHTS.value,
        strategy=common.STRATEGY.value,
        device=device.describe(),
        machine=provenance.machine(),
        code=provenance.code(),
    )
    from fbat_tf.attacks.autoattack import masking_gap

    for name, per_attack in breakdown.items():
        extra = masking_gap(per_attack)
        if extra is not None and extra > 0:
            logging.warning(
                "%s: Square broke %.2f%% of the examples that the gradient attacks did not; "
                "a sign of gradient masking",
                name,
                100 * extra,
            )
            results.setdefault("gradient_masking_warning", {})[name] = extra
    # The numbers first, so that a failure to write them loses nothing the user sees.
    print(f"\n{dataset} {eval_flags.SPLIT.value}, first {results['examples']} examples\n")
    print(table(results))
    saved = run_files.save_results(results, results_path, write_json_atomic)
    if saved != results_path:
        sys.exit(f"error: could not write {results_path}; the results are in {saved}")
    if len(eps_values) > 1:
        plot_path = os.path.splitext(results_path)[0] + ".png"
        labels = {name: label(name) for name in eval_flags.ATTACKS.value}
        plots.plot_robustness(results, plot_path, labels)
        print(f"plot in {plot_path}")
    print(f"results in {results_path}")


def say_estimate(classifier, split, names: list[str], budgets: int, examples: int) -> None:
    """Before long work, how long it may take: the attacks' forward-backward passes per example
    (the registry's `passes`, every example still robust: an upper bound) × the seconds of one
    pass, measured here on the first batch, × the examples and budgets."""
    from fbat_tf import evaluation

    x, y = next(iter(split))
    per_pass = evaluation.seconds_per_pass(classifier, x, y)
    parts = []
    total = 0.0
    for name in names:
        passes = attacks.passes(name, eval_flags.attack_options(name))
        if passes is None:
            continue
        total += examples * budgets * passes * per_pass
        parts.append(f"{label(name)} {passes:.0f}")
    if total >= 5:
        spent = f"{total:.0f} s" if total < 120 else f"{total / 60:.0f} min"
        print(
            f"estimate: up to {spent} for {examples} examples at {budgets} ε "
            f"(passes per example: {', '.join(parts)}; {1000 * per_pass:.2f} ms a pass per "
            "example, measured here; examples broken early take fewer)",
            flush=True,
        )


def table(results: dict) -> str:
    lines = [
        "| attack | ε (/255) | robust accuracy | time (s) |",
        "|---|---|---|---|",
        f"| clean | 0 | {results['clean_accuracy']:.4f} | |",
    ]
    for key, accuracy in results["robust_accuracy"].items():
        name, eps = key.split("@")
        lines.append(f"| {label(name)} | {eps} | {accuracy:.4f} | {results['time_s'][key]:.1f} |")
        for part, value in results["autoattack_per_attack"].get(key, {}).items():
            if part != "clean":
                spent = results["autoattack_seconds"][key].get(part, 0.0)
                lines.append(f"| &nbsp;&nbsp;after {part} | {eps} | {value:.4f} | {spent:.1f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    usage.own_help(
        __doc__,
        {
            "flags.evaluate": "Evaluation",
            "flags.common": "Data, device and seed",
            "flags.errors": "Errors",
        },
    )
    app.run(errors.guarded(main))
