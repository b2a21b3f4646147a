"""Flags of sweep.py."""

from __future__ import annotations

from absl import flags

from flags import common

SWEEP = flags.DEFINE_string(
    "sweep",
    None,
    "A sweep definition: a name in configs/sweeps/ (paper_table2) or study/definitions/ "
    "(fashion_mnist), or a path to its JSON file.",
    required=True,
)
SWEEP_DIR = flags.DEFINE_string(
    "sweep_dir",
    None,
    "Where the cells' run directories and the report go (default results/<sweep name>; a "
    "study's study/results/<sweep name>, beside its committed cells).",
)
ONLY = flags.DEFINE_list(
    "only", None, "Run only the cells whose names match these shell patterns, e.g. fastbat-*."
)
DRY_RUN = flags.DEFINE_bool(
    "dry_run", False, "Check the definition, list the cells with their state and commands, stop."
)
REPORT_ONLY = flags.DEFINE_bool(
    "report_only", False, "Write sweep.json, the table and the plots from what the cells hold."
)
OVERRIDE = flags.DEFINE_list(
    "override",
    None,
    "train.py flags set on every cell over the definition, e.g. epochs=1,steps_per_epoch=2 to "
    "try a kit end to end; the report marks such a sweep as not comparable. A sweep directory "
    "keeps the overrides it first ran with.",
)
PRINT_COMMANDS = flags.DEFINE_bool(
    "print_commands",
    False,
    "With --dry_run: print only one shell line per cell still to run (its train.py and "
    "evaluate.py commands), for a scheduler.",
)
WAIT_SECONDS = flags.DEFINE_float(
    "wait_seconds",
    20.0,
    "How often a process waiting for the cells other sweep.py processes hold, or for tuning "
    "picks, looks again.",
    lower_bound=0.0,
)
LAUNCHER = flags.DEFINE_enum(
    "launcher",
    "local",
    ["local", "ray"],
    "local: the cells one after another in this process (several such processes may share a "
    "sweep directory). ray: each cell a Ray task, as many at once as the cluster holds (one GPU "
    'each where it has GPUs); needs pip install -e ".[cluster]".',
)
RAY_ADDRESS = flags.DEFINE_string(
    "ray_address",
    None,
    "With --launcher=ray: the Ray cluster to run on (auto, or HOST:PORT of its head). Default: "
    "Ray starts on this machine and uses all of its GPUs (or CPUs).",
)
CPUS_PER_CELL = flags.DEFINE_float(
    "cpus_per_cell",
    1.0,
    "With --launcher=ray on a cluster without GPUs: the CPUs each cell holds.",
    lower_bound=0.01,
)
CELL_RETRIES = flags.DEFINE_integer(
    "cell_retries",
    1,
    "With --launcher=ray: how many more times a failed cell is run before it is reported as "
    "failed (a diverged cell is not run again).",
    lower_bound=0,
)
# Flags of the Ray launcher alone: refused with the local one.
RAY_ONLY = ("ray_address", "cpus_per_cell", "cell_retries")
ALLOW_DIRTY = flags.DEFINE_bool(
    "allow_dirty",
    False,
    "Run the cells from the working tree as it is, uncommitted changes included, instead of "
    "from the sweep's pinned revision; the report marks every cell this touches.",
)
REPIN = flags.DEFINE_bool(
    "repin",
    False,
    "Move the sweep to the checkout's current revision: cells run after this run it. A sweep "
    "keeps the revision it first ran (revision.json) until then; the report marks comparisons "
    "between cells of different revisions.",
)

common.refuse_unsafe_values(__name__)
