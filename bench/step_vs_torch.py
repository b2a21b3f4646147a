"""Time one optimizer step of Fast-AT and Fast-BAT in PyTorch beside fbat-tf's, on this CPU.

    python bench/step_vs_torch.py --repeats=10 --rounds=3 \
        --json=bench/results/step_vs_torch_cpu.json
    python bench/step_vs_torch.py --width=8 --batch_size=8 --repeats=2 --rounds=1   # smoke run
    python bench/step_vs_torch.py --check        # both frameworks compute the same step

PreActResNet-18 (width 64 by default: the standard CIFAR model), batch 32, 32x32x3, float32,
SGD with momentum 0.9 and coupled weight decay 5e-4 (DESIGN.md §3), ε = 8/255, the methods'
default hyper-parameters. Every (implementation, method) pair runs in its own child process
(`children.run_per_method`; `--rounds=R` makes them take turns R times and reports medians over
the rounds): warm-up steps, then the median of `--repeats` timed steps. The variants:

- `fbat_tf`: fbat-tf's default CPU path, `--jit_compile=auto` (no XLA on a CPU) with oneDNN on
  (`TF_ENABLE_ONEDNN_OPTS=1`, as train.py and evaluate.py set it; `--noonednn` for 0);
- `fbat_tf_xla`: the same with `jit_compile=True` (XLA compiles the method's gradient);
- `torch`: the same steps written in PyTorch here, `torch.set_num_threads(os.cpu_count())`
  (`--torch_threads` to change it).

The fbat-tf timings are `bench/step_time.py`'s own: the child runs `step_time.py --child=...`
(the model, `AdversarialTrainer.train_on_batch`, its warm-up and timing) and passes its numbers
on. Reported: seconds per step, images/s, memory as step_time.py defines it, each fbat-tf
variant's ratio to PyTorch per method, and Fast-BAT / Fast-AT within each implementation; plus
the machine (CPU count, load average before and after, versions). JSON and a Markdown table.

What the PyTorch side matches (checked by `--check`, see below):

- the model: input standardization inside the model ((x − 0.5) / 0.25, as step_time.py builds
  it), a bias-free 3x3 stem conv, four stages of two pre-activation basic blocks
  (BN-ReLU-conv3x3(stride)-BN-ReLU-conv3x3, plus the identity or a bias-free 1x1 conv with the
  stride that reads the raw block input), widths w, 2w, 4w, 8w, strides 1, 2, 2, 2, final
  BN-ReLU, global average pooling, a Linear layer with bias; BN eps 1e-5, momentum 0.1; 11,172,170
  parameters at width 64. The timed model pads its 3x3 convs by 1 on every side (PyTorch's way);
  Keras's "same" pads a stride-2 3x3 conv by 0 before and 1 after: the same cost, other pixels,
  so `--check` builds the PyTorch model with Keras's padding.
- the steps (fbat_tf/methods/fast_at.py, fast_bat.py; DESIGN.md §3), every forward pass with
  batch norm in training mode (its running statistics updated by each, as Keras's layers do),
  attack gradients of the summed per-example cross-entropy, the weight loss a batch mean:
  Fast-AT: δ0 = P_C(U[−ε, ε]), δ = P_C(δ0 + 1.25ε·sign(∇δ Σ CE)), then the weight gradient at x+δ.
  Fast-BAT (a = 1/λ = 5000/255, c = 0.1, τ = 1e-7, linearization pgd_nosign): z = P_C(δ0 + a·∇δ
  Σ CE(x+δ0)); g_z = ∇δ Σ CE(x+z) with create_graph=True; δ* = P_C(z + a·g_z), detached; one
  backward at x+δ* for g1 = ∇θ mean CE and v = B·∇δ mean CE; H = 1[max(−ε, −x) + τ < δ* <
  min(ε, 1−x) − τ]; g2 = ∇θ (1/B) Σ ⟨g_z, stop_gradient(H ⊙ v)⟩ by torch.autograd through step
  2's recorded backward pass (double backward, as fbat-tf's nested tapes); gradient g1 + c·g2;
  then `torch.optim.SGD(lr=0.01, momentum=0.9, weight_decay=5e-4)` (step_time.py's learning
  rate; the decay is added to the gradient before momentum, as fbat-tf's trainer does).

Not matched, on purpose: fbat-tf's trainer also updates its metrics, logs Fast-BAT's
ig_norm_ratio and inactive_fraction, checks the loss for non-finite values and keeps a copy of
the batch-norm statistics each step (a few small ops); its noise comes from a stateless seed,
PyTorch's from its global generator; PyTorch runs NCHW (its default), TensorFlow NHWC.

`--check` (one process, both frameworks, PreActResNet-18 width 4, batch 8): copies the Keras
model's weights into a PyTorch model with Keras's padding, feeds both the same batch and the
same uniform noise δ0 (fbat-tf's, from its seed), and compares fbat-tf's `method.perturb` and
`method.gradients` (eager, no XLA) with the PyTorch functions timed here: the largest difference
of x+δ, and the relative difference of the whole gradient and, for Fast-BAT, of c·g2 alone.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import resource
import statistics
import sys
import time

from absl import app, flags

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from children import report, run_child, run_per_method, write_json  # noqa: E402

METHODS = ["fastat", "fastbat"]
# variant -> (label, step_time.py's --jit_compile); "torch" is this script's own.
TF_VARIANTS = {"fbat_tf": ("fbat-tf default", "auto"), "fbat_tf_xla": ("fbat-tf XLA", "true")}
VARIANTS = ["torch", *TF_VARIANTS]
LABELS = {**{name: label for name, (label, _) in TF_VARIANTS.items()}, "torch": "PyTorch"}

EPS = 8 / 255
FASTAT_ALPHA = 1.25 * EPS
FASTBAT_LAMBDA_INV = 5000 / 255  # a = 1/λ, the default at ε ≤ 8/255
FASTBAT_IG_COEF = 0.1  # c
TAU = 1e-7
LEARNING_RATE = 0.01  # step_time.py's
MOMENTUM = 0.9
WEIGHT_DECAY = 5e-4
MEAN, STD = 0.5, 0.25  # the input standardization step_time.py builds its model with
IMAGE_SIZE, CHANNELS, CLASSES = 32, 3, 10
CHECK_WIDTH, CHECK_BATCH = 4, 8

_METHODS = flags.DEFINE_list("methods", METHODS, f"Methods to time, of {METHODS}.")
_VARIANTS = flags.DEFINE_list(
    "variants",
    VARIANTS,
    "Implementations to time: fbat_tf (no XLA on a CPU, fbat-tf's default), fbat_tf_xla "
    "(jit_compile=True), torch.",
)
_WIDTH = flags.DEFINE_integer("width", 64, "PreActResNet-18 base width.", lower_bound=1)
_BATCH = flags.DEFINE_integer("batch_size", 32, "Batch size.", lower_bound=1)
_REPEATS = flags.DEFINE_integer("repeats", 10, "Timed steps per child.", lower_bound=1)
_WARMUP = flags.DEFINE_integer("warmup", 3, "Untimed steps first.", lower_bound=0)
_ROUNDS = flags.DEFINE_integer(
    "rounds", 1, "Child processes per variant, taking turns; numbers are medians.", lower_bound=1
)
_TF_THREADS = flags.DEFINE_integer(
    "tf_threads",
    0,
    "step_time.py's --tf_threads for the fbat-tf children (0: TensorFlow's defaults).",
    lower_bound=0,
)
_TORCH_THREADS = flags.DEFINE_integer(
    "torch_threads",
    None,
    "torch.set_num_threads for the PyTorch children (default: os.cpu_count()).",
    lower_bound=1,
)
_ONEDNN = flags.DEFINE_bool(
    "onednn", True, "TF_ENABLE_ONEDNN_OPTS for the fbat-tf children: 1 as train.py sets it, or 0."
)
_CHECK = flags.DEFINE_bool(
    "check", False, "Instead of timing: check that both frameworks compute the same steps."
)
_PROFILE = flags.DEFINE_integer(
    "profile_steps",
    0,
    "After timing, run this many more steps under each framework's profiler and report the "
    "time per kind of operation (bench/profiles.py).",
    lower_bound=0,
)
_JSON = flags.DEFINE_string("json", None, "Write the results here.")
_CHILD = flags.DEFINE_string("child", None, "Internal: time this variant:method, print JSON.")


# --------------------------------------------------------------------------------------------
# PyTorch: the model and the two methods' steps. torch is imported only in these functions.


def torch_preact_resnet18(width: int, keras_padding: bool = False):
    """PreActResNet-18 as fbat_tf.models.preact_resnet builds it; modules named as its layers.

    keras_padding: pad like Keras's "same" (stride-2 3x3 convs: 0 before, 1 after) instead of
    PyTorch's symmetric padding of 1, so that weights copied from Keras give the same outputs.
    """
    import torch
    import torch.nn.functional as F
    from torch import nn

    class PreActResNet18(nn.Module):
        def __init__(self):
            super().__init__()
            self.keras_padding = keras_padding
            self.register_buffer("mean", torch.full((1, CHANNELS, 1, 1), MEAN))
            self.register_buffer("std", torch.full((1, CHANNELS, 1, 1), STD))
            self.layers = nn.ModuleDict()
            self.blocks = []  # (name, stride, has projection shortcut)
            self._conv("stem_conv", CHANNELS, width, 3, 1)
            channels = width
            for stage, stage_stride in enumerate((1, 2, 2, 2), start=1):
                planes = width * 2 ** (stage - 1)
                for block in (1, 2):
                    name, stride = f"stage{stage}_block{block}", stage_stride if block == 1 else 1
                    self.layers[f"{name}_bn1"] = nn.BatchNorm2d(channels, eps=1e-5, momentum=0.1)
                    self._conv(f"{name}_conv1", channels, planes, 3, stride)
                    self.layers[f"{name}_bn2"] = nn.BatchNorm2d(planes, eps=1e-5, momentum=0.1)
                    self._conv(f"{name}_conv2", planes, planes, 3, 1)
                    projection = stride != 1 or channels != planes
                    if projection:
                        self._conv(f"{name}_shortcut", channels, planes, 1, stride)
                    self.blocks.append((name, projection))
                    channels = planes
            self.layers["final_bn"] = nn.BatchNorm2d(channels, eps=1e-5, momentum=0.1)
            self.layers["logits"] = nn.Linear(channels, CLASSES)

        def _conv(self, name, cin, cout, kernel, stride):
            padding = 0 if self.keras_padding else kernel // 2
            self.layers[name] = nn.Conv2d(cin, cout, kernel, stride, padding, bias=False)

        def conv(self, name, h):
            layer = self.layers[name]
            if self.keras_padding:
                (kernel, _), (stride, _), size = layer.kernel_size, layer.stride, h.shape[-1]
                total = max((-(-size // stride) - 1) * stride + kernel - size, 0)
                h = F.pad(h, (total // 2, total - total // 2) * 2)
            return layer(h)

        def forward(self, x):
            h = self.conv("stem_conv", (x - self.mean) / self.std)
            for name, projection in self.blocks:
                pre = F.relu(self.layers[f"{name}_bn1"](h))
                shortcut = self.conv(f"{name}_shortcut", h) if projection else h
                out = self.conv(f"{name}_conv1", pre)
                out = self.conv(f"{name}_conv2", F.relu(self.layers[f"{name}_bn2"](out)))
                h = out + shortcut
            h = F.relu(self.layers["final_bn"](h))
            return self.layers["logits"](h.mean(dim=(2, 3)))

    return PreActResNet18()


def _torch_project(delta, x, eps: float):
    """P_C: clip δ to [−ε, ε], then to [−x, 1 − x] (fbat_tf.constraints.project)."""
    import torch

    return torch.clamp(torch.clamp(delta, -eps, eps), min=-x, max=1.0 - x)


def _torch_random_init(x, eps: float, noise=None):
    """δ0 = P_C(U[−ε, ε]); `noise` (the U[−ε, ε] draw) given only by --check."""
    import torch

    if noise is None:
        noise = torch.empty_like(x).uniform_(-eps, eps)
    return _torch_project(noise, x, eps)


def _torch_input_gradient(model, x, delta, y):
    """∇δ Σ_i CE_i(θ, x + δ) with batch norm in training mode; no weight gradient computed."""
    import torch
    import torch.nn.functional as F

    delta = delta.detach().requires_grad_(True)
    loss = F.cross_entropy(model(x + delta), y, reduction="sum")
    (grad,) = torch.autograd.grad(loss, delta)
    return grad


def torch_fastat_gradients(model, x, y, noise=None):
    """Fast-AT's weight gradient (before weight decay): (grads, loss, δ)."""
    import torch
    import torch.nn.functional as F

    delta0 = _torch_random_init(x, EPS, noise)
    grad = _torch_input_gradient(model, x, delta0, y)
    delta = _torch_project(delta0 + FASTAT_ALPHA * torch.sign(grad), x, EPS)
    loss = F.cross_entropy(model(x + delta), y)
    grads = torch.autograd.grad(loss, list(model.parameters()))
    return grads, loss, {"delta": delta}


def torch_fastbat_gradients(model, x, y, noise=None):
    """Fast-BAT's g1 + c·g2 (before weight decay), DESIGN.md §3 steps 1–6: (grads, loss, parts)."""
    import torch
    import torch.nn.functional as F

    params = list(model.parameters())
    batch, a = x.shape[0], FASTBAT_LAMBDA_INV
    # 1. Linearization point: one PGD step without sign from δ0.
    delta0 = _torch_random_init(x, EPS, noise)
    z = _torch_project(delta0 + a * _torch_input_gradient(model, x, delta0, y), x, EPS)
    # 2. Lower level: g_z(θ) with its backward pass recorded for step 5; δ* a constant.
    z = z.detach().requires_grad_(True)
    lower = F.cross_entropy(model(x + z), y, reduction="sum")
    (g_z,) = torch.autograd.grad(lower, z, create_graph=True)
    delta_star = _torch_project(z.detach() + a * g_z.detach(), x, EPS).requires_grad_(True)
    # 3. Upper level at δ*: one backward pass gives g1 and v = B·∇δ L.
    loss = F.cross_entropy(model(x + delta_star), y)
    *g1, delta_grad = torch.autograd.grad(loss, [*params, delta_star])
    v = delta_grad * batch
    # 4. Inactive constraints at δ*.
    lower_bound = torch.clamp(-x, min=-EPS) + TAU
    upper_bound = torch.clamp(1.0 - x, max=EPS) - TAU
    mask = ((delta_star > lower_bound) & (delta_star < upper_bound)).to(x.dtype)
    # 5. g2 = ∇θ (1/B) Σ_i ⟨g_z,i(θ), H_i ⊙ v_i⟩: double backward through step 2.
    implicit = (g_z * (mask * v).detach()).sum() / batch
    g2 = torch.autograd.grad(implicit, params, allow_unused=True)
    # 6. g1 + c·g2.
    g2 = [torch.zeros_like(p) if g is None else g for p, g in zip(params, g2, strict=True)]
    grads = [u + FASTBAT_IG_COEF * i for u, i in zip(g1, g2, strict=True)]
    return grads, loss, {"delta": delta_star.detach(), "g2": g2}


TORCH_GRADIENTS = {"fastat": torch_fastat_gradients, "fastbat": torch_fastbat_gradients}


def _batch(batch_size: int):
    """step_time.py's batch: U[0, 1] images and random labels from numpy's generator, seed 0."""
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, (batch_size, IMAGE_SIZE, IMAGE_SIZE, CHANNELS)).astype(np.float32)
    y = rng.integers(0, CLASSES, batch_size).astype(np.int32)
    return x, y


def _resident_mb() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def time_torch(method: str) -> dict:
    import numpy as np
    import torch

    torch.set_num_threads(_TORCH_THREADS.value or os.cpu_count())
    torch.manual_seed(0)
    model = torch_preact_resnet18(_WIDTH.value).train()
    params = list(model.parameters())
    optimizer = torch.optim.SGD(
        params, lr=LEARNING_RATE, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY
    )
    x, y = _batch(_BATCH.value)
    x = torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2)))  # NCHW
    y = torch.from_numpy(y).long()
    gradients = TORCH_GRADIENTS[method]

    def step() -> float:
        grads, loss, _ = gradients(model, x, y)
        for p, g in zip(params, grads, strict=True):
            p.grad = g
        optimizer.step()  # adds weight decay to the gradient, then momentum
        return loss.item()

    resident_before = _resident_mb()
    for _ in range(_WARMUP.value):
        step()
    times = []
    for _ in range(_REPEATS.value):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    seconds = statistics.median(times)
    profile = {}
    if _PROFILE.value:
        from profiles import torch_profile

        profile = {"profile": torch_profile(step, _PROFILE.value)}
    return {
        **profile,
        "step_time_s": seconds,
        "images_per_s": _BATCH.value / seconds,
        "peak_memory_mb": peak_mb,
        "step_memory_mb": peak_mb - resident_before,
        "times_s": times,
        "parameters": sum(p.numel() for p in params),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "mkldnn": torch.backends.mkldnn.is_available(),
        "parallel_info": torch.__config__.parallel_info(),
    }


# --------------------------------------------------------------------------------------------
# fbat-tf: bench/step_time.py's child, run as is.


def step_time_command(method: str | None, jit_compile: str) -> list[str]:
    """step_time.py's child for one method; method None: the user's command for all of them."""
    return [
        sys.executable,
        os.path.join(HERE, "step_time.py"),
        f"--child={method}" if method else f"--methods={','.join(_METHODS.value)}",
        "--model=preact_resnet18",
        f"--width={_WIDTH.value}",
        f"--batch_size={_BATCH.value}",
        f"--image_size={IMAGE_SIZE}",
        f"--channels={CHANNELS}",
        f"--jit_compile={jit_compile}",
        "--precision=float32",
        f"--repeats={_REPEATS.value}",
        f"--warmup={_WARMUP.value}",
        *([f"--profile_steps={_PROFILE.value}"] if _PROFILE.value else []),
        *([f"--tf_threads={_TF_THREADS.value}"] if _TF_THREADS.value else []),
    ]


def time_fbat_tf(variant: str, method: str) -> dict:
    command = step_time_command(method, TF_VARIANTS[variant][1])
    measured = run_child(command, " ".join(command))
    measured["command"] = " ".join(["python", "bench/step_time.py", *command[2:]])
    measured["onednn"] = os.environ.get("TF_ENABLE_ONEDNN_OPTS")
    return measured


# --------------------------------------------------------------------------------------------
# --check: the same batch, weights and noise through both frameworks.


def _copy_keras_to_torch(keras_model, torch_model) -> None:
    import numpy as np
    import torch

    modules = torch_model.layers
    with torch.no_grad():
        for layer in keras_model.layers:
            if layer.name not in modules:
                continue
            module = modules[layer.name]
            weights = {v.path.split("/")[-1]: np.asarray(v) for v in layer.weights}
            if "kernel" in weights:
                kernel = weights["kernel"]
                # HWIO -> OIHW; Dense (in, out) -> (out, in)
                kernel = kernel.transpose(3, 2, 0, 1) if kernel.ndim == 4 else kernel.T
                module.weight.copy_(torch.from_numpy(np.ascontiguousarray(kernel)))
                if "bias" in weights:
                    module.bias.copy_(torch.from_numpy(weights["bias"]))
            else:  # batch norm
                module.weight.copy_(torch.from_numpy(weights["gamma"]))
                module.bias.copy_(torch.from_numpy(weights["beta"]))
                module.running_mean.copy_(torch.from_numpy(weights["moving_mean"]))
                module.running_var.copy_(torch.from_numpy(weights["moving_variance"]))


def _torch_grads_as_keras(keras_model, torch_model, grads) -> list:
    """PyTorch gradients reordered and transposed to line up with keras trainable_variables."""
    by_name = dict(zip((n for n, _ in torch_model.named_parameters()), grads, strict=True))
    aligned = []
    for variable in keras_model.trainable_variables:
        layer, kind = variable.path.split("/")[-2:]
        attribute = "bias" if kind in ("bias", "beta") else "weight"
        grad = by_name[f"layers.{layer}.{attribute}"].detach().numpy()
        if kind == "kernel":
            grad = grad.transpose(2, 3, 1, 0) if grad.ndim == 4 else grad.T
        aligned.append(grad)
    return aligned


def _norm(tensors: list) -> float:
    import numpy as np

    return float(np.sqrt(sum(float(np.sum(np.square(np.asarray(t)))) for t in tensors)))


def _relative(a: list, b: list) -> float:
    """‖a − b‖ / ‖b‖ over a list of arrays."""
    return _norm([u - w for u, w in zip(a, b, strict=True)]) / _norm(b)


def check() -> dict:
    import keras
    import numpy as np
    import tensorflow as tf
    import torch

    from fbat_tf import constraints, methods, models

    keras.utils.set_random_seed(0)
    torch.manual_seed(0)
    torch.set_num_threads(os.cpu_count())
    shape = (IMAGE_SIZE, IMAGE_SIZE, CHANNELS)
    keras_model = models.build("preact_resnet18", CLASSES, shape, MEAN, STD, width=CHECK_WIDTH)
    torch_model = torch_preact_resnet18(CHECK_WIDTH, keras_padding=True).train()
    _copy_keras_to_torch(keras_model, torch_model)
    x, y = _batch(CHECK_BATCH)
    seed = tf.constant([0, 1], tf.int32)
    noise = np.asarray(constraints.uniform_noise(tf.constant(x), EPS, seed))

    def nchw(a):
        return torch.from_numpy(np.ascontiguousarray(a.transpose(0, 3, 1, 2)))

    tx, ty = nchw(x), torch.from_numpy(y).long()
    out = {"width": CHECK_WIDTH, "batch_size": CHECK_BATCH}
    with torch.no_grad():
        logits_tf = np.asarray(keras_model(x, training=False))
        logits_torch = torch_model.eval()(tx).numpy()
        torch_model.train()
    out["logits_max_abs_diff"] = float(np.max(np.abs(logits_tf - logits_torch)))
    for name in _METHODS.value:
        method = methods.create(name, eps=EPS)
        x_adv_tf = np.asarray(method.perturb(keras_model, x, y, seed))
        grads_tf, _ = method.gradients(keras_model, x, y, seed)
        grads_tf = [np.asarray(g) for g in grads_tf]
        grads, loss, parts = TORCH_GRADIENTS[name](torch_model, tx, ty, nchw(noise))
        x_adv_torch = (tx + parts["delta"]).detach().numpy().transpose(0, 2, 3, 1)
        result = {
            "x_adv_max_abs_diff": float(np.max(np.abs(x_adv_tf - x_adv_torch))),
            "x_adv_fraction_differing": float(np.mean(np.abs(x_adv_tf - x_adv_torch) > 1e-5)),
            "gradient_relative_diff": _relative(
                _torch_grads_as_keras(keras_model, torch_model, grads), grads_tf
            ),
        }
        if name == "fastbat":
            upper_tf, _ = methods.create(name, eps=EPS, ig_coef=0.0).gradients(
                keras_model, x, y, seed
            )
            implicit_tf = [g - np.asarray(u) for g, u in zip(grads_tf, upper_tf, strict=True)]
            implicit_torch = [FASTBAT_IG_COEF * g for g in parts["g2"]]
            result["implicit_term_relative_diff"] = _relative(
                _torch_grads_as_keras(keras_model, torch_model, implicit_torch), implicit_tf
            )
            result["implicit_to_upper_norm_ratio"] = _norm(implicit_tf) / _norm(upper_tf)
        out[name] = result
    return out


def check_table(result: dict) -> str:
    lines = [
        f"PreActResNet-18 width {result['width']}, batch {result['batch_size']}, Keras's weights "
        f"and padding in PyTorch, the same δ0; inference logits differ by at most "
        f"{result['logits_max_abs_diff']:.1e}",
        "",
        "| method | largest difference of x+δ | fraction of pixels > 1e-5 apart "
        "| ‖g_torch − g_tf‖ / ‖g_tf‖ | the same for c·g2 alone | ‖c·g2‖ / ‖g1‖ (fbat-tf) |",
        "|---|---|---|---|---|---|",
    ]
    for name in METHODS:
        if name in result:
            r = result[name]
            implicit = r.get("implicit_term_relative_diff")
            share = r.get("implicit_to_upper_norm_ratio")
            lines.append(
                f"| {name} | {r['x_adv_max_abs_diff']:.1e} | {r['x_adv_fraction_differing']:.1e} "
                f"| {r['gradient_relative_diff']:.1e} | "
                f"{'' if implicit is None else f'{implicit:.1e}'} | "
                f"{'' if share is None else f'{share:.1e}'} |"
            )
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# The parent: children in turns, the summary, the table.


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def machine() -> dict:
    return {
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "tensorflow": _version("tensorflow"),
        "keras": _version("keras"),
        "torch": _version("torch"),
    }


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if _CHILD.value:
        variant, method = _CHILD.value.split(":")
        report(time_torch(method) if variant == "torch" else time_fbat_tf(variant, method))
        return
    for flag, given, known in (
        ("methods", _METHODS.value, METHODS),
        ("variants", _VARIANTS.value, VARIANTS),
    ):
        unknown = sorted(set(given) - set(known))
        if unknown:
            sys.exit(f"error: --{flag} has unknown name(s) {unknown}; choose from {known}")
    if (_CHECK.value or "torch" in _VARIANTS.value) and importlib.util.find_spec("torch") is None:
        sys.exit("error: PyTorch is not installed (a bench-only dependency): pip install torch")
    command = "python bench/step_vs_torch.py " + " ".join(sys.argv[1:])
    if _CHECK.value:
        result = {"command": command, "machine": machine(), "check": check()}
        print(check_table(result["check"]))
        write_json(_JSON.value, result)
        return

    os.environ["TF_ENABLE_ONEDNN_OPTS"] = "1" if _ONEDNN.value else "0"  # the children's
    load_before = os.getloadavg()
    names = [f"{variant}:{method}" for variant in _VARIANTS.value for method in _METHODS.value]
    measured = run_per_method(__file__, names, _ROUNDS.value)
    load_after = os.getloadavg()
    results: dict[str, dict[str, dict]] = {}
    for name, r in measured.items():
        variant, method = name.split(":")
        results.setdefault(variant, {})[method] = r
        print(f"{name}: {r['step_time_s']:.3f} s/step", file=sys.stderr)

    def seconds(variant: str, method: str) -> float | None:
        return results.get(variant, {}).get(method, {}).get("step_time_s")

    ratio_to_torch = {
        variant: {
            method: seconds(variant, method) / seconds("torch", method) for method in _METHODS.value
        }
        for variant in results
        if variant != "torch" and "torch" in results
    }
    fastbat_over_fastat = {
        variant: seconds(variant, "fastbat") / seconds(variant, "fastat")
        for variant in results
        if seconds(variant, "fastbat") and seconds(variant, "fastat")
    }
    summary = {
        "model": f"preact_resnet18 width {_WIDTH.value}",
        "batch_size": _BATCH.value,
        "image_size": IMAGE_SIZE,
        "precision": "float32",
        "eps": EPS,
        "optimizer": {
            "name": "SGD",
            "learning_rate": LEARNING_RATE,
            "momentum": MOMENTUM,
            "weight_decay": WEIGHT_DECAY,
        },
        "repeats": _REPEATS.value,
        "warmup": _WARMUP.value,
        "rounds": _ROUNDS.value,
        "onednn": _ONEDNN.value,
        "tf_threads": _TF_THREADS.value or None,
        "command": command,
        # The same fbat-tf measurement through step_time.py itself.
        "step_time_commands": {
            variant: " ".join(
                [
                    f"TF_ENABLE_ONEDNN_OPTS={os.environ['TF_ENABLE_ONEDNN_OPTS']}",
                    "python",
                    "bench/step_time.py",
                    *step_time_command(None, jit)[2:],
                ]
            )
            for variant, (_, jit) in TF_VARIANTS.items()
            if variant in results
        },
        "machine": {
            **machine(),
            "load_average_before": list(load_before),
            "load_average_after": list(load_after),
        },
        "results": results,
        "ratio_to_torch": ratio_to_torch,
        "fastbat_over_fastat": fastbat_over_fastat,
    }
    if "fastbat" in ratio_to_torch.get("fbat_tf", {}):
        ratio = ratio_to_torch["fbat_tf"]["fastbat"]
        summary["target"] = {
            "fbat_tf_fastbat_over_torch": ratio,
            "at_or_below_torch": ratio <= 1.0,
            "goal_0.75": ratio <= 0.75,
        }
    print(markdown_table(summary))
    profiled = {
        f"{LABELS[variant]} {method}": r["profile"]
        for variant, by_method in results.items()
        for method, r in by_method.items()
        if "profile" in r
    }
    if profiled:
        from profiles import markdown_table as profile_table

        print("\nSeconds per step by kind of operation (each framework's profiler):\n")
        print(profile_table(profiled))
    write_json(_JSON.value, summary)


def markdown_table(summary: dict) -> str:
    results, m = summary["results"], summary["machine"]
    variants = [v for v in VARIANTS if v in results]
    compared = [v for v in variants if v in summary["ratio_to_torch"]]
    methods = [name for name in METHODS if any(name in results[v] for v in variants)]
    versions = ", ".join(
        part
        for part in (
            f"TF {m['tensorflow']} (oneDNN {'on' if summary['onednn'] else 'off'}"
            + (f", {summary['tf_threads']} thread(s)" if summary.get("tf_threads") else "")
            + "), "
            f"Keras {m['keras']}"
            if set(variants) & set(TF_VARIANTS)
            else "",
            f"PyTorch {m['torch']} ({results['torch'][methods[0]]['torch_threads']} threads)"
            if "torch" in results
            else "",
        )
        if part
    )
    lines = [
        f"PreActResNet-18 width {summary['model'].split()[-1]}, batch {summary['batch_size']}, "
        f"{summary['image_size']}×{summary['image_size']}×3, float32, CPU ({m['cpu_count']} "
        f"cores), {versions}; median of {summary['repeats']} steps after {summary['warmup']} "
        "warm-up"
        + (f", median over {summary['rounds']} alternating rounds" if summary["rounds"] > 1 else "")
        + "; load average (1 min) "
        f"{m['load_average_before'][0]:.2f} before, {m['load_average_after'][0]:.2f} after",
        "",
        "| method | "
        + " | ".join(f"{LABELS[v]} (s)" for v in variants)
        + "".join(f" | {LABELS[v]} / PyTorch" for v in compared)
        + " |",
        "|---" * (1 + len(variants) + len(compared)) + "|",
    ]

    def cell(value: float | None, digits: int = 3) -> str:
        return "" if value is None else f"{value:.{digits}f}"

    for method in methods:
        lines.append(
            f"| {method} | "
            + " | ".join(cell(results[v].get(method, {}).get("step_time_s")) for v in variants)
            + "".join(f" | {cell(summary['ratio_to_torch'][v].get(method), 2)}" for v in compared)
            + " |"
        )
    if summary["fastbat_over_fastat"]:
        lines.append(
            "| fastbat / fastat | "
            + " | ".join(cell(summary["fastbat_over_fastat"].get(v), 2) for v in variants)
            + " |" * len(compared)
            + " |"
        )
    if m["load_average_before"][0] > 0.5:
        lines += [
            "",
            f"The machine was busy before the run (load average {m['load_average_before'][0]:.2f}"
            f" on {m['cpu_count']} cores): other processes slow every variant, multi-threaded "
            "PyTorch (OpenMP threads waiting for each other) most; rerun on an idle machine.",
        ]
    target = summary.get("target")
    if target:
        lines += [
            "",
            f"fbat-tf's default Fast-BAT step is {target['fbat_tf_fastbat_over_torch']:.2f}× "
            "PyTorch's: target (at or below PyTorch's) "
            f"{'met' if target['at_or_below_torch'] else 'NOT met'}; "
            f"goal ≤ 0.75× {'met' if target['goal_0.75'] else 'not met'}.",
        ]
    return "\n".join(lines)


if __name__ == "__main__":
    app.run(main)
