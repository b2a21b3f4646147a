"""One rule for failures in every entry point: one line saying what failed, on which file where
there is one, exit non-zero; Python's traceback only with --traceback.

    app.run(errors.guarded(main))

Expected refusals (a bad flag, a run with other flags, a refused file) are told by the entry
points themselves; this catches the rest (a truncated checkpoint, a full disk, a corrupt
record) so that none ends in a traceback the user did not ask for.
"""

from __future__ import annotations

import errno
import os
import re
import signal
import socket
import sys
import threading
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


INTERRUPTED = (
    "interrupted: what was finished is kept; the same command again resumes a training run or "
    "a sweep, and starts an evaluation over"
)
# Ctrl-C while TensorFlow holds the interpreter (Square's search of thousands of queries in one
# call, an XLA compilation): Python's handler runs only once that call returns. The line is
# said after SAY_SECONDS anyway, and the process ends after EXIT_SECONDS if it has not by then.
INTERRUPT_SAY_SECONDS = 2.0
INTERRUPT_EXIT_SECONDS = 10.0
_said = threading.Event()  # the line of an interrupt is said once


def _interrupted_line() -> None:
    """The one line of an interrupt (once); on a terminal it starts a line of its own, not the
    end of a progress bar's."""
    if _said.is_set():
        return
    _said.set()
    if sys.stdout.isatty():
        sys.stdout.write("\n")
        sys.stdout.flush()
    sys.stderr.write(INTERRUPTED + "\n")
    sys.stderr.flush()


def _prompt_interrupts() -> threading.Event:
    """Make Ctrl-C answer at once whatever runs: the signal's C-level handler writes to a
    wakeup descriptor, and a thread reading it says the line where Python's own handler has
    not within INTERRUPT_SAY_SECONDS, and ends the process where it has not ended within
    INTERRUPT_EXIT_SECONDS (its cleanup, a run directory given up, done by then where Python
    got to run). Nothing half-written is kept either way: records are replaced whole and a
    run resumes from its last epoch, as after a kill. Returns the event the program sets once
    it has handled the interrupt itself."""
    handled = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        return handled
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return handled  # SIGINT ignored, or handled by someone else: left as it is
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    try:
        signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    except ValueError:
        return handled

    def watch() -> None:
        while received := reader.recv(16):
            if signal.SIGINT not in received or handled.wait(INTERRUPT_SAY_SECONDS):
                continue
            _interrupted_line()
            if not handled.wait(INTERRUPT_EXIT_SECONDS - INTERRUPT_SAY_SECONDS):
                os._exit(1)

    _KEPT.append((reader, writer))  # open for as long as the process runs
    threading.Thread(target=watch, name="interrupts", daemon=True).start()
    return handled


_KEPT: list[tuple[socket.socket, socket.socket]] = []


def guarded(main: Callable[[list[str]], None]) -> Callable[[list[str]], None]:
    def run(argv: list[str]) -> None:
        handled = _prompt_interrupts()
        try:
            main(argv)
        except KeyboardInterrupt:
            handled.set()
            if TRACEBACK.value:
                raise
            # One line, no traceback: what was finished stays (runs resume, results are
            # written whole or not at all).
            _interrupted_line()
            sys.exit(1)
        except (SystemExit, app.UsageError):
            raise
        except Exception as error:
            if TRACEBACK.value:
                raise
            sys.exit(f"error: {describe(error)} (--traceback shows where it failed)")

    return run
