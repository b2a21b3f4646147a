"""What the indicators of attack failure found on an evaluation (fbat_tf/indicators.py computes
them; DESIGN.md §4.5), as evaluate.py's JSON holds it under "indicators".

    found = result.indicators                    # None in a record from before them
    found.fired("pgd@8")                         # {"incomplete_optimization": Count(5, 32)}
    found.touched("pgd@8")                       # whether any indicator or check touched it
    found.lines()                                # what evaluate.py prints, one per attack and ε
"""

from __future__ import annotations

import dataclasses
from typing import Any

# Pintor et al., "Indicators of Attack Failure" (NeurIPS 2022), in their order.
INDICATORS = (
    "silent_success",
    "incomplete_optimization",
    "unavailable_gradients",
    "unstable_predictions",
    "transfer_failure",
    "unconstrained_attack_failure",
)
# The checks the reference AutoAttack runs (fra31/auto-attack, autoattack/checks.py).
CHECKS = (
    "randomized",
    "softmax_outputs",
    "zero_gradients",
    "square_beats_white_box",
    "dynamic_model",
    "class_count",
)
# What to do where one fires (after Pintor et al.'s mitigations and the reference's flags_doc).
ADVICE = {
    "silent_success": "keep the best adversarial point the attack passes (return any iterate "
    "that breaks the point)",
    "incomplete_optimization": "run more steps or restarts",
    "unavailable_gradients": "attack through a differentiable approximation (BPDA) or rely on "
    "gradient-free attacks (Square with more queries and restarts)",
    "unstable_predictions": "attack the expectation over the randomness (EOT, AutoAttack "
    "--aa_version=rand) or smooth the loss",
    "transfer_failure": "craft on a surrogate closer to the model, or attack the model itself",
    "unconstrained_attack_failure": "the attack cannot break points even without a bound: fix "
    "the attack (its loss, its gradients) before trusting its number",
    "randomized": "evaluate with --aa_version=rand (EOT)",
    "softmax_outputs": "give the attacks logits, not probabilities",
    "zero_gradients": "use margin losses, BPDA or gradient-free attacks",
    "square_beats_white_box": "run Square with more queries and restarts, or an adaptive attack",
    "dynamic_model": "use an adaptive attack: the model optimizes at inference",
    "class_count": "use fewer target classes than the model has classes",
}


def _words(name: str) -> str:
    return name.replace("_", " ")


@dataclasses.dataclass(frozen=True)
class Count:
    """An indicator on one attack and ε: on how many of the `of` sample points it fired."""

    points: int
    of: int

    @property
    def fired(self) -> bool:
        return self.points > 0


@dataclasses.dataclass(frozen=True)
class Check:
    """One of the reference AutoAttack's checks: whether it fired, what it saw, and the results
    it concerns (their keys; empty: all of them)."""

    fired: bool
    detail: str = ""
    keys: tuple[str, ...] = ()
    # Where the check was computed again after the evaluation (python -m fbat_tf.indicate):
    # {"before": the check as the evaluation computed it, "code": the code that checked again}.
    rechecked: dict[str, Any] | None = None


@dataclasses.dataclass
class Indicators:
    """The indicators per attack and ε (by AttackResult.key; an indicator that does not apply
    to that attack is None), on `points` sample points, and the reference's checks."""

    points: int
    attacks: dict[str, dict[str, Count | None]] = dataclasses.field(default_factory=dict)
    checks: dict[str, Check] = dataclasses.field(default_factory=dict)
    seconds: float | None = None
    # The code that computed these after the evaluation (python -m fbat_tf.indicate), or None.
    computed_later: dict[str, Any] | None = None

    @property
    def later(self) -> tuple[str, ...]:
        """The code revisions that computed these, or one of the checks again, after the
        evaluation."""
        notes = [self.computed_later] + [
            (check.rechecked or {}).get("code") for check in self.checks.values()
        ]
        return tuple(dict.fromkeys(n["revision"] for n in notes if n and n.get("revision")))

    def fired(self, key: str) -> dict[str, Count]:
        """The indicators that fired on attack `key`, by name."""
        held = self.attacks.get(key) or {}
        return {name: count for name, count in held.items() if count is not None and count.fired}

    def checks_fired(self, key: str | None = None) -> dict[str, Check]:
        """The reference's checks that fired (concerning `key` where given)."""
        return {
            name: check
            for name, check in self.checks.items()
            if check.fired and (key is None or not check.keys or key in check.keys)
        }

    def touched(self, key: str) -> bool:
        """Whether an indicator or a check fired on attack `key`: its robust accuracy may
        overestimate robustness."""
        return bool(self.fired(key) or self.checks_fired(key))

    def lines(self) -> list[str]:
        """One line per attack and ε: the indicators that fired, on how many points, and what to
        do; then one per check that fired."""
        lines = []
        for key in self.attacks:
            fired = self.fired(key)
            if not fired:
                lines.append(f"indicators {key}: none fired on {self.points} points")
                continue
            said = "; ".join(
                f"{_words(name)} on {count.points} of {count.of} points ({ADVICE[name]})"
                for name, count in fired.items()
            )
            lines.append(
                f"indicators {key}: {said}. Its robust accuracy may overestimate robustness"
            )
        for name, check in self.checks_fired().items():
            lines.append(f"check {_words(name)}: {check.detail} ({ADVICE[name]})")
        return lines

    def to_dict(self) -> dict[str, Any]:
        return {
            "points": self.points,
            "seconds": self.seconds,
            "attacks": {
                key: {
                    name: None if count is None else {"points": count.points, "of": count.of}
                    for name, count in held.items()
                }
                for key, held in self.attacks.items()
            },
            "checks": {
                name: {
                    "fired": check.fired,
                    "detail": check.detail,
                    "keys": list(check.keys),
                    **({} if check.rechecked is None else {"rechecked": check.rechecked}),
                }
                for name, check in self.checks.items()
            },
            **({} if self.computed_later is None else {"computed_later": self.computed_later}),
        }

    @classmethod
    def from_dict(cls, payload: dict[str, Any] | None) -> Indicators | None:
        """The indicators `payload` holds, or None for none; ValueError (one line) naming an
        indicator or check it does not know."""
        if payload is None:
            return None
        attacks = {}
        for key, held in (payload.get("attacks") or {}).items():
            unknown = sorted(set(held) - set(INDICATORS))
            if unknown:
                raise ValueError(f"indicators[{key!r}] names unknown indicators {unknown}")
            attacks[key] = {
                name: None if value is None else Count(int(value["points"]), int(value["of"]))
                for name, value in held.items()
            }
        checks = {}
        for name, value in (payload.get("checks") or {}).items():
            if name not in CHECKS:
                raise ValueError(f"indicators: unknown check {name!r}")
            checks[name] = Check(
                bool(value["fired"]),
                value.get("detail", ""),
                tuple(value.get("keys") or ()),
                value.get("rechecked"),
            )
        later = payload.get("computed_later")
        return cls(int(payload["points"]), attacks, checks, payload.get("seconds"), later)
