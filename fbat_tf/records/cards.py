"""What fbat-tf reads of a model card (an export's assets.extra/model_card.json, which
export/savedmodel.py writes): ModelCard, each part of the type it has there.

    card = ModelCard.load(path)      # ValueError naming the file and the part of another type
    card.dataset, card.validation_from, card.model.name, card.model.width
    card.eps.pixels, card.eps.norm   # the training ε in pixel units, its norm ("linf", "l2")
    card.method.name, card.class_names
    card.weights_sha256              # the SHA-256 of the weights exported (None: not recorded)

A part the card lacks (a card of a .keras file names no dataset, method or ε) is None.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from fbat_tf import catalog
from fbat_tf.records import units
from fbat_tf.records.files import read_json
from fbat_tf.records.runs import MethodRecord


@dataclasses.dataclass(frozen=True)
class CardModel:
    """The card's "model": the architecture's name and width."""

    name: str | None = None
    width: int | None = None


@dataclasses.dataclass(frozen=True)
class CardBudget:
    """The card's "eps": the training ε in pixel units, under `norm` ("linf" or "l2")."""

    pixels: float
    norm: str


def _name(payload: Mapping[str, Any], key: str) -> str | None:
    value = payload.get(key)
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{key} is {value!r}, not a name")
    return value


def _budget(eps: Any) -> CardBudget | None:
    """The card's ε, where it names one in pixels (cards name the norm as RobustBench does:
    "Linf", "L2")."""
    pixels = eps.get("pixels") if isinstance(eps, dict) else None
    if pixels is None:
        return None
    if isinstance(pixels, bool) or not isinstance(pixels, int | float):
        raise ValueError(f"eps.pixels is {pixels!r}, not a number")
    named = {name: norm for norm, name in units.REFERENCE_NAMES.items()}
    norm = named.get(eps.get("norm", "Linf"))
    if norm is None:
        raise ValueError(f"eps.norm is {eps.get('norm')!r}, not Linf or L2")
    # What a run can be trained at: train.py's --eps in (0, 255], in 1/255 units under L∞.
    largest = units.to_pixels(255.0, norm)
    if not (math.isfinite(pixels) and 0 < pixels <= largest):
        raise ValueError(
            f"eps.pixels is {pixels!r}, not a budget in (0, {largest:g}] ({eps.get('norm', 'Linf')}"
            ", [0, 1]-pixel units)"
        )
    return CardBudget(float(pixels), norm)


def _digest(source: Any) -> str | None:
    """The card's source.weights_sha256: 64 hexadecimal digits, or None where not recorded."""
    if not isinstance(source, dict) or source.get("weights_sha256") is None:
        return None
    digest = source["weights_sha256"]
    if (
        not isinstance(digest, str)
        or len(digest) != 64
        or any(c not in "0123456789abcdef" for c in digest)
    ):
        raise ValueError(f"source.weights_sha256 is {digest!r}, not a SHA-256 in hex")
    return digest


@dataclasses.dataclass(frozen=True)
class ModelCard:
    """The parts of a model card fbat-tf reads back."""

    dataset: str | None = None
    # Where selection's validation examples came from ("train", or "test": half of it seen).
    validation_from: str | None = None
    model: CardModel = CardModel()
    eps: CardBudget | None = None
    method: MethodRecord | None = None
    # Label k's name, where the dataset's names are kept.
    class_names: tuple[str, ...] | None = None
    # The SHA-256 of the weights exported (source.weights_sha256: the run's best.weights.h5,
    # the .keras file), None in a card from before it was recorded.
    weights_sha256: str | None = None
    # The files written beside the SavedModel (its "artifacts"), by file name.
    artifacts: tuple[str, ...] = ()

    @classmethod
    def from_dict(cls, payload: Mapping[str, Any]) -> ModelCard:
        """The card `payload` holds (a card as written, or the part of one a caller gives);
        ValueError naming the part of another type."""
        dataset, validation_from = _name(payload, "dataset"), _name(payload, "validation_from")
        if validation_from not in (None, *catalog.VALIDATION_SOURCES):
            raise ValueError(
                f"validation_from is {validation_from!r}, not one of "
                f"{', '.join(catalog.VALIDATION_SOURCES)}"
            )
        eps = _budget(payload.get("eps"))
        model = payload.get("model") or {}
        if not isinstance(model, dict):
            raise ValueError(f"model is {model!r}, not an object")
        method = payload.get("method")
        if not isinstance(method, dict | None):
            raise ValueError(f"method is {method!r}, not an object")
        names = payload.get("class_names")
        if names is not None and (
            not isinstance(names, list | tuple) or not all(isinstance(n, str) for n in names)
        ):
            raise ValueError(f"class_names is {names!r}, not a list of names")
        artifacts = payload.get("artifacts") or {}
        if not isinstance(artifacts, dict):
            raise ValueError(f"artifacts is {artifacts!r}, not an object")
        return cls(
            dataset,
            validation_from,
            CardModel(model.get("name"), model.get("width")),
            eps,
            None if method is None else MethodRecord.from_dict(method),
            None if names is None else tuple(names),
            _digest(payload.get("source")),
            tuple(artifacts),
        )

    @classmethod
    def load(cls, path: str) -> ModelCard:
        """The card at `path`: FileNotFoundError where there is none, ValueError naming the
        file where it is not JSON, not a card (no "model") or holds a part of another type."""
        payload = read_json(path, "a model card as fbat-tf exports it", "model")
        try:
            return cls.from_dict(payload)
        except ValueError as error:
            raise ValueError(
                f"{path}: {error}; restore the card the export wrote (or export the run again)"
            ) from None
