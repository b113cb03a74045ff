"""gpuenv.module_utils.gpuenv_hostparse on what hosts print or hold, saved from real hosts (tests/data/README.md
says whence); ptxas, cudnn_version.h and ldconfig are in test_redist.py, /proc's driver version in
test_driver.py."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from gpuenv.module_utils import gpuenv_hostparse as hostparse

DATA = Path(__file__).parent / "data"


def test_smi_of_a_real_mismatch() -> None:
    # One host's real output: the module loaded is 580.173.02, the libraries are 580.178.
    assert hostparse.parse_smi_driver(9, (DATA / "nvidia-smi-mismatch-580.txt").read_text()) == (None, True)
    proc = (DATA / "proc-driver-nvidia-version-mismatch-580.173.02.txt").read_text()
    assert hostparse.parse_proc_version(proc) == {"version": "580.173.02", "flavor": "proprietary"}


def test_smi_driver_versions() -> None:
    assert hostparse.parse_smi_driver(0, "550.163.01\n550.163.01\n") == ("550.163.01", False)  # one line per GPU
    failed = "NVIDIA-SMI has failed because it couldn't communicate with the driver."
    assert hostparse.parse_smi_driver(9, failed) == (None, False)


def test_libcudnn_paths_from_proc_maps() -> None:
    maps = (
        "7f00-7f10 r--p 00000000 08:01 1 /opt/gpuenv/envs/default/lib/python3.11/site-packages/nvidia/cudnn/lib/"
        "libcudnn.so.9\n"
        "7f10-7f20 r-xp 00010000 08:01 1 /opt/gpuenv/envs/default/lib/python3.11/site-packages/nvidia/cudnn/lib/"
        "libcudnn.so.9\n"
        "7f20-7f30 r--p 00000000 08:01 2 /usr/local/cuda-12.4/lib64/libcudnn_graph.so.9.1.0\n"
        "7f30-7f40 rw-p 00000000 00:00 0 \n"
    )
    assert hostparse.libcudnn_paths(maps) == [
        "/opt/gpuenv/envs/default/lib/python3.11/site-packages/nvidia/cudnn/lib/libcudnn.so.9",
        "/usr/local/cuda-12.4/lib64/libcudnn_graph.so.9.1.0",
    ]


def test_loaded_modules() -> None:
    modules = "nouveau 2654208 0 - Live 0x0000000000000000\nnvidia_uvm 1789952 0 - Live 0x0\n\n"
    assert hostparse.loaded_modules(modules) == ["nouveau", "nvidia_uvm"]


def test_secure_boot_variable() -> None:
    assert hostparse.secure_boot_on(b"\x06\x00\x00\x00\x01")
    assert not hostparse.secure_boot_on(b"\x06\x00\x00\x00\x00")
    assert not hostparse.secure_boot_on(b"\x06\x00")  # truncated: not on


def test_the_parsers_stay_python_3_8_and_standard_library_only() -> None:
    """Ansible ships this file alone to hosts (module_utils) and verify runs it with the
    environment's Python, 3.8 and up."""
    source = Path(hostparse.__file__).read_text()
    tree = ast.parse(source, feature_version=(3, 8))
    imported = {
        alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names
    } | {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert imported <= {"__future__", "re"}, imported


DOCTOR_DATA = DATA / "doctor"


@pytest.mark.parametrize(
    ("name", "version", "cuda"),
    [
        ("torch-version-2.13.0+cu130.txt", "2.13.0+cu130", "13.0"),
        ("torch-version-2.5.1+cu124.txt", "2.5.1+cu124", "12.4"),
        ("torch-version-2.0.1+cu117.txt", "2.0.1+cu117", "11.7"),  # before the `cuda: Optional[str]` annotation
        ("torch-version-2.13.0+cpu.txt", "2.13.0+cpu", None),
    ],
)
def test_torch_version_file_of_real_wheels(name: str, version: str, cuda: str | None) -> None:
    assert hostparse.torch_version_file((DOCTOR_DATA / name).read_text()) == {"version": version, "cuda": cuda}


def test_torch_version_file_without_a_version_is_nothing() -> None:
    assert hostparse.torch_version_file("cuda = '12.4'\n") == {}


def test_os_release_of_debian_12_and_13() -> None:
    bookworm = hostparse.parse_os_release((DOCTOR_DATA / "os-release-debian12").read_text())
    assert (bookworm["ID"], bookworm["VERSION_ID"], bookworm["PRETTY_NAME"]) == (
        "debian",
        "12",
        "Debian GNU/Linux 12 (bookworm)",
    )
    assert hostparse.parse_os_release((DOCTOR_DATA / "os-release-debian13").read_text())["VERSION_ID"] == "13"


def test_the_nvml_library_version_a_mismatch_names() -> None:
    assert hostparse.smi_nvml_version((DATA / "nvidia-smi-mismatch-580.txt").read_text()) == "580.178"
    assert hostparse.smi_nvml_version((DOCTOR_DATA / "nvidia-smi-no-module-550.163.01.txt").read_text()) is None


def test_nvidia_smi_without_a_loaded_module_observes_no_version() -> None:
    said = (DOCTOR_DATA / "nvidia-smi-no-module-550.163.01.txt").read_text()
    assert hostparse.parse_smi_driver(9, said) == (None, False)


def test_modinfo_fields_from_a_real_dkms_module() -> None:
    fields = hostparse.parse_modinfo((DATA / "modinfo-nvidia-current-550.163.01.txt").read_text())
    assert fields["version"] == "550.163.01"
    assert fields["vermagic"].split(" ")[0] == "6.12.117+deb13-amd64"
    assert fields["filename"] == "/lib/modules/6.12.117+deb13-amd64/updates/dkms/nvidia-current.ko.xz"
    assert fields["signer"] == "DKMS module signing key"
    assert fields["firmware"] == "nvidia/550.163.01/gsp_tu10x.bin"  # a repeated field keeps its first value
    assert not any(name[0].isspace() or name[0].isdigit() for name in fields)  # no continuation line as a field
