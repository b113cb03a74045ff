"""Debian roots for sandbox hosts: built once with debootstrap per release and package set, cached.

Each host then runs on an overlayfs over the cached root, so ten hosts cost one root's disk plus
what each host writes.
"""

from __future__ import annotations

import fcntl
import hashlib
import shutil
from dataclasses import dataclass
from pathlib import Path

from testbed.sandbox.util import SandboxError, log, run

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


# Bumped when the way a root is built changes, so that roots cached by an older build are rebuilt
# (2: the package index is refreshed after the full sources are written).
ROOT_FORMAT = "2"


def _key(rel: Release, packages: tuple[str, ...]) -> str:
    digest = hashlib.sha256(" ".join([ROOT_FORMAT, rel.suite, *sorted(packages)]).encode()).hexdigest()[:12]
    return f"{rel.suite}-{digest}"


def _sources(suite: str) -> str:
    components = "main contrib non-free non-free-firmware"
    return (
        f"deb {DEBIAN_MIRROR} {suite} {components}\n"
        f"deb {DEBIAN_MIRROR} {suite}-updates {components}\n"
        f"deb {SECURITY_MIRROR} {suite}-security {components}\n"
    )


def ensure_root(roots_dir: Path, rel: Release, packages: tuple[str, ...] = PACKAGES) -> Path:
    """The cached root for a release and package set in roots_dir, building it on first use."""
    root = roots_dir / _key(rel, packages)
    if (root / ".gpuenv-complete").exists():
        return root
    roots_dir.mkdir(parents=True, exist_ok=True)
    # One build of a root at a time: two sandbox instances booting at once (scripts/test's lanes on
    # a fresh machine) would otherwise each remove the other's half-built directory.
    with (roots_dir / f"{root.name}.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (root / ".gpuenv-complete").exists():
            return root
        return _build_root(root, rel, packages)


def _build_root(root: Path, rel: Release, packages: tuple[str, ...]) -> Path:
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
    # debootstrap fetched the index of main alone; without a refresh the root's sources name
    # contrib and non-free while its index lacks them, and apt on a host booted from it offers
    # no nvidia-cuda-toolkit until its index is older than the roles' cache_valid_time.
    try:
        # --error-on=any: a source that failed to fetch fails the build, not a root cached without it.
        run(
            ["chroot", str(building), "apt-get", "update", "-q", "--error-on=any", "-o", "Acquire::Retries=3"],
            capture=True,
            timeout=600,
        )
    except SandboxError as exc:
        shutil.rmtree(building, ignore_errors=True)
        raise SandboxError(
            f"refreshing the {rel.suite} root's package index failed; is {DEBIAN_MIRROR} reachable?\n{exc}"
        ) from None
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
