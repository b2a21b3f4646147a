"""train.py's main() run inside the test's process, as `python train.py ARGS` runs it: the
flags parsed by absl, main under errors.guarded (one line for a failure, the exception itself
with --traceback), what it prints captured. A test of a refusal or a resume that does not claim
"before TensorFlow loads", or of what a run writes (its curves, its final test), runs it here
and saves the program's start-up (TensorFlow's import alone is about 4 s on 2 cores); bad flags
(absl's usage exit) and claims about the program itself (its start-up, its log lines, Ctrl-C, a
second process beside it) stay programs.

Only train.py's flags are defined in a test process (evaluate.py's share names with them and
are defined in the programs the tests start)."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import subprocess
import threading
import traceback


@dataclasses.dataclass
class Ran:
    """What a run of main gave, under subprocess.CompletedProcess's names."""

    returncode: int  # the exit status the program would end with
    stdout: str
    stderr: str  # what it wrote, and the line sys.exit(message) prints

    def one_line(self) -> str:
        return one_line(self)


def one_line(done: Ran | subprocess.CompletedProcess) -> str:
    """The last line of a failure, of a program or of main in-process: the one line a user
    reads (non-zero exit, no traceback)."""
    assert done.returncode != 0, done.stdout[-2000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    return done.stderr.strip().splitlines()[-1]


def train(*args: str, monkeypatch) -> Ran:
    """`python train.py *args` in this process. The program's process-wide settings are put
    back afterwards: the environment as it was, absl's flags unparsed, Ctrl-C's handling
    untouched (monkeypatch)."""
    from absl import flags as absl_flags
    from absl import logging

    import fbat_cli
    from fbat_cli import train as program
    from flags import errors

    # Ctrl-C's watcher is the program's own process's; a test process keeps pytest's.
    monkeypatch.setattr(errors, "_prompt_interrupts", threading.Event)
    environment = dict(os.environ)  # put back whatever main sets (its oneDNN choice...)
    verbosity = logging.get_verbosity()
    values = absl_flags.FLAGS
    argv = fbat_cli.shipped_flagfiles(["train.py", *args])
    out, err = io.StringIO(), io.StringIO()
    code = 0
    values.unparse_flags()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                remaining = values(argv)
                errors.guarded(program.main)(remaining)
            except SystemExit as stop:
                if isinstance(stop.code, str):
                    err.write(stop.code + "\n")
                    code = 1
                else:
                    code = stop.code or 0
            except Exception:  # what the interpreter prints of an uncaught exception
                err.write(traceback.format_exc())
                code = 1
    finally:
        values.unparse_flags()
        logging.set_verbosity(verbosity)
        os.environ.clear()
        os.environ.update(environment)
    return Ran(code, out.getvalue(), err.getvalue())
