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

Keras, which TensorFlow loads, imports IPython (to show a weights file in a notebook,
keras.saving.KerasFileEditor) and matplotlib.pyplot (keras.visualization's image galleries) if
they are installed; no program here uses either, and outside IPython they cost about half a CPU
second of the 3.2 that loading TensorFlow takes (bench/records/startup_import.py). They are kept
out while TensorFlow loads and import as usual afterwards: the evaluation's figure imports pyplot
when it draws (plots.py).

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


# Optional imports of Keras's that no program uses (above); in IPython, IPython is loaded already
# and stays as it is.
UNUSED_BY_KERAS_HERE = ("IPython", "matplotlib.pyplot")


def load_tensorflow() -> None:
    """Import TensorFlow and let it find its devices with its start-up lines left out, and
    without the modules of UNUSED_BY_KERAS_HERE that are not loaded yet."""
    if "tensorflow" in sys.modules:
        return
    # Its later INFO lines (a graph optimizer's "Starting new session", the GPUs it counted) are
    # hidden by the C++ log's level once it is initialized; warnings and errors still show.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    kept_out = [name for name in UNUSED_BY_KERAS_HERE if name not in sys.modules]
    # None in sys.modules: an import of the module raises ImportError, which Keras expects of a
    # package that is not installed.
    sys.modules.update(dict.fromkeys(kept_out))
    try:
        with held_back(NOISE):
            import tensorflow as tf

            tf.config.list_physical_devices()
    finally:
        for name in kept_out:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]


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
