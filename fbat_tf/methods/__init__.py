"""Training methods by name: one module each, one registry line each.

    from fbat_tf import methods
    method = methods.create("fastbat", eps=8 / 255, lambda_inv=5000 / 255, ig_coef=0.1)
    grads, logs = method.gradients(model, x, y, seed)

Library APIs take ε and λ⁻¹ in pixel units; the command line's 1/255 units are converted in
`flags/`.
"""

from __future__ import annotations

import inspect
from typing import Any

from fbat_tf.methods.base import Method
from fbat_tf.methods.fast_at import FastAT
from fbat_tf.methods.fast_at_ga import FastATGradAlign
from fbat_tf.methods.fast_bat import FastBAT
from fbat_tf.methods.free_at import FreeAT
from fbat_tf.methods.n_fgsm import NFGSM
from fbat_tf.methods.pgd_at import PGDAT
from fbat_tf.methods.standard import Standard

_REGISTRY: dict[str, type[Method]] = {
    "standard": Standard,
    "fastat": FastAT,
    "fastat_ga": FastATGradAlign,
    "nfgsm": NFGSM,
    "pgd": PGDAT,
    "free": FreeAT,
    "fastbat": FastBAT,
}


def names() -> list[str]:
    return list(_REGISTRY)


def option_names(name: str) -> list[str]:
    """The options of method `name`: its constructor's parameters besides ε, in order."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown method {name!r}; choose one of {names()}")
    parameters = inspect.signature(_REGISTRY[name].__init__).parameters
    return [p for p in parameters if p not in ("self", "eps")]


def create(name: str, eps: float = 8.0 / 255, **options: Any) -> Method:
    """The method `name` with budget ε (pixel units) and its options (None = default)."""
    accepted = option_names(name)
    cls = _REGISTRY[name]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ValueError(
            f"method {name!r} takes no option(s) {unknown}; it takes {sorted(accepted)}"
        )
    options = {k: v for k, v in options.items() if v is not None}
    return cls(eps=eps, **options)


__all__ = ["Method", "create", "names", "option_names"]


def check_strategy(method: Method, strategy: str) -> None:
    """ValueError where `method` cannot run under the distribution strategy named `strategy`:
    a method that carries δ from batch to batch (`single_device`, Free-AT) runs on one device."""
    if method.single_device and strategy != "default":
        raise ValueError(
            f"--method={method.name} carries δ across batches on one device: use "
            f"--strategy=default, not --strategy={strategy}"
        )
