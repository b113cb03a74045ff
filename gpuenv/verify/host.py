"""The OS around the driver: nouveau, and Secure Boot with the nvidia module's signer."""

from __future__ import annotations

import shutil
import subprocess
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
    return run_tool(argv) if shutil.which(argv[0]) else None


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
