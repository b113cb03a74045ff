"""The gpuenv stack that would replace what doctor found: gpuenv suggest for the host's GPUs and OS,
with the host's driver branch as the driver it could keep (suggest's keep-driver alternative). The
findings' fixes name its builds (a torch the installed driver runs, one with kernels for the GPUs)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpuenv import versions
from gpuenv.compat import CompatData
from gpuenv.doctor.driver import Gpu
from gpuenv.suggest import Request, suggest
from gpuenv.suggest.inputs import GpuSpec, gpu_spec, parse_constraints

TORCH_INDEX = "https://download.pytorch.org/whl/{variant}"


@dataclass
class Advice:
    command: str  # the gpuenv suggest command that gives the same answer, with its reasons
    result: dict[str, Any] | None = None  # gpuenv suggest's result
    driver_branch: str | None = None  # the host's
    notes: list[str] = field(default_factory=list)

    def stacks(self) -> list[dict[str, Any]]:
        """The suggested gpu_stack mappings: one, or one per GPU group."""
        if not self.result or self.result["verdict"] not in ("found", "per-group"):
            return []
        return [dict(e["document"]["gpu_stack"]) for e in self.result["stacks"]]

    def keeping_driver(self) -> dict[str, Any] | None:
        """The newest stack that keeps the host's driver branch, where suggest found one."""
        stacks = self.stacks()
        if len(stacks) == 1 and self.driver_branch and stacks[0]["driver"] == self.driver_branch:
            return stacks[0]
        for alt in (self.result or {}).get("alternatives", []):
            if alt["kind"] == "keep-driver":
                return dict(alt["stacks"][0]["document"]["gpu_stack"])
        return None


def pip_install(python: str, stack: dict[str, Any], data: CompatData) -> str:
    """The command that puts a stack's torch build into an environment (PyPI's own build where it is
    that release's default, else PyTorch's index for the variant)."""
    series = data.torch_series(stack["torch"])
    variant = stack["torch_variant"]
    index = "" if series and series.pypi_default == variant else f" --index-url {TORCH_INDEX.format(variant=variant)}"
    return f"{python} -m pip install torch=={stack['torch']}{index}"


def _quote(label: str) -> str:
    return f'"{label}"' if " " in label else label


def advise(data: CompatData, gpus: list[Gpu], os_key: str | None, driver: str | None) -> Advice:
    specs: list[GpuSpec] = []
    notes = []
    for gpu in gpus:
        if gpu.cc is None:
            notes.append(
                f"GPU {gpu.name!r} ({gpu.source}) is a model gpuenv does not know: give its compute "
                "capability with --gpu CC (nvidia-smi --query-gpu=compute_cap --format=csv prints it)"
            )
        elif all(s.label != gpu.name for s in specs):
            specs.append(gpu_spec(gpu.name, gpu.cc, data))
    flags = " ".join(f"--gpu {_quote(s.label)}" for s in specs) + (f" --os {os_key}" if os_key else "")
    advice = Advice(f"gpuenv suggest {flags}", notes=notes)
    if not specs:
        advice.notes.append("no GPU to suggest a stack for: nvidia-smi and lspci named none; give them with --gpu")
        return advice
    if driver:
        advice.driver_branch = str(versions.driver_branch(driver))
    keep: tuple[str, str, list[str]] | None = None
    if advice.driver_branch:
        keep = (advice.driver_branch, "the driver this host has", [])
    advice.result = suggest(data, Request(specs, parse_constraints(data, os=os_key), keep))
    return advice
