"""The nvidia_driver role's parsers, on saved real output (tests/data/README.md says whence)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuenv import driver
from gpuenv.module_utils import gpuenv_hostparse as hostparse

DATA = Path(__file__).parent / "data"


def _read(name: str) -> str:
    return (DATA / name).read_text()


def test_madison_on_bookworm_lists_security_and_main() -> None:
    available = hostparse.parse_madison(_read("apt-cache-madison-nvidia-kernel-dkms-bookworm.txt"))
    assert available == ["535.309.01-0+deb12u1", "535.261.03-1"]


@pytest.mark.parametrize(
    ("pin", "chosen"),
    [
        ("535", "535.309.01-0+deb12u1"),  # a branch: its newest version
        ("535.261.03", "535.261.03-1"),  # an exact version, though a newer one is offered
        ("550", None),  # not in bookworm
        ("535.261", None),  # a prefix is not an exact version
    ],
)
def test_pick_on_bookworm(pin: str, chosen: str | None) -> None:
    assert (
        hostparse.pick_version(hostparse.parse_madison(_read("apt-cache-madison-nvidia-kernel-dkms-bookworm.txt")), pin)
        == chosen
    )


def test_pick_on_trixie() -> None:
    available = hostparse.parse_madison(_read("apt-cache-madison-nvidia-kernel-dkms-trixie.txt"))
    assert hostparse.pick_version(available, "550") == "550.163.01-2"
    assert hostparse.package_upstream("550.163.01-2") == "550.163.01"
    assert hostparse.package_upstream("1:535.309.01-0+deb12u1") == "535.309.01"


def test_proc_version_open_module() -> None:
    assert hostparse.parse_proc_version(_read("proc-driver-nvidia-version-open-580.txt")) == {
        "version": "580.95.05",
        "flavor": "open",
    }


def test_proc_version_proprietary_module() -> None:
    assert hostparse.parse_proc_version(_read("proc-driver-nvidia-version-proprietary-515.txt")) == {
        "version": "515.76",
        "flavor": "proprietary",
    }


def test_proc_version_unreadable() -> None:
    assert hostparse.parse_proc_version("") is None


@pytest.mark.parametrize(
    ("loaded", "gpu", "needed"),
    [
        ("550.163.01", True, False),
        ("535.261.03", True, True),  # "Driver/library version mismatch" until a reboot
        (None, True, True),  # a GPU and no module loaded: the reboot loads it
        (None, False, False),  # no GPU (the sandbox): no module can load, nothing is pending
    ],
)
def test_reboot_needed(loaded: str | None, gpu: bool, needed: bool) -> None:
    assert driver.reboot_needed(loaded, "550.163.01", gpu) is needed


@pytest.mark.parametrize(
    ("requested", "ccs", "flavor"),
    [
        ("auto", ["8.0", "9.0"], "open"),  # Ampere and Hopper: NVIDIA recommends open
        ("auto", ["7.5"], "open"),  # Turing is the first generation with a GSP
        ("auto", ["7.0", "8.0"], "proprietary"),  # one Volta in the stack rules open out
        ("auto", [], "proprietary"),  # no GPU named: the flavor that drives every generation
        ("proprietary", ["9.0"], "proprietary"),
        ("open", ["8.6"], "open"),
        ("open", ["6.1"], None),  # Pascal cannot run open modules: refused, not installed
    ],
)
def test_flavor_follows_the_open_modules_floor(requested: str, ccs: list[str], flavor: str | None) -> None:
    chosen, why = driver.choose_flavor(requested, ccs, "7.5")
    assert chosen == flavor
    if flavor is None:
        assert "6.1" in why
        assert "proprietary" in why


def test_dnf_repoquery_lines_are_read_like_madison() -> None:
    # The layout `dnf repoquery --queryformat '%{version}-%{release}\n'` prints, one per line.
    available = hostparse.parse_madison("575.57.08-1.el9\n580.82.07-1.el9\n\n580.65.06-1.el9\n")
    assert available == ["580.82.07-1.el9", "580.65.06-1.el9", "575.57.08-1.el9"]
    assert hostparse.pick_version(available, "580") == "580.82.07-1.el9"
    assert hostparse.package_upstream("580.82.07-1.el9") == "580.82.07"


def test_dpkg_query_tells_installed_held_and_absent() -> None:
    status = hostparse.parse_dpkg_query(_read("dpkg-query-status-nvidia-bookworm.txt"))
    assert status == {
        "libcuda1": {"want": "i", "state": "i", "version": "535.309.01-0+deb12u1"},
        "nvidia-kernel-dkms": {"want": "u", "state": "n", "version": ""},
        "nvidia-smi": {"want": "h", "state": "i", "version": "535.309.01-0+deb12u1"},
    }


@pytest.mark.parametrize(
    ("wanted", "missing"),
    [
        # everything at the pin: the role skips apt
        (["nvidia-smi=535.309.01-0+deb12u1", "libcuda1=535.309.01-0+deb12u1"], []),
        # another version pinned: apt must run
        (["libcuda1=535.261.03-1~deb12u1"], ["libcuda1=535.261.03-1~deb12u1"]),
        # known to dpkg but not installed, and unknown to it (headers, unpinned)
        (
            ["nvidia-kernel-dkms=535.309.01-0+deb12u1", "linux-headers-6.1.0-50-amd64"],
            ["nvidia-kernel-dkms=535.309.01-0+deb12u1", "linux-headers-6.1.0-50-amd64"],
        ),
        (["libcuda1"], []),
    ],
)
def test_unsatisfied_lists_what_apt_must_install(wanted: list[str], missing: list[str]) -> None:
    status = hostparse.parse_dpkg_query(_read("dpkg-query-status-nvidia-bookworm.txt"))
    assert hostparse.dpkg_unsatisfied(status, wanted) == missing


def test_unheld_lists_what_the_role_must_hold() -> None:
    status = hostparse.parse_dpkg_query(_read("dpkg-query-status-nvidia-bookworm.txt"))
    assert hostparse.dpkg_unheld(status, ["libcuda1", "nvidia-kernel-dkms", "nvidia-smi", "firmware-nvidia-gsp"]) == [
        "libcuda1",
        "nvidia-kernel-dkms",
        "firmware-nvidia-gsp",
    ]


def test_a_reboot_of_the_controller_is_recognised_by_connection_or_machine_id() -> None:
    assert driver.reboots_the_controller("local", None, None)
    assert driver.reboots_the_controller("ansible.builtin.local", None, None)
    # SSH to the controller itself (localhost, 127.0.0.1 or its own address): the same machine id.
    same = driver.reboots_the_controller(
        "ssh", "3f2a0c9e1b7d4e6f8a9b0c1d2e3f4a5b\n", "3f2a0c9e1b7d4e6f8a9b0c1d2e3f4a5b"
    )
    assert same is not None
    assert "is the controller's" in same
    assert driver.reboots_the_controller("ssh", "3f2a0c9e1b7d4e6f8a9b0c1d2e3f4a5b", "0" * 32) is None
    assert driver.reboots_the_controller("ssh", "", "") is None  # no ids: nothing says it is the controller


def test_rpm_qa_in_gpuenv_doctors_query_format() -> None:
    """`rpm -qa --qf '%{NAME} %{VERSION}-%{RELEASE}\\n' ...` for NVIDIA's RHEL 9 packages (names and versions as
    NVIDIA's repository lists them: see data/README.md; no RHEL host was available)."""
    text = (DATA / "doctor/rpm-qa-rhel9-nvidia.txt").read_text()
    found = hostparse.parse_rpm_qa(text)
    assert found["nvidia-driver"] == "595.71.05-1.el9"
    assert found["kmod-nvidia-open-dkms"] == "595.71.05-1.el9"
    assert hostparse.package_upstream(found["nvidia-driver"]) == "595.71.05"
    assert len(found) == 5
    # `rpm -q NAME` (not -qa) words a missing package as a sentence: no entry, not a package named "package".
    assert hostparse.parse_rpm_qa("package cuda-drivers is not installed\n") == {}
