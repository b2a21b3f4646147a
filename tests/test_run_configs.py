"""One form of a run's configuration: train.py's flags and a sweep cell's flags become the same
TrainConfig through one conversion (fbat_tf/methods/configs.py), units converted there, a
value of the wrong type refused naming its flag, and no TensorFlow loaded for a sweep's cells."""

from __future__ import annotations

import copy
import dataclasses
import glob
import os
import subprocess
import sys

import pytest
from absl import flags as absl_flags

from fbat_tf.methods import configs
from fbat_tf.sweeps import definition, tuning
from flags import run as flag_words

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _definitions():
    return sorted(
        glob.glob(os.path.join(ROOT, "configs", "sweeps", "*.json"))
        + glob.glob(os.path.join(ROOT, "study", "definitions", "*.json"))
    )


@pytest.mark.parametrize("path", _definitions(), ids=os.path.basename)
def test_a_sweep_cell_and_train_py_make_the_same_config(path):
    """Every cell of each committed definition (tuning runs included): its flags read as the
    cell's TrainConfig equal what train.py makes of the same flags on its command line (parsed
    by absl, settled on this CPU machine), field by field."""
    found = definition.load_definition(path)
    cells = [*tuning.tuning_cells(found), *definition.grid_cells(found)]
    assert cells
    for cell in cells:
        values = copy.deepcopy(absl_flags.FLAGS)
        values(["train.py", *definition.flag_words(cell.flags), f"--workdir={cell.name}"])
        from_command_line = flag_words.config_from_flags(cell.name, values)
        assert dataclasses.asdict(cell.config) == dataclasses.asdict(from_command_line), cell.name


def test_units_are_converted_once_by_hand():
    config = configs.train_config(
        {"method": "fastbat", "eps": 16, "lambda_inv": 2500, "ig": "none"}, "w"
    )
    assert config.eps == pytest.approx(16 / 255)
    assert config.method_options["lambda_inv"] == pytest.approx(2500 / 255)
    assert config.method_options["ig"] == "none"
    l2 = configs.train_config({"method": "pgd", "norm": "l2", "eps": 0.5}, "w")
    assert l2.eps == pytest.approx(0.5)  # L2's ε is in pixel units already
    # Flags not named take train.py's defaults: 8/255, 20 epochs; Fast-BAT's λ⁻¹ by ε (None).
    default = configs.train_config({}, "w")
    assert (default.eps, default.epochs, default.method) == (pytest.approx(8 / 255), 20, "fastbat")
    assert default.method_options["lambda_inv"] is None


def test_device_values_settle_as_on_a_cpu():
    config = configs.train_config({"method": "fastbat"}, "w")
    assert (config.precision, config.jit_compile) == ("float32", False)
    assert config.method_options["implicit_autodiff"] == "backward_over_backward"
    asked = configs.train_config({"precision": "mixed_float16", "jit_compile": "true"}, "w")
    assert (asked.precision, asked.jit_compile) == ("mixed_float16", True)


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        ("epochs", "8", "--epochs is '8', not an int"),
        ("eval_autoattack", "false", "--eval_autoattack is 'false', not a bool"),
        ("lr_max", True, "--lr_max is True, not a float"),
    ],
)
def test_a_value_of_the_wrong_type_names_its_flag(flag, value, says):
    with pytest.raises(ValueError, match=says):
        configs.train_config({flag: value}, "w")


def test_a_sweep_cell_is_read_without_tensorflow():
    code = (
        "import sys\n"
        "from fbat_tf.sweeps import definition, estimate\n"
        f"found = definition.load_definition({_definitions()[0]!r})\n"
        "[cell.config for cell in definition.grid_cells(found)]\n"
        "estimate.estimate(found)\n"
        "assert 'tensorflow' not in sys.modules, 'TensorFlow was loaded'\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)
