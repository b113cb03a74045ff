"""GPU health from NVML (nvidia-ml-py, when the environment has it): ECC errors and throttling."""

from __future__ import annotations

from gpuenv.verify.base import Checks, Context, Spec
from gpuenv.verify.model import Check

CHECKS = Checks()

# Idle (0x1) and application clocks (0x2) are normal; the other throttle reasons slow the GPU down.
_BENIGN_THROTTLE = 0x3


@CHECKS.add("gpu.nvml_health", "ECC and throttling")
def health(ctx: Context, me: Spec) -> Check:
    if not ctx.gpu_visible:
        return ctx.gpu_skip(me)
    try:
        import pynvml  # type: ignore[import-not-found,unused-ignore]  # noqa: PLC0415 - optional (nvidia-ml-py)
    except ImportError:
        if ctx.require_gpu:
            return me.failed(
                "NVML health",
                observed="nvidia-ml-py is not installed",
                hint="add nvidia-ml-py to the stack's packages to read ECC and throttling",
            )
        return me.skipped("nvidia-ml-py is not installed")
    try:
        pynvml.nvmlInit()
    except Exception as exc:
        return ctx.gpu_skip(me, f"NVML does not start ({exc})")
    findings, observed = [], []
    try:
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            try:
                ecc = pynvml.nvmlDeviceGetTotalEccErrors(
                    handle, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC
                )
            except Exception:
                ecc = None
            reasons = int(pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle))
            slow = reasons & ~_BENIGN_THROTTLE
            observed.append({"gpu": i, "uncorrected_ecc": ecc, "throttle_reasons": hex(reasons)})
            if ecc:
                findings.append(f"GPU {i}: {ecc} uncorrected ECC errors")
            if slow:
                findings.append(f"GPU {i}: throttled (reasons {hex(slow)})")
    finally:
        pynvml.nvmlShutdown()
    if findings:
        return me.warned(
            "; ".join(findings),
            observed=observed,
            hint="uncorrected ECC errors: drain the host and reset or replace the GPU; throttling: check "
            "cooling, power caps (nvidia-smi -q -d PERFORMANCE)",
        )
    return me.passed("no uncorrected ECC errors, no throttling", observed)
