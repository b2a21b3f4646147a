"""Export a run's best model for TF-Serving: `python -m export --workdir=RUN` (export/cli.py)."""

from absl import app

from export import cli
from flags import errors, usage


def run_program() -> None:
    """The program as `python -m export` and `fbat-export` run it: --help, then main."""
    usage.own_help(cli.__doc__, {"export.cli": "Export", "flags.errors": "Errors"})
    app.run(errors.guarded(cli.main))


if __name__ == "__main__":
    run_program()
