"""sweep.py --launcher=ray across nodes, on one machine: a local Ray cluster of a head (which
runs no cell) and two worker nodes of one CPU each (`ray.cluster_utils.Cluster`, as Ray's own
tests make one), the driver joining it by address as on a real cluster. Cells land on both
nodes, and each cell's log names the node it ran on; a worker node removed while it trains a
cell is named by the driver, the cell runs again on the other node (its training resuming
from its last epoch), and every cell finishes with the numbers of the sequential launcher."""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from tests.test_ray_launcher import EPOCHS, TWO, _same_numbers, needs_data
from tests.trees import project_copy

pytestmark = [pytest.mark.slow, needs_data]

# The Ray launcher's two cells (its sequential run shared): the second long enough to remove its
# node in the middle of its training.
DEFINITION = TWO
# A head that runs no cell, and no dashboard: the driver joining a cluster only reads its address
# (the local launcher's own instance, with its dashboard, is tests/test_ray_launcher.py's).
HEAD = {"num_cpus": 0, "include_dashboard": False}
NODE_LINE = re.compile(r"^# on (node ([0-9a-f]{8}) \([^)]*\))$", re.MULTILINE)


@pytest.fixture
def cluster(monkeypatch):
    """A head without CPUs for tasks, and two worker nodes of one CPU each."""
    from ray.cluster_utils import Cluster

    scratch = tempfile.mkdtemp(prefix="rayc", dir="/tmp")  # Ray's socket paths must be short
    monkeypatch.setenv("RAY_TMPDIR", scratch)
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "3")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    started = Cluster(initialize_head=True, head_node_args=HEAD)
    for _ in range(2):
        started.add_node(num_cpus=1)
    started.wait_for_nodes()
    try:
        yield started
    finally:
        started.shutdown()
        shutil.rmtree(scratch, ignore_errors=True)


def _nodes_of(log: str) -> list[tuple[str, str]]:
    """The nodes a cell's log says its steps ran on, in order: (name, node ID's first 8)."""
    if not os.path.exists(log):
        return []
    with open(log) as f:
        return NODE_LINE.findall(f.read())


def _epochs(cell_dir: str) -> int:
    try:
        with open(os.path.join(cell_dir, "results.json")) as f:
            return len(json.load(f)["history"])
    except (OSError, ValueError, KeyError):
        return 0


def test_cells_run_on_both_nodes_and_a_lost_nodes_cell_finishes_on_the_other(
    tmp_path, cluster, sequential_two
):
    tree = project_copy(tmp_path, {"two": DEFINITION})

    command = [sys.executable, "sweep.py", "--allow_dirty", "--sweep=two", "--launcher=ray"]
    command += [f"--ray_address={cluster.address}", "--cpus_per_cell=1"]
    command += ["--sweep_dir=results/ray"]
    driver = subprocess.Popen(
        command,
        cwd=tree,
        env=dict(os.environ, PYTHONPATH=tree),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    ray_dir = os.path.join(tree, "results", "ray")
    logs = os.path.join(ray_dir, "logs")
    # Wait for a Fast-AT cell in the middle of its training, and remove the node it runs on.
    victim, deadline = None, time.time() + 600
    while victim is None and time.time() < deadline and driver.poll() is None:
        for log in glob.glob(os.path.join(logs, "fastat-*.train.log")):
            cell = os.path.basename(log).removesuffix(".train.log")
            on = _nodes_of(log)
            if on and 1 <= _epochs(os.path.join(ray_dir, cell)) < EPOCHS:
                victim = (cell, *on[-1])
                break
        time.sleep(0.2)
    assert victim is not None, driver.communicate()[0][-3000:]
    cell, lost_name, lost_id = victim
    (node,) = [n for n in cluster.list_all_nodes() if n.node_id.startswith(lost_id)]
    cluster.remove_node(node, allow_graceful=False)
    out, _ = driver.communicate(timeout=900)
    assert driver.returncode == 0, out[-3000:]

    # The driver named the lost node and ran the cell again elsewhere.
    # Said when Ray reports the cell's task lost with its node, or when the driver sees the node
    # gone while Ray runs the task again itself, whichever comes first.
    said = (
        f"{cell}: {lost_name} left the cluster while it ran the cell; it runs again",
        f"{lost_name} left the cluster (2 nodes left): {cell} run again on another node",
    )
    assert any(line in out for line in said), out[-3000:]
    ran_on = _nodes_of(os.path.join(logs, f"{cell}.train.log"))
    assert ran_on[0][0] == lost_name and ran_on[-1][0] != lost_name, ran_on
    # Cells landed on both worker nodes, and every line of a finished cell names its node.
    every = {name for log in glob.glob(os.path.join(logs, "*.log")) for name, _ in _nodes_of(log)}
    assert len(every) == 2, every
    assert len(re.findall(r"^\[\d/2\] .* \(on node [0-9a-f]{8} \(", out, re.MULTILINE)) == 2, out
    # Every cell finished, with the sequential launcher's numbers.
    assert len(_same_numbers(ray_dir, sequential_two)) == 2


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs util-linux's unshare")
def test_a_node_that_does_not_see_the_sweep_directory_fails_its_cell_at_once_naming_both(
    tmp_path, monkeypatch
):
    """A worker node whose filesystem lacks the sweep directory (started in a mount namespace
    of its own, with an empty folder mounted over the project's results/): its cell fails at
    once, naming the node and the path, and the cell on the node that sees it finishes."""
    from ray.cluster_utils import Cluster

    two = {**DEFINITION, "grid": [{"method": ["standard"], "eps": [8], "seed": [0, 1]}]}
    tree = project_copy(tmp_path, {"two": two})
    results = os.path.join(tree, "results")
    os.makedirs(results)
    scratch = tempfile.mkdtemp(prefix="rayc", dir="/tmp")
    monkeypatch.setenv("RAY_TMPDIR", scratch)
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "3")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    started = Cluster(initialize_head=True, head_node_args=HEAD)
    good = started.add_node(num_cpus=1)
    hidden = ["mount", "-t", "tmpfs", "tmpfs", results]
    joined = ["ray", "start", f"--address={started.address}", "--num-cpus=1", "--block"]
    other = subprocess.Popen(
        ["unshare", "-m", "sh", "-c", f"{' '.join(hidden)} && exec {' '.join(joined)}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        started.wait_for_nodes(3)  # the head, the good node and the other
        command = [sys.executable, "sweep.py", "--allow_dirty", "--sweep=two", "--launcher=ray"]
        command += [f"--ray_address={started.address}", "--cpus_per_cell=1", "--cell_retries=0"]
        done = subprocess.run(
            command,
            cwd=tree,
            env=dict(os.environ, PYTHONPATH=tree),
            capture_output=True,
            text=True,
            timeout=900,
        )
    finally:
        os.killpg(other.pid, 9)
        other.wait()
        started.shutdown()
        shutil.rmtree(scratch, ignore_errors=True)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out[-3000:]
    sweep_dir = os.path.join(tree, "results", "two")
    said = re.search(
        r"node ([0-9a-f]{8}) \([^)]*\): the sweep directory (\S+) does not exist here; every "
        r"worker must see it at the same path",
        out,
    )
    assert said is not None, out[-3000:]
    assert not good.node_id.startswith(said.group(1)) and said.group(2) == sweep_dir
    assert "error: 1 cells failed: standard-eps8-seed" in done.stderr
    (finished,) = glob.glob(os.path.join(sweep_dir, "*", "eval-pgd.json"))
    assert _nodes_of(os.path.join(sweep_dir, "logs", f"{finished.split(os.sep)[-2]}.train.log"))
