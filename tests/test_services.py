"""The services beside the stack: NVSwitch detection on saved real `lspci -nn` output
(gpuenv.module_utils.gpuenv_hostparse), what gpu_services decides for each service (gpuenv.services), the preflight's
rule fabric-manager, and the same rule through the preflight playbook with an lspci that prints an
HGX A100 board."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuenv import services
from gpuenv.checkspec import check_mapping
from gpuenv.module_utils import gpuenv_hostparse as hostparse
from tests.conftest import run_tool

DATA = Path(__file__).parent / "data"
REPO = Path(__file__).resolve().parents[1]
HGX_A100 = (DATA / "lspci-nn-hgx-a100.txt").read_text()
A10 = (DATA / "lspci-nn-a10.txt").read_text()
STACK = {"profile": "debian12-stock", "gpu": "A100"}  # driver 535; the controller runs Debian 12


# --- NVSwitch detection --------------------------------------------------------------------------
def test_an_hgx_a100_board_has_six_nvswitches() -> None:
    switches = hostparse.nvswitches(HGX_A100)
    # pci.ids of that host named them only "Device": the ID tells
    assert [s["slot"] for s in switches] == [f"000{c}:00:00.0" for c in "56789a"]
    assert {(s["device"], s["generation"], s["class"]) for s in switches} == {("1af1", "2", "0680")}
    # every line of the real output parses, GPUs and NICs included
    assert len(hostparse.pci_devices(HGX_A100)) == len(HGX_A100.splitlines())
    gpus = [d for d in hostparse.pci_devices(HGX_A100) if d["class"] == "0302"]
    assert len(gpus) == 8
    assert gpus[0]["name"] == "NVIDIA Corporation GA100 [A100 SXM4 80GB]"


def test_a_pcie_gpu_host_has_none() -> None:
    assert hostparse.nvswitches(A10) == []
    assert [d["device"] for d in hostparse.pci_devices(A10) if d["vendor"] == "10de"] == ["2236"]


def test_other_nvidia_bridges_are_not_nvswitches() -> None:
    # nForce chipsets put their Ethernet in the same class: 10de:03ef is MCP61's (pci.ids; envytools'
    # table gives 0x03e0-0x03f7 as MCP61). Only a known ID or an NVSwitch name counts.
    nforce = "00:07.0 Bridge [0680]: nVidia Corporation MCP61 Ethernet [10de:03ef] (rev a2)"
    assert hostparse.pci_devices(nforce)[0]["class"] == "0680"
    assert hostparse.nvswitches(nforce) == []
    # an H100 board with a newer pci.ids (lspci -Dnn), and an ID gpuenv does not know but the name does
    hopper = "0000:07:00.0 Bridge [0680]: NVIDIA Corporation GH100 [H100 NVSwitch] [10de:22a3] (rev a1)"
    future = "07:00.0 Bridge [0680]: NVIDIA Corporation GX [Next NVSwitch] [10de:ffff] (rev a1)"
    assert [(s["device"], s["generation"]) for s in hostparse.nvswitches(f"{hopper}\n{future}\n")] == [
        ("22a3", "3"),
        ("ffff", ""),
    ]
    # lspci without -nn carries no IDs: nothing is guessed from it
    assert hostparse.nvswitches("0005:00:00.0 Bridge: NVIDIA Corporation Device 1af1 (rev a1)") == []


# --- what each service gets ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("gpus", "wanted", "why"),
    [
        ([{"label": "NVIDIA A100-SXM4-80GB", "cc": "8.0"}], True, "data-centre GPU NVIDIA A100-SXM4-80GB"),
        ([{"label": "Tesla V100-SXM2-32GB", "cc": "7.0"}], True, "V100"),
        ([{"label": "9.0", "cc": "9.0"}], True, "data-centre GPU 9.0"),  # H100, H200 and GH200 only
        ([{"label": "8.6", "cc": "8.6"}], False, "no data-centre GPU"),  # A40 or RTX 3090: cannot tell
        ([{"label": "NVIDIA GeForce RTX 4090", "cc": "8.9"}], False, "no data-centre GPU"),
        ([{"label": "NVIDIA RTX A6000, A40", "cc": "8.6"}], True, "A40"),
        ([], False, "names no GPU"),
    ],
)
def test_persistenced_auto_wants_a_data_centre_gpu(gpus: list[dict[str, str]], wanted: bool, why: str) -> None:
    plan = services.plan_persistenced("auto", gpus)
    assert plan["wanted"] is wanted
    assert why in plan["why"]


def test_on_and_off_override_the_hardware() -> None:
    desk = [{"label": "RTX 4090", "cc": "8.9"}]
    assert services.plan_persistenced("on", desk)["wanted"] is True
    assert services.plan_persistenced("off", [{"label": "H100", "cc": "9.0"}])["wanted"] is False
    switches = hostparse.nvswitches(HGX_A100)
    assert services.plan_fabricmanager("off", switches)["wanted"] is False
    assert services.plan_fabricmanager("on", [])["wanted"] is True
    with pytest.raises(ValueError, match="gpu_services_fabricmanager must be one of off, on, auto"):
        services.plan_fabricmanager("yes", [])


def test_fabricmanager_auto_follows_the_nvswitches() -> None:
    plan = services.plan_fabricmanager("auto", hostparse.nvswitches(HGX_A100))
    assert plan == {"wanted": True, "why": "auto: 6 NVSwitches (10de:1af1, gen 2) on the PCI bus"}
    plan = services.plan_fabricmanager("auto", hostparse.nvswitches(A10))
    assert plan["wanted"] is False
    assert "HGX B200/B300" in plan["why"]


def test_container_toolkit_auto_follows_the_runtimes() -> None:
    assert services.plan_container_toolkit("auto", [], [], docker_install=False)["wanted"] is False
    plan = services.plan_container_toolkit("auto", ["podman"], [], docker_install=False)
    assert (plan["wanted"], plan["runtimes"]) == (True, ["podman"])
    # declared runtimes replace what was found; installing Docker adds it
    plan = services.plan_container_toolkit("auto", ["podman"], ["containerd"], docker_install=True)
    assert plan["runtimes"] == ["containerd", "docker"]
    assert services.plan_container_toolkit("off", ["docker"], [], docker_install=False)["runtimes"] == []


def test_docker_config_is_merged_not_overwritten() -> None:
    current = json.dumps({"log-driver": "local", "runtimes": {"runsc": {"path": "/usr/bin/runsc"}}})
    merged = services.docker_daemon_config(current, default_runtime=False, path="/etc/docker/daemon.json")
    assert merged == {
        "ok": True,
        "config": {
            "log-driver": "local",
            "runtimes": {
                "runsc": {"path": "/usr/bin/runsc"},
                "nvidia": {"args": [], "path": "nvidia-container-runtime"},
            },
        },
    }
    # merging again changes nothing (idempotence), and default-runtime only when asked
    again = services.docker_daemon_config(json.dumps(merged["config"]), default_runtime=False, path="x")
    assert again == merged
    assert services.docker_daemon_config(None, default_runtime=True, path="x")["config"]["default-runtime"] == "nvidia"


@pytest.mark.parametrize("text", ["{not json", "[]", '{"runtimes": []}'])
def test_a_broken_docker_config_is_refused_with_the_fix(text: str) -> None:
    out = services.docker_daemon_config(text, default_runtime=False, path="/etc/docker/daemon.json")
    assert out["ok"] is False
    assert "/etc/docker/daemon.json" in out["error"]
    assert "then run again" in out["error"]


def test_the_driver_the_services_must_match() -> None:
    target = {"version": "580.95.05-0ubuntu1", "upstream": "580.95.05"}
    record = {"version": "580.82.07", "package_version": "580.82.07-1"}
    assert services.driver_in_use(target, record, "580") == {
        "version": "580.95.05",
        "package_version": "580.95.05-0ubuntu1",
        "branch": "580",
        "from": "the driver stage",
    }
    assert services.driver_in_use(None, record, "580")["from"] == "the driver's record"
    assert services.driver_in_use(None, {}, "550.163.01")["version"] == "550.163.01"
    assert services.driver_in_use(None, None, "550") == {
        "version": None,
        "package_version": None,
        "branch": "550",
        "from": "",
    }


def test_the_package_is_the_first_name_offered_at_the_drivers_version() -> None:
    madison = {
        "nvidia-fabricmanager-550": (
            "nvidia-fabricmanager-550 | 550.90.07-1 | https://developer.download.nvidia.com/compute/cuda/repos/"
            "debian12/x86_64  Packages\n"
            "nvidia-fabricmanager-550 | 550.54.15-1 | https://developer.download.nvidia.com/compute/cuda/repos/"
            "debian12/x86_64  Packages\n"
        ),
        "nvidia-fabricmanager": "",
    }
    names = ["nvidia-fabricmanager-550", "nvidia-fabricmanager"]
    got = services.pick_package(madison, names, "550.54.15")
    assert (got["name"], got["version"]) == ("nvidia-fabricmanager-550", "550.54.15-1")
    none = services.pick_package(madison, names, "550.163.01")
    assert (none["name"], none["version"]) == (None, None)
    assert none["available"]["nvidia-fabricmanager-550"] == ["550.90.07-1", "550.54.15-1"]
    # no version asked: the newest offered (Debian's own persistence daemon)
    assert services.pick_package(madison, names, None)["version"] == "550.90.07-1"


def test_a_daemon_starts_only_with_the_installed_driver_loaded() -> None:
    proc = (DATA / "proc-driver-nvidia-version-open-580.txt").read_text()
    assert services.can_start(proc, "580.95.05")["start"] is True
    assert services.can_start(proc, None)["start"] is True
    later = services.can_start(proc, "580.105.08")
    assert later["start"] is False
    assert "the loaded module is 580.95.05 and the installed driver 580.105.08" in later["why"]
    assert "no NVIDIA kernel module is loaded" in services.can_start(None, "580.95.05")["why"]


# --- the preflight's rule ------------------------------------------------------------------------
def _check(stack: dict[str, Any], lspci: str, **settings: Any) -> dict[str, Any]:
    return check_mapping(stack, nvswitches=hostparse.nvswitches(lspci), services_settings=settings)


def test_an_nvswitch_host_with_nvidias_repository_passes_and_publishes_its_switches() -> None:
    result = _check(STACK, HGX_A100, nvidia_driver_source="nvidia_repo")
    assert result["ok"], result["errors"]
    assert len(result["stack"]["nvswitches"]) == 6
    # a host without NVSwitches is not asked about Fabric Manager, whatever the settings
    assert _check(STACK, A10, gpu_services_fabricmanager="off")["ok"]


@pytest.mark.parametrize(
    ("settings", "message", "fix"),
    [
        ({}, "Debian's driver packages (nvidia_driver_source: debian) come with no Fabric Manager", "nvidia_repo"),
        (
            {"nvidia_driver_source": "nvidia_repo", "gpu_services_fabricmanager": "off"},
            "gpu_services_fabricmanager is off",
            "gpu_services_fabricmanager: auto",
        ),
        # YAML reads an unquoted off as false
        (
            {"nvidia_driver_source": "nvidia_repo", "gpu_services_fabricmanager": False},
            "gpu_services_fabricmanager is off",
            "gpu_services_fabricmanager: auto",
        ),
    ],
)
def test_an_nvswitch_host_without_a_matching_fabric_manager_is_refused(
    settings: dict[str, str], message: str, fix: str
) -> None:
    result = _check(STACK, HGX_A100, **settings)
    assert not result["ok"]
    errors = [e for e in result["errors"] if e["rule"] == "fabric-manager"]
    assert len(errors) == 1, result["errors"]
    assert "6 NVSwitches (10de:1af1, gen 2)" in errors[0]["message"]
    assert message in errors[0]["message"]
    assert fix in errors[0]["fix"]
    assert "nv_fm_guide" in [s["key"] for s in errors[0]["sources"]]


def test_a_driver_before_fabric_managers_first_branch_is_refused() -> None:
    old = {"driver": "440", "cuda": "10.2", "cudnn": "none", "python": "3.8", "torch": "1.12.1"}
    result = _check(old, HGX_A100, nvidia_driver_source="nvidia_repo")
    fabric = [e for e in result["errors"] if e["rule"] == "fabric-manager"]
    assert fabric, result["errors"]
    assert "R450" in fabric[0]["message"]


@pytest.mark.ansible
def test_the_preflight_playbook_reads_lspci_and_refuses(tmp_path: Path, venv_env: dict[str, str]) -> None:
    """An lspci on PATH that prints the HGX A100 board, and Debian's driver source: the preflight
    stops before anything changes, with rule fabric-manager's message."""
    fake = tmp_path / "bin"
    fake.mkdir()
    lspci = fake / "lspci"
    lspci.write_text(f"#!/bin/sh\ncat '{DATA / 'lspci-nn-hgx-a100.txt'}'\n")
    lspci.chmod(0o755)
    inv = tmp_path / "inventory"
    (inv / "group_vars").mkdir(parents=True)
    host = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    (inv / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": {"gpu_hosts": {"hosts": {"localhost": host}}}}}))
    (inv / "group_vars" / "gpu_hosts.yml").write_text(yaml.safe_dump({"gpu_stack": STACK}))
    env = dict(venv_env, ANSIBLE_NOCOLOR="1", ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-tmp"))
    env["PATH"] = f"{fake}:{env['PATH']}"
    run = run_tool("ansible-playbook", "-i", str(inv), "playbooks/preflight.yml", env=env, timeout=300)
    assert run.returncode != 0, run.stdout[-2000:]
    assert "[fabric-manager] the host has 6 NVSwitches (10de:1af1, gen 2)" in run.stdout
    assert "set nvidia_driver_source: nvidia_repo" in run.stdout
    # with NVIDIA's repository the same host passes
    ok = run_tool(
        "ansible-playbook",
        "-i",
        str(inv),
        "playbooks/preflight.yml",
        "-e",
        "nvidia_driver_source=nvidia_repo",
        env=env,
        timeout=300,
    )
    assert ok.returncode == 0, ok.stdout[-2000:]
