"""A sweep: a grid of training runs, each evaluated at every budget of the grid, and the
launchers that run it.

    definition = load_definition("study/definitions/fashion_mnist.json")
    for cell in expand(definition):           # method × ε × seed × any other train.py flag
        cell.name, cell.flags                 # "fastbat-eps16-seed0", {"method": "fastbat", ...}
        cell_state("study/results/fashion_mnist/" + cell.name, definition)  # "done", ...

`definition` (the JSON format, the cells, their commands; its evaluations in `evaluations`, the
masking check in `masking`), `tuning` (candidate settings trained on tuning seeds, the pick by
validation that the final cells run with; tuning.json and its records in `tuning_file`),
`results` (what the cells hold), `scheduler` and `cluster` (run the cells' programs, here or on
Ray, each claimed by `claims` while it runs, from the code `revision` pinned) and `estimate`
(GPU time before a run). The report on what the cells hold is the study package's (study/),
above this one: the launchers rewrite it through the function the entry point hands them.
"""

from fbat_tf.sweeps import estimate, tuning
from fbat_tf.sweeps.definition import (
    EVAL_AUTOATTACK,
    EVAL_PGD,
    FLAGS_FILE,
    RESULTS,
    Cell,
    Definition,
    DefinitionError,
    Evaluation,
    commands,
    expand,
    flag_words,
    load_definition,
)
from fbat_tf.sweeps.results import (
    cell_state,
    evaluation_results,
    finished,
    missing_budgets,
)

__all__ = [
    "EVAL_AUTOATTACK",
    "EVAL_PGD",
    "FLAGS_FILE",
    "RESULTS",
    "Cell",
    "Definition",
    "Evaluation",
    "DefinitionError",
    "cell_state",
    "estimate",
    "tuning",
    "commands",
    "expand",
    "finished",
    "flag_words",
    "load_definition",
    "evaluation_results",
    "missing_budgets",
]
