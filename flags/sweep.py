"""Flags of sweep.py."""

from __future__ import annotations

from absl import flags

SWEEP = flags.DEFINE_string(
    "sweep",
    None,
    "A sweep definition: a name in configs/sweeps/ (fashion_mnist) or a path to its JSON file.",
    required=True,
)
SWEEP_DIR = flags.DEFINE_string(
    "sweep_dir",
    None,
    "Where the cells' run directories and the report go (default results/<sweep name>).",
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
