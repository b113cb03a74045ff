"""The compatibility rules, table-driven (tests/rule_cases.py), and the rules per GPU and
torch build: the fixes they name, the GPUs they judge, the stack they publish. The cuDNN rules are
in test_rules_cudnn.py, the OS and Python rules in test_rules_os.py."""

from __future__ import annotations

from typing import Any

import pytest

from gpuenv import rules
from gpuenv.checkspec import check_mapping
from gpuenv.compat import load
from tests.rule_cases import CASES, stack


@pytest.mark.parametrize(
    ("stack_keys", "exit_code", "errors", "warnings"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_rule_table(stack_keys: dict[str, Any], exit_code: int, errors: set[str], warnings: set[str]) -> None:
    result = check_mapping(stack_keys)
    got_errors = {e["rule"] for e in result["errors"]}
    got_warnings = {w["rule"] for w in result["warnings"]}
    assert (result["exit_code"], got_errors, got_warnings) == (exit_code, errors, warnings), result
    for finding in result["errors"] + result["warnings"]:
        assert all(finding[part] for part in ("message", "why", "fix")), finding
        assert finding["sources"], f"{finding['rule']} cites no source"


def test_there_are_at_least_40_cases() -> None:
    assert len(CASES) >= 40


def test_arch_fix_names_the_first_release_with_kernels() -> None:
    result = check_mapping(stack(gpu="RTX 5090"))
    arch = next(e for e in result["errors"] if e["rule"] == "gpu-torch-arch")
    assert arch["message"] == "torch 2.5.1+cu124 has no kernels for compute capability 12.0 (RTX 5090)"
    assert arch["fix"].startswith("use torch >= 2.7 with cu128")


def test_arch_fix_prefers_another_variant_of_the_same_release() -> None:
    result = check_mapping(
        stack(
            driver="580", cuda="12.8.1", cudnn="none", python="3.12", torch="2.11.0", torch_variant="cu128", gpu="V100"
        )
    )
    arch = next(e for e in result["errors"] if e["rule"] == "gpu-torch-arch")
    assert arch["fix"].startswith("set torch_variant: cu126")


def test_arch_fix_points_back_for_gpus_newer_releases_dropped() -> None:
    result = check_mapping({"profile": "torch-2.14-cu130", "gpu": "GTX 1080"})
    arch = next(e for e in result["errors"] if e["rule"] == "gpu-torch-arch")
    assert "cu126" in arch["fix"]


def test_derived_variant_fix_suggests_an_existing_older_variant() -> None:
    result = check_mapping(stack(cuda="12.6.3", torch_variant=None, driver="560"))
    (error,) = result["errors"]
    assert "set torch_variant: cu124" in error["fix"]


def test_resolved_stack_is_published() -> None:
    result = check_mapping({"profile": "torch-2.5-cu124", "python": "3.12", "cuda": "12.4"})
    resolved = result["stack"]
    assert resolved["python"] == "3.12"
    assert resolved["cuda"] == "12.4.1"  # X.Y means its newest update, the stricter driver minimum
    assert resolved["cuda_declared"] == "12.4"
    assert resolved["torch_cudnn"] == "9.1.0.70"
    assert resolved["torch_pypi_default"] is True
    assert resolved["torch_conda_pytorch_channel"] is True
    assert "python" not in resolved["from_profile"]
    assert resolved["torch_arch_list"][-1] == "sm_90"


def test_detected_gpus_are_checked_too() -> None:
    result = check_mapping(stack(gpu="RTX 4090"), host_gpus=[{"name": "NVIDIA GeForce RTX 5090", "cc": "12.0"}])
    assert "gpu-torch-arch" in {e["rule"] for e in result["errors"]}
    assert "gpu-declared-vs-detected" in {w["rule"] for w in result["warnings"]}


def test_detected_gpu_without_cc_is_looked_up_by_name() -> None:
    result = check_mapping(stack(), host_gpus=[{"name": "NVIDIA GeForce RTX 5090", "cc": ""}])
    assert result["stack"]["gpus"][0]["cc"] == "12.0"


def test_identical_gpus_are_checked_once() -> None:
    result = check_mapping(
        stack(driver="580", cuda="12.8.1", cudnn="none", python="3.12", torch="2.11.0", torch_variant="cu128"),
        host_gpus=[{"name": "Tesla V100-SXM2-16GB", "cc": "7.0"}] * 8,
    )
    assert len(result["stack"]["gpus"]) == 1
    assert [e["rule"] for e in result["errors"]].count("gpu-torch-arch") == 1


def test_overriding_torch_drops_the_profiles_variant() -> None:
    result = check_mapping({"profile": "torch-2.5-cu124", "torch": "2.6.0"})
    assert result["exit_code"] == 0, result["errors"]
    assert result["stack"]["torch_variant"] == "cu124"
    assert result["stack"]["torch_variant_derived"] is True


def test_driver_against_a_cuda_runtime_passes_warns_or_refuses() -> None:
    """The judgement check-spec makes of a declared driver, which gpuenv doctor makes of a host's."""
    data = load()
    what = "torch 2.13.0+cu130 (CUDA 13.0 runtime)"
    assert rules.driver_against(data, "580.95.05", what, "580.65.06", "13", "driver-torch-cuda", "nv_rn_table3") is None
    old = rules.driver_against(data, "550.163.01", what, "580.65.06", "13", "driver-torch-cuda", "nv_rn_table3")
    assert old is not None
    assert (old.severity, old.rule, old.sources) == ("error", "driver-torch-cuda", ["nv_rn_table3", "nv_mvc"])
    assert "CUDA driver version is insufficient" in old.why
    minor = rules.driver_against(
        data, "535.309.01", "torch 2.5.1+cu124 (CUDA 12.4 runtime)", "550.54.14", "12", "driver-torch-cuda", "x"
    )
    assert minor is not None
    assert minor.severity == "warning"
    assert "minor-version compatibility" in minor.message
