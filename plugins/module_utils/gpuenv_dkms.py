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

import hashlib
import json
import os
import re
import shutil
import tarfile
from typing import Any

from ansible.module_utils.gpuenv_cudnn_files import sha256_of
from ansible.module_utils.gpuenv_hostparse import parse_os_release

# The fields of a cache key, in the order the role's messages name them.
KEY_FIELDS = ("package", "version", "kernel", "kernel_package", "config_sha256", "arch", "os", "signer")
# dh_dkms's generated postinst names the module and version DKMS knows it by.
_POSTINST_VAR = re.compile(r"^(DKMS_NAME|DKMS_VERSION)=(\S+)\s*$", re.MULTILINE)


def cache_key(fields: dict[str, str]) -> str:
    """The entry's name: a digest of every field, so that any difference is another entry."""
    missing = [f for f in KEY_FIELDS if f not in fields]
    if missing:
        raise ValueError(f"cache key without {', '.join(missing)}")
    text = json.dumps({f: str(fields[f]) for f in KEY_FIELDS}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def os_release_id(text: str) -> str:
    """The OS release ("debian 13") from /etc/os-release: the release whose DKMS and compiler built the module."""
    values = parse_os_release(text)
    return f"{values.get('ID', 'unknown')} {values.get('VERSION_ID', '')}".strip()


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
    """One entry as the plan sees it: {"state": "hit", "entry": ...}, {"state": "miss"}, or
    {"state": "refused", "why": ...} for one that is damaged or does not describe its file."""
    meta_path = os.path.join(cache_dir, key + ".json")
    tar_path = os.path.join(cache_dir, key + ".tar.gz")
    if not os.path.exists(meta_path):
        return {"state": "miss"}
    try:
        with open(meta_path) as handle:
            entry = json.load(handle)
        recorded = str(entry["sha256"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        return {"state": "refused", "why": f"its record {meta_path} cannot be read ({err})"}
    if entry.get("key") != key:
        return {"state": "refused", "why": f"its record {meta_path} is for another key ({entry.get('key')})"}
    if not os.path.exists(tar_path):
        return {"state": "refused", "why": f"{tar_path} is missing"}
    actual = sha256_of(tar_path)
    if actual != recorded:
        return {
            "state": "refused",
            "why": f"{tar_path} has sha256 {actual}, not the {recorded} the cache recorded",
        }
    entry["file"] = tar_path
    return {"state": "hit", "entry": entry}


def plan(cache_dir: str, hosts: list[dict[str, Any]], wait: bool = True) -> dict[str, Any]:
    """For each host (in play order, each with its kernels' keys): the entries it restores, the
    kernels it builds, and (wait) the earlier host it waits for when every kernel it lacks is being
    built by one. An entry that fails its check counts as missing, and says why."""
    seen: dict[str, dict[str, Any]] = {}
    building: dict[str, str] = {}  # key -> the host that builds it
    out: dict[str, dict[str, Any]] = {}
    for host in hosts:
        name = str(host["host"])
        restore: list[dict[str, Any]] = []
        build: list[dict[str, Any]] = []
        notes: list[str] = []
        for item in host.get("kernels") or []:
            key = str(item["key"])
            if key not in seen:
                seen[key] = read_entry(cache_dir, key)
                if seen[key]["state"] == "refused":
                    notes.append(
                        f"the cached module for kernel {item['kernel']} (entry {key}) is refused: {seen[key]['why']};"
                        " this host builds it and replaces the entry"
                    )
            state = seen[key]
            if state["state"] == "hit":
                restore.append({"kernel": item["kernel"], **state["entry"]})
            else:
                build.append(item)
        waits = [building[b["key"]] for b in build if b["key"] in building]
        wait_for = waits[0] if wait and build and len(waits) == len(build) else None
        if wait_for is None:
            for item in build:
                building.setdefault(str(item["key"]), name)
        out[name] = {
            "restore": restore,
            "build": [] if wait_for else build,
            "wait": build if wait_for else [],
            "wait_for": wait_for,
            "notes": notes,
        }
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
