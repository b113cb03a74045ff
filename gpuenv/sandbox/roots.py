"""Debian roots for sandbox hosts: built once with debootstrap per release and package set, cached.

Each host then runs on an overlayfs over the cached root, so ten hosts cost one root's disk plus
what each host writes.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from gpuenv.sandbox.util import SandboxError, log, run

DEBIAN_MIRROR = "http://deb.debian.org/debian"
SECURITY_MIRROR = "http://deb.debian.org/debian-security"


@dataclass(frozen=True)
class Release:
    os: str  # gpuenv's name: debian12
    suite: str  # Debian's: bookworm


RELEASES = {"debian12": Release("debian12", "bookworm"), "debian13": Release("debian13", "trixie")}

# What a host needs to boot with systemd, be reached by Ansible over SSH, and run the roles:
# python3-apt for Ansible's apt module, xz-utils and tar for NVIDIA's .tar.xz archives, kmod for
# modinfo, iproute2 for the network checks.
PACKAGES = (
    "systemd",
    "systemd-sysv",
    "dbus",
    "openssh-server",
    "python3",
    "python3-apt",
    "sudo",
    "ca-certificates",
    "iproute2",
    "kmod",
    "xz-utils",
    "procps",
    "curl",
)

# A workstation's root also has a kernel package: the driver role's full mode builds DKMS modules
# for every installed kernel (sandbox hosts run the controller's kernel, so none is loaded).
KERNEL_PACKAGES = ("linux-image-amd64",)


def release(os_name: str) -> Release:
    try:
        return RELEASES[os_name]
    except KeyError:
        raise SandboxError(f"unknown OS {os_name!r}: the sandbox builds {', '.join(RELEASES)}") from None


def _key(rel: Release, packages: tuple[str, ...]) -> str:
    digest = hashlib.sha256(" ".join([rel.suite, *sorted(packages)]).encode()).hexdigest()[:12]
    return f"{rel.suite}-{digest}"


def _sources(suite: str) -> str:
    components = "main contrib non-free non-free-firmware"
    return (
        f"deb {DEBIAN_MIRROR} {suite} {components}\n"
        f"deb {DEBIAN_MIRROR} {suite}-updates {components}\n"
        f"deb {SECURITY_MIRROR} {suite}-security {components}\n"
    )


def ensure_root(cache: Path, rel: Release, packages: tuple[str, ...] = PACKAGES) -> Path:
    """The cached root for a release and package set, building it on first use."""
    root = cache / "roots" / _key(rel, packages)
    if (root / ".gpuenv-complete").exists():
        return root
    for tool in ("debootstrap", "chroot"):
        if shutil.which(tool) is None:
            raise SandboxError(f"{tool} is not installed: run ./scripts/setup (it installs the sandbox's packages)")
    building = root.with_name(root.name + ".building")
    shutil.rmtree(building, ignore_errors=True)
    building.parent.mkdir(parents=True, exist_ok=True)
    log(f"building the {rel.suite} root with debootstrap (once; cached in {root})")
    try:
        run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(packages)}",
                rel.suite,
                str(building),
                DEBIAN_MIRROR,
            ],
            capture=True,
            timeout=1200,
        )
    except SandboxError as exc:
        shutil.rmtree(building, ignore_errors=True)
        raise SandboxError(f"debootstrap of {rel.suite} failed; is {DEBIAN_MIRROR} reachable?\n{exc}") from None
    (building / "etc/apt/sources.list").write_text(_sources(rel.suite))
    # Each host gets its own machine-id and SSH host keys in its overlay, not these shared ones.
    (building / "etc/machine-id").write_text("")
    for key in (building / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    # Debian 13 mounts a small tmpfs on /tmp; big downloads must not land there (world-notes).
    run(["chroot", str(building), "systemctl", "mask", "tmp.mount"], capture=True, check=False)
    (building / ".gpuenv-complete").write_text(" ".join(packages) + "\n")
    if root.exists():
        shutil.rmtree(root)
    building.rename(root)
    return root


def remove_cache(cache: Path) -> None:
    """Drop every cached root (they are rebuilt on the next `up`)."""
    roots = cache / "roots"
    if roots.exists():
        subprocess.run(["rm", "-rf", "--one-file-system", str(roots)], check=True)  # noqa: S603, S607
