"""The compatibility rules, table-driven. Each case names the fact (compat-facts.md section, and the
source key in gpuenv/data/compat.yaml) that decides its expected verdict."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpuenv import rules
from gpuenv.checkspec import check_file, check_mapping, cudnn_fetch_mode
from gpuenv.compat import load


def stack(**keys: Any) -> dict[str, Any]:
    """A compatible base stack (torch-2.5-cu124 without GPU) with some keys replaced."""
    base: dict[str, Any] = {
        "driver": "550",
        "cuda": "12.4.1",
        "cudnn": "9.1.0.70",
        "python": "3.11",
        "torch": "2.5.1",
        "torch_variant": "cu124",
    }
    base.update(keys)
    return {k: v for k, v in base.items() if v is not None}


def legacy(**keys: Any) -> dict[str, Any]:
    """Driver 580 / CUDA 12.6.3 / torch 2.9.1 cu126: the last stack for Maxwell to Volta."""
    return stack(
        **{
            "driver": "580",
            "cuda": "12.6.3",
            "cudnn": "9.10.2.21",
            "python": "3.12",
            "torch": "2.9.1",
            "torch_variant": "cu126",
            **keys,
        }
    )


# (id, stack, expected exit code, expected error rules, expected warning rules)
CASES: list[tuple[str, dict[str, Any], int, set[str], set[str]]] = [
    # --- GPU architecture vs the torch wheel's arch list (section 3, binary-compatibility rule) ---
    ("4090-on-2.5-cu124-runs-sm86", stack(gpu="NVIDIA GeForce RTX 4090"), 0, set(), set()),
    (
        "5090-on-2.5-cu124-no-sm120",
        stack(gpu="NVIDIA GeForce RTX 5090"),
        1,
        {"gpu-torch-arch", "gpu-cuda-toolkit", "gpu-driver-too-old"},
        set(),
    ),
    ("5090-on-2.7-cu128", {"profile": "torch-2.7-cu128", "gpu": "NVIDIA GeForce RTX 5090"}, 0, set(), set()),
    (
        "v100-on-2.7-cu128-dropped-sm70",
        {"profile": "torch-2.7-cu128", "gpu": "Tesla V100-SXM2-16GB"},
        1,
        {"gpu-torch-arch"},
        set(),
    ),
    (
        "v100-on-2.8-cu128-sm70-back",
        stack(
            driver="580", cuda="12.8.1", cudnn="none", python="3.12", torch="2.8.0", torch_variant="cu128", gpu="V100"
        ),
        0,
        set(),
        set(),
    ),
    (
        "v100-on-2.11-cu128-volta-dropped",
        stack(
            driver="580", cuda="12.8.1", cudnn="none", python="3.12", torch="2.11.0", torch_variant="cu128", gpu="V100"
        ),
        1,
        {"gpu-torch-arch", "gpu-cudnn-sm75"},
        set(),
    ),
    (
        "v100-on-2.11-cu126-keeps-volta",
        stack(
            driver="580", cuda="12.6.3", cudnn="none", python="3.12", torch="2.11.0", torch_variant="cu126", gpu="V100"
        ),
        0,
        set(),
        set(),
    ),
    (
        "b200-on-2.6-cu126-no-sm100",
        stack(
            driver="570",
            cuda="12.8.1",
            cudnn="none",
            python="3.12",
            torch="2.6.0",
            torch_variant="cu126",
            gpu="NVIDIA B200",
        ),
        1,
        {"gpu-torch-arch"},
        set(),
    ),
    ("b300-runs-sm100-sass", {"profile": "torch-2.14-cu130", "gpu": "NVIDIA B300"}, 0, set(), set()),
    ("gb10-runs-sm120-sass", {"profile": "torch-2.13-cu130", "gpu": "12.1"}, 0, set(), set()),
    (
        "cc12.0-on-2.11-cu128-sass",
        stack(
            driver="580", cuda="12.8.1", cudnn="none", python="3.12", torch="2.11.0", torch_variant="cu128", gpu="12.0"
        ),
        0,
        set(),
        set(),
    ),
    ("sm-notation-accepted", stack(gpu="sm_89"), 0, set(), set()),
    (
        "a100-on-1.12-cu102-no-sm80",
        stack(
            driver="510",
            cuda="11.6.2",
            cudnn="none",
            python="3.10",
            torch="1.12.1",
            torch_variant="cu102",
            gpu="NVIDIA A100-SXM4-80GB",
        ),
        1,
        {"gpu-torch-arch"},
        {"driver-torch-cuda", "toolkit-torch-major"},
    ),
    (
        "h100-on-1.13-cu117",
        stack(
            driver="515",
            cuda="11.7.1",
            cudnn="none",
            python="3.10",
            torch="1.13.1",
            torch_variant="cu117",
            gpu="NVIDIA H100 80GB HBM3",
        ),
        1,
        {"gpu-torch-arch", "gpu-cuda-toolkit", "gpu-driver-too-old"},
        set(),
    ),
    # --- driver vs CUDA (section 1a table 3, section 1b minor-version compatibility) ---
    ("driver-470-below-cuda12-floor", stack(driver="470"), 1, {"driver-cuda", "driver-torch-cuda"}, set()),
    ("driver-535-cuda12.4-minor-compat", stack(driver="535"), 0, set(), {"driver-cuda", "driver-torch-cuda"}),
    ("driver-550.54.14-just-below-12.4.1", stack(driver="550.54.14"), 0, set(), {"driver-cuda"}),
    ("driver-550.54.15-exact-minimum", stack(driver="550.54.15"), 0, set(), set()),
    (
        "driver-560-below-cuda13-floor",
        stack(driver="560", cuda="13.0.2", cudnn="none", python="3.12", torch="2.13.0", torch_variant="cu130"),
        1,
        {"driver-cuda", "driver-torch-cuda"},
        set(),
    ),
    (
        "driver-575-cuda12.9.1-torch-cu129",
        stack(driver="575", cuda="12.9.1", cudnn="none", python="3.12", torch="2.8.0", torch_variant="cu129"),
        0,
        set(),
        set(),
    ),
    (
        "rtx4090-driver-515-too-old",
        stack(
            driver="515",
            cuda="11.8.0",
            cudnn="none",
            python="3.11",
            torch="2.7.1",
            torch_variant="cu118",
            gpu="RTX 4090",
        ),
        1,
        {"gpu-driver-too-old"},
        {"driver-cuda", "driver-torch-cuda"},
    ),
    # --- Python range per torch release (section 2) ---
    ("py3.13-on-2.5-experimental", stack(python="3.13"), 0, set(), {"torch-python"}),
    (
        "py3.13-on-2.4-unsupported",
        stack(python="3.13", torch="2.4.1", torch_variant="cu124"),
        1,
        {"torch-python"},
        set(),
    ),
    ("py3.8-on-2.5-too-old", stack(python="3.8"), 1, {"torch-python"}, set()),
    ("py3.14-on-2.9", legacy(python="3.14"), 0, set(), set()),
    (
        "py3.12-on-2.1-unsupported",
        stack(python="3.12", torch="2.1.2", torch_variant="cu121", driver="535", cuda="12.1.1", cudnn="none"),
        1,
        {"torch-python"},
        set(),
    ),
    (
        "py3.11-on-1.13-cp311-wheels",
        stack(python="3.11", torch="1.13.1", torch_variant="cu117", driver="515", cuda="11.7.1", cudnn="none"),
        0,
        set(),
        set(),
    ),
    # RELEASE.md calls 3.15 experimental for 2.13, but PyPI has no cp315 wheels of it (pypi_torch_cp315)
    ("py3.15-on-2.13-no-cp315-wheels", {"profile": "torch-2.13-cu130", "python": "3.15"}, 1, {"torch-python"}, set()),
    # --- torch variants (section 2) ---
    ("2.6-has-no-cu121", stack(torch="2.6.0", torch_variant="cu121"), 1, {"torch-variant"}, set()),
    ("2.5-derived-cu126-missing", stack(cuda="12.6.3", torch_variant=None, driver="560"), 1, {"torch-variant"}, set()),
    ("2.5-explicit-cu124-with-12.6-toolkit", stack(cuda="12.6.3", driver="560"), 0, set(), set()),
    ("2.5-derived-cu124", stack(torch_variant=None), 0, set(), set()),
    ("2.9-cu129-unverified-not-listed", legacy(torch_variant="cu129", cuda="12.9.1"), 1, {"torch-variant"}, set()),
    ("torch-2.15-not-in-data", legacy(torch="2.15.0"), 1, {"torch-unknown"}, set()),
    ("torch-2.5.7-no-such-patch", stack(torch="2.5.7"), 1, {"torch-unknown"}, set()),
    (
        "toolkit-12.8-with-torch-cu130",
        {"profile": "torch-2.14-cu130", "cuda": "12.8.1", "cudnn": "none"},
        0,
        set(),
        {"toolkit-torch-major"},
    ),
    # --- CUDA releases in the data ---
    ("cuda-13.3-driver-minimum-unverified", stack(cuda="13.3.0", driver="580"), 1, {"cuda-unknown"}, set()),
    ("cuda-major-minor-resolves-to-ga", stack(cuda="12.4"), 0, set(), set()),
    # --- system cuDNN vs CUDA major (PyPI nvidia-cudnn-cu11/12/13 release histories) ---
    (
        "cudnn-9.11-has-no-cuda11-build",
        stack(cuda="11.8.0", cudnn="9.11.0.98", driver="535", torch="2.7.1", torch_variant="cu118"),
        1,
        {"cudnn-cuda"},
        set(),
    ),
    (
        "cudnn-9.10.2-last-for-cuda11",
        stack(cuda="11.8.0", cudnn="9.10.2.21", driver="535", torch="2.7.1", torch_variant="cu118"),
        0,
        set(),
        set(),
    ),
    ("cudnn-9.12-first-for-cuda13", {"profile": "torch-2.13-cu130", "cudnn": "9.12.0.46"}, 0, set(), set()),
    ("cudnn-9.11.1-no-cuda13-build", {"profile": "torch-2.13-cu130", "cudnn": "9.11.1.4"}, 1, {"cudnn-cuda"}, set()),
    ("cudnn-8.7-no-cuda12-build", stack(cudnn="8.7.0.84"), 1, {"cudnn-cuda"}, set()),
    ("cudnn-unknown-release", stack(cudnn="9.99.0.1"), 1, {"cudnn-unknown"}, set()),
    # --- driver branches per GPU generation (section 1c) ---
    (
        "pascal-on-590-and-cuda13",
        legacy(driver="590", cuda="13.1.0", cudnn="none", gpu="NVIDIA GeForce GTX 1080"),
        1,
        {"gpu-driver-eol", "gpu-cuda-toolkit"},
        {"toolkit-torch-major"},
    ),
    ("pascal-on-legacy-profile", {"profile": "torch-2.9-cu126-legacy", "gpu": "GTX 1080 Ti"}, 0, set(), set()),
    (
        "kepler-cc-on-535-eol",
        stack(driver="535", cuda="11.8.0", cudnn="none", torch="2.7.1", torch_variant="cu118", gpu="3.7"),
        1,
        {"gpu-driver-eol"},
        set(),
    ),
    # --- cuDNN >= 9.11 needs compute capability 7.5 (torch/backends/cudnn) ---
    (
        "pascal-with-system-cudnn-9.11",
        legacy(cudnn="9.11.0.98", gpu="Tesla P100-PCIE-16GB"),
        1,
        {"gpu-cudnn-sm75"},
        set(),
    ),
    (
        "pascal-on-2.14-cu130",
        {"profile": "torch-2.14-cu130", "gpu": "6.1"},
        1,
        {"gpu-torch-arch", "gpu-cudnn-sm75", "gpu-cuda-toolkit"},
        set(),
    ),
    ("turing-with-cudnn-9.20-fine", {"profile": "torch-2.13-cu130", "gpu": "Tesla T4"}, 0, set(), set()),
    # --- Blackwell's generation floor covers CCs without a first toolkit of their own (section 9) ---
    (
        "b300-on-driver-550",
        stack(
            driver="550",
            cuda="12.8.1",
            cudnn="none",
            python="3.12",
            torch="2.7.1",
            torch_variant="cu128",
            gpu="NVIDIA B300",
        ),
        1,
        {"gpu-driver-too-old"},
        {"driver-cuda", "driver-torch-cuda"},
    ),
    ("gb10-on-cuda-12.6", legacy(gpu="GB10", driver="580"), 1, {"gpu-cuda-toolkit", "gpu-torch-arch"}, set()),
    ("cc-written-12.00", stack(gpu="12.00"), 1, {"gpu-torch-arch", "gpu-cuda-toolkit", "gpu-driver-too-old"}, set()),
    ("cc-in-no-generation", {"profile": "torch-2.14-cu130", "gpu": "13.0"}, 1, {"gpu-torch-arch"}, {"gpu-unknown-cc"}),
    ("jetson-orin-is-not-covered", stack(gpu="Jetson AGX Orin"), 0, set(), {"gpu-jetson"}),
    # 8.9.7.29 for CUDA 11 is a tarball only (no wheel): packagers fetch it (cudnn8-releases.md 1a)
    (
        "cudnn-8.9.7-cuda11-tarball",
        stack(cuda="11.8.0", cudnn="8.9.7.29", driver="535", torch="2.7.1", torch_variant="cu118"),
        0,
        set(),
        set(),  # NVIDIA's redistrib_8.9.7.29.json exists (XLA pins it): the role finds the tarball
    ),
    # 8.8.1 is in the .tar.xz era, but no manifest of it is known: the tarball's URL may be needed
    (
        "cudnn-8.8.1-cuda11-manifest-unknown",
        stack(cuda="11.8.0", cudnn="8.8.1", driver="535", torch="2.7.1", torch_variant="cu118"),
        0,
        set(),
        {"cudnn-archive"},
    ),
    # --- the CUDA minors each cuDNN build supports (NVIDIA's support matrices; nixpkgs where none) ---
    (
        "cudnn-8.2.1-on-cuda-11.3-the-recipe",
        stack(cuda="11.3.1", cudnn="8.2.1", driver="470", torch="1.12.1", torch_variant="cu113", python="3.9"),
        1,
        {"cudnn-archive"},  # within its matrix, but a .tgz without a manifest: its tarball must be given
        set(),
    ),
    (
        "cudnn-8.2.1-on-cuda-11.8-outside-its-matrix",
        stack(cuda="11.8.0", cudnn="8.2.1", driver="520", torch="2.0.1", torch_variant="cu118", python="3.10"),
        1,
        {"cudnn-cuda-minor", "cudnn-archive"},
        set(),
    ),
    (
        "cudnn-8.8-on-cuda-12.1-packager-range-warns",
        stack(cuda="12.1.1", cudnn="8.8.1", driver="535", torch="2.1.2", torch_variant="cu121", python="3.11"),
        0,
        set(),
        {"cudnn-cuda-minor", "cudnn-archive"},
    ),
    (
        "cudnn-9.0-on-cuda-12.4-outside-its-matrix",
        stack(cudnn="9.0.0"),
        1,
        {"cudnn-cuda-minor"},
        set(),
    ),
    # --- GPU names ---
    ("unknown-gpu-model", stack(gpu="NVIDIA Quantum 9000"), 1, {"gpu-unknown"}, set()),
    ("mixed-gpu-list", stack(gpu=["RTX 3090", "NVIDIA RTX 6000 Ada Generation"]), 0, set(), set()),
    (
        "mixed-gpu-list-one-bad",
        stack(gpu=["RTX 3090", "RTX 5080"]),
        1,
        {"gpu-torch-arch", "gpu-cuda-toolkit", "gpu-driver-too-old"},
        set(),
    ),
    # --- profiles: override and resolution ---
    ("profile-python-override", {"profile": "torch-2.5-cu124", "python": "3.12"}, 0, set(), set()),
    (
        "debian13-stock-with-5090",
        {"profile": "debian13-stock", "gpu": "RTX 5090"},
        1,
        {"gpu-torch-arch", "gpu-cuda-toolkit", "gpu-driver-too-old"},
        set(),
    ),
]


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


@pytest.mark.parametrize(
    ("facts", "rules"),
    [
        ({"distribution": "Debian", "distribution_major_version": "12", "distribution_version": "12.8"}, set()),
        (
            {"distribution": "Debian", "distribution_major_version": "13", "distribution_version": "13.1"},
            {"os-mismatch"},
        ),
    ],
)
def test_host_os_must_match_declared_os(facts: dict[str, str], rules: set[str]) -> None:
    result = check_mapping(stack(os="debian12"), host_facts=facts)
    assert {e["rule"] for e in result["errors"]} == rules


def test_unknown_host_os_warns() -> None:
    result = check_mapping(stack(), host_facts={"distribution": "Gentoo", "distribution_version": "2.15"})
    assert result["exit_code"] == 0
    assert {w["rule"] for w in result["warnings"]} == {"os-unknown"}


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


# --- cuDNN written as people write it (issue 15): the release, three parts, means its build ---
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


# --- a Python the OS does not ship, with the venv backend (issue 15; docs/research/python-per-os.md) ---
def test_python_39_on_debian_12_is_refused_naming_the_backends_and_oses_that_serve_it() -> None:
    result = check_mapping(
        stack(
            os="debian12",
            python="3.9",
            torch="1.12.1",
            torch_variant="cu116",
            cuda="11.6.2",
            cudnn="none",
            driver="510",
        )
    )
    errors = {e["rule"]: e for e in result["errors"]}
    error = errors["os-python"]
    assert error["message"] == "Python 3.9 is not packaged for debian12, which ships 3.11"
    assert (
        error["fix"] == 'set python: "3.11" for debian12, or pytorch_env_backend: conda, or an OS that ships it (rhel9)'
    )
    assert [s["key"] for s in error["sources"]][:2] == ["debian_python_bookworm", "rhel9_python"]


@pytest.mark.parametrize(
    ("os_name", "python", "backend", "refused"),
    [
        ("debian12", "3.11", None, False),
        ("debian12", "3.12", None, True),
        ("debian12", "3.12", "conda", False),  # the channel brings its own Python
        ("debian13", "3.13", None, False),
        ("debian13", "3.11", "venv", True),
        ("ubuntu2204", "3.11", None, True),  # jammy's python3.11 is a 3.11.0 release candidate
        ("ubuntu2404", "3.12", None, False),
        ("rhel9", "3.12", None, False),
        ("rhel9", "3.10", None, True),
    ],
)
def test_python_per_os_and_backend(os_name: str, python: str, backend: str | None, refused: bool) -> None:
    result = check_mapping(stack(os=os_name, python=python, torch="2.5.1"), backend=backend)
    assert ("os-python" in {e["rule"] for e in result["errors"]}) is refused, result["errors"]


def test_the_preflight_judges_the_hosts_os_when_the_stack_names_none() -> None:
    facts = {"distribution": "Debian", "distribution_major_version": "12", "distribution_version": "12.8"}
    result = check_mapping(stack(python="3.12"), host_facts=facts)
    assert "os-python" in {e["rule"] for e in result["errors"]}
    assert check_mapping(stack(python="3.12"))["exit_code"] == 0  # no OS known: nothing to judge


def test_check_spec_reads_the_backend_beside_the_stack(tmp_path: Path) -> None:
    path = tmp_path / "gpu_hosts.yml"
    body = 'gpu_stack: {profile: torch-2.5-cu124, os: debian12, python: "3.12"}\n'
    path.write_text(body)
    assert check_file(path)["exit_code"] == 1
    path.write_text(body + "pytorch_env_backend: conda\n")
    assert check_file(path)["exit_code"] == 0


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
