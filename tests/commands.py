"""A program's command line as a user types it, with an optional prelude: Python run first in
the same process, e.g. to make a package unimportable and show that the program never needs it
on that path."""

from __future__ import annotations

import sys

# A prelude that makes `package` unimportable.
BLOCK = "sys.modules[{!r}] = None"
NO_TENSORFLOW = BLOCK.format("tensorflow")


def python_command(program: str, *args: str, prelude: str = "") -> list[str]:
    """`python program args...` (`program` "-m" runs the module args[0]), with `prelude` run
    first where given."""
    if not prelude:
        return [sys.executable, program, *args]
    module = program == "-m"
    target = args[0] if module else program
    argv = [target, *(args[1:] if module else args)]
    runner = "runpy.run_module" if module else "runpy.run_path"
    code = (
        f"import runpy, sys\n{prelude}\nsys.argv = {argv!r}\n"
        f"{runner}({target!r}, run_name='__main__'" + (", alter_sys=True)" if module else ")")
    )
    return [sys.executable, "-c", code]
