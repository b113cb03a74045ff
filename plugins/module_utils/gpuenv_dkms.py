"""The fleet's cache of DKMS-built driver modules (the nvidia_driver role, modules gpuenv_dkms_cache).

The first host that builds the module for a kernel hands DKMS's own binaries-only tarball of it
(`dkms mktarball --binaries-only`) to the controller's cache; an identical host gets that tarball
where the package's postinst looks for one (dh_dkms: /usr/share/<name>-dkms/<name>-<version>.dkms.tar.gz),
and the postinst loads it (`dkms ldtarball`) and installs it without building. DKMS stays in charge:
the tarball is removed after the install, so a later kernel upgrade builds as usual.

An entry is keyed by everything the built module depends on: the package and its version, the kernel
release, its package's version and the sha256 of its config (which names the compiler that built it,
CONFIG_CC_VERSION_TEXT), the architecture, the OS release (DKMS's version comes with it) and the
certificate DKMS signs with. Each entry is `<key>.tar.gz` and `<key>.json`, the latter written last and
holding the tarball's sha256: a tarball whose sha256 differs is never installed.

Python 3.8 compatible: the host side runs on the hosts' own Python.
"""

from __future__ import annotations

import os
import re
import shutil
import tarfile
from typing import Any

from ansible.module_utils.gpuenv_buildcache import digest_key
from ansible.module_utils.gpuenv_buildcache import plan as shared_plan
from ansible.module_utils.gpuenv_buildcache import read_entry as shared_read_entry

# The fields of a cache key, in the order the role's messages name them.
KEY_FIELDS = ("package", "version", "kernel", "kernel_package", "config_sha256", "arch", "os", "signer")
# dh_dkms's generated postinst names the module and version DKMS knows it by.
_POSTINST_VAR = re.compile(r"^(DKMS_NAME|DKMS_VERSION)=(\S+)\s*$", re.MULTILINE)


def cache_key(fields: dict[str, str]) -> str:
    """The entry's name: a digest of every field, so that any difference is another entry."""
    key: str = digest_key(fields, KEY_FIELDS)
    return key


def postinst_module(text: str) -> dict[str, str] | None:
    """DKMS's name and version of the module from a dh_dkms postinst, and where it loads a tarball from;
    None for a postinst dh_dkms did not write."""
    found = dict(_POSTINST_VAR.findall(text))
    if "DKMS_NAME" not in found or "DKMS_VERSION" not in found or "common.postinst" not in text:
        return None
    name, version = found["DKMS_NAME"], found["DKMS_VERSION"]
    return {"dkms_name": name, "dkms_version": version, "tarball_dir": f"/usr/share/{name}-dkms"}


def host_keys(
    *,
    package: str,
    version: str,
    kernels: dict[str, str],
    config_sha256: dict[str, str],
    arch: str,
    os_id: str,
    signer: str,
) -> list[dict[str, Any]]:
    """This host's key for each kernel; a kernel without a config (/boot/config-K) gets none."""
    out = []
    for kernel in sorted(kernels):
        if not config_sha256.get(kernel):
            continue
        fields = {
            "package": package,
            "version": version,
            "kernel": kernel,
            "kernel_package": kernels[kernel],
            "config_sha256": config_sha256[kernel],
            "arch": arch,
            "os": os_id,
            "signer": signer,
        }
        out.append({"kernel": kernel, "key": cache_key(fields), "fields": fields})
    return out


def read_entry(cache_dir: str, key: str) -> dict[str, Any]:
    """One entry as the plan sees it (gpuenv_buildcache): hit, miss, or refused and why."""
    entry: dict[str, Any] = shared_read_entry(cache_dir, key, ".tar.gz")
    return entry


def plan(cache_dir: str, hosts: list[dict[str, Any]], wait: bool = True) -> dict[str, Any]:
    """For each host (in play order, each with its kernels' keys): the entries it restores, the
    kernels it builds, and (wait) the earlier host it waits for when every kernel it lacks is being
    built by one (gpuenv_buildcache). An entry that fails its check counts as missing, and says why."""
    items = [
        {"host": h["host"], "items": [{**k, "name": f"kernel {k['kernel']}"} for k in h.get("kernels") or []]}
        for h in hosts
    ]
    planned = shared_plan(cache_dir, items, ".tar.gz", "module", wait=wait)

    def bare(item: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in item.items() if k != "name"}

    out = {}
    for name, mine in planned["hosts"].items():
        out[name] = {
            **mine,
            "restore": [{"kernel": r["item"]["kernel"], **r["entry"]} for r in mine["restore"]],
            "build": [bare(i) for i in mine["build"]],
            "wait": [bare(i) for i in mine["wait"]],
        }
        del out[name]["refused"]  # DKMS's hosts export every module they build
    return {"hosts": out}


def _members(path: str) -> list[tarfile.TarInfo]:
    with tarfile.open(path, "r:*") as tar:
        return tar.getmembers()


def _relative(name: str) -> str:
    """A member's name without tar's leading "./"."""
    return name[2:] if name.startswith("./") else ("" if name == "." else name)


def check_tarball(path: str, kernel: str, arch: str) -> str | None:
    """Why DKMS's tarball at path cannot give kernel its module; None when it can."""
    try:
        names = [_relative(m.name) for m in _members(path)]
    except (OSError, tarfile.TarError) as err:
        return f"it is not a readable tarball ({err})"
    unsafe = [n for n in names if n.startswith("/") or ".." in n.split("/")]
    if unsafe:
        return f"it names paths outside itself ({unsafe[0]})"
    prefix = f"dkms_main_tree/{kernel}/{arch}/module/"
    if not any(n.startswith(prefix) and ".ko" in n for n in names):
        return f"it holds no module for kernel {kernel} ({arch})"
    if "dkms_binaries_only/dkms.conf" not in names:
        return "it is not DKMS's binaries-only tarball (no dkms_binaries_only/dkms.conf)"
    return None


def merge_tarballs(sources: list[str], dest: str) -> None:
    """One DKMS tarball holding every kernel of the sources (each from `dkms mktarball -k K`): their
    dkms_binaries_only is the same, their dkms_main_tree/K differ. One source is copied as it is
    (recompressing Debian 12's uncompressed modules costs seconds of CPU); several are merged, with
    gzip's fastest level. Written beside dest, then renamed."""
    tmp = dest + ".part"
    if len(sources) == 1:
        shutil.copyfile(sources[0], tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
        return
    names = set()
    with tarfile.open(tmp, "w:gz", compresslevel=1) as out:
        for source in sources:
            with tarfile.open(source, "r:*") as tar:
                for member in tar.getmembers():
                    if member.name in names:
                        continue
                    names.add(member.name)
                    data = tar.extractfile(member) if member.isfile() else None
                    out.addfile(member, data)
    os.chmod(tmp, 0o644)
    os.replace(tmp, dest)
