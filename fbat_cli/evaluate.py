"""Measure the robustness of a trained model: clean accuracy and robust accuracy under PGD-K-R,
AutoAttack (and its parts) and transfer attacks, at one or several ε.

    python evaluate.py --model_path=runs/fmnist-fastbat --n_examples=1000
    python evaluate.py --model_path=runs/fmnist-fastbat --eps=2,4,8 --attacks=pgd,apgd-ce
    python evaluate.py --model_path=runs/a --attacks=transfer --source_model_path=runs/b
    python evaluate.py --model_path=runs/fmnist-fastbat --strategy=mirrored --batch_size=1024
    python evaluate.py --model_path=runs/fmnist-fastbat/export/<name>/1/model.onnx
    python evaluate.py --model_path=$VERSION/model.onnx,$VERSION/model_int8.tflite

`--model_path` is a training run directory, a .keras file, an exported SavedModel version
directory, or an exported .onnx or .tflite file. Such a file is run by its own runtime
(onnxruntime, ai-edge-litert) and checked against its source model (the SavedModel it sits
beside, or --source_model_path): clean accuracy and agreement, the source's PGD and AutoAttack
examples replayed on it, Square run on it (DESIGN.md §5.4); its row goes into the model card.
Several files of one source, comma-separated, are checked in one command that crafts the
source's examples once and replays them on each file; each writes its own results.
Where AutoAttack (standard) ran at the model's training ε, a RobustBench-format entry,
robustbench.json, is written beside the model (one already there over more points is kept,
one over no more points or for another threat model replaced, and said so).
Prints a Markdown table, writes JSON (never over an existing file) and, with several ε, a
robustness-vs-ε plot next to it. Every
adversarial batch is checked to lie in C. A model that gives NaN or infinite logits, on clean
inputs (told before any attack, with how many examples) or on adversarial ones, is refused
with a message and nothing is written.
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
from typing import NamedTuple

from absl import app, logging
from absl import flags as absl_flags

from fbat_tf import attacks, catalog, onednn, startup, trust
from fbat_tf import run as run_files
from fbat_tf.records import ModelCard, units
from fbat_tf.run import Run
from flags import common, errors, usage
from flags import evaluate as eval_flags

FLAGS = absl_flags.FLAGS


def build_attacks(
    names, eps_values, jit_compile, source=None, artifact=False, norm="linf", kept=None
):
    """{(attack, ε): attack} in the order asked, each with its flags' options, in the ball of
    `norm`. For an exported file (`artifact`), the attacks that need its gradients are crafted
    on `source` and replayed (their points kept in `kept` where given, for the next file), and
    the others run without XLA (the file runs outside TensorFlow's graph)."""
    from fbat_tf import evaluation

    options = {name: eval_flags.attack_options(name) for name in names}

    def made(jit):
        return evaluation.registry_attacks(
            names, eps_values, norm=norm, options=options, jit_compile=jit, source=source
        )

    if not artifact:
        return made(jit_compile)
    from export import recheck

    return recheck.replayed(made(jit_compile), made(False), source, kept)


def is_artifact(model_path: str) -> bool:
    """An exported .onnx or .tflite file."""
    return catalog.artifact_format(model_path) is not None


def attack_names(model_path: str) -> list[str]:
    """The attacks asked for; for an exported file by default PGD and AutoAttack replayed from
    its source, and Square on the file itself."""
    if is_artifact(model_path) and not FLAGS["attacks"].present:
        return [*eval_flags.ATTACKS.value, *ARTIFACT_ATTACKS]
    return eval_flags.ATTACKS.value


# What evaluate.py runs on an exported file besides --attacks' default: a score-based attack.
ARTIFACT_ATTACKS = ("square",)


def label(name: str) -> str:
    return attacks.label(name, eval_flags.attack_options(name))


def named_dataset() -> str | None:
    """The dataset the command line names (--eval_dataset, or train.py's spelling --dataset),
    or None; ValueError where the two disagree."""
    if not FLAGS["dataset"].present:
        return eval_flags.DATASET.value
    if eval_flags.DATASET.value and eval_flags.DATASET.value != common.DATASET.value:
        raise ValueError(
            f"--dataset={common.DATASET.value} and --eval_dataset="
            f"{eval_flags.DATASET.value} disagree; give one of them"
        )
    return common.DATASET.value


def checked_model_path(model_path: str) -> tuple[str, object | None]:
    """`model_path` where it is a model, and an exported file as its runtime opened it (else
    None); else exit, before TensorFlow loads, naming the path that would work where there is
    one, or saying why an exported file's runtime cannot run it."""
    is_model = (
        Run(model_path).is_run()
        or os.path.isfile(os.path.join(model_path, "saved_model.pb"))
        or (model_path.endswith(".keras") and os.path.isfile(model_path))
        or (is_artifact(model_path) and os.path.isfile(model_path))
    )
    if not is_model:
        hint = run_files.model_path_suggestion(model_path)
        sys.exit(
            f"error: --model_path={model_path} is neither a training run directory (results.json), "
            "a SavedModel directory (saved_model.pb), an .onnx or .tflite file nor a .keras file"
            + (f"; did you mean {hint}?" if hint else "")
        )
    opened = None
    if is_artifact(model_path):
        from fbat_tf import artifacts

        runtime = catalog.EXPORT_RUNTIMES[catalog.artifact_format(model_path)]
        try:
            artifacts.require(runtime, f"evaluating {os.path.basename(model_path)}")
            # Opened by its runtime, which needs no TensorFlow: a file it cannot read is
            # refused before TensorFlow loads.
            opened = artifacts.load_artifact(model_path)
        except (ImportError, ValueError) as error:
            sys.exit(f"error: {error}")
    checked_card(model_path)
    return model_path, opened


def checked_card(model_path: str) -> None:
    """The model card of a SavedModel, or of the export an exported file sits in, read before
    TensorFlow loads: exit naming it where it is damaged."""
    if not (is_artifact(model_path) or os.path.isfile(os.path.join(model_path, "saved_model.pb"))):
        return
    home = model_path if os.path.isdir(model_path) else os.path.dirname(model_path)
    path = os.path.join(home, run_files.MODEL_CARD)
    if os.path.isfile(path):
        try:
            ModelCard.load(path)
        except ValueError as error:
            sys.exit(f"error: {error}")


def checked_data(model_path: str, opened, named: str | None, source_path: str | None) -> None:
    """Exit, before TensorFlow loads, where the dataset's local files are missing or an exported
    file (`opened`) declares images of another shape than the dataset's, or gives another number
    of class scores than its classes. The dataset: the one
    the command line names, else the model's (its run, its export's card), else its source's;
    one the registry does not know, or data to be fetched through TFDS, are told of later."""
    from fbat_tf import data

    try:  # a damaged record or card names its file
        dataset = (
            named
            or run_files.model_facts(model_path).get("dataset")
            or (source_path and run_files.model_facts(source_path).get("dataset"))
        )
    except ValueError as error:
        sys.exit(f"error: {error}")
    if dataset not in data.names():
        return
    if opened is not None:
        info = data.info(dataset)
        try:
            opened.check_images(info.image_shape, dataset)
            opened.check_classes(info.num_classes, info.image_shape, dataset)
        except ValueError as error:
            sys.exit(f"error: {model_path}: {error}")
    if not data.needs_tensorflow(dataset, common.DATA_DIR.value, common.DOWNLOAD.value):
        try:
            data.check_available(dataset, common.DATA_DIR.value, common.DOWNLOAD.value)
            # The test split is all it reads but where it evaluates a validation split.
            parts = ("test",) if eval_flags.SPLIT.value == "test" else ("train", "test")
            data.check_local_files(dataset, common.DATA_DIR.value, parts)
        except (ValueError, FileNotFoundError) as error:
            sys.exit(f"error: {error}")


def checked_eps_units(model_path: str, source_path: str | None) -> None:
    """Exit, before TensorFlow loads, where --eps looks like pixel units under an L∞ threat
    model: --norm's, else the model's own (its run, its card), else its source's, else L∞. Run
    here rather than by the flag's validator, which cannot know the model's norm."""
    if FLAGS["norm"].value is not None or not eval_flags.EPS.value:
        return  # with --norm given the flag's validator has checked it
    try:
        norm = (
            run_files.model_facts(model_path).get("norm")
            or (source_path and run_files.model_facts(source_path).get("norm"))
            or "linf"
        )
    except ValueError as error:
        sys.exit(f"error: {error}")
    if norm != "linf":
        return
    values = [float(v) for v in eval_flags.EPS.value]
    problem = common.units_problem("eps", values, common.ALLOW_SMALL_UNITS.value)
    if problem:
        sys.exit(f"error: {problem}")


def checked_source_path(model_path: str) -> str | None:
    """The model transfer attacks craft on, and an exported file's source: --source_model_path,
    else for a file the SavedModel it sits beside; exit where a file has neither."""
    given = eval_flags.SOURCE_MODEL_PATH.value
    if given or not is_artifact(model_path):
        return given
    folder = os.path.dirname(os.path.abspath(model_path))
    if os.path.isfile(os.path.join(folder, "saved_model.pb")):
        return folder
    sys.exit(
        f"error: --model_path={model_path}: an exported file is checked against the model it "
        "was exported from, and no SavedModel sits beside it: pass --source_model_path (the "
        "training run or SavedModel it came from)"
    )


def checked_results_path(model_path: str) -> str:
    """Where the results go (beside the model by default), refused before TensorFlow loads
    where a file is there already or the folder cannot be written."""
    # Beside the model: in the run (or SavedModel) directory, or the .keras file's directory.
    home = model_path if os.path.isdir(model_path) else os.path.dirname(model_path) or "."
    name = eval_flags.SPLIT.value
    if is_artifact(model_path):  # one a file: eval-test-model_onnx.json, ...
        name += "-" + os.path.basename(model_path).replace(".", "_")
    results_path = eval_flags.RESULTS.value or Run(home).eval_path(name)
    if os.path.exists(results_path) and common.STRATEGY.value != "multi_worker":
        several = len(eval_flags.MODEL_PATH.value) > 1
        sys.exit(
            f"error: {results_path} exists; "
            + (
                "move it away, or evaluate the file alone with --results"
                if several
                else "pass another --results"
            )
        )
    problem = run_files.unwritable(results_path)
    if problem:  # before any attack: a finished evaluation must have somewhere to go
        sys.exit(f"error: --results={results_path}: {problem}")
    given_source = eval_flags.SOURCE_MODEL_PATH.value
    for flag, path in (("model_path", model_path), ("source_model_path", given_source)):
        if path and path.endswith(".keras") and os.path.isfile(path):
            try:
                trust.check_keras_file(path, eval_flags.TRUST_MODEL_CODE.value)
            except ValueError as error:
                sys.exit(f"error: --{flag}: {error}")
    return results_path


def load_model(model_path: str, strategy, opened=None):
    """The model attacked and what is known of it, each replica with its own copy of the
    weights (folded into constants with --fold_weights). `opened`: the exported file as
    checked_model_path opened it."""
    from fbat_tf import classifiers

    with strategy.scope():
        classifier, known = classifiers.load_model(
            model_path, eval_flags.TRUST_MODEL_CODE.value, opened
        )
    if eval_flags.FOLD_WEIGHTS.value:
        # Folded weights are constants without a device: each replica runs the graph on its own.
        classifier = classifiers.fold_weights(classifier)
    return classifier, known


def load_source(source_path: str | None, strategy):
    """The source model (the transfer attacks', an exported file's) loaded as `load_model`
    loads the model attacked, and what is known of it; None and {} without one."""
    if not source_path:
        return None, {}
    return load_model(source_path, strategy)


def setting(model_path: str, named: str | None, known: dict) -> tuple[str, list[float], str]:
    """The dataset, the budgets (pixel units, under the norm `threat_model` tells) and where
    the run's validation came from: the command line's (the dataset `named`, read once by
    named_dataset), else the model's own; ValueError where neither says."""
    from fbat_tf import data

    dataset = named or known.get("dataset")
    if dataset is None:
        raise ValueError(f"--dataset is needed: {model_path} does not say its dataset")
    data.check_available(dataset, common.DATA_DIR.value, common.DOWNLOAD.value)
    norm = threat_model(known)
    if eval_flags.EPS.value:
        eps_values = [units.to_pixels(float(v), norm) for v in eval_flags.EPS.value]
    elif "eps" in known and known.get("norm", "linf") == norm:
        eps_values = [known["eps"]]
    elif "eps" in known:
        trained = units.shown(known["eps"], known["norm"])
        raise ValueError(
            f"--eps is needed: {model_path} was trained at ε = {trained}, a budget of another "
            f"norm than --norm={norm}'s"
        )
    else:
        raise ValueError(f"--eps is needed: {model_path} does not say its training ε")
    # A run that selected on half the test split is tested on the other half.
    validation_from = (
        common.VALIDATION_FROM.value
        if FLAGS["validation_from"].present
        else known.get("validation_from", "train")
    )
    return dataset, eps_values, validation_from


def threat_model(known: dict) -> str:
    """The norm of the attacks: --norm's, else the model's own (its run or model card), else
    L∞."""
    # The flag itself: its holder refuses the None evaluate.py's flags give it as default.
    return FLAGS["norm"].value or known.get("norm", "linf")


def checked_split(model_path: str, classifier, dataset: str, validation_from: str):
    """The examples attacked, after the model's outputs were checked on them (logits, not
    probabilities, and finite), and how many they are."""
    from fbat_tf import classifiers, data

    split = data.load(
        dataset,
        eval_flags.SPLIT.value,
        data_dir=common.DATA_DIR.value,
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
    # The split's size where it is known without reading it (its last batch may be short).
    info = data.info(dataset)
    if validation_from == "train" and eval_flags.SPLIT.value in data.SPLITS:
        total = info.test_examples if eval_flags.SPLIT.value == "test" else info.train_examples
        start, stop = data.split_range(total, eval_flags.SPLIT.value)
        known = stop - start
    else:  # half the test split, drawn per class: at most what its batches hold
        known = batches * common.BATCH_SIZE.value if batches > 0 else info.test_examples
    upper = batches * common.BATCH_SIZE.value if batches > 0 else known
    examples = min(eval_flags.N_EXAMPLES.value or 10**12, known, upper)
    return split, examples


def described(result, model_path: str, dataset: str, validation_from: str, norm: str):
    """evaluate()'s EvaluationResult with what produced it, and any sign of gradient masking."""
    from fbat_tf import data, device, provenance
    from fbat_tf.attacks.masking import masking_gap

    result.dataset = dataset
    result.code = provenance.code()
    result.device = device.describe()
    result.extra["model_path"] = model_path
    points = data.points(
        dataset,
        eval_flags.SPLIT.value,
        data_dir=common.DATA_DIR.value,
        download=common.DOWNLOAD.value,
        validation_from=validation_from,
    )
    result.describe(
        eval_flags.SPLIT.value,
        validation_from,
        points,
        attack_names(model_path),
        {name: holder.value for name, holder in eval_flags.OPTION_FLAGS.items()},
        common.SEED.value,
        norm=norm,
        fold_weights=eval_flags.FOLD_WEIGHTS.value,
        strategy=common.STRATEGY.value,
        machine=provenance.machine(),
    )
    for attacked in result.robust:
        extra = masking_gap(attacked.parts) if attacked.parts else None
        if extra is not None and extra > 0:
            logging.warning(
                "%s: Square broke %.2f%% of the examples that the gradient attacks did not; "
                "a sign of gradient masking",
                attacked.key,
                100 * extra,
            )
            result.extra.setdefault("gradient_masking_warning", {})[attacked.key] = extra
    return result


def write_outputs(result, results_path: str, budgets: int) -> None:
    """The table first, so that a failure to write loses nothing the user sees; then the JSON
    (elsewhere, named, where it cannot go where asked) and, with several ε, the plot."""
    from fbat_tf import plots
    from fbat_tf.records import write_json_atomic

    first = f"first {result.examples} examples"
    print(f"\n{result.dataset} {eval_flags.SPLIT.value}, {first}\n")
    print(table(result))
    saved = run_files.save_results(result.to_dict(), results_path, write_json_atomic)
    if saved != results_path:
        sys.exit(f"error: could not write {results_path}; the results are in {saved}")
    if budgets > 1:
        plot_path = os.path.splitext(results_path)[0] + ".png"
        labels = {name: label(name) for name in result.extra["attacks"]}
        try:
            plots.plot_robustness(result, plot_path, labels)
            print(f"plot in {plot_path}")
        except OSError as error:  # the results are saved: running again would be refused
            print(
                f"warning: the plot could not be written ({errors.describe(error)}); the "
                f"results are saved whole in {results_path}",
                file=sys.stderr,
            )
    print(f"results in {results_path}")


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    paths = checked_several([path.rstrip("/") for path in eval_flags.MODEL_PATH.value])
    checked_eps_units(paths[0], eval_flags.SOURCE_MODEL_PATH.value)
    models = [checked_model_path(path) for path in paths]
    results_paths = [checked_results_path(path) for path in paths]
    source_path = checked_source_path(paths[0])
    # The data the model is attacked on decides the oneDNN kernels (fbat_tf/onednn.py).
    run = Run(paths[0])
    holder = run.in_use() if os.path.isdir(paths[0]) else None
    if holder:
        print(
            f"warning: {paths[0]} is in use: {holder} trains in it; this evaluates its best "
            "model so far, which a later epoch may replace",
            file=sys.stderr,
        )
    try:
        named = named_dataset()
    except ValueError as error:
        sys.exit(f"error: {error}")
    for model_path, opened in models:
        checked_data(model_path, opened, named, source_path)
    onednn.choose(named or (run.config().dataset if run.is_run() else None))
    if not FLAGS["verbosity"].present:
        startup.load_tensorflow()
    import atexit
    import shutil
    import tempfile

    from fbat_tf import distribute

    # Created first: a multi-worker strategy must exist before other TensorFlow work.
    strategy = distribute.create_strategy(common.STRATEGY.value)
    if not distribute.is_chief(strategy):
        # Every worker computes the same results; only the chief writes them where asked.
        scratch = tempfile.mkdtemp(prefix="fbat_worker_")
        atexit.register(shutil.rmtree, scratch, True)  # its own folder, gone when it ends
        results_paths = [os.path.join(scratch, f"{i}.json") for i, _ in enumerate(paths)]
    elif common.STRATEGY.value == "multi_worker":
        for results_path in results_paths:  # now that it is known
            if os.path.exists(results_path):
                sys.exit(f"error: {results_path} exists; pass another --results")
    try:
        source = Source(*load_source(source_path, strategy), source_path)
    except (ValueError, FileNotFoundError) as error:
        sys.exit(f"error: {error}")
    kept = {} if len(paths) > 1 else None  # the source's points, crafted once for every file
    for (model_path, opened), results_path in zip(models, results_paths, strict=True):
        if kept is not None:
            print(f"\n{model_path}", flush=True)
        evaluated(model_path, opened, results_path, strategy, named, source, kept)


def checked_several(paths: list[str]) -> list[str]:
    """`paths` where one model is named, or several exported files of one source, each once;
    else exit, before TensorFlow loads, naming the path that cannot be among them."""
    if len(paths) == 1:
        return paths
    for path in paths:
        if not is_artifact(path):
            sys.exit(
                f"error: --model_path={path}: several paths are exported .onnx or .tflite files "
                "re-checked against one source; evaluate any other model on its own"
            )
        if paths.count(path) > 1:
            sys.exit(f"error: --model_path names {path} twice")
    sources = {path: checked_source_path(path) for path in paths}
    if len(set(sources.values())) > 1:
        first, *_ = paths
        other = next(path for path in paths if sources[path] != sources[first])
        sys.exit(
            f"error: --model_path: {other} is checked against {sources[other]}, {first} against "
            f"{sources[first]}: several files are re-checked together only against one source"
        )
    if eval_flags.RESULTS.value:
        sys.exit(
            "error: --results names one file, and several exported files are re-checked: each "
            "writes its own results beside it (eval-<split>-<file>.json)"
        )
    return paths


class Source(NamedTuple):
    """The source model (the transfer attacks', an exported file's) as loaded, what is known of
    it, and its path; None, {} and None without one."""

    model: object | None
    known: dict
    path: str | None


def evaluated(model_path, opened, results_path, strategy, named, source: Source, kept) -> None:
    """Evaluate one model and write its results; `kept`: the source's crafted points, shared by
    several exported files (None for one)."""
    from fbat_tf import evaluation

    try:
        classifier, known = load_model(model_path, strategy, opened)
        known = {**source.known, **known}
        dataset, eps_values, validation_from = setting(model_path, named, known)
    except (ValueError, FileNotFoundError) as error:
        sys.exit(f"error: {error}")
    split, examples = checked_split(model_path, classifier, dataset, validation_from)
    artifact, names = is_artifact(model_path), attack_names(model_path)
    if not kept:  # before the first file of several: later ones replay its crafted points
        say_estimate(
            source.model if artifact else classifier, split, names, len(eps_values), examples
        )
    # auto: each attack's own choice (XLA on a GPU; FAB-T and Square also on a CPU for a model
    # without convolutions).
    jit = {"auto": None, "true": True, "false": False}[common.JIT_COMPILE.value]
    built = build_attacks(names, eps_values, jit, source.model, artifact, threat_model(known), kept)
    checks = None if artifact else reference_checks(classifier, split, built)
    try:
        result = evaluation.evaluate(
            classifier, split, built, progress=True, strategy=strategy, seed=common.SEED.value
        )
    except evaluation.NonFiniteError as error:  # met under attack: nothing is written
        sys.exit(f"\nerror: {model_path}: {error}")
    result = described(result, model_path, dataset, validation_from, threat_model(known))
    # The re-check first: it reads what the replayed attacks recorded of the evaluation's calls.
    row = recheck(result, classifier, source.model, split, built, source.path) if artifact else None
    # A file's indicators read the source's gradients (its attacks are the source's, replayed)
    # and the file's outputs; the reference's checks need the file's own gradients.
    result.indicators = indicated(classifier, split, built, result, checks)
    if row is not None:  # the file's row in the model card names them too
        from export.modelcard import fired_indicators

        row["indicators"] = fired_indicators(result)
    write_outputs(result, results_path, len(eps_values))
    write_records(result, model_path, known, row)


def reference_checks(classifier, split, built) -> dict:
    """The reference AutoAttack's checks on the first batch (at most 64 points), before the
    attacks: a line for each that fires."""
    from fbat_tf import checks as reference

    x, y = next(iter(split))[:2]
    checks = reference.reference_checks(classifier, x[:64], y[:64], built, common.SEED.value)
    for name, check in checks.items():
        if check.fired:
            print(f"warning: check {name.replace('_', ' ')}: {check.detail}", flush=True)
    return checks


def indicated(classifier, split, built, result, checks):
    """The indicators of attack failure on the first --indicator_points clean-correct points,
    printed one line per attack and ε (None with --indicator_points=0)."""
    from fbat_tf import indicators

    points = eval_flags.INDICATOR_POINTS.value
    taken = indicators.sample(split, result.clean_outcomes or "", points) if points else None
    if taken is None:
        return None
    found = indicators.compute(
        classifier, *taken, built, result, seed=common.SEED.value, checks=checks
    )
    print(f"\nindicators of attack failure ({found.seconds:.1f} s):")
    for line in found.lines():
        print(f"  {line}")
    return found


def recheck(result, classifier, source, split, built, source_path: str) -> dict:
    """An exported file's row: agreement with its source, replayed and black-box accuracies."""
    from export import recheck as rechecking

    return rechecking.recheck(result, classifier, source, split, built, source_path)


def write_records(result, model_path: str, known: dict, row: dict | None) -> None:
    """An exported file's row in the model card of its export; for a model evaluated by
    AutoAttack (standard) at its training ε, its RobustBench-format entry beside it."""
    if row is not None:
        from export import recheck as rechecking

        print(f"\n{rechecking.table(row)}")
        card = rechecking.record(model_path, row)
        if card:
            print(f"model card: {card}")
        return
    if "eps" not in known or not known.get("dataset") or eval_flags.SPLIT.value != "test":
        return
    norm = known.get("norm", "linf")
    found = result.get("autoattack", units.in_flag_units(known["eps"], norm), norm)
    if found is None or any(key.startswith(f"{found.key}/") for key in result.not_applicable):
        return  # AutoAttack did not run whole (a model without gradients): no entry
    from export import robustbench

    home = model_path if os.path.isdir(model_path) else os.path.dirname(model_path) or "."
    robustbench.write_and_say(
        home, result, known["dataset"], known["eps"], known.get("architecture"), norm
    )


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


def table(result) -> str:
    norms = {r.norm for r in result.robust} or {"linf"}
    budget = "ε (/255)" if norms == {"linf"} else "ε (L2, pixels)" if norms == {"l2"} else "ε"
    lines = [
        f"| attack | {budget} | robust accuracy | time (s) |",
        "|---|---|---|---|",
        f"| clean | 0 | {result.clean_accuracy:.4f} | |",
    ]
    replayed = result.extra.get("replayed", [])
    for r in result.robust:
        eps = f"{r.eps:g}" if len(norms) == 1 else r.key.partition("@")[2]  # "8", "l2:0.5"
        name = label(r.attack) + (" (the source's, replayed)" if r.key in replayed else "")
        if r.robust_accuracy is None:
            lines.append(f"| {name} | {eps} | not applicable: {not_applicable_reason(r)} | |")
            continue
        touched = result.indicators is not None and result.indicators.touched(r.key)
        mark = " ¶" if touched else ""
        lines.append(f"| {name} | {eps} | {r.robust_accuracy:.4f}{mark} | {r.seconds:.1f} |")
        for part, value in r.parts.items():
            if part != "clean":
                spent = r.part_seconds.get(part, 0.0)
                lines.append(f"| ↳ after {part} | {eps} | {value:.4f} | {spent:.1f} |")
        for key in result.not_applicable:
            if key.startswith(f"{r.key}/"):
                lines.append(f"| ↳ {key.partition('/')[2]} | {eps} | not applicable | |")
    if result.indicators is not None and any(
        result.indicators.touched(r.key) for r in result.robust
    ):
        lines.append("")
        lines.append(
            "¶ an indicator of attack failure fired: the number may overestimate robustness"
        )
    return "\n".join(lines)


def not_applicable_reason(attacked) -> str:
    return "no input gradients" if attacked.robust_accuracy is None else ""


def run_program() -> None:
    """The program as `python evaluate.py` and `fbat-evaluate` run it: --help, then main."""
    usage.run(
        __doc__,
        {
            "flags.evaluate": "Evaluation",
            "flags.common": "Data, device and seed",
            "flags.errors": "Errors",
        },
        main,
    )


if __name__ == "__main__":
    run_program()
