"""The host's findings, judged once for the whole host: the driver and the kernel (a reboot pending,
nouveau, Secure Boot, no module loaded), the loader's cache against the cuDNN copied into a toolkit
tree, and two toolkits that a build would mix. Each environment's are in findings."""

from __future__ import annotations

import posixpath
from collections.abc import Callable

from gpuenv.doctor.cuda import Cudnn, Toolkit
from gpuenv.doctor.driver import PROC_VERSION, Driver, Gpu
from gpuenv.doctor.findings import ERROR, WARNING, Finding


def host_findings(drv: Driver, gpus: list[Gpu]) -> list[Finding]:
    """The driver's and the kernel's: a reboot pending, nouveau, Secure Boot, no module at all."""
    found = []
    libs = drv.library_version or drv.nvml_library
    if drv.kernel and (drv.mismatch or (libs and libs != drv.kernel)):
        lib = drv.libraries.get("libcuda.so.1") or drv.libraries.get("libnvidia-ml.so.1") or drv.smi or ""
        found.append(
            Finding(
                "driver-mismatch",
                ERROR,
                f"the loaded nvidia module is {drv.kernel} but the user-space libraries are "
                f"{libs or 'another version'}: a reboot is pending",
                "the driver's packages were upgraded while the old module stayed loaded; NVML and CUDA refuse to work "
                'across versions: nvidia-smi says "Failed to initialize NVML: Driver/library version mismatch" and '
                "torch.cuda.is_available() is False",
                "reboot; or stop every process on the GPUs (sudo lsof /dev/nvidia*) and reload the modules: sudo rmmod "
                "nvidia_uvm nvidia_drm nvidia_modeset nvidia && sudo modprobe nvidia",
                [],
                where=[PROC_VERSION, *([lib] if lib else [])],
            )
        )
    if drv.nouveau:
        if drv.nouveau_blacklist:
            fix = (
                f"{drv.nouveau_blacklist} blacklists nouveau, but the initramfs that loaded it predates that: "
                "rebuild it (sudo update-initramfs -u; sudo dracut --force on RHEL) and reboot"
            )
        else:
            fix = (
                "blacklist it: printf 'blacklist nouveau\\noptions nouveau modeset=0\\n' | sudo tee "
                "/etc/modprobe.d/blacklist-nouveau.conf, then sudo update-initramfs -u (sudo dracut --force on "
                "RHEL) and reboot; gpuenv's nvidia_driver role does this"
            )
        found.append(
            Finding(
                "nouveau-loaded",
                ERROR,
                "nouveau, the kernel's own driver for NVIDIA GPUs, is loaded",
                "while nouveau holds the GPU the nvidia module cannot bind it: nvidia-smi fails and CUDA sees "
                "no device",
                fix,
                ["nv_nouveau"],
                where=["/proc/modules", *([drv.nouveau_blacklist] if drv.nouveau_blacklist else [])],
            )
        )
    unsigned = drv.secure_boot == "on" and drv.module_file and not drv.module_signer and not drv.kernel
    if unsigned:
        found.append(
            Finding(
                "secure-boot-unsigned",
                ERROR,
                "Secure Boot is on and the nvidia module is not signed: the kernel refuses to load it",
                "with Secure Boot on the kernel loads only modules signed by a trusted key; modinfo shows no "
                "signer for "
                f'{drv.module_file}, so modprobe fails with "Key was rejected by service"',
                "sign it with an enrolled Machine Owner Key: on Debian, sudo mokutil --import /var/lib/dkms/mok.pub, "
                "reboot and confirm the key in the MOK manager, then sudo dpkg-reconfigure nvidia-kernel-dkms (gpuenv: "
                "nvidia_driver_secure_boot: sign); or turn Secure Boot off in the firmware",
                ["debian_secureboot"],
                where=[str(drv.secure_boot_var), str(drv.module_file)],
            )
        )
    on_bus = [g for g in gpus if g.source == "lspci"]
    if on_bus and not drv.kernel and not drv.nouveau and not unsigned:
        names = ", ".join(g.name for g in on_bus)
        why = (
            f"the module is installed ({drv.module_file}) but not loaded: built for another kernel, or it failed "
            "to load (dmesg says why)"
            if drv.module_file
            else "no nvidia module is installed for the running kernel"
        )
        fix = (
            "sudo modprobe nvidia (nvidia-current with Debian's packages) and read dmesg if it fails; a DKMS "
            "module missing for the running kernel: sudo dkms autoinstall"
            if drv.module_file
            else "install the driver (gpuenv: playbooks/site.yml; Debian: apt install nvidia-driver) and reboot"
        )
        found.append(
            Finding(
                "driver-not-loaded",
                ERROR,
                f"{names} on the PCI bus, but no NVIDIA kernel module is loaded",
                why,
                fix,
                [],
                where=[PROC_VERSION],
            )
        )
    return found


def loader_findings(copies: list[Cudnn]) -> list[Finding]:
    """A toolkit tree's cuDNN in a directory the loader is told about, but not in its cache."""
    found = []
    for copy in (c for c in copies if c.loader):
        other = [p for p in copy.loader if "the loader finds" in p]
        grouped: dict[str, list[str]] = {}
        for problem in copy.loader:
            name, _, what = problem.partition(": ")
            grouped.setdefault(what, []).append(name)
        said = "; ".join(f"{what}: {', '.join(names)}" for what, names in grouped.items())
        fix = f"sudo ldconfig (it reads {copy.configured} again and caches the files copied in since it last ran)"
        if other:
            fix += "; another copy comes first in the cache: remove it, or the ld.so.conf.d file that names it"
        found.append(
            Finding(
                "cudnn-loader-cache",
                ERROR,
                f"cuDNN {copy.version or ''} in {copy.lib}: {len(copy.loader)} of {len(copy.sonames)} libraries "
                "are not where the loader's cache looks",
                f"{said}. {copy.configured} names {_as_written(copy)}, but "
                + ("another copy comes first in the cache" if other else "the cache predates the copy")
                + "; cuDNN loads its parts by name, so a program fails with "
                + f'"Could not load library {copy.sonames[-1]}"',
                fix,
                ["ldconfig_man"],
                where=[copy.lib, str(copy.configured)],
            )
        )
    return found


def copies_findings(
    copies: list[Cudnn], cache: dict[str, list[str]], real: Callable[[str], str | None]
) -> list[Finding]:
    """Two cuDNN copies of one major that the loader's cache both lists (NVIDIA's packages in the
    system directory and a tarball's in a CUDA tree, the usual pair): which one a program loads by
    name, and why that one: ldconfig caches directories in the order /etc/ld.so.conf reads them, its
    own trusted directories last."""
    found = []
    for major in sorted({c.major for c in copies if c.major}):
        soname = f"libcudnn.so.{major}"
        listed = [real(posixpath.dirname(p)) for p in cache.get(soname, [])]
        pair = [c for c in copies if c.kind in ("tree", "system") and c.lib in listed]
        if len(pair) < 2:
            continue
        pair.sort(key=lambda c: listed.index(c.lib))
        first, *others = pair
        versions = {c.version for c in pair}
        why = "; ".join(
            f"{_as_written(c)} is named by {c.configured}"
            if c.configured
            else f"{c.lib} is a directory ldconfig reads last"
            for c in pair
        )
        found.append(
            Finding(
                "cudnn-copies",
                ERROR if len(versions) > 1 else WARNING,
                f"two cuDNN {major} copies the loader knows: programs load {first.lib}/{soname}"
                f" (cuDNN {first.version or '?'}, {_kind(first)}), not "
                + ", ".join(f"{c.lib} (cuDNN {c.version or '?'}, {_kind(c)})" for c in others),
                f"ldconfig caches the directories in the order /etc/ld.so.conf and its ld.so.conf.d files name them "
                f"(the files in name order), so the first of them holds the copy a program gets by name: {why}. "
                "A cuDNN loads its parts by name too, so the copies must not be mixed"
                + (" (their versions differ)" if len(versions) > 1 else ""),
                "keep one copy: where the stack's cuDNN comes from NVIDIA's packages (cudnn_source: nvidia_repo), "
                "take the tarball's out of the CUDA tree (gpuenv's cudnn role does, for the trees it filled); where "
                f"it is the tarball's, remove the packages (sudo apt remove 'libcudnn{major}*'); then sudo ldconfig",
                ["ldconfig_man"],
                where=[c.lib for c in pair],
            )
        )
    return found


def _kind(copy: Cudnn) -> str:
    return {"tree": f"the CUDA tree {copy.owner}", "system": "the system directory, NVIDIA's packages' place"}.get(
        copy.kind, copy.kind
    )


def _named(t: Toolkit) -> str:
    return t.package or ("/usr/local/cuda" if t.local_cuda else t.path)


def toolkit_findings(toolkits: list[Toolkit]) -> list[Finding]:
    """The nvcc a shell finds first and /usr/local/cuda are different CUDA releases."""
    first = next((t for t in toolkits if t.on_path), None)
    local = next((t for t in toolkits if t.local_cuda), None)
    if first is None or local is None or first is local or not first.series or first.series == local.series:
        return []
    return [
        Finding(
            "toolkit-conflict",
            WARNING,
            f"the nvcc on PATH is CUDA {first.version} ({_named(first)}) but /usr/local/cuda is CUDA {local.version}",
            "builds take one or the other: torch's CUDA extensions use $CUDA_HOME, else the nvcc on PATH "
            f"(here {first.path}), else /usr/local/cuda, while Makefiles and NVIDIA's own samples use "
            f"/usr/local/cuda; a build then mixes CUDA {first.series}'s compiler with CUDA {local.series}'s headers "
            'and libraries, or torch stops it with "The detected CUDA version (...) mismatches the version that was '
            'used to compile PyTorch (...)"',
            "keep one toolkit: "
            + (
                f"sudo apt remove {first.package.split()[0]} (the distribution's CUDA, whose {first.path} a shell "
                "finds first)"
                if first.package
                else f"take {first.path + '/bin' if first.kind == 'tree' else posixpath.dirname(first.path)} off PATH"
            )
            + f", or put {local.path}/bin first on PATH and export CUDA_HOME={local.path} where builds run; "
            "gpuenv's cuda_toolkit role installs one tree and points /usr/local/cuda at it",
            ["pt_cpp_extension"],
            where=[first.path, *([local.path] if local.path != first.path else [])],
        )
    ]


def _as_written(copy: Cudnn) -> str:
    """The directory as the ld.so.conf file writes it, and where it leads when that is a link: the
    person reading the finding looks for their own line in the file."""
    written = copy.configured_as or copy.lib
    return written if written == copy.lib else f"{written} (that is, {copy.lib})"
