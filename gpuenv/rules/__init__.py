"""The compatibility rules: one function per rule, each returning what it found with why and fix.

The same :func:`check` serves `gpuenv check-spec` and the playbooks' preflight (through the
filter plugin in plugins/filter/), so the command line and site.yml cannot disagree. The rules live
by area, each a mixin of the checker's state (gpuenv.rules.base): the GPUs (gpus), the toolkit, torch
and the driver (toolchain), the system cuDNN (cudnn), the host's OS, Python and NVSwitches (host).
A new rule goes into its area's class and is called from check() below.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpuenv import versions
from gpuenv.compat import CompatData, load
from gpuenv.osvars import Unserved
from gpuenv.rules.base import (
    ERROR,
    EXIT_INCOMPATIBLE,
    EXIT_INVALID,
    EXIT_OK,
    WARNING,
    Finding,
    Gpu,
    Report,
    covers,
    gpu_cc,
)
from gpuenv.rules.cudnn import CudnnRules
from gpuenv.rules.gpus import ARCH_SOURCES, GpuRules
from gpuenv.rules.host import HostRules
from gpuenv.rules.toolchain import ToolchainRules, driver_against
from gpuenv.stack import Stack

__all__ = [
    "ARCH_SOURCES",
    "ERROR",
    "EXIT_INCOMPATIBLE",
    "EXIT_INVALID",
    "EXIT_OK",
    "WARNING",
    "Finding",
    "Gpu",
    "Report",
    "check",
    "covers",
    "driver_against",
    "gpu_cc",
]


class _Checker(GpuRules, ToolchainRules, CudnnRules, HostRules):
    """The rules of every area over one stack; resolved() is what the preflight publishes."""

    def resolved(self) -> dict[str, Any]:
        out = self.stack.as_dict()
        out["cuda"] = self.toolkit or self.stack.cuda
        out["cuda_declared"] = self.stack.cuda
        out["cudnn"] = self.cudnn or self.stack.cudnn
        out["cudnn_declared"] = self.stack.cudnn
        # What verify checks the loader resolves to the tree's own files.
        out["cudnn_libraries"] = self.data.cudnn_libraries(self.cudnn) if self.cudnn else []
        # Derived once here, read by the roles (none of them re-derives a version from a string).
        cuda = out["cuda"] if out["cuda"] not in (None, "none") else None
        out["cuda_xy"] = versions.major_minor(cuda) if cuda else None
        out["cuda_major"] = str(versions.major(cuda)) if cuda else None
        out["cuda_tree"] = f"/usr/local/cuda-{out['cuda_xy']}" if cuda else None
        cudnn = versions.CudnnVersion(self.cudnn) if self.cudnn else None
        out["cudnn_release"] = cudnn.release if cudnn else None
        out["cudnn_major"] = cudnn.major if cudnn else None
        # The CUDA the declared driver supports: what a conda solve takes the host to have (__cuda).
        out["driver_cuda"] = self.data.driver_cuda(self.stack.driver)
        out["torch_variant"] = self.variant.name if self.variant else self.stack.torch_variant
        out["torch_variant_derived"] = self.variant_derived
        out["torch_cuda"] = self.variant.cuda if self.variant else None
        out["torch_cudnn"] = self.variant.cudnn if self.variant else None
        # The oldest driver that runs torch's CUDA runtime at all (minor-version compatibility): what
        # gpuenv verify holds the host's driver to.
        out["torch_min_driver"] = (
            self.data.minor_compat_floor.get(self.variant.cuda.split(".")[0]) if self.variant else None
        )
        out["torch_arch_list"] = self.variant.arch_list() if self.variant else []
        out["torch_pypi_default"] = bool(self.series and self.variant and self.series.pypi_default == self.variant.name)
        out["torch_conda_pytorch_channel"] = bool(self.series and self.series.conda_pytorch_channel)
        out["from_profile"] = self.stack.from_profile
        out["host_os"] = self.host_os
        # The NVSwitch chips the preflight found on the PCI bus (gpu_services' Fabric Manager: auto).
        out["nvswitches"] = self.nvswitches
        out["gpus"] = [
            {"label": g.label, "cc": g.cc, "origin": g.origin, "generation": g.generation} for g in self.gpus
        ]
        return out


def check(
    stack: Stack,
    data: CompatData | None = None,
    host_gpus: Iterable[Mapping[str, str]] = (),
    host_facts: Mapping[str, Any] | None = None,
    backend: str | None = None,
    *,
    cudnn_fetch: str = "manifest",
    nvswitches: Iterable[Mapping[str, str]] = (),
    services_settings: Mapping[str, Any] | None = None,
    unserved: Iterable[Unserved] = (),
) -> Report:
    """Judge a well-formed stack (and, where given, the host's GPUs, NVSwitches and OS, the
    environment's backend, how the cudnn role gets its tarball: cudnn_fetch_mode, and the driver
    and services settings check_fabric reads, the roles of the run that cannot serve the host's OS:
    gpuenv.osvars.unserved) against the data."""
    checker = _Checker(stack, data or load(), cudnn_fetch)
    checker.resolve_gpus(host_gpus)
    checker.check_toolkit()
    checker.check_torch()
    checker.check_python()
    checker.check_driver()
    checker.check_cudnn()
    for gpu in checker.gpus:
        checker.check_gpu(gpu)
    checker.check_os(host_facts)
    checker.check_roles_os(unserved)
    checker.check_os_python(backend)
    checker.check_fabric(nvswitches, services_settings)
    return Report(stack=stack, gpus=checker.gpus, findings=checker.findings, resolved=checker.resolved())
