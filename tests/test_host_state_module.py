"""The gpuenv_host_state module (plugins/modules): one read-only look at what the roles decide from.
Files, records and sysfs are trees made in the test; dpkg-query and nvidia-smi are fakes through
run_command whose answers are saved real output (tests/data/README.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jinja2
import pytest
import yaml
from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args

from tests.conftest import load_plugin

DATA = Path(__file__).parent / "data"
mod = load_plugin("plugins/modules/gpuenv_host_state.py")

DPKG_SAVED = (DATA / "dpkg-query-status-nvidia-bookworm.txt").read_text()
PROC_580 = (DATA / "proc-driver-nvidia-version-open-580.txt").read_text()


def call(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    answers: dict[str, tuple[int, str, str]] | None = None,
    *,
    check: bool = False,
    **params: Any,
) -> tuple[dict[str, Any], list[list[str]]]:
    commands: list[list[str]] = []

    def run_command(self: Any, argv: list[str], **_: Any) -> tuple[int, str, str]:
        commands.append(argv)
        name = Path(argv[0]).name
        assert answers is not None
        assert name in answers, f"unexpected command {argv}"
        return answers[name]

    monkeypatch.setattr(basic.AnsibleModule, "run_command", run_command)
    if check:
        params["_ansible_check_mode"] = True
    with patch_module_args(params), pytest.raises(SystemExit):
        mod.main()
    result: dict[str, Any] = json.loads(capsys.readouterr().out)
    return result, commands


def fake_bin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *names: str) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in names:
        tool = bin_dir / name
        tool.write_text("#!/bin/sh\n")
        tool.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setattr(mod, "EXTRA_PATH", [])
    return bin_dir


def test_files_paths_and_commands_are_read_and_a_missing_one_is_null(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    proc = tmp_path / "version"
    proc.write_text(PROC_580)
    (tmp_path / "dir").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "dir")
    bin_dir = fake_bin(tmp_path, monkeypatch, "dockerd")
    out, commands = call(
        monkeypatch,
        capsys,
        paths=[str(tmp_path / "dir"), str(tmp_path / "link"), str(tmp_path / "nothing")],
        read=[str(proc), str(tmp_path / "nothing")],
        commands=["dockerd", "podman"],
    )
    assert out["changed"] is False
    assert out["files"] == {str(proc): PROC_580, str(tmp_path / "nothing"): None}
    assert out["paths"][str(tmp_path / "dir")] == {"exists": True, "type": "directory"}
    assert out["paths"][str(tmp_path / "link")] == {"exists": True, "type": "link"}
    assert out["paths"][str(tmp_path / "nothing")] == {"exists": False, "type": None}
    assert out["commands"] == {"dockerd": str(bin_dir / "dockerd"), "podman": None}
    assert commands == []


def test_a_file_under_a_file_reads_as_absent_not_a_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    plain = tmp_path / "plain"
    plain.write_text("x")
    out, _ = call(monkeypatch, capsys, read=[str(plain / "below")])
    assert out["files"] == {str(plain / "below"): None}


def test_the_records_are_read_as_local_facts_and_a_broken_one_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    facts = tmp_path / "facts.d"
    facts.mkdir()
    (facts / "nvidia_driver.fact").write_text(json.dumps({"version": "535.309.01", "mode": "full"}))
    (facts / "cudnn.fact").write_text("{not json")
    (facts / "notes.txt").write_text("ignored")
    out, _ = call(monkeypatch, capsys, local_facts=True, facts_dir=str(facts))
    assert out["local"] == {"nvidia_driver": {"version": "535.309.01", "mode": "full"}}
    assert list(out["local_errors"]) == ["cudnn"]
    assert str(facts / "cudnn.fact") in out["local_errors"]["cudnn"]


def test_no_facts_directory_is_no_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out, _ = call(monkeypatch, capsys, local_facts=True, facts_dir=str(tmp_path / "none"))
    assert out["local"] == {}
    assert out["local_errors"] == {}


@pytest.mark.parametrize(
    ("variable", "expected"),
    [
        (None, {"present": False, "on": False}),
        (b"\x06\x00\x00\x00\x01", {"present": True, "on": True}),
        (b"\x06\x00\x00\x00\x00", {"present": True, "on": False}),
    ],
)
def test_secure_boot_is_read_from_its_efi_variable(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    variable: bytes | None,
    expected: dict[str, bool],
) -> None:
    efivars = tmp_path / "efivars"
    efivars.mkdir()
    if variable is not None:
        (efivars / "SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c").write_bytes(variable)
    monkeypatch.setattr(mod, "EFIVARS", str(efivars))
    out, _ = call(monkeypatch, capsys, secure_boot=True)
    assert out["secure_boot"] == expected


def test_nvidia_devices_are_counted_on_the_pci_bus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    devices = tmp_path / "devices"
    for address, vendor in [("0000:00:01.0", "0x8086"), ("0000:3b:00.0", "0x10de"), ("0000:3b:00.1", "0x10DE")]:
        (devices / address).mkdir(parents=True)
        (devices / address / "vendor").write_text(vendor + "\n")
    monkeypatch.setattr(mod, "PCI_DEVICES", str(devices))
    out, _ = call(monkeypatch, capsys, nvidia_pci=True)
    assert out["nvidia_pci"] == 2


def test_dpkg_state_is_parsed_and_an_unknown_package_is_absent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_bin(tmp_path, monkeypatch, "dpkg-query")
    err = "dpkg-query: no packages found matching linux-headers-6.1.0-50-amd64\n"
    out, commands = call(
        monkeypatch,
        capsys,
        {"dpkg-query": (1, DPKG_SAVED, err)},
        check=True,
        dpkg=["nvidia-smi", "libcuda1", "linux-headers-6.1.0-50-amd64"],
    )
    assert commands[0][1:4] == ["-W", "-f", "${db:Status-Abbrev} ${Package} ${Version}\n"]
    assert out["packages"]["nvidia-smi"]["want"] == "h"
    assert out["packages"]["libcuda1"]["state"] == "i"
    assert "linux-headers-6.1.0-50-amd64" not in out["packages"]


def test_a_broken_dpkg_fails_with_its_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_bin(tmp_path, monkeypatch, "dpkg-query")
    out, _ = call(monkeypatch, capsys, {"dpkg-query": (2, "", "dpkg: error: parsing file 'status'")}, dpkg=["x"])
    assert out["failed"] is True
    assert "parsing file 'status'" in out["msg"]


def test_no_nvidia_smi_means_no_gpu_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_bin(tmp_path, monkeypatch)
    out, commands = call(monkeypatch, capsys, gpu_processes=True)
    assert out["gpu_processes"] == {"rc": None, "lines": []}
    assert commands == []


@pytest.mark.parametrize(
    ("answer", "lines"),
    [
        ((0, "1234, python, 2048 MiB\n\n", ""), ["1234, python, 2048 MiB"]),
        ((9, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n", ""), []),
        ((6, "No devices were found\n", ""), []),
    ],
)
def test_gpu_processes_are_listed_and_no_driver_is_none(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    answer: tuple[int, str, str],
    lines: list[str],
) -> None:
    fake_bin(tmp_path, monkeypatch, "nvidia-smi")
    out, commands = call(monkeypatch, capsys, {"nvidia-smi": answer}, gpu_processes=True)
    assert commands[0][1:] == ["--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader"]
    assert out["gpu_processes"] == {"rc": answer[0], "lines": lines}


def test_an_nvidia_smi_that_fails_otherwise_stops_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_bin(tmp_path, monkeypatch, "nvidia-smi")
    mismatch = (DATA / "nvidia-smi-mismatch-580.txt").read_text()
    out, _ = call(monkeypatch, capsys, {"nvidia-smi": (18, mismatch, "")}, gpu_processes=True)
    assert out["failed"] is True
    assert "exit 18" in out["msg"]
    assert "Run it by hand" in out["msg"]


def test_the_gpus_are_listed_by_nvidia_smi_and_lspci(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_bin(tmp_path, monkeypatch, "nvidia-smi", "lspci")
    smi = "NVIDIA A100-SXM4-80GB, 8.0\n"
    pci = "07:00.0 Bridge [0680]: NVIDIA Corporation GA100 NVSwitch [10de:1af1] (rev a1)\n"
    out, commands = call(monkeypatch, capsys, {"nvidia-smi": (0, smi, ""), "lspci": (0, pci, "")}, gpu_listing=True)
    assert out["gpu_listing"] == {"nvidia_smi": smi, "lspci": pci}
    assert commands[0][1:] == ["--query-gpu=name,compute_cap", "--format=csv,noheader"]
    assert commands[1][1:] == ["-nn", "-d", "10de:"]


def test_an_nvidia_smi_too_old_for_compute_cap_is_asked_for_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_bin(tmp_path, monkeypatch, "nvidia-smi")
    old_field = (2, 'Field "compute_cap" is not a valid field to query.\n', "")
    answers = iter([old_field, (0, "Tesla V100-SXM2-16GB\n", "")])
    commands: list[list[str]] = []

    def run_command(self: Any, argv: list[str], **_: Any) -> tuple[int, str, str]:
        commands.append(argv)
        return next(answers)

    monkeypatch.setattr(basic.AnsibleModule, "run_command", run_command)
    with patch_module_args({"gpu_listing": True}), pytest.raises(SystemExit):
        mod.main()
    out = json.loads(capsys.readouterr().out)
    assert out["gpu_listing"] == {"nvidia_smi": "Tesla V100-SXM2-16GB\n", "lspci": ""}
    assert commands[1][1:] == ["--query-gpu=name", "--format=csv,noheader"]


@pytest.mark.parametrize("rc", [6, 9, 12])
def test_no_gpu_or_no_driver_lists_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], rc: int
) -> None:
    fake_bin(tmp_path, monkeypatch, "nvidia-smi", "lspci")
    answers = {
        "nvidia-smi": (rc, "No devices were found\n", ""),
        "lspci": (1, "", "pcilib: Cannot open /proc/bus/pci\n"),
    }
    out, _ = call(monkeypatch, capsys, answers, gpu_listing=True)
    assert out["gpu_listing"] == {"nvidia_smi": "", "lspci": ""}


def test_no_tools_list_nothing_and_a_broken_lspci_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_bin(tmp_path, monkeypatch)
    out, commands = call(monkeypatch, capsys, gpu_listing=True)
    assert out["gpu_listing"] == {"nvidia_smi": "", "lspci": ""}
    assert commands == []
    fake_bin(tmp_path, monkeypatch, "lspci")
    out, _ = call(monkeypatch, capsys, {"lspci": (3, "", "lspci: -d: invalid\n")}, gpu_listing=True)
    assert out["failed"] is True
    assert "exit 3" in out["msg"]


def test_paths_resolve_through_links_and_the_loader_lists_real_paths_in_its_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    tree = tmp_path / "cuda-12.4.1-abc+cudnn-9.1.0.70"
    (tree / "lib").mkdir(parents=True)
    real = tree / "lib" / "libcudnn.so.9.1.0"
    real.write_text("")
    (tree / "lib" / "libcudnn.so.9").symlink_to(real.name)
    link = tmp_path / "cuda-12.4"
    link.symlink_to(tree)
    fake_bin(tmp_path, monkeypatch, "ldconfig")
    ldconfig = (
        "3 libs found in cache `/etc/ld.so.cache'\n"
        f"\tlibcudnn.so.9 (libc6,x86-64) => {link}/lib/libcudnn.so.9\n"
        "\tlibcudnn.so.9 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcudnn.so.9\n"
        "\tlibcudnn.so.8 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcudnn.so.8\n"
    )
    out, commands = call(
        monkeypatch,
        capsys,
        {"ldconfig": (0, ldconfig, "")},
        resolve=[str(link), str(tmp_path / "none")],
        loader=["libcudnn.so.9", "libcudnn.so.7"],
    )
    assert commands[0][1:] == ["-p"]
    assert out["resolved"] == {str(link): str(tree), str(tmp_path / "none"): None}
    assert out["loader"] == {
        "libcudnn.so.9": [str(real), "/usr/lib/x86_64-linux-gnu/libcudnn.so.9"],
        "libcudnn.so.7": [],
    }


def _gpuenv_profile_scripts() -> dict[str, str]:
    """The profile scripts gpuenv writes, as the roles render them: pytorch_env's template (rendered
    here) and cuda_toolkit's content, read from its task file."""
    repo = Path(__file__).resolve().parents[1]
    template = (repo / "roles/pytorch_env/templates/profile.sh.j2").read_text()
    shell = jinja2.Environment(autoescape=False)  # noqa: S701 - a shell script, not HTML
    env_script = shell.from_string(template).render(
        pytorch_env_name="default", pytorch_env_link="/opt/gpuenv/envs/default", pytorch_env_group="gpuenv"
    )
    tasks = yaml.safe_load((repo / "roles/cuda_toolkit/tasks/environment.yml").read_text())
    paths = [p for task in tasks for sub in task.get("block", []) for p in sub.get("gpuenv_files", {}).get("paths", [])]
    [cuda_script] = [p["content"] for p in paths if p["path"].startswith("/etc/profile.d/")]
    return {
        "gpuenv-env-default.sh": env_script,
        "gpuenv-cuda.sh": cuda_script.replace("{{ cuda_toolkit_default_xy }}", "12.4"),
    }


def test_ld_library_path_names_the_files_that_set_it_and_never_gpuenv_s_own_scripts(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    profile = tmp_path / "profile.d"
    profile.mkdir()
    own = _gpuenv_profile_scripts()
    # What the cudnn role's warning was tripped by: gpuenv's script names the variable in a comment.
    assert "LD_LIBRARY_PATH" in own["gpuenv-env-default.sh"]
    for name, text in own.items():
        (profile / name).write_text(text)
    nvidia_step = "export LD_LIBRARY_PATH=/usr/local/cuda-11.8/lib64${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}\n"
    (profile / "cuda-by-hand.sh").write_text("# NVIDIA's post-installation step\n" + nvidia_step)
    environment = tmp_path / "environment"
    environment.write_text('PATH="/usr/local/bin:/usr/bin"\n#LD_LIBRARY_PATH=/old\n')
    result, _ = call(monkeypatch, capsys, ld_library_path=[str(environment), f"{profile}/*.sh"])
    assert result["ld_library_path"] == {str(profile / "cuda-by-hand.sh"): ["/usr/local/cuda-11.8/lib64"]}
