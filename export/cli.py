"""Flags and main of `python -m export`: write a run's best model as a TF-Serving SavedModel.

    python -m export --workdir=runs/fmnist-fastbat                    # <workdir>/export/<name>/<N>
    python -m export --workdir=runs/fmnist-fastbat --export_dir=/srv/models --version=3
    python -m export --model_path=model.keras --export_dir=/srv/models --name=fmnist
    python -m export --workdir=runs/fmnist-fastbat --export_formats=saved_model,onnx,litert

Every flag is checked before TensorFlow is imported, and an error names the flag and writes
nothing: a directory that is not a finished training run, a missing .keras file or one that holds
code (a Python lambda, a TFSMLayer) without --trust_model_code, a model name TF-Serving would not
accept, or a version that already exists (versions are never overwritten).
"""

from __future__ import annotations

import os
import sys

from absl import app, flags, logging

from export import artifacts, versions
from fbat_tf import catalog, run, startup, trust
from fbat_tf.records import files
from fbat_tf.run import Run

_WORKDIR = flags.DEFINE_string(
    "workdir", None, f"Training run directory: exports its {run.CHECKPOINTS}/{run.BEST_WEIGHTS}."
)
_MODEL_PATH = flags.DEFINE_string(
    "model_path", None, "A saved .keras classifier to export instead of a training run."
)
_EXPORT_DIR = flags.DEFINE_string(
    "export_dir",
    None,
    "TF-Serving model base directory (default: <workdir>/export, or export/ beside --model_path).",
)
_NAME = flags.DEFINE_string(
    "name",
    None,
    "Model name, the REST path /v1/models/<name> (default: <dataset>-<model>-<method> of the "
    "run, or the .keras file name).",
)
_VERSION = flags.DEFINE_integer(
    "version", None, "Version directory to create (default: the next free integer).", lower_bound=0
)
_TRUST_MODEL_CODE = flags.DEFINE_bool(
    "trust_model_code",
    False,
    "Export a --model_path that holds code, a Python lambda (e.g. a Lambda layer's) or a "
    "TFSMLayer, loading it with Keras' safe mode off, which runs that code. Only for files from "
    "a source you trust.",
)

_FORMATS = flags.DEFINE_list(
    "export_formats",
    ["saved_model"],
    f"What to write, of {', '.join(catalog.EXPORT_FORMATS)}: the SavedModel always, and beside "
    "it model.onnx and model.tflite (with model_int8.tflite for a training run); onnx and "
    'litert need pip install -e ".[export]".',
)
_INT8_EXAMPLES = flags.DEFINE_integer(
    "int8_examples",
    catalog.INT8_EXAMPLES,
    "Training images the int8 LiteRT file is calibrated on (post-training quantization); 0 "
    "writes no int8 file.",
    lower_bound=0,
)

flags.register_multi_flags_validator(
    ["workdir", "model_path"],
    lambda values: (values["workdir"] is None) != (values["model_path"] is None),
    message="pass exactly one of --workdir and --model_path",
)
flags.register_validator(
    "workdir",
    lambda value: value is None or Run(value).is_run(),
    message=f"not a training run directory (it holds no {run.RESULTS})",
)
flags.register_validator(
    "workdir",
    lambda value: value is None or Run(value).has_best_weights(),
    message=f"the run holds no {run.CHECKPOINTS}/{run.BEST_WEIGHTS} yet (no validated epoch)",
)
flags.register_validator(
    "model_path",
    lambda value: value is None or (value.endswith(".keras") and os.path.isfile(value)),
    message="must be an existing .keras file",
)
flags.register_validator(
    "name",
    lambda value: value is None or versions.NAME_PATTERN.fullmatch(value) is not None,
    message="letters, digits, '.', '_' and '-' only, starting with a letter or digit "
    "(it is a path segment of the REST URL)",
)


def _default_name() -> str:
    if _NAME.value is not None:
        return _NAME.value
    if _WORKDIR.value is not None:
        config = Run(_WORKDIR.value).config()
        return versions.run_name(config.dataset, config.model, config.method)
    return os.path.basename(_MODEL_PATH.value)[: -len(".keras")]


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    _check_source()
    try:
        artifacts.check_formats(_FORMATS.value)
    except (ValueError, ImportError) as error:  # ImportError: a format's missing extra
        sys.exit(f"error: --export_formats: {error}")
    name, export_dir = _target()

    if not flags.FLAGS["verbosity"].present:
        # As train.py: the export's own lines and warnings; --verbosity=0 adds absl's INFO.
        logging.set_verbosity(logging.WARNING)
        startup.load_tensorflow()
    path = _export(name, export_dir)
    print(f"exported {path} (serve {os.path.dirname(path)} as model {name!r})")
    for file_name in sorted(set(os.listdir(path)) & set(run.ARTIFACTS.values())):
        print(f"  {os.path.join(path, file_name)}")


def _check_source() -> None:
    """What is exported: a run no train.py holds, with a record that reads, or a .keras file
    that holds no code unless --trust_model_code; else exits saying which."""
    if _WORKDIR.value is not None and (holder := Run(_WORKDIR.value).in_use()):
        sys.exit(
            f"error: {_WORKDIR.value} is in use: {holder} trains in it, so its best model may "
            "still change; train.py exports the model it selects when it ends (run this again "
            "then if it ran with --noexport)"
        )
    if _MODEL_PATH.value is not None:
        try:
            trust.check_keras_file(_MODEL_PATH.value, _TRUST_MODEL_CODE.value)
        except ValueError as error:
            sys.exit(f"error: --model_path: {error}")
    if _WORKDIR.value is not None:
        try:
            Run(_WORKDIR.value).record()  # a damaged record, named, before anything else
        except ValueError as error:
            sys.exit(f"error: {error}")


def _target() -> tuple[str, str]:
    """The model's name and the export directory, checked, with a line where earlier versions
    exist; a name TF-Serving would not take or a version that exists exits saying so."""
    try:
        name = versions.check_name(_default_name())
    except ValueError as error:
        sys.exit(f"error: cannot name the model, pass --name: {error}")
    export_dir = _EXPORT_DIR.value
    if export_dir is None:
        source = _WORKDIR.value or os.path.dirname(os.path.abspath(_MODEL_PATH.value))
        export_dir = Run(source).export_dir
        try:  # the run's own export/, never a link to elsewhere (a named one may be)
            files.refuse_links(export_dir, inside=source)
        except files.LinkRefused as error:
            sys.exit(f"error: {error.filename}: {error.strerror} (--export_dir names another)")
    try:
        _, version = versions.free_version_dir(export_dir, name, _VERSION.value)
    except FileExistsError as error:
        sys.exit(f"error: --version={_VERSION.value}: {error}")
    except OSError as error:
        sys.exit(f"error: --export_dir={export_dir}: {error}")
    earlier = sorted(versions.existing_versions(os.path.join(export_dir, name)))
    if earlier and _VERSION.value is None:
        print(
            f"{name} has versions {', '.join(map(str, earlier))} in {export_dir}: this writes "
            f"version {version}, which TF-Serving serves from now on (--version picks another)"
        )
    return name, export_dir


def _export(name: str, export_dir: str) -> str:
    """The run's best model or the .keras file written as a new version; its path."""
    from export import savedmodel  # TensorFlow loads only once the flags are known to be good

    try:
        if _WORKDIR.value is not None:
            return savedmodel.export_run(
                _WORKDIR.value,
                export_dir,
                name,
                _VERSION.value,
                _FORMATS.value,
                _INT8_EXAMPLES.value,
            )
        return savedmodel.export_keras_file(
            _MODEL_PATH.value,
            export_dir,
            name,
            _VERSION.value,
            _TRUST_MODEL_CODE.value,
            _FORMATS.value,
        )
    except (ValueError, FileNotFoundError, FileExistsError) as error:
        sys.exit(f"error: {error}")
