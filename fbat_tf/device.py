"""Device-dependent defaults: the dtype policy, XLA and Fast-BAT's autodiff mode for `auto`.

policy = resolve_precision("auto")     # "mixed_bfloat16" on A100/H100, "float32" on CPU
jit = resolve_jit_compile("auto")      # True on GPU
mode = resolve_implicit_autodiff("auto")   # "forward_over_backward" on GPU/TPU
"""

from __future__ import annotations

from fbat_tf import catalog


def gpu_compute_capability() -> tuple[int, int] | None:
    """The first visible GPU's compute capability, or None without a GPU."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return None
    details = tf.config.experimental.get_device_details(gpus[0])
    return tuple(details.get("compute_capability", (0, 0)))


def tf32_in_use() -> bool:
    """Whether float32 convolutions and matrix products run in TF32 (a 10-bit mantissa) here:
    TensorFlow's setting (on by default) on a GPU that has TF32 (compute capability 8.0, Ampere,
    and newer). On a CPU or an older GPU float32 is float32 whatever the setting."""
    import tensorflow as tf

    capability = gpu_compute_capability()
    enabled = tf.config.experimental.tensor_float_32_execution_enabled()
    return bool(enabled and capability is not None and capability >= (8, 0))


# Each resolver settles "auto" on this machine (asking TensorFlow, which it loads), or with
# `on_cpu` as on a machine without GPU or TPU (no TensorFlow loaded).


def resolve_precision(name: str, on_cpu: bool = False) -> str:
    if name != "auto":
        return name
    capability = None if on_cpu else gpu_compute_capability()
    if capability is None:
        return "float32"
    return "mixed_bfloat16" if capability >= (8, 0) else "mixed_float16"


def resolve_jit_compile(value: str | bool, on_cpu: bool = False) -> bool:
    if isinstance(value, bool):
        return value
    if value == "auto":
        return not on_cpu and gpu_compute_capability() is not None
    return {"true": True, "false": False}[value]


IMPLICIT_AUTODIFF = catalog.IMPLICIT_AUTODIFF


def check_implicit_autodiff(value: str) -> str:
    """`value` if it names a mode of Fast-BAT's implicit autodiff (or "auto"), else ValueError."""
    if value not in IMPLICIT_AUTODIFF:
        raise ValueError(f"implicit_autodiff must be one of {IMPLICIT_AUTODIFF}, got {value!r}")
    return value


def resolve_implicit_autodiff(value: str, device_types: list[str] | None = None) -> str:
    """`auto`: forward-over-backward where a GPU or TPU is visible (1.5–1.7× faster Fast-BAT
    steps on an H100), backward-over-backward on CPUs (the cheaper one there).
    `device_types`: the logical devices' types (default: TensorFlow's list)."""
    if check_implicit_autodiff(value) != "auto":
        return value
    if device_types is None:
        import tensorflow as tf

        device_types = [d.device_type for d in tf.config.list_logical_devices()]
    if {"GPU", "TPU"} & set(device_types):
        return "forward_over_backward"
    return "backward_over_backward"


def describe() -> str:
    import tensorflow as tf

    capability = gpu_compute_capability()
    if capability is None:
        return "CPU"
    gpu = tf.config.list_physical_devices("GPU")[0]
    name = tf.config.experimental.get_device_details(gpu).get("device_name", "GPU")
    return f"{name} (compute capability {capability[0]}.{capability[1]})"
