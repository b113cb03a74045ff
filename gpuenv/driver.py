"""Pure helpers for the nvidia_driver role: pick the pinned driver from what apt offers, and read
which driver is loaded. Parsers are tested on saved command output (gpuenv/tests/data/)."""

from __future__ import annotations

import re

from gpuenv import versions


def parse_madison(text: str) -> list[str]:
    """Versions from `apt-cache madison PKG` ("nvidia-kernel-dkms | 535.309.01-0+deb12u1 | URL ..."), newest first."""
    found: list[str] = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split("|")]
        if len(parts) >= 3 and parts[1] and parts[1] not in found:
            found.append(parts[1])
    return sorted(found, key=_debian_key, reverse=True)


def upstream(debian_version: str) -> str:
    """535.309.01 from the Debian version 535.309.01-0+deb12u1 (and from 1:535.309.01-1)."""
    return debian_version.split(":", 1)[-1].split("-", 1)[0]


def _debian_key(debian_version: str) -> tuple[tuple[int, ...], str]:
    up = upstream(debian_version)
    try:
        return versions.parse(up), debian_version
    except ValueError:
        return (), debian_version


def pick(available: list[str], pin: str) -> str | None:
    """The newest Debian version matching a branch pin ("535") or an exact pin ("535.261.03")."""
    if "." in pin:
        matching = [v for v in available if upstream(v) == pin]
    else:
        matching = [v for v in available if upstream(v).split(".")[0] == pin]
    return max(matching, key=_debian_key) if matching else None


_PROC_VERSION = re.compile(r"NVRM version: NVIDIA UNIX (?P<kind>.*?)\s+(?P<version>\d+\.\d+(?:\.\d+)?)\s")


def parse_proc_version(text: str) -> dict[str, str] | None:
    """/proc/driver/nvidia/version -> {"version": "550.163.01", "flavor": "open"|"proprietary"}."""
    match = _PROC_VERSION.search(text)
    if not match:
        return None
    flavor = "open" if "Open Kernel Module" in match.group("kind") else "proprietary"
    return {"version": match.group("version"), "flavor": flavor}


def reboot_needed(loaded: str | None, installed: str | None, gpu_present: bool) -> bool:
    """Whether the host must reboot (or reload the module) to run the installed driver.

    A loaded module of another version than the installed user space is what makes NVML fail with
    "Failed to initialize NVML: Driver/library version mismatch"; a GPU with no module loaded needs
    the reboot to load it. Without an NVIDIA GPU no module can load, so nothing is pending."""
    return gpu_present and loaded != installed
