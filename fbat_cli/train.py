"""Train a robust classifier.

    python train.py --method=fastbat --eps=8                         # CIFAR-10 via TFDS
    python train.py --method=fastbat --dataset=fashion_mnist --model=small_cnn --epochs=5

Flags are in flags/train.py and flags/common.py. Bad values fail before any work. Restarting
with the same flags and --workdir resumes; an existing run directory with other flags is
refused, and a finished run is not redone. A run that diverges stops with a message that says
so, keeps what it had, and exits non-zero; it is not redone either.

Only the run's own lines, warnings and errors are printed; `--verbosity=0` (absl's flag) also
shows TensorFlow's and absl's INFO lines.

Like evaluate.py, this script turns on TensorFlow's oneDNN CPU kernels (off by default on x86
CPUs without AVX-512 VNNI or AMX), except for datasets of 64×64 images and larger where they
crashed (fbat_tf/onednn.py), unless TF_ENABLE_ONEDNN_OPTS says otherwise; see BUILD.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shlex
import sys

from absl import app, logging
from absl import flags as absl_flags

import fbat_cli
from fbat_tf import attacks, onednn, startup
from fbat_tf import run as run_files
from fbat_tf.records import files, units
from fbat_tf.run import Run, RunInUse
from flags import common, usage
from flags import train as train_flags
from flags.run import (
    check_final_test,
    check_method,
    check_norm,
    check_workdir,
    default_workdir,
    export_plan,
    run_config,
    run_flags,
)

FLAGS = absl_flags.FLAGS


def quiet_unless_asked() -> bool:
    """Without --verbosity, absl's and TensorFlow's INFO lines (absl turns them on once flags
    are parsed; TensorFlow's C++ logs before TensorFlow loads) are left out: whether they are."""
    if FLAGS["verbosity"].present:
        return False
    logging.set_verbosity(logging.WARNING)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    return True


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    quiet = quiet_unless_asked()
    onednn.choose(common.DATASET.value)  # before TensorFlow loads
    # The run directory first: a finished run, or one with other flags, is told at once,
    # before TensorFlow loads.
    workdir = train_flags.WORKDIR.value or default_workdir()
    current = run_flags()
    state = checked_state(workdir, current)
    # The flags read once, into the run's config (as on a CPU), what it asks of the device and
    # what to export: nothing below reads a flag.
    config, asked, plan = parsed(workdir)
    if state == "complete":
        print(f"{workdir} holds a finished run with these flags; see {Run(workdir).results_path}.")
        if _chief(config):
            export_once(config, plan, quiet)
        return
    if state == "diverged":
        message = Run(workdir).divergence_message()
        sys.exit(f"error: {workdir} holds a run with these flags that diverged: {message}")

    checked_early(config)
    if quiet:
        startup.load_tensorflow()
    config, source = checked_config(config, asked)
    chief = _chief(config)
    # A new run that fails before its first epoch is recorded leaves no directory behind.
    created = state == "new" and not (os.path.isdir(config.workdir) and os.listdir(config.workdir))
    held = hold(config.workdir, state, current) if chief else None  # the lock lasts while held
    print(
        f"{'Resuming' if state == 'resume' else 'Starting'} {config.workdir}: {config.method} at "
        f"ε = {units.shown(config.eps, config.norm)}{_in_pixels(config)} on {config.dataset}, "
        f"{config.model}; {source}"
    )

    from fbat_tf.training import Diverged, train

    try:
        try:
            record = train(config)
        except Diverged as error:
            sys.exit(f"error: {error}")
        except Exception:
            if chief and created and not Run(config.workdir).is_run():
                with contextlib.suppress(OSError):  # the folder it made, never through a link
                    files.remove_tree(config.workdir)
            raise
        say_test(config, record.final, chief)
        if chief:
            export_once(config, plan, quiet)
            print(summary(config.workdir, record, plan))
    finally:
        # However the run ends (finished, diverged, failed, Ctrl-C), it holds the directory no
        # more, and leaves no train.lock behind.
        Run(config.workdir).release(held)  # None off the chief


def checked_state(workdir: str, current: dict[str, str]) -> str:
    """The flags that need no TensorFlow checked, and the state of the run directory for these
    flags (flags/run.py's check_workdir); a bad one exits with its message."""
    try:
        check_final_test()
        check_norm()
        check_export()
        return check_workdir(workdir, current)
    except (ValueError, ImportError) as error:  # ImportError: an export format's missing extra
        sys.exit(f"error: {error}")


def parsed(workdir: str):
    """The run's config as on a CPU, what it asks of the device, and the export plan, from the
    flags; a value of the wrong type exits naming its flag."""
    try:
        config, asked = run_config(workdir)
    except ValueError as error:
        sys.exit(f"error: {error}")
    return config, asked, export_plan()


def checked_early(config) -> None:
    """What checked_config checks that needs no TensorFlow, before it loads: the flags' types,
    a built-in method's options, threat model and strategy (its rules), and data in local
    files, decoded whole; a bad one exits with its message. What the device settles ("auto")
    is not read."""
    from fbat_tf import data

    try:
        check_method(config)
        if not data.needs_tensorflow(config.dataset, config.data_dir, config.download):
            data.check_available(config.dataset, config.data_dir, config.download)
            data.check_local_files(config.dataset, config.data_dir)
    except (ValueError, FileNotFoundError) as error:
        sys.exit(f"error: {error}")


def checked_config(config, asked):
    """The run's config with the device's part settled on this machine, and where its data
    comes from: checks that need more than one flag, before anything is created; a bad one
    exits with its message."""
    from fbat_tf import data
    from fbat_tf.methods import configs

    try:
        config = configs.on_device(config, asked)
        if config.verbose == 1 and not sys.stdout.isatty():
            # A progress bar redrawn with carriage returns fills a log file: a line an epoch.
            config = dataclasses.replace(config, verbose=2)
        check_method(config)
        source = data.check_available(config.dataset, config.data_dir, config.download)
    except (ValueError, FileNotFoundError) as error:
        sys.exit(f"error: {error}")
    return config, source


def hold(workdir: str, state: str, current: dict[str, str]):
    """The chief's hold on the run directory, and a new run's flags written into it: one
    train.py a run directory, so a second one is told before it writes anything."""
    try:
        Run(workdir).refuse_links()  # what the run writes, none of it through a link
        held = Run(workdir).hold()
        if state == "new":
            with files.open_own(Run(workdir).flags_path, "w") as f:  # never through a link
                f.writelines(f"{line}\n" for line in current.values() if line)
    except (RunInUse, files.LinkRefused) as error:
        sys.exit(f"error: {error}")
    return held


def say_test(config, final, chief: bool) -> None:
    """The final test's numbers and where they are, and the chief's RobustBench entry."""
    if final is None:
        print(f"no test (--nofinal_test); results in {Run(config.workdir).results_path}")
        return
    from fbat_tf.training import final_attack_options

    options = final_attack_options(config)
    robust = ", ".join(
        f"{attacks.label(r.attack, options.get(r.attack))} {r.robust_accuracy:.4f}"
        for r in final.robust
    )
    print(
        f"test ({final.examples} examples): clean {final.clean_accuracy:.4f}, {robust}; "
        f"results in {Run(config.workdir).results_path}"
    )
    if final.indicators is not None:  # as evaluate.py says them
        print(f"indicators of attack failure ({final.indicators.seconds:.1f} s):")
        for line in final.indicators.lines():
            print(f"  {line}")
    if chief:
        robustbench_entry(config, final)


def robustbench_entry(config, final) -> None:
    """Where the final test ran AutoAttack (standard) at the run's ε, the run's
    RobustBench-format entry, as evaluate.py writes one (export/robustbench.py)."""
    from export import robustbench
    from fbat_tf.run import architecture_name

    name = architecture_name(config.model, config.width)
    robustbench.write_and_say(config.workdir, final, config.dataset, config.eps, name, config.norm)


def _in_pixels(config) -> str:
    """ε in [0, 1] pixel units beside the flag's, where they differ (L∞: 8/255 is 0.03137; an
    L2 ε is given in pixel units already)."""
    return f" ({config.eps:.4g})" if config.norm == "linf" else ""


# The evaluation `summary` suggests: evaluate.py's default attacks on this many test images.
NEXT_EXAMPLES = 1000


def evaluation_minutes(record) -> float | None:
    """Roughly how long the suggested evaluation may take on this machine, at most: its attacks'
    forward-backward passes per example (the registry's, with the selected epoch's validation
    robust accuracy as the share AutoAttack's later parts still attack) × the examples × the
    seconds of one pass per example that training measured (its last epoch's images per second
    over its method's backward, second-order and tangent passes per step, each with weight
    gradients: dearer than an attack's). None where the run recorded neither."""
    last = record.history[-1] if record.history else None
    per_second = last.get("images_per_second") if last is not None else None
    held = (record.method.passes or {}) if record.method else {}
    backward = sum(held.get(kind) or 0 for kind in ("backward", "second_order", "tangent"))
    if not per_second or not backward:
        return None
    chosen = record.selected_epoch()
    robust = chosen.val_robust_accuracy if chosen is not None else None
    passes = attacks.passes("pgd") + attacks.passes("autoattack", robust=robust or 1.0)
    return NEXT_EXAMPLES * passes / (per_second * backward) / 60


def _duration_words(minutes: float | None) -> str:
    if minutes is None:
        return ""
    if minutes < 1:
        return ": under a minute here"
    if minutes < 120:
        return f": up to about {minutes:.0f} min here"
    return f": up to about {minutes / 60:.1f} h here"


def summary(workdir: str, record, plan) -> str:
    """Which epoch was selected, where the run's files are, and what to run next."""
    chosen = record.selected_epoch()
    selected = (
        f"selected epoch {chosen.epoch} of {len(record.history)} (validation PGD accuracy "
        f"{chosen.val_robust_accuracy:.4f})"
        if chosen
        else "no epoch passed validation"
    )
    quoted = shlex.quote(workdir)
    run = Run(workdir)
    lines = [
        f"{selected}; in {workdir}: results.json, {os.path.relpath(run.best_weights, workdir)}, "
        f"{os.path.relpath(run.tensorboard_dir, workdir)}/",
        "next:",
        f"  tensorboard --logdir={shlex.quote(run.tensorboard_dir)}",
        f"  python evaluate.py --model_path={quoted} --n_examples={NEXT_EXAMPLES}   "
        f"# PGD-50-10, AutoAttack{_duration_words(evaluation_minutes(record))}",
    ]
    if not plan.export:
        lines.append(f"  python -m export --workdir={quoted}               # SavedModel")
    return "\n".join(lines)


def _chief(config) -> bool:
    """Under multi_worker every worker runs this command; only the chief writes into the
    workdir."""
    if config.strategy != "multi_worker":
        return True
    from fbat_tf import distribute

    return distribute.is_chief_process(config.strategy)


def check_export() -> None:
    """The converters of the formats asked for, before any training: a missing one is told now,
    not when the run ends (export/artifacts.py)."""
    if train_flags.EXPORT.value:
        from export import artifacts

        artifacts.check_formats(train_flags.EXPORT_FORMATS.value)


def export_once(config, plan, quiet: bool) -> None:
    """Export the run's best model, unless asked not to or a version of it already exists."""
    if not plan.export:
        return
    from export import versions

    workdir = config.workdir
    export_dir = plan.export_dir or Run(workdir).export_dir
    name = versions.run_name(config.dataset, config.model, config.method)
    existing = versions.existing_versions(os.path.join(export_dir, name))
    formats, int8_examples = list(plan.formats), plan.int8_examples
    if existing:
        path = os.path.join(export_dir, name, str(max(existing)))
        add_missing_formats(workdir, path, formats, int8_examples, quiet)
        return
    from export import savedmodel

    path = savedmodel.export_run(workdir, export_dir, name, None, formats, int8_examples)
    print(f"SavedModel for TF-Serving: {path}")
    say_beside(path)


def add_missing_formats(
    workdir: str, path: str, formats: list[str], int8_examples: int, quiet: bool
) -> None:
    """The run's latest export, `path`, completed with the files of `--export_formats` it
    lacks (its SavedModel left as it is), or said to hold them already."""
    from export import artifacts

    try:
        missing = artifacts.missing(path, formats, int8_examples > 0)
    except ValueError as error:
        sys.exit(f"error: {error}")
    if not missing:
        print(
            f"SavedModel for TF-Serving: {path} exists already with the formats asked for, not "
            "exported again (python -m export writes a new version)"
        )
        say_beside(path)
        return
    print(f"SavedModel for TF-Serving: {path} exists already; adding {', '.join(missing)}")
    if quiet:
        startup.load_tensorflow()
    from export import savedmodel

    try:
        savedmodel.add_formats(workdir, path, formats, int8_examples)
    except ValueError as error:
        sys.exit(f"error: {error}")
    say_beside(path)


def say_beside(path: str) -> None:
    """The ONNX and LiteRT files in an export's version directory, if any."""
    extra = sorted(set(os.listdir(path)) & set(run_files.ARTIFACTS.values()))
    if extra:
        print(f"beside it: {', '.join(extra)} (python evaluate.py --model_path=<file> checks each)")


def run_program() -> None:
    """The program as `python train.py` and `fbat-train` run it: --help, then main; a shipped
    flag file may be named (--flagfile=fashion_mnist_demo)."""
    sys.argv = fbat_cli.shipped_flagfiles(sys.argv)
    usage.run(
        __doc__,
        {
            "flags.train": "Training",
            "flags.common": "Data, device and seed",
            "flags.errors": "Errors",
        },
        main,
    )


if __name__ == "__main__":
    run_program()
