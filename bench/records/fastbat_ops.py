"""Where Fast-BAT's forward-over-backward mode spends its extra work: operation counts of the
gradient step's graph, per autodiff mode, beside Fast-AT's.

    python bench/records/fastbat_ops.py --json=bench/results/fastbat_ops_cpu.json

For Fast-AT and for Fast-BAT with `implicit_autodiff=backward_over_backward` (nested tapes) and
`forward_over_backward` (a ForwardAccumulator over the weight gradient), the method's
`gradients` on PreActResNet-18 (`--width`, batch `--batch_size`, 32×32×3, float32) is traced
as the trainer traces it, and counted three ways:

- the TensorFlow graph the default CPU path runs (no XLA): operations by type;
- XLA's HLO before optimization (what the graph lowers to) and after (what runs, with fusions):
  instructions by opcode.

Counting needs no timing, so it is exact on a loaded machine. Writes JSON and prints Markdown
tables: totals, and the op types whose counts differ most between the two Fast-BAT modes.
"""

from __future__ import annotations

import collections
import os
import re
import sys

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/

from harness import command_line, describe, machine, publish  # noqa: E402

_WIDTH = flags.DEFINE_integer("width", 16, "PreActResNet-18 base width.", lower_bound=1)
_BATCH = flags.DEFINE_integer("batch_size", 64, "Batch size.", lower_bound=1)
_TOP = flags.DEFINE_integer("top", 12, "Op types listed in the difference table.", lower_bound=1)
_JSON = flags.DEFINE_string("json", None, "Write the results here.")

VARIANTS = {
    "fastat": ("fastat", {}),
    "fastbat_bob": ("fastbat", {"implicit_autodiff": "backward_over_backward"}),
    "fastbat_fob": ("fastbat", {"implicit_autodiff": "forward_over_backward"}),
}
# An HLO instruction line: "  %name = f32[...]{...} opcode(operands), ..." (ROOT optional).
HLO_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*.*?\s([a-z][\w\-]*)\(")


def hlo_opcodes(text: str) -> collections.Counter:
    counts: collections.Counter = collections.Counter()
    for line in text.splitlines():
        match = HLO_INSTRUCTION.match(line)
        if match:
            counts[match.group(1)] += 1
    return counts


def graph_ops(concrete) -> collections.Counter:
    """Op types of a concrete function's graph, the bodies of its nested functions included."""
    counts: collections.Counter = collections.Counter(
        op.type for op in concrete.graph.get_operations()
    )
    library = concrete.graph.as_graph_def().library
    for function in library.function:
        counts.update(node.op for node in function.node_def)
    return counts


def count(variant: str) -> dict:
    import keras
    import numpy as np
    import tensorflow as tf

    from fbat_tf import methods, models

    name, options = VARIANTS[variant]
    keras.utils.set_random_seed(0)
    shape = (32, 32, 3)
    model = models.build("preact_resnet18", 10, shape, mean=0.5, std=0.25, width=_WIDTH.value)
    method = methods.create(name, eps=8 / 255, **options)
    rng = np.random.default_rng(0)
    x = tf.constant(rng.uniform(0, 1, (_BATCH.value, *shape)).astype(np.float32))
    y = tf.constant(rng.integers(0, 10, _BATCH.value).astype(np.int32))
    seed = tf.constant([0, 0], tf.int32)

    def step(x, y, seed):
        grads, _ = method.gradients(model, x, y, seed)
        return grads

    graph = tf.function(step, autograph=False).get_concrete_function(x, y, seed)
    compiled = tf.function(step, autograph=False, jit_compile=True)
    hlo = compiled.experimental_get_compiler_ir(x, y, seed)(stage="hlo")
    optimized = compiled.experimental_get_compiler_ir(x, y, seed)(stage="optimized_hlo")
    return {
        "graph": dict(graph_ops(graph)),
        "hlo": dict(hlo_opcodes(hlo)),
        "optimized_hlo": dict(hlo_opcodes(optimized)),
    }


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    counts = {variant: count(variant) for variant in VARIANTS}
    stages = ("graph", "hlo", "optimized_hlo")
    totals = {v: {s: sum(counts[v][s].values()) for s in stages} for v in VARIANTS}
    lines = [
        f"PreActResNet-18 width {_WIDTH.value}, batch {_BATCH.value}, 32×32×3, float32, "
        f"{describe(machine())}: operations of the method's gradient step",
        "",
        "| variant | TF graph ops (no XLA) | HLO before optimization | HLO after (fused) |",
        "|---|---|---|---|",
    ]
    for variant in VARIANTS:
        lines.append(f"| {variant} | " + " | ".join(str(totals[variant][s]) for s in stages) + " |")
    differences = {}
    for stage in stages:
        bob, fob = counts["fastbat_bob"][stage], counts["fastbat_fob"][stage]
        delta = {op: fob.get(op, 0) - bob.get(op, 0) for op in set(bob) | set(fob)}
        ranked = sorted(delta.items(), key=lambda item: (-abs(item[1]), item[0]))
        differences[stage] = ranked[: _TOP.value]
        lines += [
            "",
            f"{stage}: op types whose count differs most, forward-over-backward minus nested",
            "",
            "| op | fastat | fastbat_bob | fastbat_fob | fob − bob |",
            "|---|---|---|---|---|",
        ]
        for op, change in differences[stage]:
            row = [counts[v][stage].get(op, 0) for v in VARIANTS]
            lines.append(f"| {op} | " + " | ".join(map(str, row)) + f" | {change:+d} |")
    summary = {
        "model": "preact_resnet18",
        "width": _WIDTH.value,
        "batch_size": _BATCH.value,
        "machine": machine(),
        "totals": totals,
        "counts": counts,
        "largest_differences": {s: dict(d) for s, d in differences.items()},
        "command": command_line(),
    }
    publish("\n".join(lines), summary, _JSON.value)


if __name__ == "__main__":
    app.run(main)
