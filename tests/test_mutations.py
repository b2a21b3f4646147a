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
