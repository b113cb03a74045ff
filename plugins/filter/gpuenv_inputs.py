"""Filters for the roles' checks of their settings, calling gpuenv.inputs (the forms of values
written into files; tested in tests/test_inputs.py) and gpuenv.rolechecks (each role's
refusals; tests/test_rolechecks.py)."""

from __future__ import annotations

from typing import Any

from gpuenv import inputs, rolechecks


def gpuenv_input_problems(values: dict[str, Any]) -> list[str]:
    """{variable: [value, form]} -> one sentence per value that does not have its form."""
    return inputs.problems(dict(values))


def gpuenv_cudnn_setting_problems(settings: dict[str, Any], host: str) -> list[str]:
    return rolechecks.cudnn_problems(settings, host)


def gpuenv_cuda_toolkit_setting_problems(settings: dict[str, Any], host: str) -> list[str]:
    return rolechecks.cuda_toolkit_problems(settings, host)


def gpuenv_driver_setting_problems(settings: dict[str, Any], host: str) -> list[str]:
    return rolechecks.driver_problems(settings, host)


def gpuenv_cudnn_manifest_problem(manifest: dict[str, Any], plan: dict[str, Any], settings: dict[str, Any]) -> str:
    """The cudnn role's refusal of the manifest or the tarball it names; empty where there is none."""
    return rolechecks.cudnn_manifest_problem(manifest, plan, settings) or ""


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "gpuenv_input_problems": gpuenv_input_problems,
            "gpuenv_cudnn_setting_problems": gpuenv_cudnn_setting_problems,
            "gpuenv_driver_setting_problems": gpuenv_driver_setting_problems,
            "gpuenv_cuda_toolkit_setting_problems": gpuenv_cuda_toolkit_setting_problems,
            "gpuenv_cudnn_manifest_problem": gpuenv_cudnn_manifest_problem,
        }
