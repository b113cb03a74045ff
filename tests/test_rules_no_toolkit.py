"""A stack without a system CUDA toolkit (cuda: none): the driver and torch's wheels, which bring
their own CUDA runtime and cuDNN. check-spec judges the driver against torch's CUDA alone; a system
cuDNN has nowhere to go; the variant is the one `pip install torch` brings."""

from __future__ import annotations

from gpuenv.checkspec import check_mapping
from gpuenv.drift import compare
from gpuenv.verify import base, cuda_tree
from tests.rule_cases import stack


def test_driver_550_with_torch_2_5_1_cu124_and_no_toolkit_is_compatible() -> None:
    result = check_mapping(stack(cuda="none", cudnn="none"))
    assert result["exit_code"] == 0, result
    assert (result["errors"], result["warnings"]) == ([], [])
    resolved = result["stack"]
    assert (resolved["cuda"], resolved["cuda_tree"], resolved["cuda_major"]) == ("none", None, None)
    assert (resolved["torch_variant"], resolved["torch_cuda"]) == ("cu124", "12.4")


def test_the_driver_is_judged_against_torch_s_cuda_alone() -> None:
    old = check_mapping(stack(cuda="none", cudnn="none", driver="535"))
    assert {w["rule"] for w in old["warnings"]} == {"driver-torch-cuda"}  # minor-version compatibility
    too_old = check_mapping(stack(cuda="none", cudnn="none", driver="470"))
    assert {e["rule"] for e in too_old["errors"]} == {"driver-torch-cuda"}
    assert not [f for f in too_old["errors"] + too_old["warnings"] if f["rule"].startswith("driver-cuda")]


def test_without_a_variant_the_build_pip_install_brings() -> None:
    result = check_mapping(stack(cuda="none", cudnn="none", torch_variant=None))
    assert result["exit_code"] == 0, result
    assert result["stack"]["torch_variant"] == "cu124"  # torch 2.5.1's PyPI default


def test_a_system_cudnn_without_a_toolkit_is_refused() -> None:
    result = check_mapping(stack(cuda="none"))
    (error,) = result["errors"]
    assert error["rule"] == "cudnn-without-toolkit"
    assert "set cudnn: none" in error["fix"]


def test_cuda_written_as_yaml_s_null_says_to_write_none() -> None:
    result = check_mapping(stack(cuda=None) | {"cuda": None})
    assert result["exit_code"] == 2
    assert "write none as the word none" in result["errors"][0]["message"]


def test_verify_and_drift_skip_the_toolkit_with_the_reason() -> None:
    check = cuda_tree.toolkit(base.Context(expect={"cuda": "none"}))
    assert check.status == "skip"
    assert "no CUDA toolkit" in check.summary
    resolved = {"cuda": "none", "cudnn": "none", "driver": "550", "torch": "2.5.1", "torch_variant": "cu124"}
    found = {c.id: c for c in compare(resolved, {}, cuda_link=None, env_link=None, lock=None, freeze=None)}
    assert found["drift.cuda_default"].status == found["drift.cuda_installed"].status == "skip"
