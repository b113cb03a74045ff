from __future__ import annotations

import pytest

from gpuenv import versions
from gpuenv.probes import parse_nvidia_smi_gpus

# nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader, in the format NVIDIA documents
# (nvidia-smi --help-query-gpu): one line per GPU, fields separated by ", ".
TWO_GPUS = "NVIDIA GeForce RTX 4090, 8.9\nNVIDIA GeForce RTX 4090, 8.9\n"


def test_parse_nvidia_smi_lines() -> None:
    assert parse_nvidia_smi_gpus(TWO_GPUS) == [{"name": "NVIDIA GeForce RTX 4090", "cc": "8.9"}] * 2


def test_parse_nvidia_smi_without_compute_cap() -> None:
    assert parse_nvidia_smi_gpus("Tesla V100-SXM2-16GB, [N/A]\n") == [{"name": "Tesla V100-SXM2-16GB", "cc": ""}]


def test_parse_nvidia_smi_empty() -> None:
    assert parse_nvidia_smi_gpus("\n") == []


@pytest.mark.parametrize(("a", "b"), [("9.10.2.21", "9.9.0.52"), ("550.54.15", "550.54.14"), ("12.10", "12.9")])
def test_versions_compare_numerically(a: str, b: str) -> None:
    assert versions.parse(a) > versions.parse(b)


@pytest.mark.parametrize(
    ("driver", "minimum", "ok"),
    [
        ("550", "550.54.15", True),  # a branch stands for its newest driver
        ("545", "550.54.14", False),
        ("550.54.14", "550.54.15", False),
        ("570.26", "570.26", True),
        ("580.65.06", "570.124.06", True),
    ],
)
def test_driver_satisfies(driver: str, minimum: str, ok: bool) -> None:
    assert versions.driver_satisfies(driver, minimum) is ok


@pytest.mark.parametrize(
    ("variant", "cuda"), [("cu124", "12.4"), ("cu118", "11.8"), ("cu102", "10.2"), ("cu130", "13.0"), ("rocm6.2", None)]
)
def test_cuda_from_variant(variant: str, cuda: str | None) -> None:
    assert versions.cuda_from_variant(variant) == cuda


def test_bad_version_is_rejected() -> None:
    with pytest.raises(ValueError, match="not a dotted version"):
        versions.parse("12.x")
