"""The PyTorch references that bench/step_vs_torch.py and bench/eval_vs_torch.py time and check
fbat-tf against: the models, Fast-AT's and Fast-BAT's training steps, and PGD. torch is imported
only inside the functions, so that importing this module needs no PyTorch.

    model = preact_resnet18(width=64).train()
    grads, loss, parts = GRADIENTS["fastbat"](model, x, y)      # before weight decay
    x_adv = pgd(mlp(keras_mlp), x, y, eps, steps=50, restarts=10, generator=generator)

What they match (DESIGN.md §3; `step_vs_torch.py --check` and eval_vs_torch.py's logits check
compare them with fbat-tf on the same weights and points):

- `preact_resnet18`: input standardization inside the model ((x − MEAN) / STD, as step_time.py
  builds it), a bias-free 3x3 stem conv, four stages of two pre-activation basic blocks
  (BN-ReLU-conv3x3(stride)-BN-ReLU-conv3x3, plus the identity or a bias-free 1x1 conv with the
  stride that reads the raw block input), widths w, 2w, 4w, 8w, strides 1, 2, 2, 2, final
  BN-ReLU, global average pooling, a Linear layer with bias; BN eps 1e-5, momentum 0.1;
  11,172,170 parameters at width 64. It pads its 3x3 convs by 1 on every side (PyTorch's way);
  Keras's "same" pads a stride-2 3x3 conv by 0 before and 1 after: the same cost, other pixels,
  so `keras_padding=True` pads as Keras does, for weights copied from Keras.
- the steps (fbat_tf/methods/fast_at.py, fast_bat.py), every forward pass with batch norm in
  training mode (its running statistics updated by each, as Keras's layers do), attack
  gradients of the summed per-example cross-entropy, the weight loss a batch mean:
  Fast-AT: δ0 = P_C(U[−ε, ε]), δ = P_C(δ0 + 1.25ε·sign(∇δ Σ CE)), then the weight gradient at x+δ.
  Fast-BAT (a = 1/λ = 5000/255, c = 0.1, τ = 1e-7, linearization pgd_nosign): z = P_C(δ0 + a·∇δ
  Σ CE(x+δ0)); g_z = ∇δ Σ CE(x+z) with create_graph=True; δ* = P_C(z + a·g_z), detached; one
  backward at x+δ* for g1 = ∇θ mean CE and v = B·∇δ mean CE; H = 1[max(−ε, −x) + τ < δ* <
  min(ε, 1−x) − τ]; g2 = ∇θ (1/B) Σ ⟨g_z, stop_gradient(H ⊙ v)⟩ by torch.autograd through step
  2's recorded backward pass (double backward, as fbat-tf's nested tapes); gradient g1 + c·g2.
- `mlp`: a torch.nn copy of a Keras MLP (Flatten, then Dense layers as Linear, ReLU between).
- `pgd`: what fbat_tf/attacks/pgd.py does without XLA (see its docstring), L∞ or L2: for L2 a
  start uniform in the ball (a Gaussian's direction, radius ε·U^(1/d)) clipped to the box, steps
  along ∇/‖∇‖₂, each projected onto the L2 ball ∩ box exactly (`project_l2`: bisection on the
  scale t of clip(t·δ, −x, 1 − x), written here for torch).
"""

from __future__ import annotations

EPS = 8 / 255
FASTAT_ALPHA = 1.25 * EPS
FASTBAT_LAMBDA_INV = 5000 / 255  # a = 1/λ, the default at ε ≤ 8/255
FASTBAT_IG_COEF = 0.1  # c
TAU = 1e-7
MEAN, STD = 0.5, 0.25  # the input standardization step_time.py builds its model with
CHANNELS, CLASSES = 3, 10


def preact_resnet18(width: int, keras_padding: bool = False):
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


def project(delta, x, eps: float):
    """P_C: clip δ to [−ε, ε], then to [−x, 1 − x] (fbat_tf.constraints.project)."""
    import torch

    return torch.clamp(torch.clamp(delta, -eps, eps), min=-x, max=1.0 - x)


def random_init(x, eps: float, noise=None):
    """δ0 = P_C(U[−ε, ε]); `noise`: the U[−ε, ε] draw, to replay fbat-tf's (else drawn)."""
    import torch

    if noise is None:
        noise = torch.empty_like(x).uniform_(-eps, eps)
    return project(noise, x, eps)


def input_gradient(model, x, delta, y):
    """∇δ Σ_i CE_i(θ, x + δ) with batch norm in training mode; no weight gradient computed."""
    import torch
    import torch.nn.functional as F

    delta = delta.detach().requires_grad_(True)
    loss = F.cross_entropy(model(x + delta), y, reduction="sum")
    (grad,) = torch.autograd.grad(loss, delta)
    return grad


def fastat_gradients(model, x, y, noise=None):
    """Fast-AT's weight gradient (before weight decay): (grads, loss, δ)."""
    import torch
    import torch.nn.functional as F

    delta0 = random_init(x, EPS, noise)
    grad = input_gradient(model, x, delta0, y)
    delta = project(delta0 + FASTAT_ALPHA * torch.sign(grad), x, EPS)
    loss = F.cross_entropy(model(x + delta), y)
    grads = torch.autograd.grad(loss, list(model.parameters()))
    return grads, loss, {"delta": delta}


def fastbat_gradients(model, x, y, noise=None):
    """Fast-BAT's g1 + c·g2 (before weight decay), DESIGN.md §3 steps 1–6: (grads, loss, parts)."""
    import torch
    import torch.nn.functional as F

    params = list(model.parameters())
    batch, a = x.shape[0], FASTBAT_LAMBDA_INV
    # 1. Linearization point: one PGD step without sign from δ0.
    delta0 = random_init(x, EPS, noise)
    z = project(delta0 + a * input_gradient(model, x, delta0, y), x, EPS)
    # 2. Lower level: g_z(θ) with its backward pass recorded for step 5; δ* a constant.
    z = z.detach().requires_grad_(True)
    lower = F.cross_entropy(model(x + z), y, reduction="sum")
    (g_z,) = torch.autograd.grad(lower, z, create_graph=True)
    delta_star = project(z.detach() + a * g_z.detach(), x, EPS).requires_grad_(True)
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


GRADIENTS = {"fastat": fastat_gradients, "fastbat": fastbat_gradients}


def copy_keras_weights(keras_model, torch_model) -> None:
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


def gradients_as_keras(keras_model, torch_model, grads) -> list:
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


def mlp(model):
    """A torch.nn copy of the Keras MLP: Flatten, then Dense layers as Linear (ReLU between)."""
    import keras
    import torch

    dense = [layer for layer in model.layers if isinstance(layer, keras.layers.Dense)]
    modules = [torch.nn.Flatten()]
    for index, layer in enumerate(dense):
        activation = layer.get_config()["activation"]
        expected = "linear" if index == len(dense) - 1 else "relu"
        if activation != expected:
            raise ValueError(f"{layer.name}: activation {activation!r}, expected {expected!r}")
        kernel, bias = layer.get_weights()  # kernel [in, out]; torch's weight is [out, in]
        linear = torch.nn.Linear(*kernel.shape)
        with torch.no_grad():
            linear.weight.copy_(torch.from_numpy(kernel.T.copy()))
            linear.bias.copy_(torch.from_numpy(bias))
        modules.append(linear)
        if expected == "relu":
            modules.append(torch.nn.ReLU())
    copy = torch.nn.Sequential(*modules).eval()
    for parameter in copy.parameters():
        parameter.requires_grad_(False)  # the attacks differentiate the input only
    return copy


def project_l2(delta, x, eps: float, rounds: int = 50):
    """The nearest point of {‖δ‖₂ ≤ ε} ∩ [−x, 1 − x] per example: clip(t·δ, −x, 1 − x) with t
    the largest value in [0, 1] whose clip lies in the ball (the multiplier form of the
    projection; the clip's norm grows with t), by bisection."""
    import torch

    def norm_at(t):
        return torch.clamp(t * delta, min=-x, max=1.0 - x).flatten(1).norm(dim=1)

    low, high = torch.zeros(len(delta)), torch.ones(len(delta))
    shape = (-1,) + (1,) * (delta.dim() - 1)
    for _ in range(rounds):
        middle = (low + high) / 2
        inside = norm_at(middle.view(shape)) <= eps
        low, high = torch.where(inside, middle, low), torch.where(inside, high, middle)
    t = torch.where(norm_at(torch.ones_like(low).view(shape)) <= eps, torch.ones_like(low), low)
    return torch.clamp(t.view(shape) * delta, min=-x, max=1.0 - x)


def l2_start(x, eps: float, generator):
    """A point uniform in the L2 ball of radius ε per example, clipped to the box."""
    import torch

    direction = torch.randn(x.shape, generator=generator)
    direction = direction / direction.flatten(1).norm(dim=1).view(-1, *[1] * (x.dim() - 1))
    radius = eps * torch.rand(len(x), generator=generator) ** (1.0 / x[0].numel())
    return torch.clamp(direction * radius.view(-1, *[1] * (x.dim() - 1)), min=-x, max=1.0 - x)


def pgd(model, x, y, eps: float, steps: int, restarts: int, generator, norm: str = "linf"):
    """PGD-K-R on one batch, the points fbat_tf/attacks/pgd.py finds without XLA, one restart at
    a time (fbat-tf runs later restarts side by side; a plain loop runs them in turn).

    Step ε/4, start P_C(U[-ε, ε]^d) drawn for the whole batch (L2: `l2_start`), K signed steps
    (L2: normalized ones) on the summed cross-entropy, each projected. The first restart attacks
    every example; each later one only the examples no restart has broken yet, and none runs
    once all are broken. A restart's point is its first iterate (the start included) that
    misclassifies the example, else its last; per example the result is the first restart's
    point that misclassifies it, or else the first restart's point.
    """
    import torch
    import torch.nn.functional as F

    step_size = eps / 4
    best = x.clone()
    robust = torch.ones(len(x), dtype=torch.bool)
    for restart in range(restarts):
        if restart and not robust.any():
            break
        if norm == "l2":
            start = l2_start(x, eps, generator)
        else:
            start = project(torch.empty_like(x).uniform_(-eps, eps, generator=generator), x, eps)
        rows = robust.nonzero()[:, 0]
        x_rows, y_rows, delta = x[rows], y[rows], start[rows]
        # The restart's first iterate that the model misclassifies, per example, if any.
        found = torch.zeros(len(rows), dtype=torch.bool)
        kept = delta.clone()
        for _ in range(steps):
            delta.requires_grad_(True)
            logits = model(x_rows + delta)
            loss = F.cross_entropy(logits, y_rows, reduction="sum")
            (grad,) = torch.autograd.grad(loss, delta)
            new = ~found & (logits.detach().argmax(1) != y_rows)
            kept[new] = delta.detach()[new]
            found |= new
            if norm == "l2":
                length = grad.flatten(1).norm(dim=1).clamp_min(1e-30)
                moved = delta.detach() + step_size * grad / length.view(-1, *[1] * (x.dim() - 1))
                delta = project_l2(moved, x_rows, eps)
            else:
                delta = project(delta.detach() + step_size * grad.sign(), x_rows, eps)
        delta = torch.where(found.view(-1, *[1] * (x.dim() - 1)), kept, delta.detach())
        x_adv = x_rows + delta
        with torch.no_grad():
            broken = model(x_adv).argmax(1) != y_rows
        take = broken if restart else torch.ones_like(broken)
        best[rows[take]] = x_adv[take]
        robust[rows[broken]] = False
    return best


def check_in_ball(x_adv, x, eps: float, name: str, norm: str = "linf") -> None:
    """As evaluate.py does before counting: ‖x_adv − x‖ ≤ ε + 1e-6 (L2: 1e-6·(1 + ε)), x_adv in
    [0, 1], finite."""
    import torch

    delta = (x_adv - x).flatten(1)
    if norm == "l2":
        distance, tol = float(delta.norm(dim=1).max()), 1e-6 * (1 + eps)
    else:
        distance, tol = float(delta.abs().max()), 1e-6
    low, high = float(x_adv.min()), float(x_adv.max())
    finite = bool(torch.isfinite(x_adv).all())
    if not finite or distance > eps + tol or low < -1e-6 or high > 1 + 1e-6:
        raise AssertionError(
            f"{name}: points outside C (‖δ‖ = {distance:.3g} in {norm}, ε = {eps:.3g})"
        )


def accuracy(model, x, y) -> float:
    import torch

    with torch.no_grad():
        return int((model(x).argmax(1) == y).sum()) / len(y)


def robust_accuracy(model, x, x_adv, y) -> float:
    """The share of examples right on the clean point and on the attack's: a point wrong clean
    is not robust, whatever the attack returned for it."""
    import torch

    with torch.no_grad():
        robust = (model(x).argmax(1) == y) & (model(x_adv).argmax(1) == y)
    return int(robust.sum()) / len(y)


def to_torch(x_nhwc, y_int):
    """The images NCHW and the labels int64, as torch tensors."""
    import torch

    # Keras flattens NHWC 28×28×1, torch NCHW 1×28×28: with one channel the order is the same.
    x = torch.from_numpy(x_nhwc.transpose(0, 3, 1, 2).copy())
    return x, torch.from_numpy(y_int.astype("int64"))
