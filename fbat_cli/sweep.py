"""Run a sweep: a grid of train.py runs, each evaluated by evaluate.py, then a report.

    python sweep.py --sweep=fashion_mnist                 # study/definitions/fashion_mnist.json
    python sweep.py --sweep=fashion_mnist --dry_run       # the cells, their state and commands
    python sweep.py --sweep=fashion_mnist --only='fastbat-*'
    python sweep.py --sweep=fashion_mnist --report_only   # sweep.json, sweep.md, plots

    python sweep.py --sweep=paper_table2 --data_dir=/data   # where the data is, for every cell

    python sweep.py --sweep=fashion_mnist --allow_dirty   # run uncommitted code, marked so
    python sweep.py --sweep=fashion_mnist --repin         # move the sweep to the current HEAD
    python sweep.py --sweep=paper_table2 --launcher=ray   # every GPU of this machine, one a cell
    python sweep.py --sweep=paper_table2 --launcher=ray --ray_address=auto   # a Ray cluster

Cells run committed code: the first start pins the checkout's revision (revision.json) and
checks it out under `<sweep_dir>/code/`, from where every train.py and evaluate.py runs, so
that editing the code while a sweep runs cannot reach it (fbat_tf/sweeps/revision.py); a tree
with uncommitted changes is refused unless --allow_dirty. Every cell is an ordinary train.py run
in `<sweep_dir>/<cell>` (so a killed sweep resumes each cell where it stopped), then evaluate.py
runs each of the definition's evaluations (by default
PGD at every ε of the grid and AutoAttack at the cell's ε), each writing eval-<name>.json into
it, and, where the definition has a masking check that the cell's finished AutoAttack triggers,
the check's stronger attack (a cell is "check pending" until it has run). A cell that holds
them all is done and never run again; a run directory holding other flags
is refused. The whole definition is checked (flag names, values, ε, the method options, the
attacks, the data, existing run directories) before the first run starts. One line per cell
shows the time spent and an estimate of the time left; the report is rewritten after each cell.
With a "tuning" block, candidate settings of the tuned methods are first trained on tuning seeds
under `<sweep_dir>/tuning/` (validated, never tested nor evaluated), the best by validation is
written to `<sweep_dir>/tuning.json`, and the final cells of each tuned variant and ε wait for
that pick and then run with its flags (fbat_tf/sweeps/tuning.py).
The definition format is in fbat_tf/sweeps/definition.py.
"""

from __future__ import annotations

import copy
import errno
import fnmatch
import json
import os
import shlex
import sys

from absl import app  # noqa: E402
from absl import flags as absl_flags  # noqa: E402

import fbat_cli  # noqa: E402
import study  # noqa: E402
from fbat_tf import startup, sweeps  # noqa: E402
from fbat_tf.records import EvaluationResult, files  # noqa: E402
from fbat_tf.sweeps import claims, cluster, masking, revision, scheduler, tuning  # noqa: E402
from fbat_tf.sweeps.definition import is_cell_flag_name  # noqa: E402
from flags import common, usage  # noqa: E402
from flags import run as flag_words  # noqa: E402
from flags import sweep as sweep_flags  # noqa: E402
from flags import train as train_flags  # noqa: E402

# The clone the cells' code is pinned from (None where fbat-tf runs installed, not from one).
ROOT = fbat_cli.CHECKOUT
CONFIGS = os.path.join(fbat_cli.configs(), "sweeps")
# The kind scheduler.by_kind times a cell by where only its masking check is left to run.
CHECK_STAGE = "masking check"
# Set by the sweep itself for every cell.
RESERVED = ("workdir", "export", "export_dir", "verbose", "flagfile")
# train.py flags sweep.py takes on its own command line, for every command of every cell: where
# the data is on this machine, which a definition cannot know.
SWEEP_WIDE = ("data_dir", "download")


# The studies' definitions and committed cells, in a clone (study/; not installed).
STUDIES = None if ROOT is None else os.path.join(ROOT, "study", "definitions")
STUDY_RESULTS = None if ROOT is None else os.path.join(ROOT, "study", "results")


def _catalogs() -> list[str]:
    return [CONFIGS] + ([STUDIES] if STUDIES is not None and os.path.isdir(STUDIES) else [])


def definition_path(name: str) -> str:
    """A definition by path, or by name in configs/sweeps/ (the paper's kits, shipped with the
    programs) or, in a clone, study/definitions/ (the studies)."""
    for path in [name] + [os.path.join(c, f) for c in _catalogs() for f in (name, f"{name}.json")]:
        if os.path.isfile(path):
            return path
    folders = " or ".join(
        f"{os.path.basename(os.path.dirname(c))}/{os.path.basename(c)}/" for c in _catalogs()
    )
    known = sorted(f[:-5] for c in _catalogs() for f in os.listdir(c) if f.endswith(".json"))
    raise sweeps.DefinitionError(
        f"--sweep={name}: no such definition file, nor a name in {folders} ({', '.join(known)})"
    )


def default_sweep_dir(definition: sweeps.Definition) -> str:
    """Where a sweep's cells go without --sweep_dir: a study's beside its committed cells
    (study/results/<name> of the clone), any other's in results/<name>."""
    if STUDIES is not None and os.path.dirname(os.path.realpath(definition.path)) == (
        os.path.realpath(STUDIES)
    ):
        return os.path.relpath(os.path.join(STUDY_RESULTS, definition.name))
    return os.path.join("results", definition.name)


def check_flags(definition: sweeps.Definition, cells: list[sweeps.Cell], sweep_dir: str):
    """Raise DefinitionError naming the cell and what is wrong with its flags or its run
    directory, before TensorFlow loads. Returns the cells still to train and the cells still
    to evaluate."""
    to_train, to_evaluate = [], []
    for cell in cells:
        reserved = sorted(set(cell.flags) & set(RESERVED))
        if reserved:
            raise sweeps.DefinitionError(
                f"cell {cell.name}: {', '.join(reserved)} cannot be set in a sweep (the sweep "
                "sets each cell's run directory and output)"
            )
        cell_dir = os.path.join(sweep_dir, cell.name)
        values = copy.deepcopy(absl_flags.FLAGS)
        for name, value in cell.flags.items():
            # true/false become --name/--noname, which a flag of a value reads as taking the
            # next word ("--epochs=--steps_per_epoch=2").
            if isinstance(value, bool) and name in values and values[name].flag_type() != "bool":
                raise sweeps.DefinitionError(
                    f"cell {cell.name}: {name!r} is {str(value).lower()}, but --{name} is not "
                    f"a true/false flag: give it a value of its type ({values[name].flag_type()})"
                )
        words = sweeps.flag_words(cell.flags)
        try:
            values(["train.py", *words, f"--workdir={cell_dir}"])
        except absl_flags.Error as error:
            raise sweeps.DefinitionError(f"cell {cell.name}: {error}") from None
        try:
            flag_words.check_final_test(values)
            flag_words.check_norm(values)
            _ = cell.config  # its TrainConfig: a value of the wrong type names its flag
            state = flag_words.check_workdir(cell_dir, flag_words.run_flags(values))
        except ValueError as error:
            raise sweeps.DefinitionError(f"cell {cell.name}: {error}") from None
        if cell.pending and state != "new":
            raise sweeps.DefinitionError(
                f"cell {cell.name}: {cell_dir} holds a run, but {tuning.path(sweep_dir)} holds "
                f"no pick for {cell.unit}, whose flags it ran with: restore that file, or delete "
                "the cell's run to train it after tuning again"
            )
        if state != "complete":  # a finished run has shown that its options are valid
            to_train.append(cell)
        if sweeps.cell_state(cell_dir, definition) != "done":
            to_evaluate.append(cell)
    return to_train, to_evaluate


def check_runs(to_train, to_evaluate, data_ok: bool = True) -> str | None:
    """Raise DefinitionError for the method options of the cells still to train or the data of
    the cells still to evaluate (a sweep whose cells are all done checks neither). TensorFlow
    loads only for data looked for in TFDS; the methods' checks and local files need none.
    With `data_ok=False` (a dry run, perhaps on a machine without the data) missing data is
    returned as a message instead of raised."""
    if not to_evaluate:
        return None

    from fbat_tf import data

    for cell in to_train:
        try:
            flag_words.check_method(cell.config)
        except ValueError as error:
            raise sweeps.DefinitionError(f"cell {cell.name}: {error}") from None
    for dataset, data_dir, download in {
        (c.config.dataset, c.config.data_dir, c.config.download) for c in to_evaluate
    }:
        try:
            if data.needs_tensorflow(dataset, data_dir, download):
                load_tensorflow()
            data.check_available(dataset, data_dir, download)
        except (ValueError, FileNotFoundError) as error:
            if data_ok:
                raise sweeps.DefinitionError(str(error)) from None
            return str(error)
    return None


def load_tensorflow() -> None:
    """TensorFlow without its start-up lines (unless --verbosity asks for them), before a check
    that needs it imports it."""
    if not absl_flags.FLAGS["verbosity"].present:
        startup.load_tensorflow()


OVERRIDES_FILE = "overrides.json"


def parse_overrides(words: list[str] | None) -> dict:
    """--override=name=value,... as flag values: JSON numbers and booleans, else strings."""
    overrides = {}
    for word in words or []:
        name, sep, text = word.partition("=")
        if not sep or not name:
            raise sweeps.DefinitionError(f"--override={word}: give name=value")
        if not is_cell_flag_name(name.removeprefix("--")):
            raise sweeps.DefinitionError(
                f"--override={word}: {name!r} is not a train.py flag name (lower-case letters, "
                "digits and '_'); absl's own flags (flagfile, undefok, only_check_args, help...) "
                "are not a cell's"
            )
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = text
        overrides[name.removeprefix("--")] = value if not isinstance(value, (dict, list)) else text
    return overrides


def check_links(sweep_dir: str, cells: list[sweeps.Cell]) -> None:
    """DefinitionError naming the first path the sweep writes, replaces or removes that is a
    symbolic link (its folders, files and cells' run directories and logs), before anything
    is written: nothing is written or removed behind a link it did not make. A claim that is a
    link is no claim, and is taken over (claims.py)."""
    names = [revision.DIRECTORY, claims.DIRECTORY, "logs", tuning.DIRECTORY, revision.FILE]
    names += ["sweep.json", "sweep.md", tuning.FILE, OVERRIDES_FILE, *study.PLOTS.values()]
    paths = [os.path.join(sweep_dir, name) for name in names]
    for cell in cells:
        paths.append(os.path.join(sweep_dir, cell.name))
        paths += [scheduler.log_path(sweep_dir, cell.name, part) for part in ("train", "eval")]
    try:
        for path in paths:
            files.refuse_links(path, inside=sweep_dir)
    except files.LinkRefused as error:
        raise sweeps.DefinitionError(str(error)) from None


def settle_overrides(given: dict, sweep_dir: str, write: bool) -> dict:
    """The overrides of this sweep directory: those it first ran with, which a later command
    must repeat (or leave out); raise DefinitionError for others."""
    path = os.path.join(sweep_dir, OVERRIDES_FILE)
    if os.path.exists(path):
        with open(path) as f:
            kept = json.load(f)
        if given and given != kept:
            raise sweeps.DefinitionError(
                f"{sweep_dir} ran with --override={_words(kept)}; pass the same or none, or use "
                "another --sweep_dir"
            )
        return kept
    if given and write:
        os.makedirs(sweep_dir, exist_ok=True)
        files.write_json_atomic(path, given)  # never through a link
    return given


def _words(overrides: dict) -> str:
    return ",".join(
        f"{k}={json.dumps(v) if isinstance(v, bool) else v}" for k, v in overrides.items()
    )


def pin(sweep_dir: str) -> revision.Pinned:
    return revision.pin(
        sweep_dir, ROOT, allow_dirty=sweep_flags.ALLOW_DIRTY.value, repin=sweep_flags.REPIN.value
    )


def describe_pinned(code: revision.Pinned) -> str:
    if not code.pinned:
        try:
            state = f"{len(revision.changed_files(ROOT))} tracked files differ from its revision"
        except revision.RevisionError:
            state = "not a git checkout"
        return (
            f"cells run the working tree {ROOT} as it is (--allow_dirty; {state}): the report "
            "marks them"
        )
    line = f"cells run revision {code.revision[:12]} (pinned {code.started}), from {code.tree}"
    current = revision.head(ROOT)
    if current != code.revision:
        line += f"; this checkout is at {current[:12]}: --repin moves the sweep to it"
    return line


def describe_code(sweep_dir: str) -> str:
    """What a real run would run, said by a dry run, which pins nothing."""
    if sweep_flags.ALLOW_DIRTY.value:
        return f"code: the working tree {ROOT} as it is (--allow_dirty)"
    kept = revision.recorded(sweep_dir)
    if kept is not None and not sweep_flags.REPIN.value:
        return f"code: revision {kept['revision'][:12]}, pinned {kept.get('started')}"
    try:
        changed = revision.changed_files(ROOT, sweep_dir)
        current = revision.head(ROOT)
    except revision.RevisionError:
        return "code: not a git checkout; a real run needs --allow_dirty"
    if changed:
        return (
            f"code: a real run would stop here: {len(changed)} tracked files differ from "
            f"{current[:12]} (commit them, or pass --allow_dirty)"
        )
    return f"code: a real run pins revision {current[:12]}"


def _seconds_spent(definition, cell, sweep_dir: str) -> tuple[float, float | None]:
    """What a done cell recorded: its whole time (training with validation, each evaluation,
    the masking check's stronger attack too), and the check's alone (None where it ran none)."""
    record = study.cell_record(definition, cell, sweep_dir)
    seconds = record.train.train_seconds
    seconds += sum(sum(e.time_s.values()) for e in record.evaluations.values())
    check = None
    for entry in (record.masking_check or {}).values():
        # The report's paths are the sweep directory's as sweep.py was given it (from here).
        strong = entry.strong_source and EvaluationResult.read(entry.strong_source)
        if strong:
            check = (check or 0.0) + sum(attack.seconds for attack in strong.robust)
    return seconds + (check or 0.0), check


def dry_run_summary(definition, cells, states: dict[str, str], sweep_dir: str) -> str:
    """The cells by state and, where some are done, the time the others would take, each at
    the mean its kind's done cells recorded (scheduler.by_kind: tuning runs and final cells
    apart, by unit); a cell whose masking check alone is pending at the mean of the checks
    done cells of its unit ran."""
    counts: dict[str, int] = {}
    for cell in cells:
        counts[states[cell.name]] = counts.get(states[cell.name], 0) + 1
    by_state = ", ".join(f"{n} {state}" for state, n in counts.items())
    line = f"{len(cells)} cells: {by_state}"
    done, finished = [], 0
    for cell in cells:
        if states[cell.name] != "done":
            continue
        finished += 1
        whole, check = _seconds_spent(definition, cell, sweep_dir)
        done.append(((cell.stage, cell.unit), whole))
        if check is not None:
            done.append(((CHECK_STAGE, cell.unit), check))
    waiting = [
        (CHECK_STAGE if states[cell.name] == "check pending" else cell.stage, cell.unit)
        for cell in cells
        if states[cell.name] not in ("done", "diverged")
    ]
    if done and waiting:
        total = scheduler.duration(scheduler.by_kind(done, waiting))
        line += (
            f"; the {len(waiting)} to run would take about {total} of one process, each at the "
            f"mean of its kind's {finished} done cells (tuning runs, final cells and masking "
            "checks apart, by unit; their epochs and attacks, not start-up)"
        )
    return line


def refuse_train_flags() -> None:
    """train.py's flags belong in the definition: on sweep.py's command line only those that say
    where the data is on this machine."""
    given = [
        name
        for module in (train_flags, common)
        for name in (f.name for f in absl_flags.FLAGS.get_flags_for_module(module))
        if absl_flags.FLAGS[name].present and name not in SWEEP_WIDE
    ]
    if given:
        sys.exit(
            f"error: --{', --'.join(given)}: train.py flags go into the sweep definition's "
            "'flags' or 'grid', not on sweep.py's command line (which takes --data_dir and "
            "--download for every cell)"
        )


def prepare():
    """The definition, its sweep directory and chosen cells, checked whole before anything
    runs (flags, run directories, the code to pin, method options, data); and what is wrong
    with the data where a dry run goes on without it."""
    definition = sweeps.load_definition(definition_path(sweep_flags.SWEEP.value))
    # Where the data is, for every cell's every command (train.py and evaluate.py alike).
    for name in SWEEP_WIDE:
        if absl_flags.FLAGS[name].present:
            definition.flags[name] = absl_flags.FLAGS[name].value
    sweep_dir = sweep_flags.SWEEP_DIR.value or default_sweep_dir(definition)
    definition.overrides = settle_overrides(
        parse_overrides(sweep_flags.OVERRIDE.value), sweep_dir, write=False
    )
    # The picks tuning.json holds (refused where the definition's candidates changed since).
    tuning.refresh(definition, sweep_dir)
    cells = sweeps.expand(definition)
    tuning_runs = tuning.tuning_cells(definition)
    if sweep_flags.ONLY.value:
        patterns = sweep_flags.ONLY.value
        cells = [c for c in cells if any(fnmatch.fnmatch(c.name, p) for p in patterns)]
        # A chosen final cell waiting for its pick brings its unit's tuning runs along.
        waiting = {c.unit for c in cells if c.pending}
        tuning_runs = [
            c
            for c in tuning_runs
            if c.unit in waiting or any(fnmatch.fnmatch(c.name, p) for p in patterns)
        ]
        if not cells and not tuning_runs:
            raise sweeps.DefinitionError(f"--only={','.join(patterns)} matches no cell")
    # Tuning runs first: the final cells of a tuned unit wait for their pick.
    cells = [*tuning_runs, *cells]
    check_links(sweep_dir, cells)
    to_train, to_evaluate = check_flags(definition, cells, sweep_dir)
    if not (sweep_flags.DRY_RUN.value or sweep_flags.REPORT_ONLY.value) and to_evaluate:
        # A tree whose code cannot be pinned is refused before TensorFlow loads.
        revision.check(
            sweep_dir,
            ROOT,
            allow_dirty=sweep_flags.ALLOW_DIRTY.value,
            repin=sweep_flags.REPIN.value,
        )
    elif sweep_flags.DRY_RUN.value:
        revision.recorded(sweep_dir)  # a damaged record, named before TensorFlow loads
    data_problem = check_runs(to_train, to_evaluate, data_ok=not sweep_flags.DRY_RUN.value)
    return definition, sweep_dir, cells, data_problem


def print_commands(definition, cells, states: dict[str, str], sweep_dir: str) -> None:
    """One shell line per cell still to run, for a scheduler (a job array, one per GPU),
    running the pinned revision: it is checked out here, for the lines to run it."""
    try:
        code = pin(sweep_dir)
    except revision.RevisionError as error:
        sys.exit(f"error: {error}")
    waiting = []
    for cell in cells:
        if states[cell.name] in ("done", "diverged"):  # a diverged run is not run again
            continue
        if cell.pending:  # its flags are not known until its unit's pick is written
            waiting.append(cell.name)
            continue
        # What is left of the cell: a cell whose check is pending runs the check alone.
        argv = scheduler.remaining(definition, cell, sweep_dir)
        if not argv:
            continue
        chain = " && ".join(shlex.join(scheduler.program(words, code)) for words in argv.values())
        print(f"cd {shlex.quote(os.getcwd())} && {chain}")
    if waiting:
        print(
            f"{len(waiting)} cells wait for tuning picks and are not printed: once the tuning "
            "lines above have run, `sweep.py --dry_run --print_commands` again writes the picks "
            f"into {tuning.path(sweep_dir)} and prints them",
            file=sys.stderr,
        )
    if definition.masking_check is not None and any(
        states[c.name] not in ("done", "check pending", "diverged") for c in cells
    ):
        print(
            "note: a cell's masking check is decided from its finished AutoAttack evaluation: "
            "once these lines have run, print the lines again for the checks they trigger",
            file=sys.stderr,
        )


def dry_run(definition, cells, states: dict[str, str], sweep_dir: str, data_problem) -> None:
    """The code a real run would run, the time estimate, each cell's state and commands."""
    print(describe_code(sweep_dir))
    found = sweeps.estimate.estimate(definition)
    if found:
        print(sweeps.estimate.describe(found))
    if data_problem:
        print(f"warning: a real run would stop here: {data_problem}")
    for cell in cells:
        print(f"{cell.name}: {states[cell.name]}")
        cell_dir = os.path.join(sweep_dir, cell.name)
        if states[cell.name] == "check pending":
            print(f"  {masking.pending_reason(definition.masking_check, cell_dir)}")
        missing = sweeps.missing_budgets(definition, cell, cell_dir)
        for part, words in sweeps.commands(definition, cell, sweep_dir, missing).items():
            print(f"  {part}: {shlex.join(['python', *words])}")
        if cell.pending:
            print(f"  (then with the flags of {cell.unit}'s tuning pick)")
    print(dry_run_summary(definition, cells, states, sweep_dir))


def run(definition, cells, states: dict[str, str], sweep_dir: str) -> None:
    """Run the cells not done (nor diverged) from the pinned code, then write the report."""
    diverged = [c.name for c in cells if states[c.name] == "diverged"]
    to_run = [c for c in cells if states[c.name] not in ("done", "diverged")]
    code = None
    if to_run:
        try:
            code = pin(sweep_dir)
        except revision.RevisionError as error:
            sys.exit(f"error: {error}")
    settle_overrides(definition.overrides, sweep_dir, write=True)
    if definition.overrides:
        print(f"every cell with --override={_words(definition.overrides)}: not comparable")
    runs = sum(c.stage == "tuning" for c in cells)
    print(
        f"sweep {definition.name}: {len(cells)} cells"
        + (f" ({runs} of them tuning runs)" if runs else "")
        + ", "
        f"{len(cells) - len(to_run) - len(diverged)} done, "
        + (f"{len(diverged)} diverged, " if diverged else "")
        + f"{len(to_run)} to run, in {sweep_dir}",
        flush=True,
    )
    if code is not None:
        print(describe_pinned(code), flush=True)
    if sweep_flags.LAUNCHER.value == "ray" and to_run:
        resources = cluster.Resources(
            address=sweep_flags.RAY_ADDRESS.value,
            cpus_per_cell=sweep_flags.CPUS_PER_CELL.value,
            retries=sweep_flags.CELL_RETRIES.value,
        )
        try:
            outcome = cluster.run_cells_on_ray(
                definition,
                to_run,
                sweep_dir,
                code,
                resources,
                study.rewrite,
                wait_seconds=sweep_flags.WAIT_SECONDS.value,
            )
        except cluster.LauncherError as error:
            sys.exit(f"error: {error}")
    else:
        outcome = scheduler.run_cells(
            definition, to_run, sweep_dir, code, study.rewrite, sweep_flags.WAIT_SECONDS.value
        )
    diverged += outcome.diverged
    paths = study.rewrite(definition, sweep_dir)
    print(f"report: {paths['markdown']}, {paths['json']} and plots in {sweep_dir}")
    if diverged:
        print(f"{len(diverged)} cells diverged in training: {', '.join(diverged)}")
    if outcome.failed:
        sys.exit(f"error: {len(outcome.failed)} cells failed: {', '.join(outcome.failed)}")


WAITING = "waiting for tuning"


def cell_states(definition, cells, sweep_dir: str) -> dict[str, str]:
    """Each cell's state; a final cell whose unit has no pick yet is waiting for tuning."""
    states = {}
    for cell in cells:
        state = sweeps.cell_state(os.path.join(sweep_dir, cell.name), definition)
        states[cell.name] = WAITING if cell.pending and state == "new" else state
    return states


def current_cells(definition, cells):
    """The cells again, with the picks `definition` holds now."""
    final = {c.name: c for c in sweeps.expand(definition)}
    return [final.get(c.name, c) if c.stage == "final" else c for c in cells]


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    refuse_train_flags()
    if ROOT is None:
        sys.exit(
            "error: a sweep pins its cells' code by git revision and runs it from a clone of "
            "fbat-tf, which this installed copy is not: clone the repository, pip install -e . "
            "in it and run python sweep.py there (fbat-train, fbat-evaluate and fbat-export run "
            "installed)"
        )
    ray_only = [f"--{n}" for n in sweep_flags.RAY_ONLY if absl_flags.FLAGS[n].present]
    if ray_only and sweep_flags.LAUNCHER.value != "ray":
        sys.exit(f"error: {', '.join(ray_only)}: for --launcher=ray only")
    if sweep_flags.LAUNCHER.value == "ray":
        try:
            cluster.check_ray()  # before anything is written
            cluster.check_reachable(absl_flags.FLAGS["ray_address"].value)
        except cluster.LauncherError as error:
            sys.exit(f"error: {error}")
    try:
        definition, sweep_dir, cells, data_problem = prepare()
    except (sweeps.DefinitionError, revision.RevisionError) as error:
        sys.exit(f"error: {error}")
    if sweep_flags.REPORT_ONLY.value:
        report = study.collect(definition, sweep_dir)
        for line in study.unreadable_cells(report):
            print(line, file=sys.stderr)
        try:
            paths = study.write_report(report, sweep_dir)
        except OSError as error:
            if error.errno != errno.ENOSPC:
                raise
            sys.exit(
                f"error: no space left on the device writing {error.filename or sweep_dir}: "
                "free some space and run the same command again (the report is written anew "
                "from the cells' files, which it does not change)"
            )
        print("\n".join(f"{kind}: {path}" for kind, path in paths.items()))
        return
    if sweep_flags.DRY_RUN.value and sweep_flags.PRINT_COMMANDS.value:
        # Picks whose tuning runs have all finished are written, for their cells' lines.
        tuning.settle(definition, sweep_dir)
        cells = current_cells(definition, cells)
    states = cell_states(definition, cells, sweep_dir)
    if sweep_flags.DRY_RUN.value and sweep_flags.PRINT_COMMANDS.value:
        print_commands(definition, cells, states, sweep_dir)
    elif sweep_flags.DRY_RUN.value:
        dry_run(definition, cells, states, sweep_dir, data_problem)
    else:
        run(definition, cells, states, sweep_dir)


def run_program() -> None:
    """The program as `python sweep.py` and `fbat-sweep` run it: --help, then main."""
    usage.run(__doc__, {"flags.sweep": "Sweep", "flags.errors": "Errors"}, main)


if __name__ == "__main__":
    run_program()
