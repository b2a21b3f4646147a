"""bench/profiles.py's bookkeeping: which profiler events are op kernels, self time of nested
events, and the kinds the two frameworks' operator names fall into."""

from __future__ import annotations

import os
import sys

sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")
)

import profiles  # noqa: E402


def test_only_op_kernels_are_counted():
    assert profiles._op_type("model/conv2d/Conv2D:_MklNativeConv2D") == "_MklNativeConv2D"
    assert profiles._op_type("gradient_tape/Mul:Mul") == "Mul"
    for runtime_event in (
        "ExecutorState::Process",  # the executor's own work
        "StatefulPartitionedCall:__inference_step_123",  # a function body
        "cluster_0: convolution.1",  # an XLA instruction
        "Run",
    ):
        assert profiles._op_type(runtime_event) is None, runtime_event


def test_self_time_leaves_out_what_nested_events_spend():
    # A call [0, 10) holding a convolution [1, 5) and a multiplication [6, 8); then an addition.
    events = [(1, 5, "Conv2D"), (0, 10, "PartitionedCall"), (6, 8, "Mul"), (12, 15, "AddV2")]
    assert profiles._self_times(events) == {
        "PartitionedCall": 10 - 4 - 2,
        "Conv2D": 4,
        "Mul": 2,
        "AddV2": 3,
    }


def test_both_frameworks_names_fall_into_the_same_kinds():
    kinds = {
        "_MklNativeConv2D": "conv forward",
        "aten::mkldnn_convolution": "conv forward",
        "Conv2DBackpropFilter": "conv backward",
        "_MklNativeConv2DBackpropInput": "conv backward",
        "aten::convolution_backward": "conv backward",
        "FusedBatchNormGradV3": "batch norm",
        "aten::native_batch_norm": "batch norm",
        "_MklMatMul": "dense",
        "aten::addmm": "dense",
        "aten::copy_": "copies and casts",
        "Cast": "copies and casts",
        "ReluGrad": "other",
        "aten::mul": "other",
    }
    assert {name: profiles.kind_of(name) for name in kinds} == kinds
