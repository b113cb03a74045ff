"""The rule table's cases and the stacks they start from, shared by the rules' tests
(test_rules*.py). Each case names the fact (compat-facts.md section, and the source key in
gpuenv/data/compat.yaml) that decides its expected verdict."""

from __future__ import annotations

from typing import Any


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
