"""Pure decisions for the nvidia_driver role: what a loaded driver means (which driver is loaded is
read by gpuenv.module_utils.gpuenv_hostparse.parse_proc_version, the parser verify uses too), whether a reboot would hit
the controller, and the kernel module flavor. What apt offers and what dpkg has (the pin's choice,
what dpkg lacks or does not hold) is read by gpuenv.module_utils.gpuenv_hostparse alone, which the role's module
gpuenv_apt_pin carries to the hosts."""

from __future__ import annotations

from gpuenv import versions


def reboot_needed(loaded: str | None, installed: str | None, gpu_present: bool) -> bool:
    """Whether the host must reboot (or reload the module) to run the installed driver.

    A loaded module of another version than the installed user space is what makes NVML fail with
    "Failed to initialize NVML: Driver/library version mismatch"; a GPU with no module loaded needs
    the reboot to load it. Without an NVIDIA GPU no module can load, so nothing is pending."""
    return gpu_present and loaded != installed


# The names a local connection goes by (ansible-core's plugin and its short name).
LOCAL_CONNECTIONS = ("local", "ansible.builtin.local")


def reboots_the_controller(
    connection: str | None, host_machine_id: str | None, controller_machine_id: str | None
) -> str | None:
    """Why rebooting this host would reboot the machine running Ansible, or None. A local
    connection runs on the controller; so does any connection to a host whose /etc/machine-id is
    the controller's (SSH to localhost, to 127.0.0.1, or to the controller's own address)."""
    if (connection or "ssh") in LOCAL_CONNECTIONS:
        return f"the connection is {connection}, which runs on the controller"
    host, controller = (host_machine_id or "").strip(), (controller_machine_id or "").strip()
    if host and host == controller:
        return f"the host's /etc/machine-id ({host[:12]}...) is the controller's: it is the controller itself"
    return None


def choose_flavor(requested: str, ccs: list[str], open_min_cc: str) -> tuple[str | None, str]:
    """(flavor, why) for the kernel modules; flavor None when the request cannot work, with why.

    Open modules need the GSP that Turing (7.5) introduced; proprietary ones serve older GPUs too
    (compat.yaml driver.open_modules and its source)."""
    floor = versions.parse(open_min_cc)
    old = sorted({cc for cc in ccs if versions.parse(cc) < floor}, key=versions.parse)
    if requested == "open":
        if old:
            return None, (
                f"open kernel modules support only compute capability {open_min_cc} (Turing) and newer, "
                f"and this stack has GPUs of compute capability {', '.join(old)}: set nvidia_driver_flavor: "
                "proprietary (or auto)"
            )
        return "open", "requested"
    if requested == "proprietary":
        return "proprietary", "requested"
    if not ccs:
        return "proprietary", "the stack names no GPU; proprietary modules also drive GPUs older than Turing"
    if old:
        return "proprietary", f"GPUs of compute capability {', '.join(old)} are older than Turing"
    return "open", f"every GPU is Turing ({open_min_cc}) or newer, where NVIDIA recommends the open modules"
