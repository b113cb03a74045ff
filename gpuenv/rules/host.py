"""The rules of the host itself: its OS (against the declared one), the Python its packages ship,
and the Fabric Manager an NVSwitch board needs."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpuenv import services
from gpuenv.osvars import Unserved
from gpuenv.rules.base import ERROR, WARNING, CheckerBase


class HostRules(CheckerBase):
    # --- OS ----------------------------------------------------------------------------------
    def check_os(self, host_facts: Mapping[str, Any] | None) -> None:
        if host_facts is None:
            return
        host_os = self.data.os_from_facts(host_facts)
        label = " ".join(str(host_facts.get(k, "")) for k in ("distribution", "distribution_version")).strip()
        if host_os is None:
            self.add(
                "os-unknown",
                WARNING,
                f"the host runs {label or 'an OS gpuenv cannot name'}, which gpuenv does not know",
                f"gpuenv's roles are written and tested for {', '.join(self.data.os)}",
                "expect the roles to stop on this host; use one of those OS releases",
                "derived",
            )
            return
        self.host_os = host_os
        if self.stack.os is not None and host_os != self.stack.os:
            self.add(
                "os-mismatch",
                ERROR,
                f"gpu_stack.os is {self.stack.os} but the host runs {host_os} ({label})",
                "the stack was declared and checked for another OS; packages and driver sources differ",
                f"set gpu_stack.os: {host_os} for this group, or move the host to a group for {host_os}",
                "derived",
            )

    def check_roles_os(self, unserved: Iterable[Unserved]) -> None:
        """The roles of the run that have no vars file for the host's OS (gpuenv.osvars): refused
        here, before any role installs anything, rather than at the role's first package task."""
        for role in unserved:
            how = f" with {role.selector}" if role.selector else ""
            self.add(
                "os-role",
                ERROR,
                f"the {role.role} role cannot serve {role.host}{how}",
                f"{role.why}; the role would fail at its first package task, after the stages before it had "
                "changed the host",
                f"choose another source for {role.role} (roles/{role.role}/README.md lists what each serves), or add "
                f"the OS's vars file and tasks to roles/{role.role} (docs/architecture.md, 'Adding an OS')",
                "derived",
            )

    def check_fabric(self, nvswitches: Iterable[Mapping[str, str]], settings: Mapping[str, Any] | None) -> None:
        """An NVSwitch board (HGX) runs no CUDA until Fabric Manager, of exactly the driver's version,
        has set its switches up: refuse a driver the host cannot get a matching Fabric Manager for.
        settings: gpu_services_fabricmanager and nvidia_driver_source beside the stack (None: those
        roles' defaults, auto and debian). Whether the repository has the exact version is checked by
        gpu_services against the repository's index."""
        self.nvswitches = [dict(s) for s in nvswitches]
        if not self.nvswitches:
            return
        settings = settings or {}
        given = settings.get("gpu_services_fabricmanager")
        mode = "auto" if given is None else services.mode_of(given)
        source = str(settings.get("nvidia_driver_source") or "debian")
        switches = services.nvswitch_summary(self.nvswitches)
        why = (
            "on an NVSwitch board CUDA fails to initialise until NVIDIA Fabric Manager, of exactly the driver's "
            "version, has configured the switches"
        )
        entry = self.data.raw["services"]["fabric_manager"]
        branch = self.stack.driver.split(".")[0]
        if mode == "off":
            self.add(
                "fabric-manager",
                ERROR,
                f"the host has {switches} and gpu_services_fabricmanager is off",
                f"{why}; gpuenv would set driver {self.stack.driver} up without the Fabric Manager that must match it",
                "set gpu_services_fabricmanager: auto (or on): gpu_services installs nvidia-fabricmanager of the "
                "driver's version and holds it with the driver",
                "nv_fm_guide",
            )
        elif source == "debian":
            self.add(
                "fabric-manager",
                ERROR,
                f"the host has {switches}, and Debian's driver packages (nvidia_driver_source: debian) come "
                "with no Fabric Manager",
                f"{why}; Debian's archive has no Fabric Manager package, NVIDIA's repository has one for each "
                "driver version",
                "set nvidia_driver_source: nvidia_repo for this host's group (NVIDIA's repository carries "
                "nvidia-fabricmanager of every driver version)",
                "nv_fm_guide",
                "debian_packages",
            )
        elif branch.isdigit() and int(branch) < int(entry["first_branch"]):
            self.add(
                "fabric-manager",
                ERROR,
                f"the host has {switches}, and driver {self.stack.driver} is older than the first branch with "
                f"Fabric Manager packages (R{entry['first_branch']})",
                f"{why}; NVIDIA packages Fabric Manager from R{entry['first_branch']} on",
                f"pin a driver of R{entry['first_branch']} or newer in gpu_stack.driver",
                "nv_fm_guide",
                entry["source"],
            )

    def check_os_python(self, backend: str | None) -> None:
        """The venv backend builds from the OS's python3.X package: a Python the OS does not ship
        fails on the host only after the driver and CUDA stages changed it, so refuse it here."""
        os_name = self.host_os or self.stack.os
        mismatch = any(f.rule == "os-mismatch" for f in self.findings)  # that error comes first
        if os_name is None or mismatch or (backend or "venv") != "venv":
            return
        shipped, source = self.data.os_pythons(os_name)
        py = self.stack.python
        if not shipped or py in shipped:
            return
        others = [name for name in self.data.os if py in self.data.os_pythons(name)[0]]
        where = f", or an OS that ships it ({', '.join(others)})" if others else ""
        sources = [source or "derived", *(self.data.os_pythons(name)[1] or "derived" for name in others)]
        self.add(
            "os-python",
            ERROR,
            f"Python {py} is not packaged for {os_name}, which ships {', '.join(shipped)}",
            f"the venv backend builds the environment from the OS's python{py} package, and {os_name}'s "
            "repositories have none; the conda backend brings its own Python from its channel",
            f'set python: "{shipped[-1]}" for {os_name}, or pytorch_env_backend: conda{where}',
            *dict.fromkeys(sources),
        )
