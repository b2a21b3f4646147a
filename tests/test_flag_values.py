"""Every float flag of every entry point refuses NaN and infinity, and every text flag a line
break, however the flag is defined (a method's or an attack's declared option included)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# In a fresh process per entry point (their flags share absl's one registry): import the
# program's flag module, then parse each float flag at NaN, +inf and -inf, and each text flag
# with a line break, one at a time, recording what absl accepted.
_PROBE = """
import json, sys
from absl import flags
import importlib
importlib.import_module(sys.argv[1])
accepted, floats, texts = [], [], []
for name, flag in sorted(flags.FLAGS._flags().items()):
    if name != flag.name:
        continue  # a short name
    kind = flag.flag_type()
    if kind == "float":
        floats.append(name)
        values = ["nan", "inf", "-inf"]
    elif kind == "string":
        texts.append(name)
        values = ["a\\nb"]
    else:
        continue
    for value in values:
        try:
            flags.FLAGS(["program", f"--{name}={value}"])
        except flags.Error:
            pass
        else:
            accepted.append(f"--{name}={value!r}")
        flags.FLAGS.unparse_flags()
print(json.dumps({"accepted": accepted, "floats": floats, "texts": texts}))
"""


@pytest.mark.parametrize("module", ["flags.train", "flags.evaluate", "flags.sweep"])
def test_every_float_flag_refuses_nan_and_infinity(module):
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, module],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["accepted"] == []
    if module == "flags.train":  # the declared options are among those checked
        assert {"ig_coef", "ga_coef", "nfgsm_noise", "lambda_inv", "fastat_step"} <= set(
            found["floats"]
        )


@pytest.mark.parametrize("given", ["--ig_coef=nan", "--lambda_inv=inf", "--nfgsm_noise=inf"])
def test_train_py_refuses_a_non_finite_method_option_at_once(given):
    done = subprocess.run(
        [sys.executable, "train.py", given],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    name = given[2:].partition("=")[0]
    assert done.returncode != 0 and f"--{name} must be a finite number" in done.stderr


@pytest.mark.parametrize(
    "program, given, meant",
    [
        ("train.py", "--eps=0.03", "--eps=7.65 (7.65/255 ≈ 0.03)"),
        ("train.py", "--lambda_inv=9.8", "--lambda_inv=2500 (2500/255 ≈ 9.8)"),
        ("evaluate.py", "--eps=4,0.031", "--eps=7.91 (7.91/255 ≈ 0.031)"),
    ],
)
def test_a_budget_in_pixel_units_is_refused_with_the_value_meant(program, given, meant):
    done = subprocess.run(
        [sys.executable, program, given, *(["--model_path=."] if program == "evaluate.py" else [])],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode != 0
    assert "is in 1/255 units" in done.stderr and f"did you mean {meant}" in done.stderr
    if meant.startswith("--eps"):  # or an L2 budget, whose ε is in pixel units
        assert f"did you mean {meant} (or --norm=l2, whose ε is in pixel units)?" in done.stderr
    else:
        assert f"did you mean {meant}?" in done.stderr
    assert "--allow_small_units" in done.stderr


def test_allow_small_units_keeps_a_small_budget():
    probe = (
        "from absl import flags as absl_flags; import flags.train; "
        "absl_flags.FLAGS(['train.py', '--eps=0.5', '--allow_small_units']); "
        "print(absl_flags.FLAGS.eps)"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and done.stdout.strip() == "0.5", done.stderr[-2000:]
