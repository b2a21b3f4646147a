"""Export a run's best model for TF-Serving: `python -m export --workdir=RUN` (export/cli.py)."""

from absl import app

from export import cli
from flags import errors

if __name__ == "__main__":
    app.run(errors.guarded(cli.main))
