"""The OS around the driver: nouveau, and Secure Boot with the nvidia module's signer."""

from __future__ import annotations

import shutil

from gpuenv import hostparse
from gpuenv.verify.base import Checks, Context, Spec, run_tool
from gpuenv.verify.model import Check

CHECKS = Checks()


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


def _module_signer() -> str | None:
    if not shutil.which("modinfo"):
        return None
    for name in ("nvidia", "nvidia-current", "nvidia-current-open"):
        run = run_tool(["modinfo", "-F", "signer", name])
        if run.returncode == 0 and run.stdout.strip():
            return run.stdout.strip()
    return None


@CHECKS.add("host.secure_boot", "Secure Boot")
def secure_boot(ctx: Context, me: Spec) -> Check:
    efivars = ctx.sys_root / "firmware/efi/efivars"
    found = sorted(efivars.glob("SecureBoot-*")) if efivars.is_dir() else []
    if not found:
        return me.passed("no UEFI Secure Boot variable: unsigned modules load", "absent")
    if not hostparse.secure_boot_on(found[0].read_bytes()):
        return me.passed("Secure Boot is off", "off")
    signer = _module_signer()
    if signer:
        return me.passed(
            f"Secure Boot is on; the nvidia module is signed by {signer}", {"secure_boot": "on", "signer": signer}
        )
    return me.warned(
        "Secure Boot is on and the nvidia module shows no signature",
        observed={"secure_boot": "on", "signer": None},
        hint="sign the module with an enrolled MOK (nvidia_driver_secure_boot: sign)",
    )
