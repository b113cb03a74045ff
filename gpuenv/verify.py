"""gpuenv verify: prove on a host that the declared stack is the one that loads and runs.

This file needs nothing beyond the standard library and torch (nvidia-ml-py is used when
present), so that a host runs it with its environment's own Python:

    /opt/gpuenv/envs/default/bin/python verify.py --stack /etc/gpuenv/stack.json

`gpuenv verify` on the controller is the same code. --stack takes the resolved stack the preflight
published (gpu_stack_resolved: torch, torch_cuda, torch_cudnn, torch_min_driver, cuda, cudnn),
which the controller worked out from the compatibility data, so this file carries no data of its
own.

Exit 0: every check passed (warnings allowed); 1: a check failed; 2: verify could not run.
Every check has a stable id, a status (pass, fail, warn, skip), what it observed, what it expected,
and a fix hint when it fails. No check passes without having observed what it claims.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import json
import os
import queue
import re
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# 2: the report says when it was made (generated) and which stack it checked (stack_id), and a run
# that could not check (exit 2) still writes one, with a failing verify.run check.
SCHEMA_VERSION = 2
PASS, FAIL, WARN, SKIP = "pass", "fail", "warn", "skip"
NO_GPU = "no CUDA device visible to torch (no GPU, or no driver loaded)"


@dataclass
class Check:
    id: str
    status: str
    summary: str
    observed: Any = None
    expected: Any = None
    hint: str | None = None
    seconds: float = 0.0


@dataclass
class Context:
    """What the checks share: the expectations, the host's paths, and the GPU requirement."""

    expect: dict[str, Any] = field(default_factory=dict)
    require_gpu: bool = False
    proc: Path = Path("/proc")
    sys_root: Path = Path("/sys")
    cuda_home: Path = Path("/usr/local/cuda")
    torch: Any = None
    # `ldconfig -p` as text; None: run it (tests give saved output).
    ldconfig_cache: str | None = None
    driver_kernel: str | None = None
    driver_user: str | None = None
    # What gpu_services set up on the host (its record), for the services.* checks.
    services_record: Path = Path("/etc/ansible/facts.d/gpu_services.fact")

    def gpu_skip(self, check_id: str, summary: str, reason: str = NO_GPU) -> Check:
        """A GPU check that cannot run: skip with the reason, or fail under --require-gpu."""
        if self.require_gpu:
            return Check(check_id, FAIL, summary, observed=reason, expected="a GPU (--require-gpu)", hint=_GPU_HINT)
        return Check(check_id, SKIP, f"{summary}: skipped, {reason}", observed=reason)


_GPU_HINT = (
    "check that the host has an NVIDIA GPU (lspci | grep -i nvidia), that the driver is loaded "
    "(cat /proc/driver/nvidia/version) and that nvidia-smi lists the GPU"
)


# --- parsing (pure; tested on saved output) ----------------------------------------------------------
_PROC_VERSION = re.compile(r"NVRM version: NVIDIA UNIX (?P<kind>.*?)\s+(?P<version>\d+\.\d+(?:\.\d+)?)\s")


def parse_proc_driver(text: str) -> str | None:
    match = _PROC_VERSION.search(text)
    return match.group("version") if match else None


def version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text))


def covered(cc: str, arch_list: list[str]) -> tuple[bool, str]:
    """Whether a GPU of compute capability `cc` ("8.6") runs a build with `arch_list`
    (torch.cuda.get_arch_list(): "sm_80", "compute_90"), under NVIDIA's binary compatibility:
    SASS sm_XY runs on the same major with minor >= Y; PTX compute_XY is JIT-compiled for any
    GPU of CC >= X.Y. "Architecture-specific" sm_XYa/sm_XYf builds run only on that major."""
    major, minor = (int(p) for p in cc.split(".")[:2])
    sass, ptx = [], []
    for arch in arch_list:
        m = re.fullmatch(r"(sm|compute)_(\d+?)(\d)([af]?)", arch)
        if not m:
            continue
        kind, amaj, amin, suffix = m.group(1), int(m.group(2)), int(m.group(3)), m.group(4)
        if kind == "sm":
            if amaj == major and amin <= minor and (not suffix or amin == minor or suffix == "f"):
                sass.append(arch)
        elif (amaj, amin) <= (major, minor) and not suffix:
            ptx.append(arch)
    if sass:
        return True, f"SASS {', '.join(sass)}"
    if ptx:
        return True, f"PTX {', '.join(ptx)} (JIT-compiled at first use)"
    return False, "no SASS for this major and no PTX at or below it"


def cudnn_int(version: str) -> int:
    """9.1.0(.70) -> 90100, as torch.backends.cudnn.version() reports cuDNN 9 (8.9.7 -> 8907)."""
    parts = [int(p) for p in version.split(".")[:3]]
    major, minor, patch = [*parts, 0, 0][:3]
    return major * 10000 + minor * 100 + patch if major >= 9 else major * 1000 + minor * 100 + patch


def libcudnn_paths(maps: str) -> list[str]:
    """The libcudnn files a process mapped, from /proc/<pid>/maps."""
    seen: list[str] = []
    for line in maps.splitlines():
        path = line.split(None, 5)[-1] if len(line.split(None, 5)) == 6 else ""
        if re.search(r"/libcudnn[^/]*\.so", path) and path not in seen:
            seen.append(path)
    return seen


def _cc(capability: tuple[int, int]) -> str:
    return f"{capability[0]}.{capability[1]}"


def _run(argv: list[str], timeout: int = 120, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """A tool of the host's (nvidia-smi, modinfo, ptxas), found on PATH as a user runs it."""
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, env=env)  # noqa: S603


# --- checks -------------------------------------------------------------------------------------------
def check_driver_kernel(ctx: Context) -> Check:
    path = ctx.proc / "driver/nvidia/version"
    if not path.exists():
        return ctx.gpu_skip("driver.kernel", "NVIDIA kernel module", f"no {path}: no NVIDIA kernel module is loaded")
    ctx.driver_kernel = parse_proc_driver(path.read_text())
    if ctx.driver_kernel is None:
        return Check(
            "driver.kernel",
            FAIL,
            "NVIDIA kernel module",
            observed=path.read_text()[:200],
            hint=f"{path} has no NVRM version line; reload the module (modprobe nvidia) or reboot",
        )
    return Check("driver.kernel", PASS, f"kernel module {ctx.driver_kernel} loaded", observed=ctx.driver_kernel)


def parse_smi_driver(returncode: int, output: str) -> tuple[str | None, bool]:
    """(driver version, mismatch) from `nvidia-smi --query-gpu=driver_version --format=csv,noheader`:
    one version per GPU when it works; "Driver/library version mismatch" when the loaded module and
    the libraries differ; anything else (no driver, no GPU) observes no version."""
    if "mismatch" in output.lower():
        return None, True
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    if returncode == 0 and lines and re.fullmatch(r"\d+\.\d+(\.\d+)?", lines[0]):
        return lines[0], False
    return None, False


def check_driver_user(ctx: Context) -> Check:
    version, source = _nvml_driver()
    if version is None and shutil.which("nvidia-smi"):
        run = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], timeout=60)
        version, mismatch = parse_smi_driver(run.returncode, run.stdout + run.stderr)
        source = "nvidia-smi"
        if mismatch:
            return Check(
                "driver.userspace",
                FAIL,
                "user-space driver",
                observed=(run.stdout + run.stderr).strip()[:300],
                hint="Driver/library version mismatch: the loaded module is older or newer than the installed "
                "libraries; reboot, or unload and reload the nvidia modules",
            )
    if version is None:
        return ctx.gpu_skip("driver.userspace", "user-space driver", "neither NVML nor nvidia-smi answers")
    ctx.driver_user = version
    return Check("driver.userspace", PASS, f"user-space driver {version} ({source})", observed=version)


def _nvml_driver() -> tuple[str | None, str]:
    try:
        import pynvml  # type: ignore[import-not-found,unused-ignore]  # noqa: PLC0415 - optional (nvidia-ml-py)
    except ImportError:
        return None, ""
    try:
        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        pynvml.nvmlShutdown()
    except Exception:
        return None, ""
    return (version.decode() if isinstance(version, bytes) else str(version)), "NVML"


def check_driver_match(ctx: Context) -> Check:
    if ctx.driver_kernel is None or ctx.driver_user is None:
        return ctx.gpu_skip(
            "driver.match",
            "kernel module and user space agree",
            "the kernel module or the user-space driver was not observed",
        )
    if ctx.driver_kernel == ctx.driver_user:
        return Check(
            "driver.match",
            PASS,
            f"kernel module and user space are both {ctx.driver_user}",
            observed=ctx.driver_kernel,
            expected=ctx.driver_user,
        )
    return Check(
        "driver.match",
        FAIL,
        "kernel module and user space differ",
        observed=ctx.driver_kernel,
        expected=ctx.driver_user,
        hint='this is "Failed to initialize NVML: Driver/library version mismatch": reboot, or stop '
        "GPU processes and reload the nvidia modules",
    )


def check_driver_minimum(ctx: Context) -> Check:
    need = ctx.expect.get("torch_min_driver")
    have = ctx.driver_user or ctx.driver_kernel
    if need is None:
        return Check("driver.cuda_minimum", SKIP, "driver new enough: skipped, no expectations file gives the minimum")
    if have is None:
        return ctx.gpu_skip("driver.cuda_minimum", f"driver >= {need}", "no driver was observed")
    if version_tuple(have) >= version_tuple(need):
        return Check("driver.cuda_minimum", PASS, f"driver {have} >= {need}", observed=have, expected=f">= {need}")
    return Check(
        "driver.cuda_minimum",
        FAIL,
        f"driver {have} is older than {need}",
        observed=have,
        expected=f">= {need}",
        hint=f"install driver {need} or newer (gpu_stack.driver), or a torch build for an older CUDA",
    )


def check_torch_version(ctx: Context) -> Check:
    t = ctx.torch
    observed = {"torch": t.__version__, "cuda": t.version.cuda}
    want_torch, want_cuda = ctx.expect.get("torch"), ctx.expect.get("torch_cuda", "unset")
    if want_torch is None:
        return Check(
            "torch.build",
            PASS,
            f"torch {t.__version__} (CUDA {t.version.cuda}) imports; no stack to compare",
            observed=observed,
        )
    ok = t.__version__.split("+")[0] == want_torch and want_cuda in ("unset", t.version.cuda)
    expected = {"torch": want_torch, "cuda": want_cuda}
    if ok:
        return Check(
            "torch.build",
            PASS,
            f"torch {t.__version__} (CUDA {t.version.cuda}) as declared",
            observed=observed,
            expected=expected,
        )
    return Check(
        "torch.build",
        FAIL,
        f"torch {t.__version__} (CUDA {t.version.cuda}) is not the declared build",
        observed=observed,
        expected=expected,
        hint="rebuild the environment (pytorch_env) or activate the one gpuenv built",
    )


def check_cuda_available(ctx: Context) -> Check:
    t = ctx.torch
    if t.version.cuda is None:
        return ctx.gpu_skip("torch.cuda_available", "torch sees CUDA", "this torch is a CPU build")
    if not t.cuda.is_available():
        return ctx.gpu_skip("torch.cuda_available", "torch sees CUDA")
    count = t.cuda.device_count()
    devices = [
        {"index": i, "name": t.cuda.get_device_name(i), "cc": _cc(t.cuda.get_device_capability(i))}
        for i in range(count)
    ]
    return Check("torch.cuda_available", PASS, f"{count} CUDA device(s)", observed=devices)


def check_arch_coverage(ctx: Context) -> Check:
    t = ctx.torch
    arch_list = list(t.cuda.get_arch_list()) if t.version.cuda else []
    if not arch_list:
        return Check("gpu.arch_coverage", SKIP, "kernel images: skipped, this torch carries no CUDA kernels")
    if not t.cuda.is_available():
        return ctx.gpu_skip("gpu.arch_coverage", f"kernel images for the GPUs (build has {' '.join(arch_list)})")
    missing, how = [], []
    for i in range(t.cuda.device_count()):
        cc = _cc(t.cuda.get_device_capability(i))
        ok, why = covered(cc, arch_list)
        how.append(f"GPU {i} (CC {cc}): {why}")
        if not ok:
            missing.append(cc)
    if missing:
        return Check(
            "gpu.arch_coverage",
            FAIL,
            f"no kernel image for CC {', '.join(missing)}",
            observed=how,
            expected=arch_list,
            hint='"no kernel image is available for execution on the device": use a '
            "torch build whose arch list covers these GPUs (gpuenv check-spec --gpu names one)",
        )
    return Check("gpu.arch_coverage", PASS, "every GPU has a kernel image", observed=how, expected=arch_list)


def check_cudnn(ctx: Context) -> Check:
    t = ctx.torch
    if t.version.cuda is None:
        return Check("cudnn.version", SKIP, "cuDNN: skipped, this torch is a CPU build")
    want = ctx.expect.get("torch_cudnn")
    try:
        observed = t.backends.cudnn.version()
    except RuntimeError as exc:  # torch's own refusal: "cuDNN version incompatibility ... LD_LIBRARY_PATH ..."
        return Check(
            "cudnn.version",
            FAIL,
            "torch refuses the cuDNN it loaded",
            observed=str(exc)[:600],
            expected=cudnn_int(want) if want else None,
            hint="another cuDNN was loaded before torch's own: unset LD_LIBRARY_PATH (or take the CUDA tree out of "
            "it); see cudnn.loaded_library for the file",
        )
    enabled = bool(t.backends.cudnn.enabled)
    if observed is None:
        return Check(
            "cudnn.version",
            FAIL,
            "torch loads no cuDNN",
            observed=None,
            expected=want,
            hint="torch's cuDNN wheel (nvidia-cudnn-cu*) is missing or unloadable; rebuild the environment",
        )
    if want is None:
        return Check(
            "cudnn.version", PASS, f"cuDNN {observed} (enabled: {enabled}); no stack to compare", observed=observed
        )
    if observed == cudnn_int(want) and enabled:
        return Check(
            "cudnn.version",
            PASS,
            f"cuDNN {observed}, as torch's build ships ({want})",
            observed=observed,
            expected=cudnn_int(want),
        )
    return Check(
        "cudnn.version",
        FAIL,
        f"cuDNN {observed} (enabled: {enabled}), not {want}",
        observed=observed,
        expected=cudnn_int(want),
        hint="another cuDNN was loaded first: look for LD_LIBRARY_PATH, and at cudnn.loaded_library",
    )


def check_cudnn_library(ctx: Context) -> Check:
    t = ctx.torch
    if t.version.cuda is None:
        return Check("cudnn.loaded_library", SKIP, "loaded libcudnn: skipped, this torch is a CPU build")
    maps = (ctx.proc / "self/maps").read_text() if (ctx.proc / "self/maps").exists() else ""
    paths = libcudnn_paths(maps)
    if not paths:
        return Check(
            "cudnn.loaded_library", SKIP, "loaded libcudnn: skipped, torch has not mapped libcudnn yet", observed=[]
        )
    torch_dir = Path(t.__file__).resolve().parent.parent
    foreign = [p for p in paths if not p.startswith(str(torch_dir))]
    if foreign:
        return Check(
            "cudnn.loaded_library",
            WARN,
            "a cuDNN outside torch's environment is loaded",
            observed=paths,
            expected=f"under {torch_dir}",
            hint="a system cuDNN shadows torch's own: unset LD_LIBRARY_PATH (or remove the CUDA tree from it)",
        )
    return Check("cudnn.loaded_library", PASS, f"libcudnn from torch's environment ({paths[0]})", observed=paths)


def _compared(check_id: str, summary: str, found: str | None, want: str, hint: str) -> Check:
    """Pass when what was found is what was declared; fail with the hint otherwise."""
    ok = found == want
    return Check(check_id, PASS if ok else FAIL, summary, observed=found, expected=want, hint=None if ok else hint)


def check_cuda_tree(ctx: Context) -> list[Check]:
    out = []
    want_cuda, want_cudnn = ctx.expect.get("cuda"), ctx.expect.get("cudnn")
    ptxas = ctx.cuda_home / "bin/ptxas"
    if want_cuda is None:
        out.append(Check("cuda_tree.toolkit", SKIP, "CUDA toolkit: skipped, the stack declares none"))
    elif not ptxas.exists():
        out.append(
            Check(
                "cuda_tree.toolkit",
                FAIL,
                f"no {ptxas}",
                expected=want_cuda,
                hint="run the cuda_toolkit role, or check that /usr/local/cuda points at a toolkit",
            )
        )
    else:
        text = _run([str(ptxas), "--version"]).stdout
        m = re.search(r"release (\d+\.\d+), V(\S+)", text)
        release = m.group(1) if m else None
        want_xy = ".".join(str(want_cuda).split(".")[:2])
        out.append(
            _compared(
                "cuda_tree.toolkit",
                f"{ctx.cuda_home} is CUDA {release}",
                release,
                want_xy,
                "cuda_toolkit_default selects /usr/local/cuda",
            )
        )
    header = ctx.cuda_home / "include/cudnn_version.h"
    if want_cudnn in (None, "none"):
        out.append(Check("cuda_tree.cudnn", SKIP, "system cuDNN: skipped, the stack declares none"))
    elif not header.exists():
        out.append(Check("cuda_tree.cudnn", FAIL, f"no {header}", expected=want_cudnn, hint="run the cudnn role"))
    else:
        values = dict(re.findall(r"#define\s+CUDNN_(MAJOR|MINOR|PATCHLEVEL)\s+(\d+)", header.read_text()))
        found = ".".join(values.get(k, "?") for k in ("MAJOR", "MINOR", "PATCHLEVEL"))
        want = ".".join(str(want_cudnn).split(".")[:3])
        out.append(_compared("cuda_tree.cudnn", f"{header} says cuDNN {found}", found, want, "run the cudnn role"))
    return out


def parse_ldconfig(text: str) -> dict[str, list[str]]:
    """`ldconfig -p` as {soname: [paths, in the loader's order]}. The one parser of that output
    (gpuenv.redist's role filters use it too)."""
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        name, sep, path = line.strip().partition(" => ")
        if sep:
            found.setdefault(name.split(" (", 1)[0], []).append(path.strip())
    return found


_LOADER_HINT = (
    "run ldconfig: gpuenv writes /etc/ld.so.conf.d/gpuenv-cuda.conf, which gives the loader "
    "{lib}; if the loader still finds another copy, a file in /etc/ld.so.conf.d that comes first "
    "names another cuDNN: remove it or rerun the cudnn role"
)


def check_cudnn_loader(ctx: Context) -> Check:
    """Every library of the tree's cuDNN resolves through the loader's cache to the tree's own file:
    the "Could not load library libcudnn_cnn_infer.so.8" case when one is missing or shadowed."""
    check_id, want = "cuda_tree.cudnn_loader", ctx.expect.get("cudnn")
    if want in (None, "none"):
        return Check(check_id, SKIP, "cuDNN in the loader's cache: skipped, the stack declares no system cuDNN")
    lib = ctx.cuda_home / "lib64"
    major = str(want).partition(".")[0]
    names = list(ctx.expect.get("cudnn_libraries") or sorted(p.name for p in lib.glob(f"libcudnn*.so.{major}")))
    if ctx.ldconfig_cache is None:
        ldconfig = "/sbin/ldconfig" if Path("/sbin/ldconfig").exists() else "ldconfig"
        ctx.ldconfig_cache = _run([ldconfig, "-p"]).stdout
    cache = parse_ldconfig(ctx.ldconfig_cache)
    if not names:
        return Check(
            check_id,
            FAIL,
            f"no cuDNN {major} libraries in {lib}",
            expected=f"libcudnn*.so.{major} in {lib}",
            hint="run the cudnn role, which installs the declared cuDNN into the CUDA tree",
        )
    problems = []
    for name in names:
        own = lib / name
        found = cache.get(name, [])
        if not own.exists():
            problems.append(f"{name}: not in {lib}")
        elif not found:
            problems.append(f"{name}: not in the loader's cache")
        elif Path(found[0]).resolve() != own.resolve():
            problems.append(f"{name}: the loader finds {found[0]}, not {own}")
    if problems:
        return Check(
            check_id,
            FAIL,
            f"{len(problems)} of {len(names)} cuDNN libraries do not load from {lib}",
            observed=problems,
            expected=f"each of {', '.join(names)} from {lib}",
            hint=_LOADER_HINT.format(lib=lib),
        )
    return Check(check_id, PASS, f"the loader finds all {len(names)} cuDNN libraries in {lib}", observed=names)


def check_nouveau(ctx: Context) -> Check:
    modules = (ctx.proc / "modules").read_text() if (ctx.proc / "modules").exists() else ""
    loaded = any(line.split()[0] == "nouveau" for line in modules.splitlines() if line.strip())
    if loaded:
        return Check(
            "host.nouveau",
            FAIL,
            "nouveau is loaded",
            observed=True,
            expected=False,
            hint="blacklist nouveau (the nvidia_driver role does), rebuild the initramfs and reboot",
        )
    return Check("host.nouveau", PASS, "nouveau is not loaded", observed=False, expected=False)


def check_secure_boot(ctx: Context) -> Check:
    efivars = ctx.sys_root / "firmware/efi/efivars"
    found = sorted(efivars.glob("SecureBoot-*")) if efivars.is_dir() else []
    if not found:
        return Check("host.secure_boot", PASS, "no UEFI Secure Boot variable: unsigned modules load", observed="absent")
    on = len(found[0].read_bytes()) >= 5 and found[0].read_bytes()[4] == 1
    if not on:
        return Check("host.secure_boot", PASS, "Secure Boot is off", observed="off")
    signer = _module_signer()
    if signer:
        return Check(
            "host.secure_boot",
            PASS,
            f"Secure Boot is on; the nvidia module is signed by {signer}",
            observed={"secure_boot": "on", "signer": signer},
        )
    return Check(
        "host.secure_boot",
        WARN,
        "Secure Boot is on and the nvidia module shows no signature",
        observed={"secure_boot": "on", "signer": None},
        hint="sign the module with an enrolled MOK (nvidia_driver_secure_boot: sign)",
    )


def _module_signer() -> str | None:
    if not shutil.which("modinfo"):
        return None
    for name in ("nvidia", "nvidia-current", "nvidia-current-open"):
        run = _run(["modinfo", "-F", "signer", name])
        if run.returncode == 0 and run.stdout.strip():
            return run.stdout.strip()
    return None


def check_gpu_compute(ctx: Context) -> list[Check]:
    """Convolution forward and backward through cuDNN, a matmul with its TFLOP/s, autocast with a
    GradScaler step, and a few training steps of a small CNN whose loss must go down."""
    t = ctx.torch
    ids = ["gpu.conv_cudnn", "gpu.matmul", "gpu.bandwidth", "gpu.autocast", "gpu.train_cnn"]
    if t.version.cuda is None or not t.cuda.is_available():
        return [ctx.gpu_skip(i, i.split(".")[1].replace("_", " ")) for i in ids]
    return compute_checks(t, t.device("cuda"))


def compute_checks(t: Any, dev: Any) -> list[Check]:
    """The compute checks' bodies on a device: CUDA on a GPU host; the CPU device for
    --cpu-selftest, which runs this code where no GPU is, so that an API the environment's torch
    lacks is found before the first GPU host (it proves nothing about a GPU)."""
    return [
        _timed("gpu.conv_cudnn", lambda: _conv(t, dev)),
        _timed("gpu.matmul", lambda: _matmul(t, dev)),
        _timed("gpu.bandwidth", lambda: _bandwidth(t, dev)),
        _timed("gpu.autocast", lambda: _autocast(t, dev)),
        _timed("gpu.train_cnn", lambda: _train(t, dev)),
    ]


def _sync(t: Any, dev: Any) -> None:
    """Wait for the device's queued work (CUDA runs asynchronously; the CPU does not)."""
    if dev.type == "cuda":
        t.cuda.synchronize()


def _timed(check_id: str, fn: Callable[[], Check]) -> Check:
    start = time.perf_counter()
    try:
        result = fn()
    except Exception as exc:
        result = Check(
            check_id,
            FAIL,
            f"{check_id} raised {type(exc).__name__}",
            observed=str(exc)[:500],
            hint="see the message: an error here on a GPU host is what training jobs would hit",
        )
    result.seconds = round(time.perf_counter() - start, 3)
    return result


def _conv(t: Any, dev: Any) -> Check:
    x = t.randn(8, 3, 64, 64, device=dev, requires_grad=True)
    conv = t.nn.Conv2d(3, 16, 3, padding=1).to(dev)
    y = conv(x)
    y.sum().backward()
    _sync(t, dev)
    ok = x.grad is not None and bool(t.isfinite(x.grad).all())
    return Check(
        "gpu.conv_cudnn",
        PASS if ok else FAIL,
        "convolution forward and backward",
        observed=list(y.shape),
        hint=None if ok else "the gradient is not finite",
    )


def _matmul(t: Any, dev: Any) -> Check:
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
    return Check("gpu.matmul", PASS if ok else FAIL, f"fp32 matmul {tflops:.1f} TFLOP/s", observed=round(tflops, 2))


def _bandwidth(t: Any, dev: Any) -> Check:
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
    return Check("gpu.bandwidth", PASS, f"device memory copy {gbs:.0f} GB/s", observed=round(gbs, 1))


def check_nvml_health(ctx: Context) -> Check:
    """ECC errors and throttling reasons from NVML (nvidia-ml-py), per GPU."""
    try:
        import pynvml  # type: ignore[import-not-found,unused-ignore]  # noqa: PLC0415 - optional (nvidia-ml-py)
    except ImportError:
        if ctx.require_gpu:
            return Check(
                "gpu.nvml_health",
                FAIL,
                "NVML health",
                observed="nvidia-ml-py is not installed",
                hint="add nvidia-ml-py to the stack's packages to read ECC and throttling",
            )
        return Check("gpu.nvml_health", SKIP, "ECC and throttling: skipped, nvidia-ml-py is not installed")
    try:
        pynvml.nvmlInit()
    except Exception as exc:
        return ctx.gpu_skip("gpu.nvml_health", "ECC and throttling", f"NVML does not start ({exc})")
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
            reasons = pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle)
            # idle (0x1) and application clocks (0x2) are normal; the rest slow the GPU down
            slow = int(reasons) & ~0x3
            observed.append({"gpu": i, "uncorrected_ecc": ecc, "throttle_reasons": hex(int(reasons))})
            if ecc:
                findings.append(f"GPU {i}: {ecc} uncorrected ECC errors")
            if slow:
                findings.append(f"GPU {i}: throttled (reasons {hex(slow)})")
    finally:
        pynvml.nvmlShutdown()
    if findings:
        return Check(
            "gpu.nvml_health",
            WARN,
            "; ".join(findings),
            observed=observed,
            hint="uncorrected ECC errors: drain the host and reset or replace the GPU; throttling: check "
            "cooling, power caps (nvidia-smi -q -d PERFORMANCE)",
        )
    return Check("gpu.nvml_health", PASS, "no uncorrected ECC errors, no throttling", observed=observed)


def _grad_scaler(t: Any, device_type: str) -> Any:
    """torch.amp.GradScaler(device) exists from torch 2.3; 1.12 to 2.2 have torch.cuda.amp.GradScaler
    only, for CUDA (a stack of that era must not fail here on its first GPU)."""
    scaler = getattr(getattr(t, "amp", None), "GradScaler", None)
    if scaler is not None:
        return scaler(device_type)
    return t.cuda.amp.GradScaler(enabled=device_type == "cuda")


def _autocast(t: Any, dev: Any) -> Check:
    """Mixed precision with a GradScaler step; on the CPU device (unit tests) in bfloat16."""
    model = t.nn.Linear(256, 256).to(dev)
    opt = t.optim.SGD(model.parameters(), lr=0.01)
    scaler = _grad_scaler(t, dev.type)
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
    return Check("gpu.autocast", PASS, f"autocast ({', '.join(names)}) with a GradScaler step", observed=names)


def _train(t: Any, dev: Any) -> Check:
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
    ok = losses[-1] < losses[0]
    return Check(
        "gpu.train_cnn",
        PASS if ok else FAIL,
        f"small CNN loss {losses[0]:.3f} -> {losses[-1]:.3f}",
        observed=[round(losses[0], 4), round(losses[-1], 4)],
        expected="loss goes down",
        hint=None if ok else "training does not converge on synthetic data: numerics are broken",
    )


def _allreduce_worker(rank: int, world: int, port: int, results: Any) -> None:
    """One rank of the all-reduce, in a process forked from verify after `import torch`: it picks
    NCCL and its own GPU where torch sees one, gloo on the CPU otherwise."""
    try:
        import torch  # type: ignore[import-not-found,unused-ignore]  # noqa: PLC0415 - already imported; forked
        import torch.distributed as dist  # type: ignore[import-not-found,unused-ignore]  # noqa: PLC0415

        on_gpu = bool(torch.version.cuda) and torch.cuda.is_available()
        backend = "nccl" if on_gpu else "gloo"
        if on_gpu:
            torch.cuda.set_device(rank)
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        x = torch.ones(4, device="cuda" if on_gpu else "cpu") * (rank + 1)
        dist.all_reduce(x)
        total = float(world * (world + 1) // 2)
        ok = x.tolist() == [total] * 4
        dist.destroy_process_group()
        results.put((rank, backend, ok, None if ok else f"rank {rank} got {x.tolist()}, not {[total] * 4}"))
    except Exception as exc:  # the rank's failure is the check's observation
        results.put((rank, "?", False, f"rank {rank}: {type(exc).__name__}: {exc}"))


def _free_port() -> int:
    import socket  # noqa: PLC0415 - only this check listens

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _gpu_count_without_cuda_init(ctx: Context) -> int:
    """How many GPUs the ranks will find, asked of the driver (nvidia-smi), not of CUDA: CUDA
    initialised in verify's own process would make it unusable in the processes forked from it."""
    if not ctx.torch.version.cuda or shutil.which("nvidia-smi") is None:
        return 0
    listing = _run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], timeout=30)
    gpus = len(listing.stdout.split()) if listing.returncode == 0 else 0
    # nvidia-smi lists every GPU; the ranks see only those CUDA_VISIBLE_DEVICES leaves them.
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        gpus = min(gpus, len([d for d in visible.split(",") if d.strip()]))
    return gpus


def check_distributed(ctx: Context) -> Check:
    """An all-reduce across processes: one per GPU over NCCL, or two over gloo on a host without
    one. The ranks are forked from this process, which has imported torch already, so the check
    costs the all-reduce and not a torch import per rank; it runs before any other check touches
    CUDA, because CUDA does not survive a fork once initialised."""
    import multiprocessing  # noqa: PLC0415 - only this check starts processes

    gpus = _gpu_count_without_cuda_init(ctx)
    world = gpus if gpus > 0 else 2
    mp = multiprocessing.get_context("fork")
    results = mp.Queue()
    port = _free_port()
    start = time.perf_counter()
    procs = [mp.Process(target=_allreduce_worker, args=(rank, world, port, results)) for rank in range(world)]
    for proc in procs:
        proc.start()
    found: list[tuple[int, str, bool, str | None]] = []
    deadline = time.monotonic() + 120
    while len(found) < world and time.monotonic() < deadline:
        with contextlib.suppress(queue.Empty):
            found.append(results.get(timeout=1))
        if len(found) < world and not any(p.is_alive() for p in procs) and results.empty():
            break
    for proc in procs:
        proc.join(timeout=5)
        if proc.is_alive():
            proc.kill()
    seconds = round(time.perf_counter() - start, 3)
    backends = sorted({b for _, b, _, _ in found if b != "?"})
    backend = "/".join(backends) or "?"
    problems = [msg for _, _, ok, msg in found if not ok and msg]
    if len(found) < world:
        problems.append(f"{world - len(found)} of {world} ranks did not report within 120 s (hung or crashed)")
    if not problems:
        return Check(
            "dist.all_reduce",
            PASS,
            f"all-reduce across {world} processes over {backend}",
            observed={"backend": backend, "processes": world},
            seconds=seconds,
        )
    return Check(
        "dist.all_reduce",
        FAIL,
        f"all-reduce across {world} processes over {backend} failed",
        observed="; ".join(problems)[-800:],
        hint="torch.distributed does not work in this environment; see the message"
        + ("; with NCCL, NCCL_DEBUG=INFO shows why" if gpus else ""),
        seconds=seconds,
    )


# --- services beside the stack (roles/gpu_services; issue 21) -----------------------------------------
def _services(ctx: Context, name: str) -> dict[str, Any]:
    """gpu_services' record of one service ({} where the role has not run)."""
    try:
        record = json.loads(ctx.services_record.read_text())
    except (OSError, ValueError):
        return {}
    entry = record.get(name) if isinstance(record, dict) else None
    return entry if isinstance(entry, dict) else {}


def _not_asked(ctx: Context, check_id: str, summary: str, entry: dict[str, Any]) -> Check:
    why = entry.get("why") or f"gpu_services has not set it up here (no {ctx.services_record})"
    return Check(check_id, SKIP, f"{summary}: skipped, the stack does not ask for it ({why})", observed=why)


def _smi_rows(ctx: Context, check_id: str, summary: str, fields: str) -> tuple[list[list[str]], Check | None]:
    """nvidia-smi --query-gpu=index,FIELDS as rows, or the check to report when there are none."""
    if not shutil.which("nvidia-smi"):
        return [], ctx.gpu_skip(check_id, summary, "nvidia-smi is not installed")
    run = _run(["nvidia-smi", f"--query-gpu=index,{fields}", "--format=csv,noheader"], timeout=60)
    out = (run.stdout + run.stderr).strip()
    if "not a valid field" in out:
        return [], Check(check_id, WARN, f"{summary}: this driver's nvidia-smi cannot report it", observed=out[:300])
    rows = [[c.strip() for c in line.split(",")] for line in run.stdout.splitlines() if line.strip()]
    if run.returncode != 0 or not rows:
        return [], ctx.gpu_skip(check_id, summary, f"nvidia-smi lists no GPU (exit {run.returncode}: {out[:200]})")
    return rows, None


def _per_gpu_state(
    ctx: Context, check_id: str, what: str, *, service: str, fields: str, good: list[str], hint: str
) -> Check:
    """A state gpu_services' daemon sets on every GPU (nvidia-smi's `fields`), where its record says
    the stack asks for the daemon: `good` on every GPU, else a failure naming the GPUs."""
    entry = _services(ctx, service)
    if not entry.get("wanted"):
        return _not_asked(ctx, check_id, what, entry)
    rows, why = _smi_rows(ctx, check_id, what, fields)
    if why:
        return why
    bad = [row[0] for row in rows if row[1 : 1 + len(good)] != good]
    if bad:
        return Check(
            check_id,
            FAIL,
            f"{what} is not {', '.join(good)} on GPU {', '.join(bad)}",
            observed={row[0]: row[1:] for row in rows},
            expected=f"{', '.join(good)} on every GPU",
            hint=hint,
        )
    return Check(check_id, PASS, f"{what}: {', '.join(good)} on all {len(rows)} GPUs", observed=len(rows))


def check_persistence_mode(ctx: Context) -> Check:
    return _per_gpu_state(
        ctx,
        "services.persistence_mode",
        "persistence mode",
        service="persistenced",
        fields="persistence_mode",
        good=["Enabled"],
        hint="systemctl enable --now nvidia-persistenced; journalctl -u nvidia-persistenced says why it stopped",
    )


def check_fabric(ctx: Context) -> Check:
    """Without the fabric set up (Fabric Manager of the driver's exact version), CUDA does not
    initialise on an NVSwitch board."""
    return _per_gpu_state(
        ctx,
        "services.fabric",
        "the NVSwitch fabric",
        service="fabricmanager",
        fields="fabric.state,fabric.status",
        good=["Completed", "Success"],
        hint="CUDA does not initialise without it: systemctl status nvidia-fabricmanager and journalctl -u "
        "nvidia-fabricmanager; Fabric Manager must be exactly the driver's version (run playbooks/site.yml, stage "
        "gpu_services, after a driver change)",
    )


def _container_tool(entry: dict[str, Any]) -> tuple[str | None, str]:
    """The runtime command that answers here (docker first), or None and why none does."""
    runtimes = [r for r in ("docker", "podman") if r in (entry.get("runtimes") or []) and shutil.which(r)]
    if not runtimes:
        return None, "no docker or podman command here"
    info = _run([runtimes[0], "info"], timeout=60)
    if info.returncode != 0:
        reason = (info.stderr or info.stdout).strip().splitlines()[-1:] or [f"exit {info.returncode}"]
        return None, f"{runtimes[0]} does not answer ({reason[0][:200]})"
    return runtimes[0], ""


def check_container(ctx: Context) -> Check:
    check_id, summary = "services.container", "a CUDA container sees the GPUs"
    entry = _services(ctx, "container_toolkit")
    if not entry.get("wanted"):
        return _not_asked(ctx, check_id, summary, entry)
    image = entry.get("verify_image")
    tool, why = _container_tool(entry) if image else (None, "no image named (gpu_services_verify_container_image)")
    if tool is None:
        return Check(check_id, SKIP, f"{summary}: skipped, {why}", observed=why)
    if not (ctx.proc / "driver/nvidia/version").exists():
        return ctx.gpu_skip(check_id, summary, "no NVIDIA kernel module is loaded")
    gpus = ["--gpus", "all"] if tool == "docker" else ["--device", "nvidia.com/gpu=all"]
    run = _run([tool, "run", "--rm", *gpus, str(image), "nvidia-smi", "-L"], timeout=600)
    listed = [line for line in run.stdout.splitlines() if line.startswith("GPU ")]
    if run.returncode != 0 or not listed:
        return Check(
            check_id,
            FAIL,
            f"{tool} run {image} nvidia-smi -L lists no GPU",
            observed=(run.stdout + run.stderr).strip()[-600:],
            expected="GPU 0: ...",
            hint="check the runtime's configuration (gpu_services: daemon.json's nvidia runtime, the CDI "
            "specification for Podman) and run nvidia-ctk cdi generate after a driver change",
        )
    return Check(check_id, PASS, f"{tool} run {image} sees {len(listed)} GPUs", observed=listed)


# --- running and reporting ---------------------------------------------------------------------------
def _guarded(check_id: str, fn: Callable[[], Check | list[Check]]) -> list[Check]:
    """One check's crash is that check's failure, not the end of the run."""
    try:
        result = fn()
    except Exception as exc:  # whatever a check raises is what it found
        return [
            Check(
                check_id,
                FAIL,
                f"{check_id} raised {type(exc).__name__}",
                observed=str(exc)[:600],
                hint="the message above is what a job would hit on this host",
            )
        ]
    return result if isinstance(result, list) else [result]


def run_checks(ctx: Context, *, distributed: bool = True) -> list[Check]:
    # The all-reduce first, before any check initialises CUDA in this process (its ranks are forked
    # from it); it is reported last, where readers look for it.
    first = _guarded("dist.all_reduce", lambda: check_distributed(ctx)) if distributed else []
    plan: list[tuple[str, Callable[[], Check | list[Check]]]] = [
        ("driver.kernel", lambda: check_driver_kernel(ctx)),
        ("driver.userspace", lambda: check_driver_user(ctx)),
        ("driver.match", lambda: check_driver_match(ctx)),
        ("driver.cuda_minimum", lambda: check_driver_minimum(ctx)),
        ("torch.build", lambda: check_torch_version(ctx)),
        ("torch.cuda_available", lambda: check_cuda_available(ctx)),
        ("gpu.arch_coverage", lambda: check_arch_coverage(ctx)),
        ("cudnn.version", lambda: check_cudnn(ctx)),
        ("cudnn.loaded_library", lambda: check_cudnn_library(ctx)),
        ("cuda_tree.toolkit", lambda: check_cuda_tree(ctx)),
        ("cuda_tree.cudnn_loader", lambda: check_cudnn_loader(ctx)),
        ("host.nouveau", lambda: check_nouveau(ctx)),
        ("host.secure_boot", lambda: check_secure_boot(ctx)),
        ("gpu.compute", lambda: check_gpu_compute(ctx)),
        ("gpu.nvml_health", lambda: _nvml_or_skip(ctx)),
        ("services.persistence_mode", lambda: check_persistence_mode(ctx)),
        ("services.fabric", lambda: check_fabric(ctx)),
        ("services.container", lambda: check_container(ctx)),
    ]
    return [check for check_id, fn in plan for check in _guarded(check_id, fn)] + first


def _nvml_or_skip(ctx: Context) -> Check:
    if ctx.torch.version.cuda and ctx.torch.cuda.is_available():
        return check_nvml_health(ctx)
    return ctx.gpu_skip("gpu.nvml_health", "ECC and throttling")


def exit_code(checks: list[Check]) -> int:
    return exit_code_of((c.id, c.status) for c in checks)


def exit_code_of(results: Iterable[tuple[str, str]]) -> int:
    """The report's exit code from (check id, status) pairs, for verify's checks and the reports
    drift merges alike: 0 every check passed, 1 a check failed, 2 verify could not check."""
    failed = {check_id for check_id, status in results if status == FAIL}
    if RUN_CHECK in failed:
        return 2
    return 1 if failed else 0


RUN_CHECK = "verify.run"


def stack_id(expect: dict[str, Any]) -> str | None:
    """Which stack a report checked: a hash of the expectations it was given."""
    if not expect:
        return None
    return hashlib.sha256(json.dumps(expect, sort_keys=True, default=str).encode()).hexdigest()[:12]


def now() -> str:
    # timezone.utc, not datetime.UTC (3.11): hosts run verify with the environment's Python, 3.8 and up
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")  # noqa: UP017


def to_json(
    checks: list[Check], host: str, *, generated: str | None = None, stack: str | None = None, run: str | None = None
) -> dict[str, Any]:
    counts = {s: sum(c.status == s for c in checks) for s in (PASS, FAIL, WARN, SKIP)}
    return {
        "schema_version": SCHEMA_VERSION,
        "host": host,
        "generated": generated or now(),
        "stack_id": stack,
        "run": run,
        "exit_code": exit_code(checks),
        "counts": counts,
        "checks": [asdict(c) for c in checks],
    }


def could_not_run(summary: str, error: str, hint: str) -> list[Check]:
    """The report of a run that could not check the host: one failing verify.run check that
    carries the error, so that the host shows as failed, never as missing or as its old report."""
    return [Check(RUN_CHECK, FAIL, summary, observed=error[-2000:], expected="verify runs its checks", hint=hint)]


def failed_report(  # noqa: PLR0917 - the playbooks' filter passes these by position
    host: str, summary: str, error: str, hint: str, expect: dict[str, Any] | None = None, run: str | None = None
) -> dict[str, Any]:
    """The JSON report of a run that could not check (for the playbooks' stand-ins too)."""
    return to_json(could_not_run(summary, error, hint), host, stack=stack_id(expect or {}), run=run)


def to_junit(checks: list[Check], host: str) -> str:
    suite = ET.Element(
        "testsuite",
        name=f"gpuenv verify {host}",
        tests=str(len(checks)),
        failures=str(sum(c.status == FAIL for c in checks)),
        skipped=str(sum(c.status == SKIP for c in checks)),
    )
    for c in checks:
        case = ET.SubElement(suite, "testcase", classname=f"gpuenv.{host}", name=c.id, time=f"{c.seconds:.3f}")
        if c.status == FAIL:
            ET.SubElement(case, "failure", message=c.summary).text = json.dumps(
                {"observed": c.observed, "expected": c.expected, "hint": c.hint}, default=str
            )
        elif c.status == SKIP:
            ET.SubElement(case, "skipped", message=c.summary)
        elif c.status == WARN:
            ET.SubElement(case, "system-out").text = f"warning: {c.summary}; {c.hint or ''}"
    return ET.tostring(suite, encoding="unicode")


def to_prometheus(checks: list[Check], host: str) -> str:
    """node_exporter textfile collector format: one gauge per check and status."""
    lines = [
        "# HELP gpuenv_verify_check 1 for the status each gpuenv verify check reported.",
        "# TYPE gpuenv_verify_check gauge",
    ]
    for c in checks:
        for status in (PASS, FAIL, WARN, SKIP):
            lines.append(
                f'gpuenv_verify_check{{host="{host}",check="{c.id}",status="{status}"}} '
                f"{1 if c.status == status else 0}"
            )
    lines += [
        "# HELP gpuenv_verify_exit_code The exit code of the last gpuenv verify run.",
        "# TYPE gpuenv_verify_exit_code gauge",
        f'gpuenv_verify_exit_code{{host="{host}"}} {exit_code(checks)}',
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpuenv verify", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--stack", help="expectations file (JSON) the controller wrote for this host (-: read from stdin)"
    )
    parser.add_argument(
        "--json", dest="json_out", help="write the JSON report here (-: to stdout, the lines to stderr)"
    )
    parser.add_argument("--junit", help="write JUnit XML here")
    parser.add_argument("--prom", help="write Prometheus text format here (node_exporter textfile collector)")
    parser.add_argument("--require-gpu", action="store_true", help="GPU checks fail instead of skipping")
    parser.add_argument("--no-distributed", action="store_true", help="skip the multi-process all-reduce")
    parser.add_argument(
        "--cpu-selftest",
        action="store_true",
        help="run the GPU compute checks' code on the CPU device instead of the checks (tests verify itself "
        "with this environment's torch; proves nothing about a GPU)",
    )
    parser.add_argument(
        "--run", help="an id of the run this report belongs to (gpuenv report --run marks others stale)"
    )
    parser.add_argument(
        "--python-missing",
        metavar="PATH",
        help=argparse.SUPPRESS,  # gpuenv-verify: the environment's Python PATH is gone; report that
    )
    args = parser.parse_args(argv)
    host = os.uname().nodename
    expect: dict[str, Any] = {}
    checks: list[Check] = []
    if args.stack:
        try:
            expect = json.loads(sys.stdin.read() if args.stack == "-" else Path(args.stack).read_text())
        except (OSError, ValueError) as exc:
            checks = could_not_run(
                f"cannot read the stack to check against, {args.stack}",
                str(exc),
                "run playbooks/site.yml (gpu_verify writes /etc/gpuenv/stack.json), or pass --stack FILE",
            )
    if not checks and args.python_missing:
        checks = could_not_run(
            f"the environment's Python {args.python_missing} does not exist",
            f"{args.python_missing}: no such file (the environment was removed or never built)",
            "rebuild the environment: ansible-playbook playbooks/site.yml --limit <host> (stage pytorch_env)",
        )
    if not checks:
        checks = _checks_or_why(expect, args)
    report = to_json(checks, host, stack=stack_id(expect), run=args.run)
    _write(report, checks, host, args)
    return int(report["exit_code"])


def _checks_or_why(expect: dict[str, Any], args: argparse.Namespace) -> list[Check]:
    try:
        import torch  # type: ignore[import-not-found,unused-ignore]  # noqa: PLC0415 - only here: --help needs no torch
    except Exception as exc:
        return could_not_run(
            f"cannot import torch with {sys.executable}",
            f"{type(exc).__name__}: {exc}",
            "run verify with the environment's own Python (/opt/gpuenv/envs/<name>/bin/python); if it fails "
            "there too, rebuild the environment with playbooks/site.yml",
        )
    try:
        if args.cpu_selftest:
            return compute_checks(torch, torch.device("cpu"))
        ctx = Context(expect=expect, require_gpu=args.require_gpu, torch=torch)
        return run_checks(ctx, distributed=not args.no_distributed)
    except Exception as exc:  # verify itself broke: say so in the report instead of leaving none
        return could_not_run(
            f"gpuenv verify itself failed ({type(exc).__name__})",
            f"{type(exc).__name__}: {exc}",
            "this is a gpuenv bug: keep this report and the output above when reporting it",
        )


def _write(report: dict[str, Any], checks: list[Check], host: str, args: argparse.Namespace) -> None:
    # With --json -, the report is the standard output and the lines for people go to stderr.
    human = sys.stderr if args.json_out == "-" else sys.stdout
    for c in checks:
        line = f"{c.status.upper():5} {c.id:24} {c.summary}" + (f"\n      fix: {c.hint}" if c.status == FAIL else "")
        if c.id == RUN_CHECK and c.status == FAIL:
            line += f"\n      error: {c.observed}"
        print(line, file=human)
    print(f"{report['counts']}; exit {report['exit_code']}", file=human)
    if args.json_out == "-":
        print(json.dumps(report, indent=2, default=str))
    elif args.json_out:
        Path(args.json_out).write_text(json.dumps(report, indent=2, default=str) + "\n")
    if args.junit:
        Path(args.junit).write_text(to_junit(checks, host) + "\n")
    if args.prom:
        Path(args.prom).write_text(to_prometheus(checks, host))


if __name__ == "__main__":
    sys.exit(main())
