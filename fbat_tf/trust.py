"""The code a .keras file can hold, and the refusal to load it from a caller that does not trust it.

A .keras file is a zip archive of a JSON config and the weights; Keras rebuilds the model from the
config. Two things a config can hold are code, not a description of layers, and Keras' safe mode
refuses both:

- a Python lambda, stored as its bytecode (a `Lambda` layer's function or output shape, or a
  lambda wherever Keras serializes one as `__lambda__`), which runs when the model is built or
  called;
- a `TFSMLayer`, which loads a SavedModel, itself a program.

fbat-tf loads every .keras file with `safe_mode=True` stated, and reads the config first, so that
a refusal says what the file holds and how a user who trusts it allows it:

    keras_file_code("model.keras")        # ["Lambda 'double': a Python lambda, ..."]
    check_keras_file("model.keras")       # UntrustedCodeError if that list is not empty
    check_keras_file("model.keras", trust_code=True)   # the caller trusts the file: no check

This check holds even after `keras.config.enable_unsafe_deserialization()`, which overrides an
explicit `safe_mode=True` in Keras. The module imports neither TensorFlow nor Keras, so a command
line refuses a file before they load.
"""

from __future__ import annotations

import json
import zipfile
from typing import Any

# The command-line flag that allows code in a model file (evaluate.py, python -m export).
TRUST_FLAG = "--trust_model_code"

# A model's config is kilobytes; a larger one is not read into memory.
_MAX_CONFIG_BYTES = 64 << 20


class UntrustedCodeError(ValueError):
    """A model file holds code, and whoever loads it did not say that they trust the file."""


def keras_file_code(path: str) -> list[str]:
    """What code the .keras file at `path` holds, one description per place (empty: none).

    ValueError if it is not a .keras archive with a readable config.json.
    """
    try:
        with zipfile.ZipFile(path) as archive:
            size = archive.getinfo("config.json").file_size
            if size > _MAX_CONFIG_BYTES:
                raise ValueError(f"its config.json declares {size} bytes")
            config = json.loads(archive.read("config.json"))
        found: list[str] = []
        _find_code(config, "the model", found)
    except RecursionError:
        raise ValueError(
            f"{path} is not a readable .keras model file: its config nests deeper than any model's"
        ) from None
    except (zipfile.BadZipFile, KeyError, UnicodeDecodeError, ValueError) as error:
        raise ValueError(f"{path} is not a readable .keras model file: {error}") from None
    return found


def refusal(path: str, code: list[str]) -> str:
    """The message that refuses to load `path` because of `code` (keras_file_code's list)."""
    return (
        f"refusing to load {path}: it holds code that would run when the model is loaded or "
        f"called: {'; '.join(code)}. fbat-tf loads from a .keras file only layers, weights and "
        "registered objects (Keras' safe mode), since a model file from elsewhere can hold any "
        f"code. If you trust the file and whoever made it, pass {TRUST_FLAG} (trust_code=True "
        "in Python) to load it with safe mode off"
    )


def check_keras_file(path: str, trust_code: bool = False) -> None:
    """Raise UntrustedCodeError if the .keras file at `path` holds code, unless `trust_code`."""
    if trust_code:
        return
    code = keras_file_code(path)
    if code:
        raise UntrustedCodeError(refusal(path, code))


def _find_code(value: Any, owner: str, found: list[str]) -> None:
    if isinstance(value, list):
        for item in value:
            _find_code(item, owner, found)
        return
    if not isinstance(value, dict):
        return
    class_name, config = value.get("class_name"), value.get("config")
    if class_name == "__lambda__":
        found.append(f"{owner}: a Python lambda, stored as bytecode")
        return
    if isinstance(class_name, str) and isinstance(config, dict):
        if isinstance(config.get("name"), str):
            owner = f"{class_name} {config['name']!r}"
        if class_name == "TFSMLayer":
            found.append(f"{owner}: loads the SavedModel {config.get('filepath')!r}, a program")
            return
    for item in value.values():
        _find_code(item, owner, found)
