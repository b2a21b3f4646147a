"""A sweep: a grid of training runs, each evaluated at every budget of the grid, and its report.

    definition = load_definition("configs/sweeps/fashion_mnist.json")
    for cell in expand(definition):           # method × ε × seed × any other train.py flag
        cell.name, cell.flags                 # "fastbat-eps16-seed0", {"method": "fastbat", ...}
    report = collect(definition, "results/fashion_mnist")   # what the cells' files say
    write_report(report, "results/fashion_mnist")           # sweep.json, sweep.md, PNG plots

`definition` (the JSON format, the cells, their commands; its evaluations in `evaluations`),
`tuning` (candidate settings trained on tuning seeds, the pick by validation that the final
cells run with), `results` (what the cells hold), `scheduler` (runs the cells' programs in
order, each claimed by `claims` while it runs, from the code `revision` pinned), `estimate` (GPU
time before a run) and the report: `report` (sweep.json and the tables, put together from
`readings`, `costs`, `comparisons` with `paired`, and `paper`) and `plots`.
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
from fbat_tf.sweeps.paper import paper_rows
from fbat_tf.sweeps.plots import PLOTS
from fbat_tf.sweeps.report import markdown, unreadable_cells, write_report
from fbat_tf.sweeps.results import (
    cell_record,
    cell_state,
    collect,
    evaluation_results,
    finished,
    load_paper,
    missing_budgets,
    study_sweeps,
)

__all__ = [
    "EVAL_AUTOATTACK",
    "EVAL_PGD",
    "FLAGS_FILE",
    "PLOTS",
    "RESULTS",
    "Cell",
    "Definition",
    "Evaluation",
    "DefinitionError",
    "cell_record",
    "cell_state",
    "collect",
    "estimate",
    "tuning",
    "commands",
    "expand",
    "finished",
    "study_sweeps",
    "flag_words",
    "load_definition",
    "load_paper",
    "markdown",
    "evaluation_results",
    "missing_budgets",
    "paper_rows",
    "unreadable_cells",
    "write_report",
]
