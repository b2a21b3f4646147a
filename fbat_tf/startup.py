"""Loading TensorFlow without its start-up lines.

    startup.load_tensorflow()        # before anything imports tensorflow; the entry points call it

TensorFlow 2.21 writes, on import and when it first looks for devices, lines that
TF_CPP_MIN_LOG_LEVEL no longer hides (absl's C++ log writes everything before it is
initialized): "All log messages before absl::InitializeLog() ...", oneDNN's and the CUDA stub's
INFO lines, the CPU instruction notice, and on a machine without a GPU "E0000 ... failed call to
cuInit: UNKNOWN ERROR (303)", which reads as a failure on a CPU machine. While TensorFlow loads
and finds its devices, the process's standard error goes to a file; afterwards every line of it
but those is written out again, so a real warning or error still shows; TensorFlow's later
INFO lines are left out by TF_CPP_MIN_LOG_LEVEL=1 (unless the environment sets it). absl's
--verbosity asks for them all (the entry points then do not call this).

    with startup.held_back(pattern):  # other native lines (LiteRT's), held back the same way
        ...
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import threading

# What TensorFlow prints on every start: INFO lines (I…), absl's pre-initialization notice, the
# CPU instruction notice, and the CUDA probe's failure where there is no GPU.
NOISE = re.compile(
    r"^(I\d{4} |WARNING: All log messages before absl::InitializeLog\(\)|"
    r"To enable the following instructions:|This TensorFlow binary is optimized|"
    r"E\d{4} .*(failed call to cuInit|Unable to register cu\w+ factory))"
)


def load_tensorflow() -> None:
    """Import TensorFlow and let it find its devices with its start-up lines left out."""
    if "tensorflow" in sys.modules:
        return
    # Its later INFO lines (a graph optimizer's "Starting new session", the GPUs it counted) are
    # hidden by the C++ log's level once it is initialized; warnings and errors still show.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    with held_back(NOISE):
        import tensorflow as tf

        tf.config.list_physical_devices()


# File descriptor 2 is the process's: one block at a time redirects it (two threads each
# saving and restoring it could leave it pointing at the other's closed file).
_HOLDING = threading.RLock()  # a block inside another holds back into the outer one


@contextlib.contextmanager
def held_back(noise: re.Pattern):
    """Inside the block, what the process writes to its standard error goes to a file; afterwards
    every line of it that `noise` does not match is written out again. Native code's log writes
    to file descriptor 2, whatever sys.stderr is (pytest, for one, gives sys.stderr a file of its
    own)."""
    fd = 2
    with _HOLDING, tempfile.TemporaryFile() as captured:
        sys.stderr.flush()
        saved = os.dup(fd)
        os.dup2(captured.fileno(), fd)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, fd)
            os.close(saved)
            captured.seek(0)
            kept = [
                line
                for line in captured.read().decode(errors="replace").splitlines()
                if line.strip() and not noise.match(line)
            ]
            if kept:
                sys.stderr.write("\n".join(kept) + "\n")
