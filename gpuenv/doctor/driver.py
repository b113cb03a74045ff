"""The driver and what stands around it: the loaded kernel module, the user-space libraries and
nvidia-smi, the driver packages, the GPUs, nouveau, Secure Boot and the OS. Read only; every output is
read by the parser the rest of gpuenv uses for it (gpuenv.module_utils.gpuenv_hostparse, gpuenv.probes,
gpuenv.driver)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gpuenv import probes
from gpuenv.compat import CompatData
from gpuenv.doctor.host import Host
from gpuenv.module_utils import gpuenv_hostparse as hostparse
from gpuenv.rules import gpu_cc
from gpuenv.verify import host as verify_host

PROC_VERSION = "/proc/driver/nvidia/version"
EFIVARS = "/sys/firmware/efi/efivars"
# The packages whose version is the driver's (Debian, Ubuntu, NVIDIA's repositories, RPM distributions).
_DRIVER_PACKAGE = re.compile(
    r"^(libcuda1|nvidia-driver(-[0-9]+)?(-open|-server)?|libnvidia-compute-[0-9]+(-server)?|nvidia-kernel-dkms"
    r"|nvidia-open-kernel-dkms|nvidia-driver-cuda-libs|nvidia-driver-libs|libnvidia-tesla-[0-9]+-cuda1|cuda-drivers)$"
)
DPKG_PATTERNS = ("nvidia-*", "libnvidia-*", "libcuda1", "cuda-*", "libcudnn*", "cudnn*")
RPM_PATTERNS = ("nvidia-*", "kmod-nvidia*", "akmod-nvidia*", "xorg-x11-drv-nvidia*", "cuda-*", "libcudnn*")
# How os-release's ID reads as Ansible's distribution fact, which gpuenv's data matches on.
_DISTRIBUTION = {"debian": "Debian", "ubuntu": "Ubuntu", "rhel": "RedHat", "rocky": "Rocky", "almalinux": "AlmaLinux"}


@dataclass
class Package:
    name: str
    version: str
    manager: str  # dpkg or rpm


@dataclass
class Gpu:
    name: str
    cc: str | None
    source: str  # nvidia-smi, lspci or --gpu


@dataclass
class Driver:
    kernel: str | None = None  # the loaded module's version (/proc/driver/nvidia/version)
    flavor: str | None = None  # open or proprietary
    smi: str | None = None  # where nvidia-smi is
    smi_version: str | None = None
    smi_error: str | None = None  # what nvidia-smi said when it did not answer
    mismatch: bool = False  # nvidia-smi said "Driver/library version mismatch"
    nvml_library: str | None = None  # the library version nvidia-smi names then
    libraries: dict[str, str] = field(default_factory=dict)  # soname -> the file the loader's cache gives
    packages: list[Package] = field(default_factory=list)
    module_file: str | None = None  # the installed module (modinfo -F filename)
    module_signer: str | None = None
    loaded_modules: list[str] = field(default_factory=list)  # nvidia* and nouveau
    secure_boot: str = "absent"  # on, off, or absent (no UEFI variable: a BIOS boot or no efivarfs)
    secure_boot_var: str | None = None
    nouveau_blacklist: str | None = None  # the modprobe.d file that blacklists nouveau

    @property
    def library_version(self) -> str | None:
        """The user-space libraries' version: libcuda's (else NVML's) file as the loader's cache finds it."""
        for soname in ("libcuda.so.1", "libnvidia-ml.so.1"):
            stem = soname.rsplit(".", 1)[0] + "."
            name = self.libraries.get(soname, "").rsplit("/", 1)[-1]
            if name.startswith(stem) and re.fullmatch(r"[0-9]+\.[0-9]+(\.[0-9]+)?", name[len(stem) :]):
                return name[len(stem) :]
        return None

    @property
    def package_version(self) -> str | None:
        versions = [hostparse.package_upstream(p.version) for p in self.packages if _DRIVER_PACKAGE.match(p.name)]
        return max(versions, key=lambda v: tuple(int(x) for x in re.findall(r"[0-9]+", v)), default=None)

    @property
    def installed(self) -> tuple[str, str] | None:
        """The user space installed (version, and how doctor knows it), whether or not it runs."""
        if self.smi_version:
            return self.smi_version, str(self.smi)
        if self.library_version:
            lib = self.libraries.get("libcuda.so.1") or self.libraries.get("libnvidia-ml.so.1")
            return self.library_version, str(lib)
        if self.nvml_library:
            return self.nvml_library, f"the NVML library version {self.smi} names"
        if self.package_version:
            names = [p.name for p in self.packages if _DRIVER_PACKAGE.match(p.name)]
            return self.package_version, f"package {names[0]}"
        return None

    @property
    def effective(self) -> tuple[str, str] | None:
        """The driver a CUDA program meets: the loaded module, else the user space that loads at boot."""
        if self.kernel:
            return self.kernel, PROC_VERSION
        return self.installed

    @property
    def nouveau(self) -> bool:
        return "nouveau" in self.loaded_modules


def packages(host: Host) -> list[Package]:
    """The NVIDIA, CUDA and cuDNN packages installed (dpkg and rpm, where each is present)."""
    found: list[Package] = []
    run = host.run(["dpkg-query", "-W", "-f", "${db:Status-Abbrev} ${Package} ${Version}\n", *DPKG_PATTERNS])
    if run is not None:  # exit 1 when a pattern matches nothing; the rest is still listed
        for name, entry in hostparse.parse_dpkg_query(run.stdout).items():
            if entry["state"] == "i":
                found.append(Package(name, entry["version"], "dpkg"))
    run = host.run(["rpm", "-qa", "--qf", "%{NAME} %{VERSION}-%{RELEASE}\n", *RPM_PATTERNS])
    if run is not None and run.returncode == 0:
        found += [Package(n, v, "rpm") for n, v in hostparse.parse_rpm_qa(run.stdout).items()]
    return found


def probe(host: Host, cache: dict[str, list[str]]) -> Driver:
    """The driver as the host has it; `cache` is the loader's cache (`ldconfig -p`, parsed)."""
    found = Driver()
    parsed = hostparse.parse_proc_version(host.read(PROC_VERSION) or "")
    if parsed:
        found.kernel, found.flavor = parsed["version"], parsed["flavor"]
    found.smi = host.which("nvidia-smi")
    if found.smi:
        run = host.run([found.smi, "--query-gpu=driver_version", "--format=csv,noheader"])
        if run is None:
            # Found but not run: a --root tree's commands would describe this machine, not the tree.
            found.smi_error = "present, not run (another host's tree: its commands are not run)"
        else:
            said = run.stdout + run.stderr
            found.smi_version, found.mismatch = hostparse.parse_smi_driver(run.returncode, said)
            if found.smi_version is None:
                found.smi_error = said.strip()[:300] or f"exit {run.returncode}"
                found.nvml_library = hostparse.smi_nvml_version(said)
    for soname in ("libcuda.so.1", "libnvidia-ml.so.1"):
        if cache.get(soname):
            found.libraries[soname] = host.real(cache[soname][0]) or cache[soname][0]
    found.packages = packages(host)
    modinfo = lambda argv: host.run(argv, 30)  # noqa: E731 - verify's modinfo reader, through doctor's runner
    found.module_file = verify_host.module_field("filename", modinfo)
    if found.module_file:
        found.module_signer = verify_host.module_field("signer", modinfo)
    loaded = hostparse.loaded_modules(host.read("/proc/modules") or "")
    found.loaded_modules = [m for m in loaded if m.startswith("nvidia") or m == "nouveau"]
    for conf in [*host.glob("/etc/modprobe.d", "*.conf"), *host.glob("/usr/lib/modprobe.d", "*.conf")]:
        if re.search(r"^\s*blacklist\s+nouveau\b", host.read(conf) or "", re.M):
            found.nouveau_blacklist = found.nouveau_blacklist or conf
    variables = host.glob(EFIVARS, "SecureBoot-*")
    if variables:
        found.secure_boot_var = variables[0]
        found.secure_boot = "on" if hostparse.secure_boot_on(host.read_bytes(variables[0]) or b"") else "off"
    return found


def gpus(host: Host, drv: Driver, data: CompatData) -> list[Gpu]:
    """The NVIDIA GPUs: as nvidia-smi lists them, else as lspci names them (their compute capability
    from gpuenv's data, where it knows the model)."""
    if drv.smi and drv.smi_version:
        run = host.run([drv.smi, "--query-gpu=name,compute_cap", "--format=csv,noheader"])
        if run is not None and run.returncode == 0:
            listed = probes.parse_nvidia_smi_gpus(run.stdout)
            return [Gpu(g["name"], g["cc"] or gpu_cc(g["name"], data), "nvidia-smi") for g in listed]
    run = host.run(["lspci", "-nn"])
    found = []
    for dev in hostparse.pci_devices(run.stdout if run else ""):
        if dev["vendor"] == "10de" and dev["class"] in ("0300", "0302"):
            # "GA102GL [A10]": pci.ids gives the chip, then the product in brackets.
            names = re.findall(r"\[([^\]]+)\]", dev["name"])
            name = names[-1] if names else dev["name"]
            found.append(Gpu(name, gpu_cc(name, data), "lspci"))
    return found


def os_release(host: Host, data: CompatData) -> tuple[str, str | None]:
    """The OS as people read it ("Debian GNU/Linux 12 (bookworm)") and gpuenv's name for it
    ("debian12"; None for an OS gpuenv's data does not know)."""
    info = hostparse.parse_os_release(host.read("/etc/os-release") or "")
    ident = info.get("ID", "")
    like = f"{ident} {info.get('ID_LIKE', '')}"
    version = info.get("VERSION_ID", "")
    facts = {
        "distribution": _DISTRIBUTION.get(ident, ident.capitalize()),
        "distribution_version": version,
        "distribution_major_version": version.split(".")[0],
        "os_family": "RedHat" if re.search(r"rhel|fedora|centos", like) else "Debian" if "debian" in like else "",
    }
    return info.get("PRETTY_NAME", "an unknown OS (no /etc/os-release)"), data.os_from_facts(facts)
