"""Where a training step's time goes, by kind of operation, in TensorFlow and in PyTorch.

    seconds = tf_profile(step, steps=3)      # {kind: seconds per step}, TensorFlow's profiler
    seconds = torch_profile(step, steps=3)   # the same kinds, torch.profiler

Both profilers time each operation kernel on the host (this is a CPU measurement); the time
of an operation that calls others (a function call, an autograd node) counts only what it
spends outside them (its self time), so the kinds add up to the time spent in kernels. Its
difference to the step's wall time is what runs outside any kernel (Python, dispatch,
scheduling), or, when kernels run in parallel on several threads, negative. XLA runs a
compiled step as one cluster whose inner work TensorFlow's profiler does not break down by
the kinds below: profile the path without XLA.

Kinds: "conv forward" (2-D convolutions), "conv backward" (their input and filter gradients:
PyTorch computes both in one kernel), "batch norm" (forward and backward), "dense" (matrix
products), "copies and casts", and "other" (every element-wise and reduction kernel).
"""

from __future__ import annotations

import collections
import glob
import os
import re
import tempfile
import time
from collections.abc import Callable

KINDS = ("conv forward", "conv backward", "batch norm", "dense", "copies and casts", "other")


def kind_of(op: str) -> str:
    """The kind of a TensorFlow op type or a PyTorch aten operator name."""
    name = op.lower()
    if "backprop" in name or "convolution_backward" in name:
        return "conv backward"
    if "conv" in name:
        return "conv forward"
    if "batchnorm" in name or "batch_norm" in name:
        return "batch norm"
    if "matmul" in name or name in ("aten::mm", "aten::addmm", "aten::linear", "aten::bmm"):
        return "dense"
    if any(word in name for word in ("copy", "cast", "contiguous", "transpose", "_to_copy")):
        return "copies and casts"
    return "other"


def _by_kind(seconds_per_op: dict[str, float], steps: int) -> dict[str, float]:
    kinds = dict.fromkeys(KINDS, 0.0)
    for op, seconds in seconds_per_op.items():
        kinds[kind_of(op)] += seconds / steps
    return kinds


def tf_profile(step: Callable[[], object], steps: int) -> dict:
    """Run `step` (which must wait for its result) `steps` times under TensorFlow's profiler.

    {"kinds": {kind: s per step}, "ops": {op type: s per step}, "wall_s": s per step}.
    """
    import tensorflow as tf
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    with tempfile.TemporaryDirectory() as logdir:
        tf.profiler.experimental.start(logdir)
        start = time.perf_counter()
        for _ in range(steps):
            step()
        wall = (time.perf_counter() - start) / steps
        tf.profiler.experimental.stop()
        (path,) = glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True)
        space = xplane_pb2.XSpace()
        with open(path, "rb") as f:
            space.ParseFromString(f.read())
    seconds: collections.Counter = collections.Counter()
    for plane in space.planes:
        if plane.name != "/host:CPU":
            continue
        names = {key: meta.name for key, meta in plane.event_metadata.items()}
        for line in plane.lines:
            ops = [
                (event.offset_ps, event.offset_ps + event.duration_ps, op_type)
                for event in line.events
                if (op_type := _op_type(names.get(event.metadata_id, "")))
            ]
            for op_type, self_ps in _self_times(ops).items():
                seconds[op_type] += self_ps * 1e-12
    return {
        "kinds": _by_kind(seconds, steps),
        "ops": {op: s / steps for op, s in seconds.most_common()},
        "wall_s": wall,
    }


# TensorFlow's op kernels are events named "<op name>:<OpType>"; the runtime's own events are
# "Class::Method", function bodies "<name>:__inference_...", XLA's instructions "<name>: <hlo>".
_OP_TYPE = re.compile(r"^[^:]+:([A-Z_][A-Za-z0-9_]*)$")


def _op_type(event_name: str) -> str | None:
    match = _OP_TYPE.match(event_name)
    return match.group(1) if match and not match.group(1).startswith("__") else None


def _self_times(ops: list[tuple[int, int, str]]) -> collections.Counter:
    """Self time per op type of the events on one thread: an event's duration minus that of
    the events nested inside it."""
    ops.sort(key=lambda event: (event[0], -event[1]))
    self_ps: collections.Counter = collections.Counter()
    stack: list[tuple[int, str]] = []  # (end, op type) of the enclosing events
    for begin, end, op_type in ops:
        while stack and stack[-1][0] <= begin:
            stack.pop()
        self_ps[op_type] += end - begin
        if stack:
            self_ps[stack[-1][1]] -= end - begin
        stack.append((end, op_type))
    return self_ps


def torch_profile(step: Callable[[], object], steps: int) -> dict:
    """`tf_profile`'s numbers for a PyTorch step, from torch.profiler's self CPU times."""
    import torch

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
        start = time.perf_counter()
        for _ in range(steps):
            step()
        wall = (time.perf_counter() - start) / steps
    seconds = {
        event.key: event.self_cpu_time_total * 1e-6
        for event in profiler.key_averages()
        if event.self_cpu_time_total > 0
    }
    ordered = sorted(seconds.items(), key=lambda item: -item[1])
    return {
        "kinds": _by_kind(seconds, steps),
        "ops": {op: s / steps for op, s in ordered},
        "wall_s": wall,
    }


def markdown_table(profiles: dict[str, dict]) -> str:
    """One column per profiled step: seconds per step in each kind, their sum and the wall."""
    names = list(profiles)
    lines = [
        "| kind | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for kind in KINDS:
        cells = " | ".join(f"{profiles[n]['kinds'][kind]:.3f}" for n in names)
        lines.append(f"| {kind} | {cells} |")
    total = " | ".join(f"{sum(profiles[n]['kinds'].values()):.3f}" for n in names)
    lines.append(f"| **in kernels** | {total} |")
    wall = " | ".join(f"{profiles[n]['wall_s']:.3f}" for n in names)
    lines.append(f"| wall time of a profiled step | {wall} |")
    return "\n".join(lines)
