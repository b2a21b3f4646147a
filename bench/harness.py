"""What the bench scripts share: child processes and their result line, turns and medians, timed
steps and the memory they take, the machine and its load, the command line and the output.

    _REPEATS, _WARMUP = define_steps(repeats=10, warmup=3)  # --repeats, --warmup
    _ROUNDS = define_rounds()                                # --rounds
    runs = children_in_turns(__file__, ["fastat", "fastbat"], rounds=3)  # {name: [per round]}
    medians = run_per_method(__file__, ["fastat", "fastbat"], rounds=3)   # {name: medians}
    measured = timed_steps(step, warmup=2, repeats=5, batch_size=64)   # time, memory
    with load_average() as load: ...                        # load["before"], load["after"]
    markdown = table("A heading", ["method", "time (s)"], [["fastat", "0.41"]])
    publish(markdown, summary, "bench/results/x.json")      # print the table, write the JSON
    publish(markdown, summary, "x.json", markdown_path="x.md")  # and the table beside it

A child is the calling script run again with `--child=<name>`; it prints one line
`RESULT <json>` (`report`). The parent passes on its own flags except --methods, --json and
--rounds. With several rounds the names take turns (A B A B A B), so that a slow drift in the
machine's background load hits each alike, and each number reported is the median over rounds.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from absl import flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)  # fbat_tf, for scripts run from a checkout without installing it

RESULT = "RESULT "
T = TypeVar("T")


def module_at(path: str, revision: str):
    """The module in file `path` (from the repository's root) as it was at a git revision,
    read with `git show` and imported under a name of its own, beside today's package."""
    source = subprocess.run(
        ["git", "show", f"{revision}:{path}"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    name = os.path.splitext(os.path.basename(path))[0] + "_before"
    file = os.path.join(tempfile.mkdtemp(), f"{name}.py")
    with open(file, "w") as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Child processes and turns.


def report(result: dict) -> None:
    """What a child prints for its parent."""
    print(RESULT + json.dumps(result))


def run_child(
    command: list[str], label: str, env: dict[str, str] | None = None, echo: bool = False
) -> dict:
    """Run `command` and return what it printed on its last RESULT line; exit with its stderr
    if it failed. `echo` prints the rest of its standard output."""
    child = subprocess.run(command, capture_output=True, text=True, env=env)
    lines = [line for line in child.stdout.splitlines() if line.startswith(RESULT)]
    if child.returncode != 0 or not lines:
        sys.exit(f"error: {label} failed:\n{child.stderr[-3000:]}")
    if echo:
        print(child.stdout.replace(lines[-1], "").strip(), flush=True)
    return json.loads(lines[-1][len(RESULT) :])


def in_turns(
    calls: dict[str, Callable[[], T]], rounds: int, alternate: bool = False
) -> dict[str, list[T]]:
    """Each call once per round, in turns; `alternate` reverses the order every other round.
    {name: what it returned in each round}."""
    returned: dict[str, list[T]] = {name: [] for name in calls}
    for index in range(rounds):
        order = list(reversed(calls)) if alternate and index % 2 else list(calls)
        for name in order:
            returned[name].append(calls[name]())
    return returned


def define_rounds(
    help_text: str = "Child processes per method, taking turns; numbers are medians.",
) -> flags.FlagHolder:
    """The --rounds flag (default 1)."""
    return flags.DEFINE_integer("rounds", 1, help_text, lower_bound=1)


def children_in_turns(script: str, names: list[str], rounds: int = 1) -> dict[str, list[dict]]:
    """`script --child=<name>` for each name, in turns: {name: its result in each round}."""
    passed = [a for a in sys.argv[1:] if not a.startswith(("--methods", "--json", "--rounds"))]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    calls = {
        name: functools.partial(
            run_child,
            [sys.executable, os.path.abspath(script), f"--child={name}", *passed],
            name,
            env,
        )
        for name in names
    }
    return in_turns(calls, rounds)


def run_per_method(script: str, names: list[str], rounds: int = 1) -> dict[str, dict]:
    """`children_in_turns`, each name's results merged by `median_of`."""
    runs = children_in_turns(script, names, rounds)
    return {name: median_of(measured) for name, measured in runs.items()}


def median_of(measured: list[dict]) -> dict:
    """Numbers: the median over rounds; anything else: the first round's value."""
    merged = dict(measured[0])
    for key, value in merged.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            merged[key] = statistics.median(m[key] for m in measured)
    return merged


def parse_variant(text: str) -> tuple[str, dict]:
    """The name and options of `name:key=value:key=value`; values as int, float, bool or str.

    >>> parse_variant("fastbat:ig=none:ig_coef=0.1")
    ('fastbat', {'ig': 'none', 'ig_coef': 0.1})
    """
    name, *pairs = text.split(":")
    options = {}
    for pair in pairs:
        key, equals, value = pair.partition("=")
        if not (key and equals):
            raise ValueError(f"{text!r}: options are written name:key=value, not {pair!r}")
        options[key] = _option_value(value)
    return name, options


def _option_value(text: str) -> object:
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def variant_label(text: str) -> str:
    """A variant's name in tables and JSON: "fastbat:ig=none" -> "fastbat ig=none"."""
    name, options = parse_variant(text)
    return " ".join([name, *(f"{key}={value}" for key, value in options.items())])


def run_evaluate(arguments: list[str], env: dict[str, str]) -> tuple[float, dict, Any]:
    """evaluate.py with `arguments` in a child process, as a user runs it from the repository's
    root, its JSON written to a temporary file: (wall time in s, the load around it, its
    EvaluationResult). Exits with its stderr if it failed."""
    from fbat_tf.records import EvaluationResult

    with tempfile.TemporaryDirectory() as scratch:
        path = os.path.join(scratch, "eval.json")
        command = [sys.executable, os.path.join(ROOT, "evaluate.py"), *arguments]
        with load_average() as load:
            start = time.perf_counter()
            child = subprocess.run(
                [*command, f"--results={path}"], capture_output=True, text=True, env=env, cwd=ROOT
            )
            wall = time.perf_counter() - start
        if child.returncode != 0:
            sys.exit(f"error: evaluate.py failed:\n{child.stderr[-3000:]}")
        return wall, load, EvaluationResult.load(path)


# Timed steps and their memory.


def resident_mb() -> float:
    """This process's resident set now."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def define_steps(repeats: int, warmup: int) -> tuple[flags.FlagHolder, flags.FlagHolder]:
    """The --repeats and --warmup flags of `timed_steps`."""
    return (
        flags.DEFINE_integer("repeats", repeats, "Timed steps.", lower_bound=1),
        flags.DEFINE_integer("warmup", warmup, "Untimed steps first.", lower_bound=0),
    )


def timed_steps(
    step: Callable[[], object],
    warmup: int,
    repeats: int,
    batch_size: int,
    steps_per_call: int = 1,
    gpu: bool = False,
) -> dict:
    """`warmup` untimed calls of `step` (which must wait for its result), then `repeats` timed.

    {"step_time_s": the median call's time / `steps_per_call`, "images_per_s", "times_s" (each
    call's), "peak_memory_mb", "step_memory_mb"}: on a GPU (`gpu`, TensorFlow's first) the
    allocator's peak over the timed calls, both; on the CPU the process's peak resident set,
    and what the calls added to the resident set of the process built so far (model, data,
    runtime)."""
    before = resident_mb()
    for _ in range(warmup):
        step()
    if gpu:
        import tensorflow as tf

        tf.config.experimental.reset_memory_stats("GPU:0")
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    if gpu:
        peak = tf.config.experimental.get_memory_info("GPU:0")["peak"] / 2**20
        added = peak
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
        added = peak - before
    seconds = statistics.median(times) / steps_per_call
    return {
        "step_time_s": seconds,
        "images_per_s": batch_size / seconds,
        "times_s": times,
        "peak_memory_mb": peak,
        "step_memory_mb": added,
    }


# The machine and its load.


def machine() -> dict:
    """The processor, the cores this process may use, its niceness and the versions."""
    from fbat_tf import provenance

    found = provenance.machine()
    return {
        **{key: found[key] for key in ("cpu", "cpu_count", "cpus_usable")},
        "niceness": os.nice(0),
        **{key: found[key] for key in ("platform", "python", "tensorflow", "keras")},
        "torch": provenance.package_version("torch"),
    }


@contextlib.contextmanager
def load_average() -> Iterator[dict]:
    """The 1-minute load average before and after the block: other processes skew CPU times."""
    load = {"before": os.getloadavg()[0]}
    try:
        yield load
    finally:
        load["after"] = os.getloadavg()[0]


def describe(machine: dict, load: dict | None = None, torch: bool = False) -> str:
    """The machine (and the load around a measurement) for a table's heading; `torch`: with
    PyTorch's version."""
    packages = (("tensorflow", "TF"), ("keras", "Keras"), ("torch", "torch"))[: 3 if torch else 2]
    versions = ", ".join(f"{label} {machine[key]}" for key, label in packages if machine.get(key))
    text = f"{machine['cpu_count']} CPU cores, {versions}"
    if load:
        text += f", 1-min load average {load['before']:.1f} → {load['after']:.1f}"
    return text


# The command and the output.


def table(heading: str | None, columns: list[str], rows: list[list[object]]) -> str:
    """A heading line (if any), then a Markdown table: its columns' names, one line per row."""
    lines = [] if heading is None else [heading, ""]
    lines += ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["|" + "".join(f" {cell} |" if str(cell) else " |" for cell in row) for row in rows]
    return "\n".join(lines)


def command_line() -> str:
    """How this script was called, from the repository's root."""
    script = os.path.relpath(os.path.abspath(sys.argv[0]), ROOT)
    return " ".join(["python", script, *sys.argv[1:]])


def write_json(path: str | None, payload: dict) -> None:
    from fbat_tf.records.files import open_own

    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open_own(path, "w") as f:  # never through a link (O_NOFOLLOW)
            json.dump(payload, f, indent=2)


def publish_taking_turns(table: list[str], rows: list[dict], rounds: int, turns: str, path: str):
    """A decision record's table of medians over `rounds` fresh processes of each setting, the
    settings (`turns`: what they are) taking turns: printed, and written to `path` (JSON: the
    command, the rounds and `rows`) and beside it as Markdown."""
    lines = [
        *table,
        "",
        f"Medians of {rounds} fresh processes each, the {turns} taking turns; "
        f"load average at the end: {os.getloadavg()[0]:.2f}.",
    ]
    payload = {"command": " ".join(sys.argv), "rounds": rounds, "rows": rows}
    publish("\n".join(lines), payload, path, path.removesuffix(".json") + ".md")


def publish(
    markdown: str, payload: dict, path: str | None, markdown_path: str | None = None
) -> None:
    """Print the Markdown table, write the JSON (if `path`) and the Markdown, ending in a newline
    (if `markdown_path`)."""
    print(markdown)
    write_json(path, payload)
    if markdown_path:
        from fbat_tf.records.files import open_own

        with open_own(markdown_path, "w") as f:  # never through a link (O_NOFOLLOW)
            f.write(markdown + "\n")
