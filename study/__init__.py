"""The study: what the sweeps' cells showed, as tables, verdicts and plots, above the library
and its launchers (fbat_tf/sweeps), which run the cells and never import it.

    report = collect(definition, "study/results/fashion_mnist")  # every cell's numbers
    write_report(report, "study/results/fashion_mnist")  # sweep.json, sweep.md, PNG plots
    rewrite(definition, "study/results/fashion_mnist")  # the two, as the launchers call it
    committed.sweeps(root)            # the studies of definitions/ and results/, finished or not

`cells` (`collect`: the report's record, a `Report` of each cell's record, the definition's
evaluations, the tuning stage, the paper's numbers and the cost bench), `report` (sweep.json and
the tables, put together from `readings`, `costs`, `comparisons` with `paired`, `paper` and
`tuning_report`), `plots` and `committed` (the studies as committed here: their definitions
in study/definitions/, their cells and reports in study/results/).
"""

from __future__ import annotations

from fbat_tf.sweeps import Definition
from study.cells import Report, cell_record, collect, load_paper
from study.paper import paper_rows
from study.plots import PLOTS
from study.report import markdown, unreadable_cells, write_report


def rewrite(definition: Definition, sweep_dir: str) -> dict[str, str]:
    """The sweep's report written anew from its cells' files: the paths written, by kind. The
    entry point hands this to the launchers, which call it after each cell."""
    return write_report(collect(definition, sweep_dir), sweep_dir)


__all__ = [
    "PLOTS",
    "Report",
    "cell_record",
    "collect",
    "load_paper",
    "markdown",
    "paper_rows",
    "rewrite",
    "unreadable_cells",
    "write_report",
]
