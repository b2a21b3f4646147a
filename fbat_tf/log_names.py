"""What the progress line and TensorBoard call the logs results.json keeps by other names.

names = shown_names(method.adversarial)   # {"epoch_time": "train_seconds", ...}
renamed(logs, names)                      # a copy of the logs under those names
"""

from __future__ import annotations


def shown_names(adversarial: bool = True) -> dict[str, str]:
    """What the progress line and TensorBoard call a log that results.json keeps by another
    name: the epoch's training time with its unit, and where training is not adversarial
    (standard training) the accuracy of its batches, which are clean."""
    names = {"epoch_time": "train_seconds"}
    if not adversarial:
        names["adv_accuracy"] = "accuracy"
    return names


def renamed(logs: dict | None, names: dict[str, str]) -> dict | None:
    """The logs with the keys `names` renames (a copy; the shared dict is left as it is)."""
    if logs is None or not names:
        return logs
    return {names.get(k, k): v for k, v in logs.items()}
