"""--help for the entry points: their own flags, by topic, with defaults, and exit status 0.

absl's --help lists only the flags the main module itself defines (ours live in flags/) and
exits 1; `own_help` answers --help, -h and --helpshort before absl sees them.
"""

from __future__ import annotations

import sys

from absl import flags

ASKED = {"--help", "-h", "--helpshort", "-?"}


def own_help(description: str, modules: dict[str, str]) -> None:
    """If --help was asked for: print `description`, then each module's flags under its title
    ({module name: title}), and exit 0."""
    if not ASKED & set(sys.argv[1:]):
        return
    lines = [description.strip(), ""]
    for module, title in modules.items():
        listed = flags.FLAGS.module_help(module).strip().splitlines()[1:]  # no "module:" line
        if listed:
            lines += [f"{title}:", *listed, ""]
    lines.append("--helpfull also lists absl's and TensorFlow's own flags.")
    print("\n".join(lines))
    sys.exit(0)


def run(description: str, modules: dict[str, str], main) -> None:
    """An entry point's run: --help answered by `own_help`, else absl runs `main` under
    errors.guarded (one line for a failure or Ctrl-C)."""
    from absl import app

    from flags import errors

    own_help(description, modules)
    app.run(errors.guarded(main))
