"""The OS around the driver: nouveau, and Secure Boot with the nvidia module's signer."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from gpuenv.module_utils import gpuenv_hostparse as hostparse
from gpuenv.verify.base import Checks, Context, Spec, run_tool
from gpuenv.verify.model import Check

CHECKS = Checks()

if TYPE_CHECKING:  # Python 3.8 on the hosts cannot subscript Callable at runtime
    from collections.abc import Callable

    Runner = Callable[[list[str]], subprocess.CompletedProcess[str] | None]


@CHECKS.add("host.nouveau", "nouveau")
def nouveau(ctx: Context, me: Spec) -> Check:
    modules = (ctx.proc / "modules").read_text() if (ctx.proc / "modules").exists() else ""
    if "nouveau" in hostparse.loaded_modules(modules):
        return me.failed(
            "nouveau is loaded",
            observed=True,
            expected=False,
            hint="blacklist nouveau (the nvidia_driver role does), rebuild the initramfs and reboot",
        )
    return me.passed("nouveau is not loaded", False, False)


def _run_modinfo(argv: list[str]) -> subprocess.CompletedProcess[str] | None:
    # Debian keeps modinfo in /usr/sbin, which a user's PATH lacks; it reads no privileged file.
    found = shutil.which(argv[0]) or shutil.which(argv[0], path="/usr/sbin:/sbin")
    return run_tool([found, *argv[1:]]) if found else None


# The module's names: NVIDIA's installer and repositories (nvidia), Debian's DKMS packages
# (nvidia-current, nvidia-current-open).
MODULE_NAMES = ("nvidia", "nvidia-current", "nvidia-current-open")


def module_field(field: str, run: Runner = _run_modinfo) -> str | None:
    """A field of the installed nvidia module (`modinfo -F FIELD`: signer, filename, version), from
    the first of its names that modinfo knows; None when modinfo is missing or knows none of them.
    gpuenv doctor passes its own runner (its commands run through one, for its tests)."""
    for name in MODULE_NAMES:
        found = run(["modinfo", "-F", field, name])
        if found is not None and found.returncode == 0 and found.stdout.strip():
            return found.stdout.strip()
    return None


def installed_kernels(modules_root: Path) -> list[str]:
    """The kernels whose modules are installed: each /lib/modules directory with a modules.dep (a
    removed kernel's leftover directory has none)."""
    if not modules_root.is_dir():
        return []
    return sorted(p.name for p in modules_root.iterdir() if (p / "modules.dep").is_file())


def module_for(kernel: str, run: Runner | None = None) -> dict[str, str] | None:
    """modinfo's fields of the nvidia module installed for kernel, under the first of its names that
    kernel's modules know; None when none is installed for it."""
    run = run or _run_modinfo
    for name in MODULE_NAMES:
        found = run(["modinfo", "-k", kernel, name])
        if found is not None and found.returncode == 0 and found.stdout.strip():
            return hostparse.parse_modinfo(found.stdout)
    return None


@CHECKS.add("host.module_kernels", "the nvidia module of each kernel")
def module_kernels(ctx: Context, me: Spec) -> Check:
    kernels = installed_kernels(ctx.modules_root)
    found = {k: info for k in kernels if (info := module_for(k)) is not None}
    if not found:
        return me.skipped("no nvidia kernel module is installed for any kernel (user space only, or none)")
    built_for = {k: info.get("vermagic", "").split(" ")[0] for k, info in found.items()}
    wrong = sorted(k for k, magic in built_for.items() if magic != k)
    if wrong:
        return me.failed(
            f"the nvidia module of kernel {wrong[0]} was built for kernel {built_for[wrong[0]] or 'unknown'}",
            observed=built_for,
            expected={k: k for k in found},
            hint=f"rebuild it for that kernel: dkms remove nvidia-current/<version> -k {wrong[0]}, then dkms"
            f" autoinstall -k {wrong[0]} (or run the driver stage again)",
        )
    versions = {k: info.get("version", "") for k, info in found.items()}
    want = str(ctx.record("nvidia_driver").get("version") or "")
    off = sorted(k for k, v in versions.items() if want and v != want)
    if off:
        return me.failed(
            f"the nvidia module of kernel {off[0]} is version {versions[off[0]]}, not the driver's {want}",
            observed=versions,
            expected=want,
            hint=f"rebuild it: dkms autoinstall -k {off[0]} (or run the driver stage again)",
        )
    missing = [k for k in kernels if k not in found]
    if missing:
        return me.warned(
            f"kernel {', '.join(missing)} has no nvidia module: booting it loads no driver",
            observed=versions,
            hint=f"install linux-headers-{missing[0]} and run dkms autoinstall -k {missing[0]} (the driver stage"
            " does both), or remove that kernel",
        )
    return me.passed(
        f"nvidia module {', '.join(sorted(set(versions.values())))} built for each kernel ({', '.join(found)})",
        versions,
    )


@CHECKS.add("host.secure_boot", "Secure Boot")
def secure_boot(ctx: Context, me: Spec) -> Check:
    efivars = ctx.sys_root / "firmware/efi/efivars"
    found = sorted(efivars.glob("SecureBoot-*")) if efivars.is_dir() else []
    if not found:
        return me.passed("no UEFI Secure Boot variable: unsigned modules load", "absent")
    if not hostparse.secure_boot_on(found[0].read_bytes()):
        return me.passed("Secure Boot is off", "off")
    signer = module_field("signer")
    if signer:
        return me.passed(
            f"Secure Boot is on; the nvidia module is signed by {signer}", {"secure_boot": "on", "signer": signer}
        )
    return me.warned(
        "Secure Boot is on and the nvidia module shows no signature",
        observed={"secure_boot": "on", "signer": None},
        hint="sign the module with an enrolled MOK (nvidia_driver_secure_boot: sign)",
    )
