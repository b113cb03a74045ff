"""What every rule shares: the findings and the report, the checker's state, and the two facts the
areas all read (a declared GPU's compute capability, NVIDIA's binary-compatibility rule)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from gpuenv import archcompat
from gpuenv.compat import CompatData, TorchRelease, TorchVariant
from gpuenv.stack import Stack

ERROR = "error"
WARNING = "warning"

EXIT_OK = 0
EXIT_INCOMPATIBLE = 1
EXIT_INVALID = 2


@dataclass
class Finding:
    rule: str
    severity: str
    message: str
    why: str
    fix: str
    sources: list[str] = field(default_factory=list)


@dataclass
class Gpu:
    label: str
    cc: str
    origin: str  # "declared" or "detected"
    generation: str | None = None


@dataclass
class Report:
    stack: Stack
    gpus: list[Gpu]
    findings: list[Finding]
    resolved: dict[str, Any]

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == ERROR]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == WARNING]

    @property
    def exit_code(self) -> int:
        return EXIT_INCOMPATIBLE if self.errors else EXIT_OK

    @property
    def verdict(self) -> str:
        return "incompatible" if self.errors else "compatible"


class CheckerBase:
    """The state the rules of every area read and fill: each area is a mixin of this class
    (gpuenv.rules.gpus, .toolchain, .cudnn, .host), and gpuenv.rules composes them."""

    def __init__(self, stack: Stack, data: CompatData, cudnn_fetch: str = "manifest") -> None:
        self.stack = stack
        self.data = data
        # How the cudnn role gets its tarball (cudnn_fetch_mode of the settings beside the stack).
        self.cudnn_fetch = cudnn_fetch
        self.findings: list[Finding] = []
        self.gpus: list[Gpu] = []
        self.toolkit: str | None = None
        # The system cuDNN's build, resolved from what the stack declares ("8.9.2" -> "8.9.2.26").
        self.cudnn: str | None = None
        self.series: TorchRelease | None = None
        self.variant: TorchVariant | None = None
        self.variant_derived = False
        self.host_os: str | None = None
        self.nvswitches: list[dict[str, str]] = []

    def add(self, rule: str, severity: str, message: str, why: str, fix: str, *sources: str) -> None:
        self.findings.append(Finding(rule, severity, message, why, fix, list(sources)))


def gpu_cc(label: str, data: CompatData) -> str | None:
    """The compute capability a declared GPU stands for: "8.6", "sm_86" or a model name; None when
    gpuenv does not know the model (the rules then report gpu-unknown)."""
    if re.fullmatch(r"[0-9]{1,3}\.[0-9]{1,3}", label):
        return label
    match = re.fullmatch(r"sm_([0-9]+)([0-9])", label.lower())
    if match:
        return f"{int(match.group(1))}.{match.group(2)}"
    model = data.gpu_by_name(label)
    return model.cc if model is not None else None


def covers(variant: TorchVariant, cc: str) -> bool:
    """Whether the variant's kernels run on compute capability `cc`, under NVIDIA's
    binary-compatibility rule (gpuenv.archcompat, the rule verify applies on the hosts too)."""
    return archcompat.runs_on(cc, variant.arch_list())[0]
