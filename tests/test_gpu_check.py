"""bench/gpu_check.py, a GPU user's first command, runs on this CPU: every gradient check runs and
passes, and the parts that mean something on a GPU only say they were skipped."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_gpu_check_runs_on_a_cpu_and_says_what_it_checked_and_skipped(tmp_path):
    output = tmp_path / "gpu_check.json"
    done = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "bench", "gpu_check.py"),
            # PreActResNet-18's second-order graph takes XLA half a minute a configuration on
            # this CPU; the small CNN, with max pooling and batch norm between its convolutions,
            # far less. Float32 and one mixed policy here.
            "--model=small_cnn",
            "--policies=float32,mixed_bfloat16",
            "--width=2",
            "--batch_size=4",
            "--repeats=1",
            f"--json={output}",
        ],
        cwd=ROOT,
        # XLA compiles the program's eight graphs with LLVM's optimisation of the CPU machine
        # code off (unless the environment sets XLA_FLAGS): what XLA computes, fuses and in what
        # order is as for users, and nothing checked here is about this CPU's machine code,
        # which a GPU does not run. Compiling is most of the program's time, which drops by
        # over a quarter (60.8 to 43.7 CPU s at rest, BUILD.md); the steps it times run a few
        # ms each. XLA's float32 gradient moves by rounding (1.2e-6 to 1.6e-6 of the
        # reference's norm), far inside 1e-4.
        env={
            "XLA_FLAGS": "--xla_backend_optimization_level=0",
            **os.environ,
            "TF_CPP_MIN_LOG_LEVEL": "3",
        },
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "all gradient checks passed" in done.stdout
    # TensorFlow loaded as the entry points load it: none of its start-up lines, which its log
    # level does not hide (fbat_tf/startup.py).
    for line in ("InitializeLog", "oneDNN custom operations", "cuda drivers", "cuInit"):
        assert line not in done.stderr, done.stderr[-3000:]
    assert done.stdout.count("skipped (no GPU)") >= 4  # what auto picks, and each H100 figure
    results = json.loads(output.read_text())
    assert results["tf32"] is False  # float32 checked as float32 on Ampere and newer GPUs
    # It says how training runs here (a CPU has no TF32) and what each precision is held to.
    assert results["tf32_in_training"] is False
    assert "TF32 in training here: off" in done.stdout
    assert "float32, TF32 off: 0.0001" in done.stdout
    for policy in ("mixed_bfloat16", "mixed_float16"):
        assert f"{policy}: 3x the policy's own error" in done.stdout
    checks = {(c["policy"], c["execution"], c["autodiff"]): c for c in results["checks"]}
    assert len(checks) == 5
    assert done.stdout.count("skipped (--policies)") == 2
    for check in checks.values():
        assert check["relative_error"] <= check["tolerance"]
        assert check["implicit_term_relative_error"] <= check["tolerance"]
        row = f"| {check['policy']} | {check['execution']} | {check['autodiff']} |"
        assert row in done.stdout
    # The implicit term weighs in, so that an error in it would show.
    assert results["implicit_term_share"] > 0.05
    # XLA in float32 agrees with eager execution far inside what the mixed policies allow.
    assert checks["float32", "xla", "forward_over_backward"]["relative_error"] < 1e-4
    assert set(results["step_ms"]) >= {"fastat", "fastbat forward_over_backward"}
    # Fast-BAT's steps are timed as the float32 XLA checks compiled them, not compiled again.
    assert results["steps_timed_as_checked"] == [
        "fastbat backward_over_backward",
        "fastbat forward_over_backward",
    ]
