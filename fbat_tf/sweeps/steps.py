"""The commands of one cell, run one after another: what every launcher runs for a cell, in
this process or on a Ray worker. Only the standard library: a Ray worker runs it as it is sent,
whatever fbat-tf it has installed, and the programs come from the sweep's pinned code.

    seconds = run_steps(steps, cwd)      # {"train": s, "evaluate": s}; RuntimeError on failure
"""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import os
import shlex
import signal
import socket
import subprocess
import sys
import time


@dataclasses.dataclass(frozen=True)
class Step:
    """One program of a cell: `python <argv>` with the program from the sweep's code."""

    part: str  # "train", or the evaluation's name
    command: list[str]  # the interpreter, the program's path and its arguments
    log: str  # its output is appended here
    # A file that must exist before it runs, and what to say where it does not.
    needs: tuple[str, str] | None = None


def _die_with_parent() -> None:
    """In a child, before it runs: be killed when the process that started it dies (Linux),
    so that a killed Ray worker leaves no train.py behind to hold its run directory."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def run_step(step: Step, cwd: str, env: dict[str, str], where: str | None = None) -> None:
    """Run one step, its output appended to its log (after a line naming `where` it runs,
    where given); RuntimeError with the log's end if it fails. Its paths are read from `cwd`,
    as the driver named them: a worker of a cluster has a working directory of its own."""
    log_path = os.path.join(cwd, step.log)
    if step.needs is not None and not os.path.exists(os.path.join(cwd, step.needs[0])):
        raise RuntimeError(step.needs[1])
    with _open_log(log_path) as log:
        if where:
            log.write(f"\n# on {where}")
        log.write(f"\n$ {shlex.join(['python', *step.command[1:]])}\n")
        log.flush()
        status = subprocess.run(
            step.command,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
            preexec_fn=_die_with_parent,
        ).returncode
    if status != 0:
        with open(log_path) as log:
            tail = log.read()[-2000:]
        program = os.path.basename(step.command[1])
        raise RuntimeError(f"{program} failed (exit {status}); end of {step.log}:\n{tail}")


def _open_log(path: str):
    """The log opened to append, never through a symbolic link: O_NOFOLLOW, as
    fbat_tf/records/files.py's open_own opens (this module uses the standard library only, for
    the Ray workers it is sent to), and RuntimeError naming the file where one is there."""
    try:
        descriptor = os.open(
            path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666
        )
    except OSError as error:
        if error.errno != errno.ELOOP:
            raise
        raise RuntimeError(
            f"{path}: a symbolic link, and fbat-tf writes and removes only what it makes itself, "
            "never through a link: move the link away (or name another path) and run the "
            "command again"
        ) from None
    return os.fdopen(descriptor, "a")


def node_name() -> str:
    """Where this runs: on a Ray worker its node ("node 1a2b3c4d (10.0.0.5)", the node ID's
    first 8 digits and its address), else this host's name."""
    ray = sys.modules.get("ray")
    try:
        node = ray.get_runtime_context().get_node_id() if ray and ray.is_initialized() else None
    except Exception:  # no worker context: not on a Ray worker
        node = None
    if not node:
        return socket.gethostname()
    return f"node {node[:8]} ({ray.util.get_node_ip_address()})"


def check_paths(paths: dict[str, str], where: str | None = None) -> None:
    """RuntimeError naming this node (or host) and the first of `paths` ({what: path}) it
    does not see: a worker of a cluster must see the sweep's directories at the paths the
    driver named."""
    for what, path in paths.items():
        if not os.path.exists(path):
            raise RuntimeError(
                f"{where or node_name()}: {what} {path} does not exist here; every worker must "
                "see it at the same path (a shared filesystem)"
            )


def run_steps(
    steps: list[Step], cwd: str, paths: dict[str, str] | None = None, where: str | None = None
) -> dict[str, float]:
    """Run a cell's steps in order from `cwd` (where sweep.py was started, so that relative
    paths mean what they mean to it), after checking `paths`; the seconds of its training and
    of its evaluations. `where` (a Ray node's name) is written into each step's log."""
    check_paths({"the working directory": cwd, **(paths or {})}, where)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    spent = {"train": 0.0, "evaluate": 0.0}
    for step in steps:
        start = time.perf_counter()
        run_step(step, cwd, env, where)
        spent["train" if step.part == "train" else "evaluate"] += time.perf_counter() - start
    return spent


def run_steps_on_node(
    steps: list[Step], cwd: str, paths: dict[str, str] | None = None
) -> tuple[dict[str, float], str]:
    """`run_steps` on a Ray worker: its seconds, and the node it ran on (`node_name`), which
    each step's log also names."""
    where = node_name()
    return run_steps(steps, cwd, paths, where), where
