"""Filters for the nvidia_driver role, calling gpuenv.driver and gpuenv.module_utils.gpuenv_hostparse
(tested with saved real output)."""

from __future__ import annotations

from typing import Any

from gpuenv import compat, driver
from gpuenv.module_utils import gpuenv_hostparse as hostparse


def gpuenv_driver_pick(madison: str, pin: str) -> dict[str, Any]:
    """{"version": newest Debian version matching the pin or None, "available": every version offered}."""
    return hostparse.pin_choice(str(madison), str(pin))


def gpuenv_driver_flavor(requested: str, ccs: list[Any]) -> dict[str, Any]:
    """{"flavor": "open"|"proprietary"|None, "why": ...} for the role's nvidia_driver_flavor."""
    floor = str(compat.load().raw["driver"]["open_modules"]["min_cc"])
    flavor, why = driver.choose_flavor(str(requested), [str(cc) for cc in ccs or []], floor)
    return {"flavor": flavor, "why": why}


def gpuenv_nvidia_proc_version(text: str) -> dict[str, str] | None:
    return hostparse.parse_proc_version(str(text))


def gpuenv_driver_reboot_needed(loaded: dict[str, str] | None, installed: str, gpu_present: bool) -> bool:
    return driver.reboot_needed((loaded or {}).get("version"), str(installed), bool(gpu_present))


def gpuenv_reboots_the_controller(connection: Any, host_machine_id: Any, controller_machine_id: Any) -> str | None:
    return driver.reboots_the_controller(
        str(connection) if connection else None, str(host_machine_id or ""), str(controller_machine_id or "")
    )


def gpuenv_modinfo(text: str) -> dict[str, str]:
    """The fields of `modinfo` output (version, vermagic, signer, filename)."""
    return hostparse.parse_modinfo(str(text))


def gpuenv_dpkg_unsatisfied(dpkg_query: str, wanted: list[str]) -> list[str]:
    """Entries of an apt install list ("pkg" or "pkg=version") that dpkg does not have installed."""
    return hostparse.dpkg_unsatisfied(hostparse.parse_dpkg_query(str(dpkg_query)), [str(w) for w in wanted])


def gpuenv_dpkg_unheld(dpkg_query: str, packages: list[str]) -> list[str]:
    """The packages dpkg does not hold."""
    return hostparse.dpkg_unheld(hostparse.parse_dpkg_query(str(dpkg_query)), [str(p) for p in packages])


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "gpuenv_driver_pick": gpuenv_driver_pick,
            "gpuenv_driver_flavor": gpuenv_driver_flavor,
            "gpuenv_nvidia_proc_version": gpuenv_nvidia_proc_version,
            "gpuenv_driver_reboot_needed": gpuenv_driver_reboot_needed,
            "gpuenv_dpkg_unsatisfied": gpuenv_dpkg_unsatisfied,
            "gpuenv_reboots_the_controller": gpuenv_reboots_the_controller,
            "gpuenv_dpkg_unheld": gpuenv_dpkg_unheld,
            "gpuenv_modinfo": gpuenv_modinfo,
        }
