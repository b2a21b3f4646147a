"""What each built-in method refuses, importable without TensorFlow: the threat models it has a
form for, whether it runs on one device only, and the option values its constructor refuses.

    rules.FastBAT.check(8 / 255, "linf", {**methods.defaults("fastbat"), "lambda_inv": -1.0})
    # ValueError: lambda_inv must be > 0, got -1.0   (as FastBAT(8 / 255, lambda_inv=-1.0) says)

Each method's class inherits its rules (`class FastBAT(rules.FastBAT, Method)`) and its
constructor calls the same checks, so each rule and its message are written here once; the
registry (`Entry.rules`) asks them before anything is created, which lets sweep.py check every
cell of a definition without loading TensorFlow.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fbat_tf import catalog, device
from fbat_tf.catalog import ELLE_ATTACKS, ELLE_SCHEDULES, IMPLICIT_GRADIENTS, LINEARIZATIONS

#: N-FGSM's noise as ELLE's base attack, a multiple of ε (scripts/run_N-FGSM+elle-a_cifar10.sh).
NFGSM_NOISE = 2.0


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
    def check_options() -> None:
        """ValueError for an option value the method refuses: each method's takes its options
        by name, as its constructor does (a None one: the constructor's default)."""

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


class Standard(Rules):
    name = "standard"
    # No perturbation to train on: the norm is that of its validation and test.
    norms = ("linf", "l2")


class FastAT(Rules):
    name = "fastat"
    norms = ("linf", "l2")

    @staticmethod
    def check_options(*, step: float) -> None:
        if not step > 0:
            raise ValueError(f"fastat step (a multiple of eps) must be > 0, got {step!r}")


class FastATGradAlign(Rules):
    name = "fastat_ga"

    @staticmethod
    def check_options(*, ga_coef: float | None) -> None:
        if ga_coef is not None and float(ga_coef) < 0:
            raise ValueError(f"ga_coef must be >= 0, got {ga_coef!r}")


class NFGSM(Rules):
    name = "nfgsm"

    @staticmethod
    def check_options(*, noise: float, step: float, clip: float | None) -> None:
        if not noise >= 0:
            raise ValueError(f"nfgsm noise (a multiple of eps) must be >= 0, got {noise!r}")
        if clip is not None and not clip > 0:
            raise ValueError(f"nfgsm clip (a multiple of eps) must be > 0, got {clip!r}")
        if not step > 0:
            raise ValueError(f"nfgsm step (a multiple of eps) must be > 0, got {step!r}")


class PGDAT(Rules):
    name = "pgd"
    norms = ("linf", "l2")

    @staticmethod
    def check_options(*, steps: int, step: float | None) -> None:
        if steps < 1:
            raise ValueError(f"pgd needs steps >= 1, got {steps!r}")
        if step is not None and not step > 0:
            raise ValueError(f"pgd step (a multiple of eps) must be > 0, got {step!r}")


class FreeAT(Rules):
    name = "free"
    single_device = True

    @staticmethod
    def check_options(*, replays: int) -> None:
        if replays < 1:
            raise ValueError(f"free needs replays >= 1, got {replays!r}")


class FastBAT(Rules):
    name = "fastbat"
    linf_only_because = (
        "its lower-level solution and implicit term are derived for the L∞ ball ∩ box (the "
        "inactive-constraint mask of its linearized box-constrained problem)"
    )

    @staticmethod
    def check_options(
        *,
        lambda_inv: float | None,
        ig_coef: float,
        ig: str,
        linearization: str,
        cg_steps: int,
        tau: float | None,
        implicit_autodiff: str,
    ) -> None:
        device.check_implicit_autodiff(implicit_autodiff)
        if ig not in IMPLICIT_GRADIENTS:
            raise ValueError(f"ig must be one of {IMPLICIT_GRADIENTS}, got {ig!r}")
        if linearization not in LINEARIZATIONS:
            raise ValueError(
                f"linearization must be one of {LINEARIZATIONS}, got {linearization!r}"
            )
        # None: the default for ε, which is positive.
        if lambda_inv is not None and not float(lambda_inv) > 0:
            raise ValueError(f"lambda_inv must be > 0, got {lambda_inv!r}")
        if ig_coef < 0:
            raise ValueError(f"ig_coef must be >= 0, got {ig_coef!r}")
        if cg_steps < 1:
            raise ValueError(f"cg_steps must be >= 1, got {cg_steps!r}")


class ELLE(Rules):
    name = "elle"

    @staticmethod
    def check_options(
        *,
        weight: float | None,
        schedule: str,
        decay: float,
        sensitivity: float,
        attack: str,
        step: float,
    ) -> None:
        if schedule not in ELLE_SCHEDULES:
            raise ValueError(f"elle schedule must be one of {ELLE_SCHEDULES}, got {schedule!r}")
        if attack not in ELLE_ATTACKS:
            raise ValueError(f"elle attack must be one of {ELLE_ATTACKS}, got {attack!r}")
        # None: the default for ε and the schedule, which is positive.
        if weight is not None and not float(weight) >= 0:
            raise ValueError(f"elle weight (λ) must be >= 0, got {weight!r}")
        if not 0 < decay <= 1:
            raise ValueError(f"elle decay (γ) must be in (0, 1], got {decay!r}")
        if not sensitivity >= 0:
            raise ValueError(f"elle sensitivity (s) must be >= 0, got {sensitivity!r}")
        if not step >= 0:
            raise ValueError(f"elle step (a multiple of eps) must be >= 0, got {step!r}")
        if attack == "nfgsm":  # its training point is N-FGSM's, with this step
            NFGSM.check_options(noise=NFGSM_NOISE, step=float(step), clip=None)


class FGSMPGI(Rules):
    name = "fgsm_pgi"
    # Its prior is one perturbation per training example, read and written by each step.
    single_device = True

    @staticmethod
    def check_options(*, weight: float, decay: float, step: float, reset: int) -> None:
        if not weight >= 0:
            raise ValueError(f"fgsm_pgi weight (λ) must be >= 0, got {weight!r}")
        if not decay >= 0:
            raise ValueError(f"fgsm_pgi decay (μ) must be >= 0, got {decay!r}")
        if not step > 0:
            raise ValueError(f"fgsm_pgi step (a multiple of eps) must be > 0, got {step!r}")
        if not reset >= 1:
            raise ValueError(f"fgsm_pgi reset must be >= 1 epochs, got {reset!r}")
