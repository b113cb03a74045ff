"""The GPU compute checks: a convolution forward and backward through cuDNN, a matmul with its
TFLOP/s, device memory bandwidth, autocast with a GradScaler step, and a small CNN whose loss must
fall. Each body runs on the device the context gives: CUDA on a GPU host; the CPU device for
--cpu-selftest and the unit tests, which run this code where no GPU is, so that an API the
environment's torch lacks is found before the first GPU host (it proves nothing about a GPU)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gpuenv.verify.base import Checks, Context, Spec
from gpuenv.verify.model import Check

CHECKS = Checks()
_CRASH_HINT = "see the message: an error here on a GPU host is what training jobs would hit"

if TYPE_CHECKING:  # Python 3.8 on the hosts cannot subscript Callable at runtime
    DeviceBody = Callable[[Any, Any, Spec], Check]


def _on_device(check_id: str, title: str) -> Callable[[DeviceBody], Spec]:
    """Declare a compute check whose body takes (torch, device, spec): skipped (or failed under
    --require-gpu) where there is no device to run it on."""

    def declare(body: DeviceBody) -> Spec:
        def on_device(ctx: Context, me: Spec) -> Check:
            dev = ctx.compute_device()
            return ctx.gpu_skip(me) if dev is None else body(ctx.torch, dev, me)

        return CHECKS.add(check_id, title, crash_hint=_CRASH_HINT)(on_device)

    return declare


def _sync(t: Any, dev: Any) -> None:
    """Wait for the device's queued work (CUDA runs asynchronously; the CPU does not)."""
    if dev.type == "cuda":
        t.cuda.synchronize()


@_on_device("gpu.conv_cudnn", "conv cudnn")
def conv(t: Any, dev: Any, me: Spec) -> Check:
    x = t.randn(8, 3, 64, 64, device=dev, requires_grad=True)
    layer = t.nn.Conv2d(3, 16, 3, padding=1).to(dev)
    y = layer(x)
    y.sum().backward()
    _sync(t, dev)
    ok = x.grad is not None and bool(t.isfinite(x.grad).all())
    return me.judged(ok, "convolution forward and backward", list(y.shape), None, "the gradient is not finite")


@_on_device("gpu.matmul", "matmul")
def matmul(t: Any, dev: Any, me: Spec) -> Check:
    n = 4096 if dev.type == "cuda" else 256  # the CPU self-test runs the code, it measures nothing
    a, b = t.randn(n, n, device=dev), t.randn(n, n, device=dev)
    a @ b
    _sync(t, dev)
    start = time.perf_counter()
    reps = 10
    for _ in range(reps):
        c = a @ b
    _sync(t, dev)
    tflops = 2 * n**3 * reps / (time.perf_counter() - start) / 1e12
    ok = bool(t.isfinite(c).all())
    return me.judged(ok, f"fp32 matmul {tflops:.1f} TFLOP/s", round(tflops, 2), None, "the product is not finite")


@_on_device("gpu.bandwidth", "bandwidth")
def bandwidth(t: Any, dev: Any, me: Spec) -> Check:
    size = 256 if dev.type == "cuda" else 8  # MiB
    src = t.empty(size * 1024 * 1024, dtype=t.uint8, device=dev)
    dst = t.empty_like(src)
    dst.copy_(src)
    _sync(t, dev)
    reps = 20
    start = time.perf_counter()
    for _ in range(reps):
        dst.copy_(src)
    _sync(t, dev)
    gbs = 2 * src.numel() * reps / (time.perf_counter() - start) / 1e9  # read + write
    return me.passed(f"device memory copy {gbs:.0f} GB/s", round(gbs, 1))


def grad_scaler(t: Any, device_type: str) -> Any:
    """torch.amp.GradScaler(device) exists from torch 2.3; 1.12 to 2.2 have torch.cuda.amp.GradScaler
    only, for CUDA (a stack of that era must not fail here on its first GPU)."""
    scaler = getattr(getattr(t, "amp", None), "GradScaler", None)
    if scaler is not None:
        return scaler(device_type)
    return t.cuda.amp.GradScaler(enabled=device_type == "cuda")


@_on_device("gpu.autocast", "autocast")
def autocast(t: Any, dev: Any, me: Spec) -> Check:
    """Mixed precision with a GradScaler step; on the CPU device in bfloat16, the one autocast type
    the CPU has (float16 and the scaler's scaling are the GPU's part)."""
    model = t.nn.Linear(256, 256).to(dev)
    opt = t.optim.SGD(model.parameters(), lr=0.01)
    scaler = grad_scaler(t, dev.type)
    on_gpu = dev.type == "cuda"
    dtypes = [t.float16, *([t.bfloat16] if t.cuda.is_bf16_supported() else [])] if on_gpu else [t.bfloat16]
    for dtype in dtypes:
        with t.autocast(dev.type, dtype=dtype):
            loss = model(t.randn(64, 256, device=dev)).float().pow(2).mean()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    names = [str(d).replace("torch.", "") for d in dtypes]
    return me.passed(f"autocast ({', '.join(names)}) with a GradScaler step", names)


@_on_device("gpu.train_cnn", "train cnn")
def train_cnn(t: Any, dev: Any, me: Spec) -> Check:
    t.manual_seed(0)
    model = t.nn.Sequential(
        t.nn.Conv2d(3, 8, 3, padding=1), t.nn.ReLU(), t.nn.AdaptiveAvgPool2d(4), t.nn.Flatten(), t.nn.Linear(128, 10)
    ).to(dev)
    opt = t.optim.Adam(model.parameters(), lr=1e-2)
    x, y = t.randn(64, 3, 32, 32, device=dev), t.randint(0, 10, (64,), device=dev)
    losses = []
    for _ in range(20):
        loss = t.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return me.judged(
        losses[-1] < losses[0],
        f"small CNN loss {losses[0]:.3f} -> {losses[-1]:.3f}",
        [round(losses[0], 4), round(losses[-1], 4)],
        "loss goes down",
        "training does not converge on synthetic data: numerics are broken",
    )
