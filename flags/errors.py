"""One rule for failures in every entry point: one line saying what failed, on which file where
there is one, exit non-zero; Python's traceback only with --traceback.

    app.run(errors.guarded(main))

Expected refusals (a bad flag, a run with other flags, a refused file) are told by the entry
points themselves; this catches the rest (a truncated checkpoint, a full disk, a corrupt
record) so that none ends in a traceback the user did not ask for.
"""

from __future__ import annotations

import errno
import re
import sys
from collections.abc import Callable

from absl import app, flags

TRACEBACK = flags.DEFINE_bool(
    "traceback", False, "On an error, show Python's traceback instead of one line."
)


def describe(error: BaseException) -> str:
    """The error in one line, naming its file where it has one."""
    if isinstance(error, OSError) and error.strerror:
        where = error.filename or ""
        if error.errno == errno.ENOSPC:
            return (
                f"no space left on the device writing {where or 'a file'}: free some space and "
                "run the same command again (a training run resumes from its last epoch)"
            )
        return f"{where}: {error.strerror}" if where else error.strerror
    text = " ".join(str(error).split()) or "(no message)"
    # TensorFlow's writers (checkpoints, TensorBoard events) and h5py report a full disk as an
    # error of their own ("… <path>; No space left on device …"): told as the OSError above is.
    full = re.search(r"(\S+); No space left on device", text) or re.search(
        r"filename = '([^']+)'.*No space left on device", text
    )  # h5py's
    if full or "No space left on device" in text:
        return describe(OSError(errno.ENOSPC, "No space left on device", full and full.group(1)))
    if len(text) > 600:
        text = text[:600] + " ..."
    # The library's own refusals say what is wrong in words; others are named by their kind.
    return text if type(error) in (ValueError, RuntimeError) else f"{type(error).__name__}: {text}"


def guarded(main: Callable[[list[str]], None]) -> Callable[[list[str]], None]:
    def run(argv: list[str]) -> None:
        try:
            main(argv)
        except KeyboardInterrupt:
            if TRACEBACK.value:
                raise
            # One line, no traceback: what was finished stays (runs resume, results are
            # written whole or not at all). On a terminal it starts a line of its own, not the
            # end of a progress bar's.
            if sys.stdout.isatty():
                sys.stdout.write("\n")
                sys.stdout.flush()
            sys.exit(
                "interrupted: what was finished is kept; the same command again resumes a "
                "training run or a sweep, and starts an evaluation over"
            )
        except (SystemExit, app.UsageError):
            raise
        except Exception as error:
            if TRACEBACK.value:
                raise
            sys.exit(f"error: {describe(error)} (--traceback shows where it failed)")

    return run
