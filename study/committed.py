"""The studies this project has run, as committed: each one's definition in study/definitions/
and its cells and report in study/results/ under the same name.

    committed.sweeps(root)                 # {"<root>/study/results/fashion_mnist": True, ...}
    committed.sweeps(root, checks=False)   # a masking check still landing counts as finished
    committed.DEFINITIONS, committed.RESULTS   # the two folders, relative to the project's root

`sweeps` says of each whether it has finished (sweeps.finished): a study still running is
committed cell by cell as its cells land, and its report is the one it last wrote.
"""

from __future__ import annotations

import os

from fbat_tf.sweeps import finished, load_definition

DEFINITIONS = os.path.join("study", "definitions")
RESULTS = os.path.join("study", "results")


def sweeps(root: str, checks: bool = True) -> dict[str, bool]:
    """The studies a project at `root` holds: each folder study/results/<name> with a sweep.json
    whose definition is study/definitions/<name>.json, and whether it has finished (`finished`,
    with `checks`)."""
    found = {}
    for name in sorted(os.listdir(os.path.join(root, RESULTS))):
        sweep_dir = os.path.join(root, RESULTS, name)
        definition = os.path.join(root, DEFINITIONS, f"{name}.json")
        if os.path.isfile(os.path.join(sweep_dir, "sweep.json")) and os.path.isfile(definition):
            found[sweep_dir] = finished(load_definition(definition), sweep_dir, checks)
    return found
