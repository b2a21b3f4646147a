"""What a method refuses, importable without TensorFlow: the threat models it has a form for,
whether it runs on one device only, and the option values its constructor refuses.

    FastBAT.check(8 / 255, "linf", {**methods.defaults("fastbat"), "lambda_inv": -1.0})
    # ValueError: lambda_inv must be > 0, got -1.0   (as FastBAT(8 / 255, lambda_inv=-1.0) says)

`Rules` is the base of every method's class (methods/base.py). Each method's module states its
rules on its class (`norms`, `single_device`, `check_options`), which its constructor calls; the
class is importable without TensorFlow (fbat_tf/lazy.py), so the registry asks them before
anything is created, and sweep.py checks every cell of a definition without loading TensorFlow.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fbat_tf import catalog


class Rules:
    """A method's name and what it refuses; the base of every method's class (methods/base.py)."""

    name: str = ""
    #: whether it carries state from batch to batch on one device (Free-AT's δ): it then runs
    #: without a distribution strategy.
    single_device: bool = False
    #: the threat models it has a form for (catalog.NORMS), and why not the others.
    norms: tuple[str, ...] = ("linf",)
    linf_only_because: str = "its released form and settings are for the L∞ ball only"

    @classmethod
    def check_norm(cls, norm: str) -> str:
        """`norm` if the method has a form for it, else ValueError in one line saying why."""
        if catalog.check_norm(norm) not in cls.norms:
            raise ValueError(
                f"--method={cls.name} has no {norm.upper()} form: {cls.linf_only_because}; "
                f"train it with --norm={cls.norms[0]}"
            )
        return norm

    @staticmethod
    def check_eps(eps: float, norm: str) -> None:
        """ValueError for a budget outside [0, 1] pixels (an L2 ball may exceed 1)."""
        if not eps >= 0.0 or (norm == "linf" and eps > 1.0):
            raise ValueError(f"eps must be in [0, 1] (pixel units), got {eps!r}")

    @staticmethod
    def check_options(**options: Any) -> None:
        """ValueError for an option value the method refuses: each method's takes its options
        by name, as its constructor does (a None one: the constructor's default). A method that
        states none refuses no value."""

    @classmethod
    def check(cls, eps: float, norm: str, options: Mapping[str, Any]) -> None:
        """ValueError for what the constructor refuses, in its order: the norm, ε, then the
        options (`options`: every one, the declared default where none was set)."""
        cls.check_norm(norm)
        cls.check_eps(eps, norm)
        cls.check_options(**options)


def check_strategy(method: Any, strategy: str) -> None:
    """ValueError where `method` (a method, or its rules) cannot run under the distribution
    strategy named `strategy`: a method that carries δ from batch to batch (`single_device`,
    Free-AT) runs on one device."""
    if method.single_device and strategy != "default":
        raise ValueError(
            f"--method={method.name} carries δ across batches on one device: use "
            f"--strategy=default, not --strategy={strategy}"
        )
