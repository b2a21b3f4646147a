"""The code a run or an evaluation ran, as its record keeps it (provenance.code(), "code")."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any


@dataclasses.dataclass(frozen=True)
class CodeIdentity:
    """A record's "code": the package and its version, the git revision (None: not a git
    checkout) and whether tracked files differed from it (None: unknown)."""

    package: str | None = None
    version: str | None = None
    revision: str | None = None
    dirty: bool | None = None

    @classmethod
    def of(cls, block: Mapping[str, Any] | None) -> CodeIdentity:
        """The identity a record's "code" holds; every part None for a record from before
        it was kept (no block)."""
        block = block or {}
        return cls(*(block.get(field.name) for field in dataclasses.fields(cls)))
