"""Export a run's best model for TF-Serving: `python -m export --workdir=RUN` (export/cli.py)."""

from absl import app

from export import cli
from flags import errors, usage

if __name__ == "__main__":
    usage.own_help(cli.__doc__, {"export.cli": "Export", "flags.errors": "Errors"})
    app.run(errors.guarded(cli.main))
