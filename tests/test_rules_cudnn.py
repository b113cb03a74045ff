"""The rules of the system cuDNN: a release written as people write it, the builds named when it is
unknown, its CUDA matrix, the tarball of the .tgz era, the GPUs its matrix drops."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuenv.checkspec import check_file, check_mapping, cudnn_fetch_mode
from tests.rule_cases import stack


# --- cuDNN written as people write it: the release, three parts, means its build ---
@pytest.mark.parametrize(
    ("declared", "cuda", "build"),
    [
        ("9.1.0", "12.4.1", "9.1.0.70"),  # NVIDIA's downloads page names releases in three parts
        ("8.9.2", "12.1.1", "8.9.2.26"),
        ("8.9.7", "12.4.1", "8.9.7.29"),  # a build only CUDA 12 has on PyPI
        ("9.1.0.70", "12.4.1", "9.1.0.70"),  # the build itself
    ],
)
def test_a_three_part_cudnn_resolves_to_its_build(declared: str, cuda: str, build: str) -> None:
    keys = stack(cudnn=declared, cuda=cuda, driver="550")
    if cuda.startswith("12.1"):
        keys.update(torch="2.1.2", torch_variant="cu121", python="3.11", driver="535")
    result = check_mapping(keys)
    assert result["exit_code"] == 0, result
    assert result["stack"]["cudnn"] == build
    assert result["stack"]["cudnn_declared"] == declared


def test_an_unknown_cudnn_release_names_the_nearest_for_that_cuda_major() -> None:
    result = check_mapping(stack(cudnn="9.1.5"))
    (error,) = result["errors"]
    assert error["rule"] == "cudnn-unknown"
    assert error["message"] == "cuDNN 9.1.5 is not a release gpuenv knows for CUDA 12"
    assert error["fix"] == "use a release gpuenv has for CUDA 12: the nearest are 9.1.1.17 and 9.2.0.82"


def test_cudnn_of_two_or_five_parts_is_malformed_with_a_readable_message() -> None:
    for bad in ("9.1", "9.1.0.70.1"):
        result = check_mapping(stack(cudnn=bad))
        assert result["exit_code"] == 2
        (problem,) = [e["message"] for e in result["errors"]]
        assert f"gpu_stack.cudnn: '{bad}' is not a cuDNN release (\"8.2.1\", which means its build" in problem


def test_a_tgz_era_cudnn_passes_once_its_tarball_is_given(tmp_path: Path) -> None:
    # The recipe people follow: cuDNN 8.2.1 ships only as cudnn-11.3-linux-x64-v8.2.1.32.tgz.
    recipe = stack(cuda="11.3.1", cudnn="8.2.1", driver="470", torch="1.12.1", torch_variant="cu113", python="3.9")
    (error,) = check_mapping(recipe)["errors"]
    assert error["rule"] == "cudnn-archive"
    assert "cudnn_tarball_path" in error["fix"]
    assert "cuda/include and cuda/lib64" in error["why"]
    assert check_mapping(recipe, cudnn_fetch="tarball")["exit_code"] == 0
    assert check_mapping(recipe, cudnn_fetch="packages")["exit_code"] == 0
    # check-spec reads the settings beside the stack, as the preflight passes them.
    path = tmp_path / "gpu_hosts.yml"
    body = "gpu_stack: " + json.dumps(recipe) + "\n"
    path.write_text(body)
    assert check_file(path)["exit_code"] == 1
    path.write_text(body + "cudnn_tarball_path: /srv/nvidia/cudnn-11.3-linux-x64-v8.2.1.32.tgz\n")
    assert check_file(path)["exit_code"] == 0
    path.write_text(body + "cudnn_source: none\n")
    assert check_file(path)["exit_code"] == 0
    assert cudnn_fetch_mode({"cudnn_tarball_url": "file:///srv/x.tgz"}) == "tarball"
    assert cudnn_fetch_mode({}) == "manifest"


def test_cudnn_outside_its_matrix_names_a_build_that_lists_the_toolkit() -> None:
    result = check_mapping(
        stack(cuda="11.8.0", cudnn="8.2.1", driver="520", torch="2.0.1", torch_variant="cu118", python="3.10")
    )
    error = next(e for e in result["errors"] if e["rule"] == "cudnn-cuda-minor")
    assert error["message"] == "cuDNN 8.2.1.32 for CUDA 11 supports CUDA 11.0 to 11.3, not 11.8 (CUDA 11.8.0)"
    # The same major (sonames stay .so.8) whose range NVIDIA's own matrix gives: 8.9.6, not 9.x
    assert error["fix"] == "use a cuDNN whose matrix lists CUDA 11.8, e.g. 8.9.6.50"
    assert [s["key"] for s in error["sources"]] == ["nv_cudnn_matrix_8"]


def test_the_nearest_builds_include_the_same_release() -> None:
    (error,) = check_mapping(stack(cudnn="9.1.0.99"))["errors"]
    assert error["fix"] == "use a release gpuenv has for CUDA 12: the nearest are 9.1.0.70 and 9.1.1.17"


def test_a_system_cudnn_whose_matrix_drops_kepler_is_refused_for_kepler() -> None:
    # NVIDIA's cuDNN 8.9.1 matrix lists compute capability 5.0 to 9.0 (cudnn.matrix_min_cc,
    # nv_cudnn_matrix_8); a K80 (3.7) cannot use a system cuDNN 8.9.6. 8.5.0's matrix still says
    # "SM 3.5 and later", and the releases between are UNVERIFIED: no refusal there.
    kepler = stack(cuda="11.3.1", driver="470", torch="1.12.1", torch_variant="cu113", python="3.10", gpu="3.7")
    result = check_mapping({**kepler, "cudnn": "8.9.6"})
    (error,) = [e for e in result["errors"] if e["rule"] == "gpu-cudnn-cc"]
    assert error["message"] == "the system cuDNN 8.9.6.50 does not support compute capability 3.7 (3.7)"
    assert [s["key"] for s in error["sources"]] == ["nv_cudnn_matrix_8"]
    assert "gpu-cudnn-cc" not in {e["rule"] for e in check_mapping({**kepler, "cudnn": "8.6.0"})["errors"]}
    assert "gpu-cudnn-cc" not in {
        e["rule"] for e in check_mapping({**kepler, "cudnn": "8.9.6", "gpu": "5.0"})["errors"]
    }
