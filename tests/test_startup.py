"""startup.load_tensorflow without the optional modules Keras would import, and
startup.held_back: native lines held back from the process's standard error, the others
written out again, and the process's standard error itself left as it was, also when threads
hold lines back at once (a LiteRT file per thread)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import threading

import pytest

from fbat_tf import startup


def test_noise_is_held_back_and_every_other_line_comes_out():
    code = (
        "import os, re\n"
        "from fbat_tf import startup\n"
        "with startup.held_back(re.compile(r'^INFO: noise')):\n"
        "    os.write(2, b'INFO: noise\\nwarning: kept\\n')\n"
        "os.write(2, b'after\\n')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "warning: kept\nafter\n"


def test_threads_holding_back_at_once_leave_standard_error_as_it_was():
    before = os.fstat(2)

    def hold():
        for _ in range(50):
            with startup.held_back(re.compile(r"^noise")):
                os.write(2, b"noise\n")

    threads = [threading.Thread(target=hold) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    after = os.fstat(2)
    assert (after.st_dev, after.st_ino) == (before.st_dev, before.st_ino)


LOADED = """
import sys
{before}
from fbat_tf import startup
startup.load_tensorflow()
print(sorted(name for name in ("IPython", "matplotlib.pyplot") if name in sys.modules))
import matplotlib.pyplot as plt
figure, axes = plt.subplots()
print(type(figure).__name__)
if {ipython}:
    import IPython
    print(IPython.get_ipython())
"""


@pytest.mark.slow
def test_tensorflow_loads_without_ipython_and_pyplot_which_then_import_as_usual():
    """Keras's optional IPython and pyplot are not imported while TensorFlow loads, outside
    IPython; afterwards both import and work. Loaded before, IPython stays loaded. (IPython is
    no dependency of the project: where it is not installed, its part is left out.)"""
    ipython = importlib.util.find_spec("IPython") is not None
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", MPLBACKEND="Agg")
    cases = [("", ["[]", "Figure"] + ["None"] * ipython)]
    if ipython:
        cases.append(("import IPython", ["['IPython']", "Figure", "None"]))
    for before, said in cases:
        done = subprocess.run(
            [sys.executable, "-c", LOADED.format(before=before, ipython=ipython)],
            capture_output=True,
            text=True,
            env=env,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert done.stdout.splitlines() == said, done.stdout
