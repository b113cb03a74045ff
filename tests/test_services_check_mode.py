"""The gpu_services role in check mode on Ubuntu 22.04 / 24.04 (the controller reporting those OSes'
facts; a Rocky 9 host, which the role does not serve, refused): what each host would get from
NVIDIA's repositories (Fabric Manager of the driver's exact version on an HGX A100 board whose
NVSwitches come from saved real `lspci -nn` output, the persistence daemon, the container toolkit
and the runtimes' configuration), the refusals, and that check mode changes nothing on the
controller."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuenv.module_utils import gpuenv_hostparse as hostparse
from tests.conftest import check_mode_plans

pytestmark = pytest.mark.ansible

REPO = Path(__file__).resolve().parents[1]
PLAYBOOK = REPO / "tests" / "ansible" / "services_check_mode.yml"
DATA = Path(__file__).parent / "data"
SUM = "sha256:" + "0" * 64  # check mode never downloads a key it does not have
HGX = hostparse.nvswitches((DATA / "lspci-nn-hgx-a100.txt").read_text())
A100 = [{"label": "NVIDIA A100-SXM4-80GB", "cc": "8.0", "origin": "detected"}]
# What a site's Docker already has: must survive the merge.
DOCKER_BEFORE = {"log-driver": "local", "runtimes": {"runsc": {"path": "/usr/bin/runsc"}}}

HOSTS: dict[str, dict[str, Any]] = {
    # An HGX A100 board on Ubuntu, driver 580 from NVIDIA's repository, Docker configured.
    "ubuntu2204-hgx": {
        "test_os": ["Ubuntu", "22.04", "Debian"],
        "resolved": {"driver": "580", "gpus": A100, "nvswitches": HGX},
        "target": {"version": "580.95.05-0ubuntu1", "upstream": "580.95.05"},
        "vars": {"gpu_services_container_toolkit": "on", "gpu_services_container_runtimes": ["docker"]},
        "docker": DOCKER_BEFORE,
    },
    # A workstation: a GeForce GPU, no NVSwitch; Podman through CDI; the 590 branch's plain names.
    "ubuntu2404-workstation": {
        "test_os": ["Ubuntu", "24.04", "Debian"],
        "resolved": {"driver": "590", "gpus": [{"label": "NVIDIA GeForce RTX 4090", "cc": "8.9"}], "nvswitches": []},
        "target": {"version": "590.44.01-0ubuntu1", "upstream": "590.44.01"},
        "vars": {"gpu_services_container_toolkit": "auto", "gpu_services_container_runtimes": ["podman"]},
    },
    # An HGX board on Rocky 9, driver 570: no RHEL-family path (none could be tested here).
    "rocky9-hgx": {
        "test_os": ["Rocky", "9.4", "RedHat"],
        "resolved": {"driver": "570", "gpus": [{"label": "9.0", "cc": "9.0"}], "nvswitches": HGX},
        "target": {"version": "570.172.08-1.el9", "upstream": "570.172.08"},
        "vars": {"gpu_services_container_toolkit": "on", "gpu_services_container_runtimes": ["podman"]},
    },
    # Refusals, each before anything changes.
    "debian12-hgx-debian-source": {
        "test_os": ["Debian", "12.8", "Debian"],
        "source": "debian",
        "resolved": {"driver": "535", "gpus": A100, "nvswitches": HGX},
        "target": {"version": "535.261.03-1", "upstream": "535.261.03"},
    },
    "ubuntu2204-toolkit-nokey": {
        "test_os": ["Ubuntu", "22.04", "Debian"],
        "vars": {"gpu_services_container_toolkit": "on", "gpu_services_container_toolkit_key_checksum": ""},
    },
    "ubuntu2204-broken-docker-json": {
        "test_os": ["Ubuntu", "22.04", "Debian"],
        "vars": {"gpu_services_container_toolkit": "on", "gpu_services_container_runtimes": ["docker"]},
        "docker_text": '{"log-driver": "local",',
    },
    "rocky9-docker-install": {
        "test_os": ["Rocky", "9.4", "RedHat"],
        "vars": {"gpu_services_container_toolkit": "on", "gpu_services_docker_install": True},
    },
    "ubuntu2204-unknown-runtime": {
        "test_os": ["Ubuntu", "22.04", "Debian"],
        "vars": {"gpu_services_container_toolkit": "on", "gpu_services_container_runtimes": ["cri-o"]},
    },
}


def _inventory(tmp_path: Path) -> Path:
    hosts = {}
    for name, spec in HOSTS.items():
        docker = tmp_path / name / "daemon.json"
        docker.parent.mkdir(parents=True)
        if "docker" in spec:
            docker.write_text(json.dumps(spec["docker"], indent=2))
        elif "docker_text" in spec:
            docker.write_text(spec["docker_text"])
        host = {
            "ansible_connection": "local",
            "ansible_python_interpreter": sys.executable,
            "test_os": spec["test_os"],
            "nvidia_driver_source": spec.get("source", "nvidia_repo"),
            "gpu_stack_resolved": spec.get("resolved", {"driver": "580", "gpus": [], "nvswitches": []}),
            "gpu_services_container_toolkit": "off",
            "gpu_services_container_toolkit_key_checksum": SUM,
            "gpu_services_docker_config": str(docker),
            "gpu_services_cdi_spec": str(tmp_path / name / "cdi" / "nvidia.yaml"),
            **spec.get("vars", {}),
        }
        if "target" in spec:
            host["nvidia_driver_target"] = spec["target"]
        hosts[name] = host
    inv = tmp_path / "hosts.yml"
    inv.write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    return inv


def _controller_files() -> dict[str, bool]:
    paths = [
        "/etc/apt/sources.list.d/gpuenv-nvidia-container-toolkit.sources",
        "/usr/share/keyrings/gpuenv-nvidia-container-toolkit.asc",
        "/etc/apt/preferences.d/gpuenv-nvidia-container-toolkit",
        "/etc/ansible/facts.d/gpu_services.fact",
        "/etc/cdi/nvidia.yaml",
        "/var/lib/gpuenv/cdi-nvidia.yaml",
    ]
    return {p: Path(p).exists() for p in paths}


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory, venv_env: dict[str, str]) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("services-check")
    inv = _inventory(tmp)
    docker_before = {h: (tmp / h / "daemon.json").read_bytes() for h in HOSTS if (tmp / h / "daemon.json").exists()}
    before = _controller_files()
    run, plans, failures = check_mode_plans(PLAYBOOK, inv, tmp, venv_env, "gpu_services", timeout=600)
    return {
        "run": run,
        "plans": plans,
        "failures": failures,
        "before": before,
        "after": _controller_files(),
        "docker_before": docker_before,
        "docker_after": {h: (tmp / h / "daemon.json").read_bytes() for h in docker_before},
        "cdi_dirs": [h for h in HOSTS if (tmp / h / "cdi").exists()],
    }


def test_an_hgx_board_gets_fabric_manager_of_the_drivers_exact_version(results: dict[str, Any]) -> None:
    got = results["plans"]["ubuntu2204-hgx"]["gpu_services"]
    fm = got["fabricmanager"]
    assert fm["wanted"] is True
    assert fm["why"] == "auto: 6 NVSwitches (10de:1af1, gen 2) on the PCI bus"
    assert fm["nvswitches"] == 6
    # the branch's name first, the plain name (from 590) second; of exactly the driver's version
    assert fm["candidates"] == ["nvidia-fabricmanager-580", "nvidia-fabricmanager"]
    assert fm["driver_version"] == "580.95.05"
    assert (fm["unit"], fm["enabled"], fm["started"]) == ("nvidia-fabricmanager", False, False)
    assert "versions are read once NVIDIA's repository is configured" in fm["pending"]
    assert "no NVIDIA kernel module is loaded" in fm["start_check"]


def test_a_data_centre_gpu_gets_the_persistence_daemon(results: dict[str, Any]) -> None:
    got = results["plans"]["ubuntu2204-hgx"]["gpu_services"]["persistenced"]
    assert got["wanted"] is True
    assert got["why"] == "auto: data-centre GPU NVIDIA A100-SXM4-80GB"
    # Ubuntu's packaging: the daemon and its unit are in nvidia-compute-utils
    assert got["candidates"] == ["nvidia-compute-utils-580", "nvidia-compute-utils"]
    assert got["unit"] == "nvidia-persistenced"
    ws = results["plans"]["ubuntu2404-workstation"]["gpu_services"]
    assert ws["persistenced"]["wanted"] is False
    assert "no data-centre GPU (NVIDIA GeForce RTX 4090)" in ws["persistenced"]["why"]
    assert ws["fabricmanager"]["wanted"] is False


def test_docker_gets_the_nvidia_runtime_merged_into_its_configuration(results: dict[str, Any]) -> None:
    plan = results["plans"]["ubuntu2204-hgx"]
    toolkit = plan["gpu_services"]["container_toolkit"]
    assert (toolkit["wanted"], toolkit["runtimes"], toolkit["installed_by_gpuenv"]) == (True, ["docker"], True)
    assert plan["docker_config"] == {
        "log-driver": "local",
        "runtimes": {"runsc": {"path": "/usr/bin/runsc"}, "nvidia": {"args": [], "path": "nvidia-container-runtime"}},
    }


def test_podman_on_a_workstation_gets_the_toolkit(results: dict[str, Any]) -> None:
    ws = results["plans"]["ubuntu2404-workstation"]["gpu_services"]["container_toolkit"]
    assert (ws["wanted"], ws["runtimes"]) == (True, ["podman"])
    assert "gpu_services_container_runtimes" in ws["why"]


# Each refused host, with what its message must say: what is wrong and how to fix it.
REFUSALS = {
    "debian12-hgx-debian-source": ["has no Fabric Manager package", "nvidia_driver_source: nvidia_repo"],
    "ubuntu2204-toolkit-nokey": ["gpu_services_container_toolkit_key_checksum", "sha256sum"],
    "ubuntu2204-broken-docker-json": ["is not valid JSON", "fix or remove it"],
    "rocky9-docker-install": ["docker.io only", "known for the Debian family (Debian, Ubuntu) only"],
    "rocky9-hgx": ["Debian and Ubuntu 22.04 / 24.04 only", "no RHEL-family path"],
    "ubuntu2204-unknown-runtime": ["configures docker, containerd and podman"],
}


def test_refusals_say_what_to_fix(results: dict[str, Any]) -> None:
    assert set(results["failures"]) == set(REFUSALS), results["failures"]
    for host, phrases in REFUSALS.items():
        for phrase in phrases:
            assert phrase in results["failures"][host], (host, results["failures"][host])
        assert "Nothing was changed" in results["failures"][host], host


def test_check_mode_changes_nothing_on_the_controller(results: dict[str, Any]) -> None:
    assert results["before"] == results["after"]
    assert results["docker_before"] == results["docker_after"]
    assert results["cdi_dirs"] == []
    # ansible-playbook exits 2 for the hosts refused above, and the others all reached their plan
    assert results["run"].returncode == 2, results["run"].stdout[-3000:]
    assert set(results["plans"]) == {"ubuntu2204-hgx", "ubuntu2404-workstation"}
