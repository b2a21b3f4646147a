"""Running a sweep's cells as Ray tasks: on every GPU of a machine, or across the machines of a
Ray cluster (KubeRay, `ray start` on SLURM nodes).

    check_ray()                                    # LauncherError naming the install command
    outcome = run_cells_on_ray(definition, to_run, sweep_dir, code, Resources(...), report)

Each cell is one task, holding one GPU where the cluster has GPUs (else `cpus_per_cell` CPUs),
so Ray runs as many cells at once as the cluster holds and gives each its own device
(CUDA_VISIBLE_DEVICES). A task runs the cell's steps (fbat_tf/sweeps/steps.py, sent to the
worker as code, not imported there) from the sweep's pinned code, which lies under the sweep
directory: every worker must see the sweep directory, the working directory and any
--data_dir at the paths the driver names (a shared filesystem), or the cell fails at once
saying so. Results land in the sweep directory as with the sequential launcher, so a driver
started again finishes the sweep without running a finished cell again (a cell cut short
resumes from its last epoch). A failed cell is retried `retries` times, then reported with
the end of its log; a diverged cell is a finding, not retried. Each cell's log names the node
each of its steps ran on, and its progress line the node it finished on; a node that leaves the
cluster is named with the cells it held, which run again on another node (not a retry
spent). The driver holds each running cell's claim (claims.py), so that sweep.py processes
without Ray leave those cells alone.
Tuning runs are queued first; a final cell of a tuned unit stays in the queue, other cells
passing it, until the last tuning run of its unit has finished and its pick is written
(tuning.py), then runs with the pick's flags. A tuning run another process holds is looked at
again until it is done, since final cells wait for it.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
import time
from collections.abc import Callable
from typing import Any

from fbat_tf.sweeps import claims, revision, steps, tuning
from fbat_tf.sweeps.definition import Cell, Definition
from fbat_tf.sweeps.results import cell_state
from fbat_tf.sweeps.scheduler import (
    Outcome,
    Report,
    by_kind,
    diverged_line,
    duration,
    finished_line,
    needs_check,
    new_runs,
    plan,
    ready,
    rewrite_report,
)

INSTALL = 'pip install -e ".[cluster]"'


class LauncherError(RuntimeError):
    """The Ray launcher cannot start: Ray is missing, or the cluster cannot be reached."""


def check_ray() -> None:
    """LauncherError unless Ray can be imported."""
    try:
        import ray  # noqa: F401
    except ImportError:
        raise LauncherError(f"--launcher=ray needs Ray: {INSTALL}") from None


@dataclasses.dataclass(frozen=True)
class Resources:
    """Where the cells run and what each holds."""

    address: str | None = None  # a running cluster ("auto", "HOST:PORT"); None: this machine
    cpus_per_cell: float = 1.0  # on a cluster without GPUs
    retries: int = 1  # a failed cell's further attempts
    num_cpus: int | None = None  # CPUs of a local instance (None: all of this machine's)


# How long a cluster's head may take to answer before the sweep gives up on it: Ray itself
# retries an unreachable address for many minutes.
CONNECT_SECONDS = 20.0


def check_reachable(address: str | None, timeout: float = CONNECT_SECONDS) -> None:
    """LauncherError (one line) where `address` names a HOST:PORT (or ray://HOST:PORT) that
    does not accept a connection within `timeout`; "auto", "local" and None are Ray's to find."""
    if address in (None, "auto", "local"):
        return
    import socket

    hostport = address.removeprefix("ray://")
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise LauncherError(f"--ray_address={address}: give HOST:PORT, ray://HOST:PORT or auto")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except OSError as error:
        raise LauncherError(
            f"--ray_address={address}: no Ray cluster answers there within {timeout:g} s "
            f"({error}); start one (ray start --head) or check the address"
        ) from None


def connect(resources: Resources) -> dict[str, Any]:
    """Ray started on this machine (all its GPUs), or joined at `address`: the cluster's
    resources and its dashboard's address."""
    check_reachable(resources.address)
    import ray

    try:
        context = ray.init(
            address=resources.address or "local",
            num_cpus=None if resources.address else resources.num_cpus,
            log_to_driver=False,
            include_dashboard=None,
        )
    except (ConnectionError, OSError, RuntimeError, ValueError) as error:
        where = resources.address or "this machine"
        raise LauncherError(f"Ray could not start or connect at {where}: {error}") from None
    return {"resources": ray.cluster_resources(), "dashboard": context.dashboard_url}


def slots(cluster: dict[str, float], resources: Resources) -> tuple[int, dict[str, float]]:
    """How many cells the cluster runs at once, and what each task asks for."""
    gpus = int(cluster.get("GPU", 0))
    if gpus:
        return gpus, {"num_gpus": 1, "num_cpus": 1}
    per_cell = resources.cpus_per_cell
    return max(1, int(cluster.get("CPU", 1) // per_cell)), {"num_cpus": per_cell}


def _paths(definition: Definition, sweep_dir: str, code: revision.Pinned) -> dict[str, str]:
    paths = {"the sweep directory": os.path.abspath(sweep_dir), "the sweep's code": code.tree}
    if definition.flags.get("data_dir"):
        paths["--data_dir"] = os.path.abspath(definition.flags["data_dir"])
    return paths


def run_cells_on_ray(
    definition: Definition,
    to_run: list[Cell],
    sweep_dir: str,
    code: revision.Pinned,
    resources: Resources,
    report: Report,
    say: Callable[[str], None] = lambda line: print(line, flush=True),
    wait_seconds: float = 20.0,
    complain: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
) -> Outcome:
    """Run the cells as Ray tasks, as many at once as the cluster holds; one line per finished
    cell (its time; cells done, running and to run; the time left), the report rewritten after
    each."""
    import ray
    from ray import cloudpickle

    cluster = connect(resources)
    capacity, asks = slots(cluster["resources"], resources)
    say(
        f"Ray: {capacity} cells at a time ({', '.join(f'{k}={v:g}' for k, v in asks.items())} "
        f"each); dashboard at {cluster['dashboard'] or 'none (pip install ray[default])'}"
    )
    # The worker gets the steps' code with the task, whatever fbat-tf it has installed.
    cloudpickle.register_pickle_by_value(steps)
    task = ray.remote(max_retries=0, **asks)(steps.run_steps_on_node)
    paths, cwd = _paths(definition, sweep_dir, code), os.getcwd()
    driver = _Driver(
        definition,
        sweep_dir,
        resources,
        report,
        say,
        complain,
        start=lambda cell: task.remote(plan(definition, cell, sweep_dir, code), cwd, paths),
        capacity=capacity,
        total=len(to_run),
        # Tuning runs first: a final cell of a tuned unit waits in the queue for its pick.
        queue=sorted(to_run, key=lambda c: c.stage != "tuning"),
        attempts=dict.fromkeys((c.name for c in to_run), 0),
        begin=time.perf_counter(),
        nodes=_alive_nodes(),
    )
    try:
        while driver.queue or driver.running:
            # Nodes added to the cluster meanwhile take cells too.
            driver.capacity = max(driver.capacity, slots(ray.cluster_resources(), resources)[0])
            driver.fill()
            driver.watch_nodes()
            if driver.running:
                driver.collect_one()
            elif driver.queue:  # else every cell left was done, or another process's
                driver.wait_for_picks(wait_seconds)
    finally:
        for _, claim in driver.running.values():
            claim.release()
        ray.shutdown()
    return driver.outcome


def _logs(sweep_dir: str, cell: Cell) -> list[str]:
    return [os.path.join(sweep_dir, "logs", f"{cell.name}.{p}.log") for p in ("train", "evaluate")]


def _log_sizes(sweep_dir: str, cell: Cell) -> dict[str, int]:
    """How long a cell's logs are now: where the lines of its next task begin."""
    return {
        path: os.path.getsize(path) if os.path.exists(path) else 0
        for path in _logs(sweep_dir, cell)
    }


def _ran_on(sweep_dir: str, cell: Cell, since: dict[str, int]) -> set[str]:
    """The nodes a cell's steps ran on since its task started (`since`: its logs' sizes then),
    as the logs' "# on" lines name them."""
    nodes = set()
    for path in _logs(sweep_dir, cell):
        try:
            with open(path, "rb") as f:
                f.seek(since.get(path, 0))
                text = f.read().decode(errors="replace")
        except OSError:
            continue
        nodes.update(line[5:].strip() for line in text.splitlines() if line.startswith("# on "))
    return nodes


def _alive_nodes() -> dict[str, str]:
    """The cluster's nodes alive now: their names as steps.node_name gives them, by node ID."""
    import ray

    return {
        n["NodeID"]: f"node {n['NodeID'][:8]} ({n['NodeManagerAddress']})"
        for n in ray.nodes()
        if n.get("Alive")
    }


@dataclasses.dataclass
class _Driver:
    """The cells of a sweep as Ray tasks: those queued, those running (by task reference, each
    with its claim), and what became of those that ended."""

    definition: Definition
    sweep_dir: str
    resources: Resources
    report: Report
    say: Callable[[str], None]
    complain: Callable[[str], None]
    start: Callable[[Cell], Any]  # a cell's task started, its reference
    capacity: int
    total: int
    queue: list[Cell]
    attempts: dict[str, int]
    begin: float  # time.perf_counter() when the first cell was queued
    running: dict[Any, tuple[Cell, claims.Claim]] = dataclasses.field(default_factory=dict)
    spent_cells: list[tuple[tuple[str, str | None], float]] = dataclasses.field(
        default_factory=list
    )
    # Cells whose masking check runs as a second task, with the first task's seconds.
    checking: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    outcome: Outcome = dataclasses.field(default_factory=Outcome)
    finished: int = 0
    nodes: dict[str, str] = dataclasses.field(default_factory=dict)  # alive, as last seen
    # Each running cell's logs' sizes when its task started: its task's lines come after.
    log_sizes: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)

    def fill(self) -> None:
        """Start queued cells while the cluster has room for them; a cell that is done, or
        that another process runs, counts as finished, and one not ready stays queued."""
        waiting = []
        while self.queue and len(self.running) < self.capacity:
            cell = ready(self.definition, self.queue[0], self.sweep_dir)
            if cell is None:  # a final cell whose unit has no pick yet
                waiting.append(self.queue.pop(0))
                continue
            self.queue.pop(0)
            if cell_state(os.path.join(self.sweep_dir, cell.name), self.definition) == "done":
                self.finished += 1
                continue
            claim = claims.take(self.sweep_dir, cell.name)
            if claim is None and cell.stage == "tuning":
                # Its unit's final cells wait for it: looked at again until it is done,
                # and taken over should its process die.
                waiting.append(cell)
                continue
            if claim is None:
                self.complain(f"{cell.name}: another sweep.py process runs it; left to it")
                self.finished += 1
                continue
            self.attempts[cell.name] += 1
            self.log_sizes[cell.name] = _log_sizes(self.sweep_dir, cell)
            self.running[self.start(cell)] = (cell, claim)
        # Runs a unit's grid gained where its best sat at an edge (tuning.grow).
        known = [*self.queue, *waiting, *(cell for cell, _ in self.running.values())]
        fresh = [
            c
            for c in new_runs(self.definition, known, self.sweep_dir)
            if c.name not in self.attempts
        ]
        for cell in fresh:
            self.attempts[cell.name] = 0
        self.total += len(fresh)
        self.queue = sorted(fresh + waiting + self.queue, key=lambda c: c.stage != "tuning")

    def wait_for_picks(self, wait_seconds: float) -> None:
        """Nothing runs, and what is left are final cells waiting for picks and tuning runs
        another process holds: a final cell whose pick cannot come fails, saying why, and the
        driver waits while no cell left is ready."""
        for cell in [c for c in self.queue if c.stage == "final"]:
            reason = tuning.blocked(
                self.definition, cell, self.sweep_dir, self.outcome.failed, self.queue
            )
            if reason is not None:
                self.queue.remove(cell)
                self.outcome.failed.append(cell.name)
                self.finished += 1
                self.complain(f"{cell.name}: FAILED: not run: {reason}")
        if self.queue and not any(ready(self.definition, c, self.sweep_dir) for c in self.queue):
            time.sleep(wait_seconds)

    def collect_one(self) -> None:
        """The next task to end: its cell's claim released, and the cell failed, retried or
        diverged, queued again for its masking check, or done."""
        import ray

        # A few seconds at most, so that a node that leaves the cluster is said at once.
        done, _ = ray.wait(list(self.running), num_returns=1, timeout=5.0)
        if not done:
            return
        (ref,) = done
        cell, claim = self.running.pop(ref)
        claim.release()
        counter = f"[{self.finished + 1}/{self.total}] {cell.name}"
        try:
            spent, where = ray.get(ref)
        except ray.exceptions.NodeDiedError as error:
            self.lost(cell, str(error))
            return
        except ray.exceptions.RayError as error:
            self.failed(cell, counter, str(getattr(error, "cause", None) or error))
            return
        counter = f"{counter} (on {where})"
        if needs_check(self.definition, cell, self.sweep_dir) and cell.name not in self.checking:
            # Its AutoAttack just triggered the masking check: one more task, for it alone.
            self.checking[cell.name] = spent
            self.attempts[cell.name] = 0
            self.say(f"{cell.name}: AutoAttack shows signs of gradient masking; masking check next")
            self.queue.insert(0, cell)
            return
        self.succeeded(cell, counter, spent)

    def watch_nodes(self) -> None:
        """Say which nodes left the cluster since last looked, and the running cells they held
        (their logs name the node each step ran on): Ray runs such a cell again on another
        node, where its training resumes from its last epoch."""
        now = _alive_nodes()
        for node, name in self.nodes.items():
            if node not in now:
                held = [
                    c.name
                    for c, _ in self.running.values()
                    if name in _ran_on(self.sweep_dir, c, self.log_sizes.get(c.name, {}))
                ]
                where = f": {', '.join(held)} run again on another node" if held else ""
                self.say(f"{name} left the cluster ({len(now)} nodes left){where}")
        self.nodes = now

    def lost(self, cell: Cell, reason: str) -> None:
        """A cell whose node left the cluster while it ran (Ray's NodeDiedError, whose `reason`
        names the node): queued again for another node, where its training resumes from its
        last epoch, without spending one of its retries."""
        node = re.search(r"node ID: ([0-9a-f]+)", reason)
        address = re.search(r"Node IP: (\S+?)[,.]?\s", reason)
        name = "its node"
        if node:
            name = f"node {node.group(1)[:8]} ({address.group(1) if address else '?'})"
            self.nodes.pop(node.group(1), None)  # said here, not again by watch_nodes
        self.attempts[cell.name] -= 1
        self.say(f"{cell.name}: {name} left the cluster while it ran the cell; it runs again")
        self.queue.insert(0, cell)

    def failed(self, cell: Cell, counter: str, reason: str) -> None:
        """A task that raised: a diverged cell is a finding, a failed one is tried again until
        its retries are spent, then reported with the end of its log."""
        cell_dir = os.path.join(self.sweep_dir, cell.name)
        if cell_state(cell_dir) == "diverged":  # a finding, not a failure
            self.outcome.diverged.append(cell.name)
            self.finished += 1
            self.say(diverged_line(counter, cell_dir))
        elif self.attempts[cell.name] <= self.resources.retries:
            lines = [line for line in reason.splitlines() if line.strip()] or ["failed"]
            first = lines[0] if len(lines) == 1 else f"{lines[0]} … {lines[-1]}"
            self.say(
                f"{cell.name}: failed (attempt {self.attempts[cell.name]} of "
                f"{self.resources.retries + 1}), trying again: {first}"
            )
            self.queue.insert(0, cell)
        else:
            self.outcome.failed.append(cell.name)
            self.finished += 1
            self.complain(f"{counter}: FAILED after {self.attempts[cell.name]} attempts\n{reason}")

    def succeeded(self, cell: Cell, counter: str, spent: dict[str, float]) -> None:
        """A cell finished: its line (its time, the cells running and to run, the time left at
        the mean of the cells of each kind so far, scheduler.by_kind) and the report rewritten."""
        earlier = self.checking.pop(cell.name, None)
        if earlier is not None:
            spent = {part: spent[part] + earlier[part] for part in spent}
        self.finished += 1
        self.spent_cells.append(((cell.stage, cell.unit), sum(spent.values())))
        left_cells = [*self.queue, *(c for c, _ in self.running.values())]
        left = by_kind(self.spent_cells, [(c.stage, c.unit) for c in left_cells]) / self.capacity
        self.say(
            f"{counter}: {finished_line(cell, spent)}; "
            f"{len(self.running)} running, {len(self.queue)} to run; "
            f"sweep {duration(time.perf_counter() - self.begin)} spent, about "
            f"{duration(left)} left"
        )
        rewrite_report(self.report, self.definition, self.sweep_dir)
