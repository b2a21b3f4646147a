"""The mutation check (tests/mutations.py, outside CI) stays applicable: each mutation's text is
found once in the file it changes, and the tests named to catch it exist."""

from __future__ import annotations

import ast
import os

import pytest

from tests import mutations


@pytest.mark.parametrize("mutation", mutations.MUTATIONS, ids=lambda m: m.key)
def test_each_mutation_applies_once_and_names_tests_that_exist(mutation):
    with open(os.path.join(mutations.ROOT, mutation.path)) as f:
        assert f.read().count(mutation.old) == 1, f"{mutation.key} no longer applies once"
    for test in mutation.tests:
        path, _, name = test.partition("::")
        name = name.partition("[")[0]  # a parametrized case: its function
        with open(os.path.join(mutations.ROOT, path)) as f:
            tree = ast.parse(f.read())
        if name:
            defined = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
            assert name in defined, f"{mutation.key}: {test} does not exist"


def test_the_scratch_copy_is_the_tracked_tree_its_links_kept_its_results_left_out(tmp_path):
    """Each mutation runs in a copy of the tracked tree: the link fbat_cli/configs stays a link
    (copying it as a file stopped every mutation before it ran), the committed results stay out."""
    tree = mutations.scratch_copy(str(tmp_path))
    assert os.path.islink(os.path.join(tree, "fbat_cli", "configs"))
    assert os.path.isfile(os.path.join(tree, "fbat_cli", "configs", "fashion_mnist_demo.flags"))
    assert os.path.isfile(os.path.join(tree, "study", "definitions", "fashion_mnist.json"))
    assert not os.path.exists(os.path.join(tree, "study", "results"))
