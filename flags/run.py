"""What train.py's flags make, shared by train.py and sweep.py: the run's flag words (its
flags.txt), the check of an existing run directory against them, and the TrainConfig.

    words = run_flags(values)                       # {"eps": "--eps=8.0", "seed": "", ...}
    state = check_workdir("runs/a", words)          # "new", "resume", "complete", "diverged"
    check_final_test(values)                        # ValueError: --eval_* with --nofinal_test
    config = config_from_flags("runs/a", values)    # fbat_tf.records.TrainConfig
    config, asked = run_config("runs/a")            # the same, as on a CPU, and what it asks of
                                                    # the device (configs.on_device settles it)
    plan = export_plan()                            # what train.py exports when the run ends

`values` are parsed flags: this process's own by default; sweep.py parses each cell's. Importing
this module defines train.py's flags and loads no TensorFlow.
"""

from __future__ import annotations

import copy
import dataclasses
import os

from absl import flags as absl_flags

from fbat_tf.run import LOCK, Run
from flags import common
from flags import train as train_flags

FLAGS = absl_flags.FLAGS


def run_flags(values: absl_flags.FlagValues = FLAGS) -> dict[str, str]:
    """This program's own flags as command-line words (flag-file lines); unset ones are ''.

    `values`: parsed flags (default: this process's own; sweep.py passes each cell's)."""
    names = [f.name for f in FLAGS.get_flags_for_module(train_flags)]
    names += [f.name for f in FLAGS.get_flags_for_module(common)]
    return {name: values[name].serialize() for name in sorted(set(names))}


def default_workdir(values: absl_flags.FlagValues = FLAGS) -> str:
    budget = f"eps{values.eps:g}" if values.norm == "linf" else f"{values.norm}eps{values.eps:g}"
    return os.path.join("runs", f"{values.method}-{values.dataset}-{values.model}-{budget}")


def _saved_flags(path: str, names: list[str]) -> dict[str, str]:
    """The words of flags.txt by flag name (absent: '')."""
    with open(path) as f:
        lines = [line.strip() for line in f if line.startswith("--")]
    saved = dict.fromkeys(names, "")
    for line in lines:
        word = line[2:].split("=", 1)[0]
        name = word[2:] if word.startswith("no") and word[2:] in saved else word
        saved[name] = line
    return saved


def _default_word(name: str) -> str:
    """The flag `name` at its default, as a command-line word ('' for a None default)."""
    flag = copy.deepcopy(FLAGS[name])
    flag.value = flag.default
    return flag.serialize()


def check_workdir(workdir: str, current: dict[str, str]) -> str:
    """'new', 'resume', 'complete' or 'diverged'; ValueError for a run with other flags.

    A flag that the run's flags.txt does not name is either one it left unset or one added
    since; either way the run behaved as the flag's default does (a new flag's default keeps
    the behaviour from before it), so it differs only where the current value is not the
    default."""
    run = Run(workdir)
    if os.path.exists(workdir) and not os.path.isdir(workdir):
        raise ValueError(f"--workdir={workdir} is a file, not a folder; name a folder")
    if not os.path.exists(run.flags_path):
        # A lock file alone is what a train.py killed before writing flags.txt left.
        if os.path.isdir(workdir) and set(os.listdir(workdir)) - {LOCK}:
            raise ValueError(
                f"--workdir={workdir} exists, is not empty and holds no "
                f"{os.path.basename(run.flags_path)}"
            )
        return "new"
    saved = _saved_flags(run.flags_path, list(current))
    ignored = set(train_flags.NOT_RUN_DEFINING) | {"workdir"}
    differing = [
        f"{saved[name] or f'--{name} unset'} -> {current[name] or f'--{name} unset'}"
        for name in current
        if name not in ignored
        and saved[name] != current[name]
        and (saved[name] or current[name] != _default_word(name))
    ]
    if differing:
        raise ValueError(
            f"--workdir={workdir} holds a run with other flags ("
            + "; ".join(differing)
            + "). Use a new --workdir, or the same flags to resume."
        )
    status = run.status()
    if status == "diverged":
        return "diverged"
    return "complete" if status == "complete" else "resume"


def check_final_test(values: absl_flags.FlagValues = FLAGS) -> None:
    """ValueError for flags of the final test given with --nofinal_test, which runs none."""
    if values.final_test:
        return
    given = [name for name in train_flags.FINAL_TEST_FLAGS if values[name].present]
    if given:
        raise ValueError(
            f"--{', --'.join(given)}: set the final test on the test split, which "
            "--nofinal_test leaves out; drop them, or the --nofinal_test"
        )


def check_norm(values: absl_flags.FlagValues = FLAGS) -> None:
    """ValueError for --norm=l2 without an --eps of its own (the default ε is L∞'s 8/255,
    which read in L2's pixel units would be a ball around the whole image), or with one that
    holds the image's whole [0, 1] box, or is so large a share of it that it is most likely an
    L∞ number (`common.l2_budget_problem`; --allow_large_l2_eps keeps the latter)."""
    if values.norm != "l2":
        return
    if not values["eps"].present:
        default = values["eps"].default
        raise ValueError(
            "--norm=l2 needs its own --eps, in [0, 1]-pixel units over the image (e.g. "
            f"--eps=0.5 for CIFAR-10, 1.5 for Fashion-MNIST); the default {default:g} is L∞'s "
            f"{default:g}/255"
        )
    problem = common.l2_budget_problem(values.eps, values.dataset, values.allow_large_l2_eps)
    if problem:
        raise ValueError(problem)


def check_method(config) -> None:
    """ValueError for the method's options, for a threat model it has no form for, or for a
    strategy the method cannot run under, before anything is created (the method's class says
    which: its rules, in its module under fbat_tf/methods/); no TensorFlow."""
    from fbat_tf import methods

    methods.check(
        config.method,
        config.method_options,
        eps=config.eps,
        norm=config.norm,
        strategy=config.strategy,
    )


def config_from_flags(workdir: str, values: absl_flags.FlagValues = FLAGS, here: bool = True):
    """The run's TrainConfig (fbat_tf/methods/configs.py converts the flags' units and settles
    their "auto" on this machine, which loads TensorFlow; `here=False`: as on a CPU, without)."""
    from fbat_tf.methods import configs

    return configs.train_config({name: values[name].value for name in values}, workdir, not here)


def run_config(workdir: str, values: absl_flags.FlagValues = FLAGS):
    """The run's TrainConfig as on a CPU (no TensorFlow), and what its flags ask of the device
    (configs.Requested): train.py reads its flags once, here, and settles the device's part on
    this machine with configs.on_device once TensorFlow has loaded."""
    from fbat_tf.methods import configs

    given = {name: values[name].value for name in values}
    return configs.train_config(given, workdir), configs.requested(given)


@dataclasses.dataclass(frozen=True)
class ExportPlan:
    """What train.py exports when a run ends (its export flags, read once)."""

    export: bool
    export_dir: str | None
    formats: tuple[str, ...]
    int8_examples: int


def export_plan(values: absl_flags.FlagValues = FLAGS) -> ExportPlan:
    return ExportPlan(
        values["export"].value,
        values["export_dir"].value,
        tuple(values["export_formats"].value),
        values["int8_examples"].value,
    )
