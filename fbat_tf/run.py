"""A training run directory, and the one place that knows its layout.

    run = Run("runs/demo")
    run.is_run(), run.status()             # results.json present / "running", "complete", ...
    run.is_diverged()                      # its status "diverged"; run.divergence_message()
    run.record()                           # results.json as a records.RunRecord
    run.config()                           # the TrainConfig the run was started with
    classifier = run.build_classifier()    # the architecture, with the selected weights

The layout (DESIGN.md §5):

    flags.txt                      train.py's command line, one flag-file line per flag
    results.json                   status, config, per-epoch history, final test numbers
    checkpoints/best.weights.h5    the model selected by validation robust accuracy
    checkpoints/last/              the checkpoint a killed run resumes from
    tensorboard/train/, tensorboard/validation/
    eval-<name>.json, eval-<name>.png    evaluate.py's results (one name per evaluation)
    export/<model name>/<version>/ the SavedModel for TF-Serving, and beside it on request
                                   model.onnx, model.tflite, model_int8.tflite
    robustbench.json               a RobustBench-format entry, where AutoAttack ran at the
                                   training ε (also beside an evaluated SavedModel or file)
    train.lock                     held by the train.py that trains here (who, in the file)

This module imports TensorFlow only inside `build_classifier`, so that the command line can
check a run directory before TensorFlow loads.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
from typing import Any

from fbat_tf import catalog
from fbat_tf.records import ModelCard, RunRecord, TrainConfig
from fbat_tf.records.files import open_own, refuse_links

RESULTS = "results.json"
# An exported SavedModel version directory (export/ writes it): its model card and signatures.
MODEL_CARD = os.path.join("assets.extra", "model_card.json")
FLOAT_SIGNATURE = "serving_default"
UINT8_SIGNATURE = "serve_uint8"
# The other formats of an export, beside its SavedModel in the version directory, by the file
# name the model card's rows use: each takes raw pixels in [0, 1] and gives logits.
ARTIFACTS = {"onnx": "model.onnx", "litert": "model.tflite", "litert_int8": "model_int8.tflite"}
ROBUSTBENCH = "robustbench.json"
FLAGS = "flags.txt"
CHECKPOINTS = "checkpoints"
BEST_WEIGHTS = "best.weights.h5"
EXPORT = "export"
LOCK = "train.lock"


class RunInUse(RuntimeError):
    """Another live process trains in this run directory."""


def unwritable(path: str) -> str | None:
    """Why a results file cannot be written at `path` (its folder missing, not a folder, or not
    writable: tried by writing a file there; or `path` a symbolic link, which is never written
    through), or None."""
    import tempfile

    if os.path.islink(path):
        return f"{path} is a symbolic link, which fbat-tf never writes through: move it away"
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        missing = "is not a folder" if os.path.exists(folder) else "does not exist"
        return f"the folder {folder} {missing}"
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".fbat-write-check-"):
            pass
    except OSError as error:
        return f"cannot write into {folder} ({error.strerror or error})"
    return None


def save_results(results: dict, path: str, write) -> str:
    """Write `results` to `path` with `write`; where that fails (a full disk, a folder gone
    read-only during the attacks), to a new file in the system's temporary folder instead.
    Returns where they are."""
    import tempfile

    try:
        write(path, results)
        return path
    except OSError:
        handle, fallback = tempfile.mkstemp(prefix="fbat-unsaved-results-", suffix=".json")
        os.close(handle)
        write(fallback, results)
        return fallback


def eval_file(name: str) -> str:
    """The file name of evaluate.py's results named `name`: eval-<name>.json."""
    return f"eval-{name}.json"


@dataclasses.dataclass(frozen=True)
class Run:
    workdir: str

    def path(self, *parts: str) -> str:
        return os.path.join(self.workdir, *parts)

    @property
    def results_path(self) -> str:
        return self.path(RESULTS)

    @property
    def flags_path(self) -> str:
        return self.path(FLAGS)

    @property
    def checkpoints_dir(self) -> str:
        return self.path(CHECKPOINTS)

    @property
    def best_weights(self) -> str:
        return self.path(CHECKPOINTS, BEST_WEIGHTS)

    @property
    def last_checkpoint_dir(self) -> str:
        return self.path(CHECKPOINTS, "last")

    @property
    def tensorboard_dir(self) -> str:
        return self.path("tensorboard")

    @property
    def export_dir(self) -> str:
        return self.path(EXPORT)

    @property
    def robustbench_path(self) -> str:
        return self.path(ROBUSTBENCH)

    def refuse_links(self) -> None:
        """LinkRefused naming the first of the files and folders a run writes here (its
        record, flags, lock, checkpoints, TensorBoard logs, RobustBench entry and export) that
        is a symbolic link: none is written, replaced or removed through one."""
        for part in (
            (RESULTS,),
            (FLAGS,),
            (LOCK,),
            (CHECKPOINTS,),
            (CHECKPOINTS, BEST_WEIGHTS),
            (CHECKPOINTS, "last"),
            ("tensorboard",),
            *(("tensorboard", kind) for kind in ("train", "validation", "test")),
            (ROBUSTBENCH,),
            (EXPORT,),
        ):
            refuse_links(self.path(*part), inside=self.workdir)

    def hold(self) -> Any:
        """Take this run directory for the calling process, or raise RunInUse naming the
        process that has it. The lock is the kernel's (flock on train.lock): it ends with the
        process, however it ends, so a killed run never leaves the directory taken. Returns the
        open lock file; keep it for as long as the run goes on. LinkRefused where train.lock is
        a symbolic link: nothing is written behind it."""
        import fcntl
        import socket

        os.makedirs(self.workdir, exist_ok=True)
        handle = open_own(self.path(LOCK), "r+")  # held until the process ends
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            handle.close()
            raise RunInUse(
                f"{self.workdir} is in use: {holder} trains in it; wait for it to end (a "
                "second train.py would write the same checkpoints and logs), or use another "
                "--workdir"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"process {os.getpid()} on {socket.gethostname()}\n")
        handle.flush()
        return handle

    def release(self, handle: Any) -> None:
        """Give up the directory `hold` took, removing train.lock: a finished run holds none."""
        if handle is None:
            return
        with contextlib.suppress(OSError):
            refuse_links(self.path(LOCK))  # hold made it: a link there now is not its own
            os.remove(self.path(LOCK))
        handle.close()

    def in_use(self) -> str | None:
        """Who trains in this run directory now ("process N on HOST"), or None: asked of the
        kernel's lock on train.lock, which ends with the process however it ends."""
        import fcntl

        path = self.path(LOCK)
        try:
            handle = open(path)  # never created here
        except OSError:
            return None
        with handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError:
                return handle.read().strip() or "another process"
            fcntl.flock(handle, fcntl.LOCK_UN)
            return None

    def eval_path(self, name: str) -> str:
        """Where evaluate.py's results named `name` go: eval-<name>.json."""
        return self.path(eval_file(name))

    def eval_files(self, prefix: str) -> list[str]:
        """File names of the evaluation results whose name starts with `prefix`, sorted."""
        start = eval_file(prefix).removesuffix(".json")
        names = os.listdir(self.workdir) if os.path.isdir(self.workdir) else []
        return sorted(n for n in names if n.startswith(start) and n.endswith(".json"))

    def is_run(self) -> bool:
        """A training run directory: it holds results.json."""
        return os.path.isfile(self.results_path)

    def has_best_weights(self) -> bool:
        return os.path.isfile(self.best_weights)

    def read_record(self) -> RunRecord | None:
        """results.json, or None when absent or not (yet) a readable record."""
        return RunRecord.read(self.results_path)

    def status(self) -> str | None:
        """The record's status ("running", "complete", "diverged"), read once; None without a
        readable record."""
        record = self.read_record()
        return None if record is None else record.status

    def is_complete(self) -> bool:
        return self.status() == "complete"

    def is_diverged(self) -> bool:
        return self.status() == "diverged"

    def divergence_message(self, record: RunRecord | None = None) -> str:
        """What a diverged run's results.json (or `record`) says of it, in words, with what to
        try and how to start over: "in epoch 3, 40 of the 100 steps it tried were skipped
        ...; the last finite training loss was ... Try a lower --lr_max ..."."""
        record = self.record() if record is None else record
        outcome, config = record.divergence, record.config
        epoch = outcome.epoch
        if outcome.reason == "skipped_batches":
            what = (
                f"in epoch {epoch}, {outcome.nonfinite_batches} of the {outcome.steps} "
                "steps it tried were skipped because their loss, gradients or batch-norm "
                "statistics were not finite (--max_skipped_fraction allows "
                f"{outcome.max_skipped_fraction:g} of an epoch's steps)"
            )
        else:
            what = (
                f"after epoch {epoch}, validation met {outcome.val_nonfinite_examples} "
                "examples whose logits are not finite"
            )
        last = outcome.last_finite_loss
        last = (
            "no batch was applied since it started or resumed"
            if last is None
            else f"the last finite training loss was {last:.4g}"
        )
        remedies = [f"a lower --lr_max (it was {config.lr_max:g})"]
        precision = config.precision
        if precision != "float32":
            remedies.append(f"--precision=float32 (it ran in {precision})")
        best = (
            f"the best checkpoint so far ({self.best_weights})"
            if self.has_best_weights()
            else "no best checkpoint (no epoch's model passed validation)"
        )
        return (
            f"{what}; {last}. Try {' or '.join(remedies)}. This is not "
            "catastrophic overfitting: --stop_on_overfitting plays no part in it. "
            f'{self.workdir} keeps the history so far ({RESULTS}, status "diverged"), {best} '
            "and the TensorBoard logs, and is not trained again: to start over, use another "
            "--workdir or delete it."
        )

    def record(self) -> RunRecord:
        """results.json, or FileNotFoundError naming the directory."""
        if not self.is_run():
            raise FileNotFoundError(
                f"{self.workdir} holds no {RESULTS}: not a training run directory"
            )
        return RunRecord.load(self.results_path)

    def config(self) -> TrainConfig:
        """The TrainConfig the run was started with, as saved in results.json."""
        return self.record().config

    def build_classifier(self, weights: str = "best"):
        """The run's architecture with its weights: "best" (the selected checkpoint) or the path
        of a .weights.h5 file."""
        config = self.config()
        classifier = build_architecture(
            config.model, config.dataset, config.activation, config.width
        )
        path = self.best_weights if weights == "best" else weights
        if not os.path.exists(path):
            raise FileNotFoundError(f"no weights at {path}")
        try:
            classifier.load_weights(path)
        except (OSError, ValueError) as error:  # h5py names neither the file nor the cure
            raise ValueError(
                f"{path} cannot be read as this run's weights ({' '.join(str(error).split())}); "
                "a truncated or foreign file: restore it, or train the run again"
            ) from None
        return classifier


def build_architecture(model: str, dataset: str, activation: str, width: int | None):
    """A run's classifier, untrained: `model` for `dataset`'s classes, input shape and
    normalization, in the global precision policy of the moment. Training builds its classifier
    with it, and a run directory rebuilds it so."""
    from fbat_tf import data, models

    info = data.info(dataset)
    return models.build(
        model,
        num_classes=info.num_classes,
        input_shape=info.image_shape,
        mean=info.mean,
        std=info.std,
        activation=activation,
        width=width,
    )


def architecture_name(model: str, width: int | None) -> str:
    """How a RobustBench entry names a model: "small_cnn width 16", "preact_resnet18"."""
    return f"{model} width {width}" if width else model


def model_facts(path: str) -> dict[str, Any]:
    """What a model's own files say of it, read without TensorFlow: a training run's config,
    else the model card of a SavedModel version directory or of the export an .onnx or .tflite
    file sits in, gives its dataset, training ε and norm, where its validation came from and
    its architecture (those it names); {} for a .keras file or a model without a card.
    ValueError naming a record or card that is not one fbat-tf writes."""
    if Run(path).is_run():
        config = Run(path).config()
        return {
            "dataset": config.dataset,
            "eps": config.eps,
            "norm": config.norm,
            "validation_from": config.validation_from,
            "architecture": architecture_name(config.model, config.width),
        }
    if os.path.isfile(os.path.join(path, "saved_model.pb")):
        home = path
    elif catalog.artifact_format(path) is not None:
        home = os.path.dirname(path)
    else:
        return {}
    if not os.path.exists(os.path.join(home, MODEL_CARD)):
        return {}
    card = ModelCard.load(os.path.join(home, MODEL_CARD))
    known: dict[str, Any] = {}
    if card.dataset:
        known["dataset"] = card.dataset
    if card.validation_from:
        known["validation_from"] = card.validation_from
    if card.eps is not None:
        known["eps"], known["norm"] = card.eps.pixels, card.eps.norm
    if card.model.name:
        known["architecture"] = architecture_name(card.model.name, card.model.width)
    return known


def weights_sha256(path: str | None) -> str | None:
    """The SHA-256 (hex) of the weights a model path holds, read without TensorFlow: a training
    run's best.weights.h5, a .keras file itself; for a SavedModel, or an .onnx or .tflite file
    of an export, the weights its model card says it was exported from. None where unknown (no
    path, no weights yet, a card from before it recorded them). ValueError naming a damaged
    card."""
    if not path:
        return None
    if Run(path).is_run():
        weights = Run(path).best_weights
        return file_sha256(weights) if os.path.isfile(weights) else None
    if path.endswith(".keras") and os.path.isfile(path):
        return file_sha256(path)
    home = path if os.path.isdir(path) else os.path.dirname(path)
    if not os.path.isfile(os.path.join(home, MODEL_CARD)):
        return None
    return ModelCard.load(os.path.join(home, MODEL_CARD)).weights_sha256


def file_sha256(path: str) -> str:
    """The SHA-256 of a file's bytes, in hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def model_path_suggestion(path: str) -> str | None:
    """For a --model_path that is no model (a folder of runs, a run's weights file, an export
    folder without its version), the path that would be one, said as a hint; else None."""
    path = os.path.normpath(path)
    if path.endswith(".weights.h5") and os.path.isfile(path):
        run_dir = os.path.dirname(os.path.dirname(path))
        if Run(run_dir).is_run():
            return f"--model_path={run_dir} (the run it belongs to)"
    if not os.path.isdir(path):
        return None
    versions = _saved_model_versions(path)
    if not versions and os.path.isdir(os.path.join(path, EXPORT)):
        path = os.path.join(path, EXPORT)
    for name in [None, *sorted(os.listdir(path))]:
        folder = path if name is None else os.path.join(path, name)
        found = _saved_model_versions(folder) if os.path.isdir(folder) else []
        if found:
            latest = os.path.join(folder, str(max(found)))
            return f"--model_path={latest} (the SavedModel's latest version)"
    runs = sorted(n for n in os.listdir(path) if Run(os.path.join(path, n)).is_run())
    if runs:
        others = f", one of {len(runs)} training runs in it" if len(runs) > 1 else ""
        return f"--model_path={os.path.join(path, runs[0])} (a training run in it{others})"
    return None


def _saved_model_versions(folder: str) -> list[int]:
    """The integer-named subfolders of `folder` that hold a SavedModel (TF-Serving's versions)."""
    return [
        int(n)
        for n in os.listdir(folder)
        if n.isdigit() and os.path.isfile(os.path.join(folder, n, "saved_model.pb"))
    ]
