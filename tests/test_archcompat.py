"""NVIDIA's binary-compatibility rule (gpuenv.archcompat), as verify applies it to torch's arch list
on a host and as the rules apply it to the data's torch builds."""

from __future__ import annotations

import pytest

from gpuenv import archcompat, rules
from gpuenv.compat import TorchVariant


@pytest.mark.parametrize(
    ("cc", "arch", "ok"),
    [
        ("8.6", ["sm_80", "sm_90"], True),  # SASS 8.0 runs on 8.6 (same major, lower minor)
        ("8.0", ["sm_86"], False),  # but not the other way round
        ("12.0", ["sm_80", "sm_90", "compute_90"], True),  # PTX 9.0 is JIT-compiled for 12.0
        ("12.0", ["sm_50", "sm_90"], False),  # "no kernel image is available for execution on the device"
        ("6.1", ["sm_70", "compute_70"], False),  # PTX only runs at or above its own CC
        ("10.0", ["sm_100a"], True),  # architecture-specific SASS for exactly that CC
        ("10.3", ["sm_100a"], False),  # ... and not for a later minor
        ("10.3", ["sm_100f"], True),  # family-specific SASS covers the family
        ("10.0", ["sm_103f"], False),  # ... from its own minor up
        ("12.0", ["sm_100f"], False),  # ... and never another major
        ("9.0", ["compute_90a"], True),  # architecture-specific PTX: that CC only
        ("10.0", ["compute_90a"], False),
        ("10.3", ["compute_100f"], True),  # family-specific PTX: the family only
        ("12.0", ["compute_100f"], False),
    ],
)
def test_arch_coverage_follows_nvidias_binary_compatibility(cc: str, arch: list[str], ok: bool) -> None:
    assert archcompat.runs_on(cc, arch)[0] is ok


def test_the_reason_names_what_runs() -> None:
    assert archcompat.runs_on("8.6", ["sm_80", "compute_80"]) == (True, "SASS sm_80")
    assert archcompat.runs_on("12.0", ["sm_90", "compute_90"]) == (True, "PTX compute_90 (JIT-compiled at first use)")


def _variant(sass: tuple[str, ...], ptx: tuple[str, ...] = ()) -> TorchVariant:
    return TorchVariant(name="cu129", cuda="12.9", cudnn="9.10.2.21", sass=sass, ptx=ptx)


def test_the_rules_read_architecture_and_family_specific_builds_as_verify_does() -> None:
    """rules.covers parsed every arch as dotted digits: a build listed as "10.0a" (TORCH_CUDA_ARCH_LIST
    "10.0a") raised ValueError, where NVIDIA's rule (and verify) say it runs on 10.0 only, and
    "10.0f" on the whole 10.x family."""
    assert rules.covers(_variant(("9.0", "10.0a")), "10.0")
    assert not rules.covers(_variant(("9.0", "10.0a")), "10.3")
    assert rules.covers(_variant(("10.0f",)), "10.3")
    assert not rules.covers(_variant(("10.0f",)), "12.0")
    assert rules.covers(_variant(("9.0",), ("9.0",)), "12.0")  # plain PTX still JITs upwards
