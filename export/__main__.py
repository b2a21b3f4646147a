"""Export a run's best model for TF-Serving: `python -m export --workdir=RUN` (export/cli.py)."""

from export import cli
from flags import usage


def run_program() -> None:
    """The program as `python -m export` and `fbat-export` run it: --help, then main."""
    usage.run(cli.__doc__, {"export.cli": "Export", "flags.errors": "Errors"}, cli.main)


if __name__ == "__main__":
    run_program()
