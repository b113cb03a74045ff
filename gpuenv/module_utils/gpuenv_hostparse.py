"""Parsers of what a host prints or holds, with the standard library alone.

One parser per output: the controller's code (gpuenv.redist, gpuenv.drift, the driver's filters),
gpuenv's own Ansible modules on the hosts (ansible.cfg names this folder as a module_utils folder),
gpuenv verify (which carries this file to the hosts in its zipapp) and the tests all
read these outputs here, so that a format change is mended in one place. Nothing here may import
anything outside the standard library, nor anything of gpuenv's (Ansible ships this file alone),
and the syntax stays Python 3.8's: verify runs it with the environment's own Python.
"""

from __future__ import annotations

import re

_PTXAS = re.compile(r"release (?P<release>[0-9]+\.[0-9]+), V(?P<version>[0-9]+\.[0-9]+\.[0-9]+)")


def tool_version(text: str) -> dict[str, str] | None:
    """`ptxas --version` / `nvcc --version` -> {"release": "12.4", "version": "12.4.131"}."""
    match = _PTXAS.search(text)
    return match.groupdict() if match else None


_CUDNN_DEFINE = re.compile(r"^#define\s+CUDNN_(MAJOR|MINOR|PATCHLEVEL)\s+([0-9]+)", re.MULTILINE)


def cudnn_header_version(text: str) -> str | None:
    """ "9.1.0" from cudnn_version.h (cuDNN 8 and 9) or cudnn.h (cuDNN 7 and before): the
    CUDNN_MAJOR, CUDNN_MINOR and CUDNN_PATCHLEVEL defines."""
    values = dict(_CUDNN_DEFINE.findall(text))
    if not {"MAJOR", "MINOR", "PATCHLEVEL"} <= set(values):
        return None
    return f"{values['MAJOR']}.{values['MINOR']}.{values['PATCHLEVEL']}"


def parse_ldconfig(text: str) -> dict[str, list[str]]:
    """`ldconfig -p` as {soname: [paths, in the loader's order]}."""
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        name, sep, path = line.strip().partition(" => ")
        if sep:
            found.setdefault(name.split(" (", 1)[0], []).append(path.strip())
    return found


_PROC_VERSION = re.compile(r"NVRM version: NVIDIA UNIX (?P<kind>.*?)\s+(?P<version>[0-9]+\.[0-9]+(?:\.[0-9]+)?)\s")


def parse_proc_version(text: str) -> dict[str, str] | None:
    """/proc/driver/nvidia/version -> {"version": "550.163.01", "flavor": "open"|"proprietary"}."""
    match = _PROC_VERSION.search(text)
    if not match:
        return None
    flavor = "open" if "Open Kernel Module" in match.group("kind") else "proprietary"
    return {"version": match.group("version"), "flavor": flavor}


_SMI_VERSION = re.compile(r"[0-9]+\.[0-9]+(\.[0-9]+)?")


def parse_smi_driver(returncode: int, output: str) -> tuple[str | None, bool]:
    """(driver version, mismatch) from `nvidia-smi --query-gpu=driver_version --format=csv,noheader`:
    one version per GPU when it works; "Driver/library version mismatch" when the loaded module and
    the libraries differ; anything else (no driver, no GPU) observes no version."""
    if "mismatch" in output.lower():
        return None, True
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    if returncode == 0 and lines and _SMI_VERSION.fullmatch(lines[0]):
        return lines[0], False
    return None, False


_NVML_LIBRARY = re.compile(r"NVML library version:\s*(?P<version>[0-9]+\.[0-9]+(?:\.[0-9]+)?)")


def smi_nvml_version(output: str) -> str | None:
    """The user-space libraries' version nvidia-smi names when it refuses with "Driver/library
    version mismatch" ("NVML library version: 580.178", printed since about R535), else None."""
    match = _NVML_LIBRARY.search(output)
    return match.group("version") if match else None


_LIBCUDNN = re.compile(r"/libcudnn[^/]*\.so")


def libcudnn_paths(maps: str) -> list[str]:
    """The libcudnn files a process mapped, in the order first mapped, from /proc/<pid>/maps."""
    seen: list[str] = []
    for line in maps.splitlines():
        fields = line.split(None, 5)
        path = fields[-1] if len(fields) == 6 else ""
        if _LIBCUDNN.search(path) and path not in seen:
            seen.append(path)
    return seen


def loaded_modules(text: str) -> list[str]:
    """The kernel modules /proc/modules lists (the first field of each line), as lsmod reads them."""
    return [line.split()[0] for line in text.splitlines() if line.strip()]


def parse_modinfo(text: str) -> dict[str, str]:
    """The fields of `modinfo` ("name:    value" lines: version, vermagic, signer, filename); a field
    listed more than once (alias, parm) keeps its first value."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        # A field's continuation lines (signature's) start with whitespace.
        if sep and name and not any(c.isspace() for c in name) and name not in out:
            out[name] = value.strip()
    return out


def secure_boot_on(efivar: bytes) -> bool:
    """Whether the SecureBoot-<guid> EFI variable (read from efivarfs) says Secure Boot is on: four
    bytes of attributes, then the value, 1 for on (UEFI specification, "Globally Defined Variables")."""
    return len(efivar) >= 5 and efivar[4] == 1


def parse_lock(text: str) -> dict[str, str]:
    """name -> version from a lock of "name==version --hash=..." lines (names normalised)."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)", line)
        if m:
            out[normalise(m.group(1))] = m.group(2)
    return out


def parse_freeze(text: str) -> dict[str, str]:
    """name -> version from `pip freeze --all` (editable or URL installs are kept by name)."""
    out = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if "==" in line:
            name, version = line.split("==", 1)
        elif " @ " in line:
            name, version = line.split(" @ ", 1)
        else:
            continue
        out[normalise(name)] = version.strip()
    return out


def normalise(name: str) -> str:
    """PEP 503's normalised project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


# `lspci -nn` (and `-Dnn`): "0005:00:00.0 Bridge [0680]: NVIDIA Corporation Device [10de:1af1] (rev a1)".
# The vendor:device pair is the last bracketed pair of four hex digits before an optional "(rev xx)";
# names may carry brackets of their own ("GA100 [A100 SXM4 80GB]").
_LSPCI_NN = re.compile(
    r"^(?P<slot>(?:[0-9a-f]{4}:)?[0-9a-f]{2}:[0-9a-f]{2}\.[0-7])\s+"
    r"(?P<class_name>[^\[]+?)\s+\[(?P<class>[0-9a-f]{4})\]:\s+"
    r"(?P<name>.*?)\s*\[(?P<vendor>[0-9a-f]{4}):(?P<device>[0-9a-f]{4})\]"
    r"(?:\s+\(rev [0-9a-f]+\))?(?:\s+\(prog-if.*)?\s*$",
    re.IGNORECASE,
)

# NVSwitch chips as the host sees them: NVIDIA (10de) devices of PCI class 0680 ("Bridge", other), the
# class the NVSwitch kernel driver claims. NVIDIA made other 10de:0680 devices too (the nForce
# chipsets' Ethernet, e.g. MCP61's 10de:03ef), so a device counts only by a known NVSwitch ID or a
# name pci.ids gives as "... NVSwitch". IDs (pci.ids, NVIDIA's Fabric Manager user guide):
#   1ac2  NVSwitch gen1, HGX-2 (V100)
#   1af1  NVSwitch gen2, HGX A100 ("GA100 [A100 NVSwitch]"; older pci.ids say "Device")
#   22a3  NVSwitch gen3, HGX H100/H200 ("GH100 [H100 NVSwitch]")
# HGX B200/B300's NVSwitches are not PCI devices on the host (the guide), and GB200/GB300 compute
# trays carry none: lspci cannot find them there (gpu_services_fabricmanager: on).
NVSWITCH_DEVICE_IDS = {"1ac2": 1, "1af1": 2, "22a3": 3}


def pci_devices(text: str) -> list[dict[str, str]]:
    """`lspci -nn` as [{slot, class, class_name, vendor, device, name}] (hex in lower case). Lines
    of other forms (`lspci` without -nn, the indented detail lines of -v) are skipped."""
    found = []
    for line in text.splitlines():
        match = _LSPCI_NN.match(line.strip())
        if match:
            entry = match.groupdict()
            found.append({k: v.lower() if k in ("class", "vendor", "device") else v for k, v in entry.items()})
    return found


def nvswitches(text: str) -> list[dict[str, str]]:
    """The NVSwitch chips in `lspci -nn` output, each as pci_devices() gives it plus "generation"
    ("" when only the name tells it is one)."""
    switches = []
    for dev in pci_devices(text):
        if dev["vendor"] != "10de" or dev["class"] != "0680":
            continue
        generation = NVSWITCH_DEVICE_IDS.get(dev["device"])
        if generation is None and not re.search(r"\bNVSwitch\b", dev["name"], re.IGNORECASE):
            continue
        switches.append({**dev, "generation": str(generation or "")})
    return switches


# torch/version.py, which torch's build writes: "__version__ = '2.5.1+cu124'" and "cuda = '12.4'" (or,
# from about 2.0, "cuda: Optional[str] = '12.4'"; None in a CPU build).
_TORCH_FIELD = re.compile(r"^(?P<key>__version__|cuda)\s*(?::[^=]*)?=\s*(?P<value>'[^']*'|\"[^\"]*\"|None)\s*$", re.M)


def torch_version_file(text: str) -> dict[str, str | None]:
    """torch/version.py -> {"version": "2.5.1+cu124", "cuda": "12.4"} (cuda None for a CPU build),
    read without importing torch; {} when it has no __version__."""
    found = {m["key"]: None if m["value"] == "None" else m["value"][1:-1] for m in _TORCH_FIELD.finditer(text)}
    if "__version__" not in found:
        return {}
    return {"version": found["__version__"], "cuda": found.get("cuda")}


def parse_os_release(text: str) -> dict[str, str]:
    """/etc/os-release (os-release(5): KEY=value lines, values optionally quoted) as a dict."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and key and not key.startswith("#"):
            value = value.strip()
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                value = value[1:-1]
            out[key] = value
    return out


# --- packages: what apt, dnf and dpkg say about a package's versions ----------------------------
# Read by the driver role's module (gpuenv_apt_pin, on the hosts), by gpuenv.driver and
# gpuenv.services for the filters, and by the tests: the pin's choice and what dpkg lacks or does not
# hold are read straight off these outputs, so they live here with their parsers.


def package_upstream(version: str) -> str:
    """535.309.01 from the Debian version 535.309.01-0+deb12u1 (and from 1:535.309.01-1, and from
    the RPM version-release 580.82.07-1.el9)."""
    return version.split(":", 1)[-1].split("-", 1)[0]


def package_key(version: str) -> tuple[tuple[int, ...], str]:
    """Sort key: the upstream version numerically (a non-numeric one first), then the whole string."""
    parts = package_upstream(version).split(".")
    numeric = tuple(int(p) for p in parts) if all(p.isdigit() for p in parts) else ()
    return numeric, version


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
    return sorted(found, key=package_key, reverse=True)


def madison_from(text: str, repository: str) -> str:
    """The lines of `apt-cache madison` output whose source is the repository (its URL, a flat
    repository's as apt prints it: "pkg | version | http://host/path  Packages"): what only that
    repository offers of a name other repositories have too (Debian's nvidia-driver beside NVIDIA's)."""
    base = repository.rstrip("/")
    kept = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split("|")]
        if len(parts) >= 3:
            source = parts[2].split()[0] if parts[2].split() else ""
            if source.rstrip("/") == base or source.startswith(base + "/"):
                kept.append(line)
    return "".join(f"{line}\n" for line in kept)


def pick_version(available: list[str], pin: str) -> str | None:
    """The newest version matching a branch pin ("535") or an exact pin ("535.261.03")."""
    if "." in pin:
        matching = [v for v in available if package_upstream(v) == pin]
    else:
        matching = [v for v in available if package_upstream(v).split(".")[0] == pin]
    return max(matching, key=package_key) if matching else None


def pin_choice(madison: str, pin: str) -> dict[str, object]:
    """What a pin picks from `apt-cache madison` (or repoquery) text: {"version": the newest matching
    package version or None, "upstream": its upstream part or None, "available": every version offered,
    newest first}; the shape the roles' refusals read."""
    available = parse_madison(madison)
    version = pick_version(available, pin)
    return {"version": version, "upstream": package_upstream(version) if version else None, "available": available}


# The format every reader of dpkg's state asks for: parse_dpkg_query reads it.
DPKG_QUERY_FORMAT = "${db:Status-Abbrev} ${Package} ${Version}\n"


def parse_dpkg_query(text: str) -> dict[str, dict[str, str]]:
    """`dpkg-query -W -f DPKG_QUERY_FORMAT PKG...` as {package: {"want": "i"|"h"|..., "state":
    "i"|"n"|..., "version": ...}}. Status-Abbrev is three characters: the selection (h: hold), the
    package state (i: installed) and the error flag."""
    found: dict[str, dict[str, str]] = {}
    for line in text.splitlines():
        if len(line) < 5 or line[3] != " ":
            continue
        fields = line[4:].split()
        if not fields:
            continue
        found[fields[0]] = {"want": line[0], "state": line[1], "version": fields[1] if len(fields) > 1 else ""}
    return found


def dpkg_unsatisfied(status: dict[str, dict[str, str]], wanted: list[str]) -> list[str]:
    """The entries of an apt install list ("pkg" or "pkg=version") that dpkg does not have."""
    missing = []
    for entry in wanted:
        name, _, version = entry.partition("=")
        have = status.get(name)
        if have is None or have["state"] != "i" or (version and have["version"] != version):
            missing.append(entry)
    return missing


def dpkg_unheld(status: dict[str, dict[str, str]], packages: list[str]) -> list[str]:
    """The packages dpkg does not hold (selection "h"), whether installed or not."""
    return [p for p in packages if status.get(p, {}).get("want") != "h"]


def parse_rpm_qa(text: str) -> dict[str, str]:
    """`rpm -qa --qf '%{NAME} %{VERSION}-%{RELEASE}\\n' PATTERN...` as {package: version-release}."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 2:
            found[fields[0]] = fields[1]
    return found


# --- LD_LIBRARY_PATH in a shell script or /etc/environment -------------------------------------
_ASSIGN = re.compile(r"^\s*(?:export\s+)?(?P<name>[A-Za-z_][A-Za-z0-9_]*)=(?P<value>.*)$")
# The variable's own value inside a new one: $LD_LIBRARY_PATH, ${LD_LIBRARY_PATH} and the
# ${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}} of NVIDIA's post-installation steps.
_SELF = re.compile(r"\$\{LD_LIBRARY_PATH(?::[-+][^{}]*(?:\{[^{}]*\}[^{}]*)*)?\}|\$LD_LIBRARY_PATH\b")
_VAR = re.compile(r"\$\{(?P<a>[A-Za-z_][A-Za-z0-9_]*)\}|\$(?P<b>[A-Za-z_][A-Za-z0-9_]*)")
_MARK = "\0"


def _value(raw: str) -> str:
    text = raw.strip()
    if text and text[0] in "'\"":
        end = text.find(text[0], 1)
        return text[1:end] if end > 0 else text[1:]
    return re.split(r"\s+#|\s*;", text, maxsplit=1)[0].strip()


def ld_library_path(text: str, home: str) -> list[str]:
    """The directories a shell script (or /etc/environment) puts on LD_LIBRARY_PATH, in order, with
    $HOME, ~ and the variables the script sets itself expanded; entries that still hold an unknown
    variable are left out."""
    known = {"HOME": home}
    current: list[str] = []
    for line in text.splitlines():
        match = _ASSIGN.match(line)
        if not match:
            continue
        value = _value(match["value"])
        if match["name"] != "LD_LIBRARY_PATH":
            known[match["name"]] = _VAR.sub(lambda m: known.get(m["a"] or m["b"], m[0]), value)
            continue
        new: list[str] = []
        for raw in _SELF.sub(f":{_MARK}:", value).split(":"):
            if _MARK in raw:
                new += current
                continue
            part = _VAR.sub(lambda m: known.get(m["a"] or m["b"], m[0]), raw)
            part = home + part[1:] if part.startswith("~") else part
            if part.startswith("/") and "$" not in part:
                new.append(part.rstrip("/") or "/")
        current = list(dict.fromkeys(new))
    return current


# --- systemctl show ------------------------------------------------------------------------------
# The properties every reader of a unit's state asks `systemctl show --property=...` for.
SYSTEMCTL_SHOW_PROPERTIES = "Id,LoadState,ActiveState,UnitFileState"


def parse_systemctl_show(text: str) -> dict[str, dict[str, str]]:
    """`systemctl show --property=SYSTEMCTL_SHOW_PROPERTIES -- UNIT...` as {unit id: {property:
    value}}: one block of Key=Value lines per unit, blocks separated by a blank line. A unit that
    does not exist has a block too, with LoadState=not-found."""
    units: dict[str, dict[str, str]] = {}
    for block in text.strip().split("\n\n"):
        props = dict(line.partition("=")[::2] for line in block.splitlines() if "=" in line)
        if props.get("Id"):
            units[props["Id"]] = props
    return units


# --- deb822: a Packages index, a .deb's control, a Release file ----------------------------------
def parse_deb822(text: str) -> list[dict[str, str]]:
    """Stanzas separated by blank lines, as field -> value; a continuation line (one that starts with
    a space or a tab) is joined to its field's value by a newline."""
    stanzas: list[dict[str, str]] = []
    for block in text.strip().split("\n\n"):
        fields: dict[str, str] = {}
        key = ""
        for line in block.splitlines():
            if line.startswith((" ", "\t")) and key:
                fields[key] += "\n" + line.strip()
            elif ":" in line:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        if fields:
            stanzas.append(fields)
    return stanzas
