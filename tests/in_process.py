"""train.py's and evaluate.py's main() run inside the test's process, as `python train.py ARGS`
and `python evaluate.py ARGS` run them: the flags parsed by absl (a bad one told as absl tells
it), main under errors.guarded (one line for a failure, the exception itself with --traceback),
what it prints (and absl's log lines) captured. A test of a refusal that does not claim "before
TensorFlow loads", of a resume, or of what a run or an evaluation writes (its curves, its final
test, its table, its JSON, its indicators) runs it here and saves the program's start-up
(TensorFlow's import alone is about 4 s on 2 cores). Claims about the program itself stay
programs: bad flags (absl's usage exit; a flag of the other program may be taken here), --help,
its start-up, its log lines and TensorFlow's, Ctrl-C, a second process beside it, the console
scripts, and oneDNN: the programs set TF_ENABLE_ONEDNN_OPTS by dataset before TensorFlow loads,
and here TensorFlow is loaded already, with the test process's own choice, so a test that
compares numbers with a program's or a committed evaluation's stays a program.

The two programs' flags live in one process here, and each program has one of its own. They
share most (flags/common.py's, absl's) and clash on --eps (train.py's float, evaluate.py's list
of budgets); evaluate.py's flags module also changes shared ones: --dataset, --validation_from
and --norm default to None there, the attack options register under flags/common.py (whose
flags train.py writes into its flags.txt), and its validators of --eps sit on the shared --norm
and --allow_small_units. So evaluate.py's flags are defined once, by the first evaluate(), with
train.py's --eps (where defined) and its validators hidden, and absl's registry as it then is
(which Flag each name means, each module's flags, each flag's default, help and validators) is
kept; each evaluate() puts that registry in place and the test process's back afterwards. train()
runs in the test process's registry, where evaluate.py's flags are never defined: either program
may run first, and each reads its own --eps."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import logging as std_logging
import os
import subprocess
import sys
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
    """`python train.py *args` in this process (a shipped flag file named as the program
    takes it). The program's process-wide settings are put back afterwards: the environment as
    it was, absl's flags unparsed, Ctrl-C's handling untouched (monkeypatch)."""
    import fbat_cli
    from fbat_cli import train as program

    return _main(program, fbat_cli.shipped_flagfiles(["train.py", *args]), monkeypatch)


def evaluate(*args: str, monkeypatch) -> Ran:
    """`python evaluate.py *args` in this process, with evaluate.py's flags in absl's registry
    for the run and the test process's put back afterwards; otherwise as train()."""
    global _EVALUATE
    _import_shared_flags()
    kept = _Registry.taken()
    registry = _evaluate_registry()
    registry.put()
    try:
        from fbat_cli import evaluate as program

        return _main(program, ["evaluate.py", *args], monkeypatch)
    finally:
        after = _Registry.taken()
        kept.put()
        # A module imported during the run that defined flags would leave them in neither
        # registry: none does (export/cli.py's are `python -m export`'s own).
        defined = after.names.keys() ^ registry.names.keys()
        assert not defined, f"flags defined during evaluate.py's run: {sorted(defined)}"
        _EVALUATE = after


def evaluate_program():
    """fbat_cli.evaluate as evaluate() runs it, for a test to patch: imported only here, where
    its flags are held apart (importing it elsewhere would define them in the test process's
    registry)."""
    _evaluate_registry()
    from fbat_cli import evaluate as program

    return program


def _main(program, argv: list[str], monkeypatch) -> Ran:
    """`program`'s main run on `argv` as its run_program runs it (app.run, errors.guarded)."""
    from absl import app, logging
    from absl import flags as absl_flags

    from flags import errors

    # Ctrl-C's watcher is the program's own process's; a test process keeps pytest's.
    monkeypatch.setattr(errors, "_prompt_interrupts", threading.Event)
    environment = dict(os.environ)  # put back whatever main sets (its oneDNN choice...)
    verbosity = logging.get_verbosity()
    values = absl_flags.FLAGS
    out, err = io.StringIO(), io.StringIO()
    # absl's log lines go to the program's standard error, as app.run's handler writes them.
    said = std_logging.StreamHandler(err)
    said.setFormatter(logging.PythonFormatter())
    logging.get_absl_logger().addHandler(said)
    code = 0
    values.unparse_flags()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                remaining = app.parse_flags_with_usage(argv)  # absl's message and exit 1
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
        logging.get_absl_logger().removeHandler(said)
        values.unparse_flags()
        logging.set_verbosity(verbosity)
        os.environ.clear()
        os.environ.update(environment)
    return Ran(code, out.getvalue(), err.getvalue())


# What each Flag carries that a flags module's import may change (flags/evaluate.py sets the
# default and help of shared ones; validators naming several flags sit on each of them).
_SETTINGS = ("default", "default_unparsed", "default_as_str", "help", "validators")


@dataclasses.dataclass
class _Registry:
    """absl's flag registry at one moment: the Flag each name means, each module's flags, what
    each Flag carries, and flags/common.py's record of the flags it guarded (by name)."""

    names: dict
    modules: list[dict]
    settings: list[tuple]
    guarded: set

    @staticmethod
    def _module_dicts() -> list[dict]:
        from absl import flags as absl_flags

        values = absl_flags.FLAGS
        return [
            values.flags_by_module_dict(),
            values.flags_by_module_id_dict(),
            values.key_flags_by_module_dict(),
        ]

    @classmethod
    def taken(cls) -> _Registry:
        from absl import flags as absl_flags

        from flags import common

        names = dict(absl_flags.FLAGS._flags())
        unique = {id(flag): flag for flag in names.values()}.values()
        return cls(
            names,
            [{module: list(held) for module, held in d.items()} for d in cls._module_dicts()],
            [(flag, {key: _copied(getattr(flag, key)) for key in _SETTINGS}) for flag in unique],
            set(common._GUARDED),
        )

    def put(self) -> None:
        from absl import flags as absl_flags

        from flags import common

        registered = absl_flags.FLAGS._flags()
        registered.clear()
        registered.update(self.names)
        for now, then in zip(self._module_dicts(), self.modules, strict=True):
            now.clear()
            now.update({module: list(held) for module, held in then.items()})
        for flag, settings in self.settings:
            for key, value in settings.items():
                setattr(flag, key, _copied(value))
        common._GUARDED.clear()
        common._GUARDED.update(self.guarded)
        absl_flags.FLAGS.unparse_flags()


def _copied(value):
    """A list copied (a Flag's validators), anything else as it is."""
    return list(value) if isinstance(value, list) else value


_EVALUATE: _Registry | None = None  # the registry with evaluate.py's flags, once defined


def _evaluate_registry() -> _Registry:
    """The registry as evaluate.py's flags module leaves it: defined on first use, from the
    test process's registry with train.py's --eps (its Flag, and every validator naming it)
    hidden; the test process's registry is put back afterwards."""
    global _EVALUATE
    if _EVALUATE is not None:
        return _EVALUATE
    from absl import flags as absl_flags

    from flags import common

    assert "flags.evaluate" not in sys.modules, "evaluate.py's flags defined outside evaluate()"
    _import_shared_flags()
    kept = _Registry.taken()
    try:
        registered = absl_flags.FLAGS._flags()
        # Hidden, not deleted: deleting a Flag also takes it out of its module's list, which
        # train.py reads (flags/run.py's run_flags).
        registered.pop("eps", None)
        common._GUARDED.discard("eps")
        for flag in {id(flag): flag for flag in registered.values()}.values():
            flag.validators = [v for v in flag.validators if "eps" not in v.get_flags_names()]
        import fbat_cli.evaluate  # noqa: F401  (defines evaluate.py's flags)

        _EVALUATE = _Registry.taken()
    finally:
        kept.put()
    return _EVALUATE


def _import_shared_flags() -> None:
    """The modules whose flags both programs have (absl's own, --traceback) imported before
    either registry is taken: both then hold their flags."""
    import absl.app  # noqa: F401
    import absl.logging  # noqa: F401

    import flags.errors  # noqa: F401
