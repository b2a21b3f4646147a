"""A module imported where it is first used, not where it is named: the method modules declare
their options and rules with TensorFlow named but not loaded, so that a bad flag is refused
before TensorFlow starts (DESIGN.md §1.2).

    tf = later("tensorflow")        # nothing imported yet
    tf.constant(1.0)                # TensorFlow imported here, once

`tests/test_layers.py` reads `later("fbat_tf.x")` as an import of fbat_tf.x.
"""

from __future__ import annotations

import importlib
import types
from typing import Any


class _Later(types.ModuleType):
    def __getattr__(self, attribute: str) -> Any:
        # Called only for what the placeholder lacks: every name of the real module.
        return getattr(importlib.import_module(self.__name__), attribute)


def later(name: str) -> Any:
    """The module `name`, imported at its first attribute read."""
    return _Later(name)
