"""What every check is built on: its declaration (Spec, each id written once, in `Checks.add`),
what it runs against (Context: the expectations, the host's paths, and what more than one check
reads of the host, each read once when first asked for), and how one runs (Spec.run: timed, and a
crash is that check's failure). Standard library only; torch arrives as Context.torch."""

from __future__ import annotations

import contextlib
import json
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuenv.module_utils import gpuenv_hostparse as hostparse
from gpuenv.verify.model import FAIL, PASS, SKIP, WARN, Check

NO_GPU = "no CUDA device visible to torch (no GPU, or no driver loaded)"
GPU_HINT = (
    "check that the host has an NVIDIA GPU (lspci | grep -i nvidia), that the driver is loaded "
    "(cat /proc/driver/nvidia/version) and that nvidia-smi lists the GPU"
)
CRASH_HINT = "the message above is what a job would hit on this host"

if TYPE_CHECKING:  # Python 3.8 on the hosts cannot subscript Callable at runtime
    Body = Callable[["Context", "Spec"], Check]


@dataclass(frozen=True)
class Spec:
    """One check: its id, what it checks (the summary when it is skipped), and its body."""

    id: str
    title: str
    body: Body
    crash_hint: str = CRASH_HINT
    # Runs before every other check: its ranks are forked from this process, which CUDA, once
    # initialised by another check, would not survive (the check is reported in its own place).
    forks: bool = False

    def __call__(self, ctx: Context) -> Check:
        return self.body(ctx, self)

    def run(self, ctx: Context) -> Check:
        """The check, timed; whatever it raises is what it found, not the end of the run."""
        start = time.perf_counter()
        try:
            found = self(ctx)
        except Exception as exc:
            found = self.failed(f"{self.id} raised {type(exc).__name__}", observed=str(exc)[:600], hint=self.crash_hint)
        found.seconds = round(time.perf_counter() - start, 3)
        return found

    def passed(self, summary: str, observed: Any = None, expected: Any = None) -> Check:
        return Check(self.id, PASS, summary, observed, expected)

    def failed(self, summary: str, *, hint: str, observed: Any = None, expected: Any = None) -> Check:
        return Check(self.id, FAIL, summary, observed, expected, hint)

    def warned(self, summary: str, *, hint: str, observed: Any = None, expected: Any = None) -> Check:
        return Check(self.id, WARN, summary, observed, expected, hint)

    def skipped(self, reason: str, observed: Any = None, *, title: str | None = None) -> Check:
        return Check(self.id, SKIP, f"{title or self.title}: skipped, {reason}", observed)

    def judged(self, ok: bool, summary: str, observed: Any, expected: Any, hint: str) -> Check:
        return Check.judged(self.id, ok, summary, observed, expected, hint)


class Checks:
    """An area's checks, in their report order."""

    def __init__(self) -> None:
        self.specs: list[Spec] = []

    def add(self, check_id: str, title: str, **options: Any) -> Callable[[Body], Spec]:
        """Declare a check: `@CHECKS.add("driver.kernel", "NVIDIA kernel module")` over its body."""

        def declare(body: Body) -> Spec:
            spec = Spec(check_id, title, body, **options)
            self.specs.append(spec)
            return spec

        return declare


def run_tool(argv: list[str], timeout: int = 120) -> subprocess.CompletedProcess[str]:
    """A tool of the host's (nvidia-smi, modinfo, ptxas, ldconfig), found on PATH as a user runs it."""
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)  # noqa: S603


@dataclass(frozen=True)
class Userspace:
    """The user-space driver as NVML or nvidia-smi reports it."""

    version: str | None
    source: str  # "NVML", "nvidia-smi", or "" when neither answers
    mismatch: str | None = None  # nvidia-smi's words when it says "Driver/library version mismatch"


def _nvml_driver() -> str | None:
    try:
        import pynvml  # type: ignore[import-not-found,unused-ignore]  # noqa: PLC0415 - optional (nvidia-ml-py)
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        pynvml.nvmlShutdown()
    except Exception:
        return None
    return version.decode() if isinstance(version, bytes) else str(version)


@dataclass(frozen=True)
class CudnnPlace:
    """Where the host's system cuDNN is: NVIDIA's packages put it in the system directories (headers
    named cudnn*_vN.h, the plain names through the libcudnn alternative), the tarball into the CUDA
    tree."""

    kind: str  # "packages" or "tree"
    include: Path
    lib: Path

    def describe(self) -> str:
        return "installed by packages" if self.kind == "packages" else "in the CUDA tree"


# The system library directory of NVIDIA's packages (Debian's multiarch directory).
MULTIARCH = f"{platform.machine()}-linux-gnu"


@dataclass
class Context:
    """What the checks run against. A check reads the host through the properties below, each read
    once when first asked for, so that no check depends on another having run before it."""

    expect: dict[str, Any] = field(default_factory=dict)
    require_gpu: bool = False
    proc: Path = Path("/proc")
    # The environment verify runs in (its Python's sys.prefix).
    prefix: str = sys.prefix
    sys_root: Path = Path("/sys")
    # Each installed kernel's modules (the nvidia module's per-kernel check reads them through modinfo).
    modules_root: Path = Path("/lib/modules")
    cuda_home: Path = Path("/usr/local/cuda")
    torch: Any = None
    # The device the compute checks run on; None: CUDA where torch sees a GPU (--cpu-selftest and
    # the unit tests give the CPU device).
    device: Any = None
    # `ldconfig -p` as text; None: run it when a check asks (tests give saved output).
    ldconfig_cache: str | None = None
    # The roles' records (the cudnn role's says which source installed the cuDNN), and the system
    # directories NVIDIA's packages install into (tests give temporary ones).
    facts_dir: Path = Path("/etc/ansible/facts.d")
    system_include: Path = Path("/usr/include") / MULTIARCH
    system_lib: Path = Path("/usr/lib") / MULTIARCH

    def gpu_skip(self, spec: Spec, reason: str = NO_GPU, *, title: str | None = None, observed: Any = None) -> Check:
        """A GPU check that cannot run: skip with the reason (what it observed without a GPU, else the
        reason, as observed), or fail under --require-gpu."""
        if self.require_gpu:
            return Check(
                spec.id, FAIL, title or spec.title, observed=reason, expected="a GPU (--require-gpu)", hint=GPU_HINT
            )
        return spec.skipped(reason, reason if observed is None else observed, title=title)

    @cached_property
    def proc_driver(self) -> str | None:
        """/proc/driver/nvidia/version, or None without an NVIDIA kernel module."""
        path = self.proc / "driver/nvidia/version"
        return path.read_text() if path.exists() else None

    @cached_property
    def driver_kernel(self) -> str | None:
        parsed = hostparse.parse_proc_version(self.proc_driver or "")
        return parsed["version"] if parsed else None

    @cached_property
    def userspace(self) -> Userspace:
        version = _nvml_driver()
        if version is not None:
            return Userspace(version, "NVML")
        if not shutil.which("nvidia-smi"):
            return Userspace(None, "")
        run = run_tool(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], timeout=60)
        version, mismatch = hostparse.parse_smi_driver(run.returncode, run.stdout + run.stderr)
        return Userspace(version, "nvidia-smi", (run.stdout + run.stderr).strip()[:300] if mismatch else None)

    @cached_property
    def driver_user(self) -> str | None:
        return self.userspace.version

    @cached_property
    def gpu_visible(self) -> bool:
        """Whether torch is a CUDA build and sees a GPU."""
        t = self.torch
        return bool(t.version.cuda) and bool(t.cuda.is_available())

    def compute_device(self) -> Any:
        """Where the compute checks run: the given device, else CUDA when torch sees a GPU, else None."""
        if self.device is not None:
            return self.device
        return self.torch.device("cuda") if self.gpu_visible else None

    @cached_property
    def cudnn_record(self) -> dict[str, Any]:
        """The cudnn role's record, {} when there is none or it cannot be read."""
        return self.record("cudnn")

    @cached_property
    def env_record(self) -> dict[str, Any]:
        """The pytorch_env role's record (the environment's companions), {} without one."""
        return self.record("pytorch_env")

    def record(self, role: str) -> dict[str, Any]:
        """A role's record in facts_dir, {} when there is none or it cannot be read."""
        try:
            record = json.loads((self.facts_dir / f"{role}.fact").read_text())
        except (OSError, ValueError):
            return {}
        return record if isinstance(record, dict) else {}

    @cached_property
    def cudnn_place(self) -> CudnnPlace:
        """Where the declared cuDNN is: the system directories where the cudnn role installed it from
        NVIDIA's repository, else the CUDA tree."""
        if self.cudnn_record.get("source") == "nvidia_repo":
            return CudnnPlace("packages", self.system_include, self.system_lib)
        return CudnnPlace("tree", self.cuda_home / "include", self.cuda_home / "lib64")

    def ldconfig(self) -> str:
        """The loader's cache (`ldconfig -p`), read once."""
        if self.ldconfig_cache is None:
            tool = "/sbin/ldconfig" if Path("/sbin/ldconfig").exists() else "ldconfig"
            self.ldconfig_cache = run_tool([tool, "-p"]).stdout
        return self.ldconfig_cache

    def load_cudnn(self) -> None:
        """Have torch load its cuDNN (what torch.backends.cudnn.version() does first), so that a
        check of the mapped library sees it whether or not cudnn.version ran before; torch's
        refusal of that cuDNN is cudnn.version's finding, not this one's."""
        with contextlib.suppress(Exception):
            self.torch.backends.cudnn.version()
