"""Pure helpers for the nvidia_driver role: pick the pinned driver from what apt offers, and decide
what a loaded driver means (which driver is loaded is read by gpuenv.hostparse.parse_proc_version,
the parser verify uses too). Parsers are tested on saved command output (gpuenv/tests/data/)."""

from __future__ import annotations

from gpuenv import versions


def parse_madison(text: str) -> list[str]:
    """Versions offered, newest first, from `apt-cache madison PKG` ("nvidia-kernel-dkms |
    535.309.01-0+deb12u1 | URL ...") or from `dnf repoquery --queryformat '%{version}-%{release}'`
    (one "580.82.07-1.el9" per line)."""
    found: list[str] = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split("|")]
        version = parts[1] if len(parts) >= 3 else parts[0] if len(parts) == 1 and parts[0][:1].isdigit() else ""
        if version and version not in found:
            found.append(version)
    return sorted(found, key=_debian_key, reverse=True)


def parse_dpkg_query(text: str) -> dict[str, dict[str, str]]:
    """`dpkg-query -W -f '${db:Status-Abbrev} ${Package} ${Version}\\n' PKG...` as
    {package: {"want": "i"|"h"|..., "state": "i"|"n"|..., "version": ...}}. Status-Abbrev is three
    characters: the selection (h: hold), the package state (i: installed) and the error flag."""
    found: dict[str, dict[str, str]] = {}
    for line in text.splitlines():
        if len(line) < 5 or line[3] != " ":
            continue
        fields = line[4:].split()
        if not fields:
            continue
        found[fields[0]] = {"want": line[0], "state": line[1], "version": fields[1] if len(fields) > 1 else ""}
    return found


def parse_rpm_qa(text: str) -> dict[str, str]:
    """`rpm -qa --qf '%{NAME} %{VERSION}-%{RELEASE}\\n' PATTERN...` as {package: version-release}."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 2:
            found[fields[0]] = fields[1]
    return found


def unsatisfied(status: dict[str, dict[str, str]], wanted: list[str]) -> list[str]:
    """The entries of an apt install list ("pkg" or "pkg=version") that dpkg does not have."""
    missing = []
    for entry in wanted:
        name, _, version = entry.partition("=")
        have = status.get(name)
        if have is None or have["state"] != "i" or (version and have["version"] != version):
            missing.append(entry)
    return missing


def unheld(status: dict[str, dict[str, str]], packages: list[str]) -> list[str]:
    """The packages dpkg does not hold (selection "h"), whether installed or not."""
    return [p for p in packages if status.get(p, {}).get("want") != "h"]


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
