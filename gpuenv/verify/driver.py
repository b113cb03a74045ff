"""The driver: the kernel module against the user space ("Driver/library version mismatch"), and
against the minimum torch's CUDA needs."""

from __future__ import annotations

import re

from gpuenv.verify.base import Checks, Context, Spec
from gpuenv.verify.model import Check

CHECKS = Checks()


def version_tuple(text: str) -> tuple[int, ...]:
    # Not gpuenv.versions.parse: that module is not Python 3.8 (the hosts' floor) at runtime, and
    # a driver version from NVML is compared here as it comes.
    return tuple(int(p) for p in re.findall(r"[0-9]+", text))


@CHECKS.add("driver.kernel", "NVIDIA kernel module")
def kernel(ctx: Context, me: Spec) -> Check:
    path = ctx.proc / "driver/nvidia/version"
    if ctx.proc_driver is None:
        return ctx.gpu_skip(me, f"no {path}: no NVIDIA kernel module is loaded")
    if ctx.driver_kernel is None:
        return me.failed(
            me.title,
            observed=ctx.proc_driver[:200],
            hint=f"{path} has no NVRM version line; reload the module (modprobe nvidia) or reboot",
        )
    return me.passed(f"kernel module {ctx.driver_kernel} loaded", ctx.driver_kernel)


@CHECKS.add("driver.userspace", "user-space driver")
def userspace(ctx: Context, me: Spec) -> Check:
    found = ctx.userspace
    if found.mismatch is not None:
        return me.failed(
            me.title,
            observed=found.mismatch,
            hint="Driver/library version mismatch: the loaded module is older or newer than the installed "
            "libraries; reboot, or unload and reload the nvidia modules",
        )
    if found.version is None:
        return ctx.gpu_skip(me, "neither NVML nor nvidia-smi answers")
    return me.passed(f"user-space driver {found.version} ({found.source})", found.version)


@CHECKS.add("driver.match", "kernel module and user space agree")
def match(ctx: Context, me: Spec) -> Check:
    kernel, user = ctx.driver_kernel, ctx.driver_user
    if kernel is None or user is None:
        return ctx.gpu_skip(me, "the kernel module or the user-space driver was not observed")
    if kernel == user:
        return me.passed(f"kernel module and user space are both {user}", kernel, user)
    return me.failed(
        "kernel module and user space differ",
        observed=kernel,
        expected=user,
        hint='this is "Failed to initialize NVML: Driver/library version mismatch": reboot, or stop '
        "GPU processes and reload the nvidia modules",
    )


@CHECKS.add("driver.cuda_minimum", "driver new enough")
def cuda_minimum(ctx: Context, me: Spec) -> Check:
    need = ctx.expect.get("torch_min_driver")
    have = ctx.driver_user or ctx.driver_kernel
    if need is None:
        return me.skipped("no expectations file gives the minimum")
    if have is None:
        return ctx.gpu_skip(me, "no driver was observed", title=f"driver >= {need}")
    if version_tuple(have) >= version_tuple(need):
        return me.passed(f"driver {have} >= {need}", have, f">= {need}")
    return me.failed(
        f"driver {have} is older than {need}",
        observed=have,
        expected=f">= {need}",
        hint=f"install driver {need} or newer (gpu_stack.driver), or a torch build for an older CUDA",
    )
