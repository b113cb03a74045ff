"""The nvidia_driver role's NVIDIA-repository paths for Ubuntu 22.04 / 24.04, in check mode only (the
sandbox boots Debian): what each would install, from which repository, and that check mode touches
nothing; a RHEL-family host, which the role does not serve, refused with what to do. Each inventory
host is the controller reporting that OS."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import check_mode_plans

pytestmark = pytest.mark.ansible

REPO = Path(__file__).resolve().parents[1]
PLAYBOOK = REPO / "tests" / "ansible" / "driver_check_mode.yml"
KEEP_PLAYBOOK = REPO / "tests" / "ansible" / "driver_stamp_keep.yml"
NVIDIA = "https://developer.download.nvidia.com/compute/cuda/repos/"
# Check mode never downloads a key it does not have, so any well-formed sum will do here.
SUM = "sha256:" + "0" * 64

HOSTS: dict[str, dict[str, Any]] = {
    "ubuntu2204": {"test_os": ["Ubuntu", "22.04", "Debian"], "nvidia_driver_version": "580", "gpus": ["8.0"]},
    "ubuntu2404": {"test_os": ["Ubuntu", "24.04", "Debian"], "nvidia_driver_version": "590", "gpus": ["9.0"]},
    "rocky9": {"test_os": ["Rocky", "9.4", "RedHat"], "nvidia_driver_version": "580.82.07", "gpus": ["7.0"]},
    "ubuntu2404-userspace": {
        "test_os": ["Ubuntu", "24.04", "Debian"],
        "nvidia_driver_version": "575",
        "nvidia_driver_mode": "userspace",
        "gpus": [],
    },
    "ubuntu2204-nokey": {"test_os": ["Ubuntu", "22.04", "Debian"], "nvidia_driver_version": "580", "key": ""},
    "ubuntu2204-debian-source": {"test_os": ["Ubuntu", "22.04", "Debian"], "source": "debian"},
    "ubuntu2404-open-pascal": {
        "test_os": ["Ubuntu", "24.04", "Debian"],
        "nvidia_driver_flavor": "open",
        "gpus": ["6.1"],
    },
    # The controller under the connection plugin's full name, with a policy that reboots.
    "controller-reboot": {
        "test_os": ["Ubuntu", "22.04", "Debian"],
        "connection": "ansible.builtin.local",
        "nvidia_driver_reboot_policy": "if_needed",
    },
}


def _inventory(tmp_path: Path, specs: dict[str, dict[str, Any]] = HOSTS) -> Path:
    hosts = {}
    for name, spec in specs.items():
        host = {
            "ansible_connection": spec.get("connection", "local"),
            "ansible_python_interpreter": sys.executable,
            "test_os": spec["test_os"],
            "nvidia_driver_source": spec.get("source", "nvidia_repo"),
            "nvidia_driver_version": spec.get("nvidia_driver_version", "580"),
            "nvidia_driver_mode": spec.get("nvidia_driver_mode", "full"),
            "nvidia_driver_flavor": spec.get("nvidia_driver_flavor", "auto"),
            "nvidia_driver_reboot_policy": spec.get("nvidia_driver_reboot_policy", "never"),
            "nvidia_driver_repo_keyring_checksum": spec.get("key", SUM),
            # A download directory no real run has made, to show that check mode makes none.
            "nvidia_driver_download_dir": str(tmp_path / "downloads"),
            "gpu_stack_resolved": {"gpus": [{"cc": cc} for cc in spec.get("gpus", [])]},
        }
        if "variant" in spec:
            host["nvidia_driver_debian_variant"] = spec["variant"]
        hosts[name] = host
    inv = tmp_path / "hosts.yml"
    inv.write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    return inv


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory, venv_env: dict[str, str]) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("driver-check")
    before = _controller_files()
    run, plans, failures = check_mode_plans(PLAYBOOK, _inventory(tmp), tmp, venv_env, "would_install", timeout=300)
    return {
        "run": run,
        "plans": plans,
        "failures": failures,
        "downloads": (tmp / "downloads").exists(),
        "before": before,
        "after": _controller_files(),
    }


def _controller_files() -> dict[str, bool]:
    paths = [
        "/etc/apt/sources.list.d/gpuenv-cuda.sources",
        "/etc/apt/preferences.d/gpuenv-nvidia-driver",
        "/etc/modprobe.d/gpuenv-blacklist-nouveau.conf",
        "/etc/ansible/facts.d/nvidia_driver.fact",
    ]
    return {p: Path(p).exists() for p in paths}


def test_ubuntu_2204_open_modules_from_nvidias_repository(results: dict[str, Any]) -> None:
    plan = results["plans"]["ubuntu2204"]
    assert plan["would_configure_repository"] == NVIDIA + "ubuntu2204/x86_64/"
    # up to the 580 branch the user-space packages carry the branch in their names
    assert plan["would_install"] == ["nvidia-open", "nvidia-utils-580", "libnvidia-compute-580"]
    assert plan["flavor"].startswith("open")


def test_ubuntu_2404_branch_590_drops_the_suffix(results: dict[str, Any]) -> None:
    plan = results["plans"]["ubuntu2404"]
    assert plan["would_configure_repository"] == NVIDIA + "ubuntu2404/x86_64/"
    assert plan["would_install"] == ["nvidia-open", "nvidia-utils", "libnvidia-compute"]


def test_the_stamp_keeps_the_packages_the_plan_named_for_a_converged_re_run(
    tmp_path: Path, venv_env: dict[str, str]
) -> None:
    # nvidia_driver's current.yml asks the index for these on a converged host instead of planning
    # again; they must be values, readable in the stamp's play, which has no driver role (Debian's
    # names are templates over nvidia_driver_debian_variant).
    hosts = {
        "ubuntu2404": {"test_os": ["Ubuntu", "24.04", "Debian"], "nvidia_driver_version": "590", "gpus": ["9.0"]},
        "debian12-tesla": {"test_os": ["Debian", "12", "Debian"], "source": "debian", "variant": "tesla-535"},
        # The role's default variant (""), which only the role's own play has.
        "debian12": {"test_os": ["Debian", "12", "Debian"], "source": "debian", "gpus": ["8.6"]},
    }
    inventory = _inventory(tmp_path, hosts)
    run, kept, failures = check_mode_plans(KEEP_PLAYBOOK, inventory, tmp_path, venv_env, "stamp_keeps", timeout=300)
    assert not failures, failures
    assert run.returncode == 0, run.stdout + run.stderr
    assert kept["ubuntu2404"]["stamp_keeps"]["nvidia_driver"] == {
        "main_package": "nvidia-open",
        "version_package": "libnvidia-compute*",
        "pkg_mgr": "apt",
        "repository": NVIDIA + "ubuntu2404/x86_64/",
    }
    assert kept["debian12-tesla"]["stamp_keeps"]["nvidia_driver"] == {
        "main_package": "nvidia-tesla-535-kernel-dkms",
        "version_package": "libnvidia-tesla-535-cuda1",
        "pkg_mgr": "apt",
        "repository": "",
    }
    assert kept["debian12"]["stamp_keeps"]["nvidia_driver"] == {
        "main_package": "nvidia-open-kernel-dkms",
        "version_package": "libcuda1",
        "pkg_mgr": "apt",
        "repository": "",
    }


def test_userspace_mode_installs_no_kernel_module(results: dict[str, Any]) -> None:
    plan = results["plans"]["ubuntu2404-userspace"]
    assert plan["would_install"] == ["nvidia-utils-575", "libnvidia-compute-575"]


def test_a_rhel_family_host_is_refused_with_what_to_do(results: dict[str, Any]) -> None:
    # No test here can run a dnf host, so the role serves none (its vars' reason), before any change.
    said = results["failures"]["rocky9"]
    assert "Debian and Ubuntu 22.04 / 24.04 only" in said
    assert "nvidia_driver_mode: none" in said


def test_refusals_say_what_to_fix(results: dict[str, Any]) -> None:
    failures = results["failures"]
    assert set(failures) == {
        "ubuntu2204-nokey",
        "ubuntu2204-debian-source",
        "ubuntu2404-open-pascal",
        "controller-reboot",
        "rocky9",
    }, failures
    assert "the connection is ansible.builtin.local, which runs on the controller" in failures["controller-reboot"]
    assert "nvidia_driver_reboot_policy: never" in failures["controller-reboot"]
    assert "nvidia_driver_repo_keyring_checksum" in failures["ubuntu2204-nokey"]
    assert "sha256sum" in failures["ubuntu2204-nokey"]
    assert "Ubuntu 22.04" in failures["ubuntu2204-debian-source"]
    assert "nvidia_driver_source" in failures["ubuntu2204-debian-source"]
    assert "6.1" in failures["ubuntu2404-open-pascal"]
    assert "proprietary" in failures["ubuntu2404-open-pascal"]


def test_check_mode_changes_nothing_on_the_controller(results: dict[str, Any]) -> None:
    assert results["before"] == results["after"]
    assert not results["downloads"]
    # ansible-playbook exits 2 for the hosts refused above, and the others all reached their plan
    assert results["run"].returncode == 2, results["run"].stdout[-3000:]
    assert set(results["plans"]) == {"ubuntu2204", "ubuntu2404", "ubuntu2404-userspace"}
