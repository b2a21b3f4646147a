"""A run's TrainConfig from train.py's flag values: the one conversion train.py and sweep.py share.

    config = train_config({"method": "fastbat", "eps": 16, "lambda_inv": 2500}, "runs/a")
    config.eps, config.method_options["lambda_inv"]      # 16/255 and 2500/255: pixel units
    config = train_config(flag_values, "runs/a", on_cpu=False)   # "auto" settled on this machine
    config = on_device(train_config(values, "runs/a"), requested(values))   # the same, in two
                                                          # steps: checked first, settled after

`values` are train.py's flags by flag name, as absl parses them or as a sweep definition's JSON
gives them (a flag not named is at its default). Every unit conversion of the command line
happens here: ε by its norm (records/units.py), a method option through its `from_flag`. The
values train.py settles on its device ("auto" precision, XLA and Fast-BAT's implicit_autodiff)
are settled as on a machine without GPU or TPU unless `on_cpu=False` asks this one (which loads
TensorFlow); a sweep reads none of them, and a run's results.json records what it ran with.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from fbat_tf.methods import entry
from fbat_tf.records import TrainConfig, units
from fbat_tf.records.config import config_from_dict

# TrainConfig's fields that train.py's flags set otherwise than by value: ε (1/255 units under
# L∞), the method's options (a flag each), the values settled on the device, and Keras'
# verbosity (an enum flag of digits).
_CONVERTED = ("workdir", "eps", "method_options", "precision", "jit_compile", "verbose")


@dataclasses.dataclass(frozen=True)
class Requested:
    """What a run asks of its device, as its flags give it ("auto": the device decides): the
    precision, XLA, and the method options the device settles (Fast-BAT's implicit_autodiff)."""

    precision: Any = "auto"
    jit_compile: Any = "auto"
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)


def requested(values: Mapping[str, Any]) -> Requested:
    """What `values` (train.py's flags by name) ask of the device."""
    found = entry(values.get("method", TrainConfig(workdir="").method))
    return Requested(
        values.get("precision", "auto"),
        values.get("jit_compile", "auto"),
        {
            option.name: values.get(found.flag_name(option), option.default)
            for option in found.options
            if option.on_device is not None
        },
    )


def on_device(config: TrainConfig, asked: Requested, on_cpu: bool = False) -> TrainConfig:
    """`config` with what `asked` leaves to the device settled on this machine (which loads
    TensorFlow; `on_cpu=True`: as on a machine without GPU or TPU, without)."""
    from fbat_tf import device

    found = entry(config.method)
    settled = {
        option.name: option.on_device(asked.options[option.name], on_cpu)
        for option in found.options
        if option.on_device is not None
    }
    return dataclasses.replace(
        config,
        precision=device.resolve_precision(asked.precision, on_cpu),
        jit_compile=device.resolve_jit_compile(asked.jit_compile, on_cpu),
        method_options={**config.method_options, **settled},
    )


def train_config(values: Mapping[str, Any], workdir: str, on_cpu: bool = True) -> TrainConfig:
    """The run's TrainConfig; ValueError naming the flag whose value is not of its type."""
    defaults = TrainConfig(workdir=workdir)
    given = {
        field.name: values[field.name]
        for field in dataclasses.fields(TrainConfig)
        if field.name in values and field.name not in _CONVERTED
    }
    method = given.get("method", defaults.method)
    norm = given.get("norm", defaults.norm)
    found = entry(method)
    options = {}
    for option in found.options:
        value = values.get(found.flag_name(option), option.default)
        if option.from_flag is not None:
            value = option.from_flag(value)
        if option.on_device is not None:  # as on a CPU here; on_device settles it otherwise
            value = option.on_device(value, True)
        options[option.name] = value
    eps = values.get("eps")
    given.update(
        workdir=workdir,
        eps=defaults.eps if eps is None else units.to_pixels(eps, norm),
        method_options=options,
        verbose=int(values.get("verbose", defaults.verbose)),
        **_settled(values, True),
    )
    try:
        config = config_from_dict(given)
    except ValueError as error:  # "config.epochs is '8', not an int": the flag is named
        raise ValueError(f"--{str(error).removeprefix('config.')}") from None
    return config if on_cpu else on_device(config, requested(values))


def _settled(values: Mapping[str, Any], on_cpu: bool) -> dict[str, Any]:
    """precision and jit_compile as a CPU settles "auto" (their flags' default)."""
    from fbat_tf import device

    return {
        "precision": device.resolve_precision(values.get("precision", "auto"), on_cpu),
        "jit_compile": device.resolve_jit_compile(values.get("jit_compile", "auto"), on_cpu),
    }
