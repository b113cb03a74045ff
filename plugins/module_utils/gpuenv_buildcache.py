"""The controller's caches of what one host of a fleet built and the others take instead of building
(gpuenv_dkms_cache: the driver's DKMS module; gpuenv_env_cache: the PyTorch environment).

An entry is a file `<key><ext>` and its record `<key>.json`, the record fetched last: it is what
makes an entry, and holds the file's sha256. A key is a digest of everything the built artifact
depends on, so that any difference is another entry. The plan, read on the controller once for a
play, gives each key to one host to build; the other hosts with that key wait for it, and a host
whose key has an entry restores it. An entry whose file is missing or whose sha256 is not the
recorded one is refused, and its host builds it again and replaces it.

Python 3.8 compatible: the host side runs on the hosts' own Python.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from ansible.module_utils.gpuenv_cudnn_files import sha256_of
from ansible.module_utils.gpuenv_hostparse import parse_os_release


def digest_key(fields: dict[str, Any], names: tuple[str, ...]) -> str:
    """An entry's name: a digest of the named fields, every one required."""
    missing = [f for f in names if f not in fields]
    if missing:
        raise ValueError(f"cache key without {', '.join(missing)}")
    text = json.dumps({f: str(fields[f]) for f in names}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def os_release_id(text: str) -> str:
    """The OS release ("debian 13") from /etc/os-release: the release whose compiler, DKMS and libraries
    a build used."""
    values = parse_os_release(text)
    return f"{values.get('ID', 'unknown')} {values.get('VERSION_ID', '')}".strip()


def host_os_release(path: str) -> str:
    """The host's OS release ("debian 13") from its os-release file; "unknown" where it cannot be read."""
    try:
        with open(path, errors="replace") as handle:
            return os_release_id(handle.read())
    except OSError:
        return os_release_id("")


def read_entry(cache_dir: str, key: str, ext: str) -> dict[str, Any]:
    """One entry as the plan sees it: {"state": "hit", "entry": ...} (its record, with "file" where it
    lies), {"state": "miss"}, or {"state": "refused", "why": ...} for one that is damaged or does not
    describe its file."""
    meta_path = os.path.join(cache_dir, key + ".json")
    file_path = os.path.join(cache_dir, key + ext)
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
    if not os.path.exists(file_path):
        return {"state": "refused", "why": f"{file_path} is missing"}
    actual = sha256_of(file_path)
    if actual != recorded:
        return {"state": "refused", "why": f"{file_path} has sha256 {actual}, not the {recorded} the cache recorded"}
    entry["file"] = file_path
    return {"state": "hit", "entry": entry}


def plan(cache_dir: str, hosts: list[dict[str, Any]], ext: str, what: str, wait: bool = True) -> dict[str, Any]:
    """For each host (in play order, each with its "items": a "key" and the "name" the messages give
    it): the entries it restores, the items it builds, and (wait) the earlier host it waits for when
    every item it lacks is being built by one. An entry that fails its check counts as missing, and
    says why in the host's notes; the host that reads it first replaces it ("refused"). `what` names
    the artifact in those notes ("module", "environment")."""
    seen: dict[str, dict[str, Any]] = {}
    building: dict[str, str] = {}  # key -> the host that builds it
    out: dict[str, dict[str, Any]] = {}
    for host in hosts:
        name = str(host["host"])
        restore: list[dict[str, Any]] = []
        build: list[dict[str, Any]] = []
        notes: list[str] = []
        refused: list[str] = []
        for item in host.get("items") or []:
            key = str(item["key"])
            if key not in seen:
                seen[key] = read_entry(cache_dir, key, ext)
                if seen[key]["state"] == "refused":
                    refused.append(key)
                    notes.append(
                        f"the cached {what} for {item['name']} (entry {key}) is refused: {seen[key]['why']};"
                        " this host builds it and replaces the entry"
                    )
            state = seen[key]
            if state["state"] == "hit":
                restore.append({"item": item, "entry": state["entry"]})
            else:
                build.append(item)
        waits = [building[b["key"]] for b in build if b["key"] in building]
        wait_for = waits[0] if wait and build and len(waits) == len(build) else None
        # A host that cannot hand its build over ("exports": false) builds for itself alone.
        if wait_for is None and host.get("exports", True):
            for item in build:
                building.setdefault(str(item["key"]), name)
        out[name] = {
            "restore": restore,
            "build": [] if wait_for else build,
            "wait": build if wait_for else [],
            "wait_for": wait_for,
            "notes": notes,
            # The entries this host replaces: the first host with a refused key builds it, when it
            # can hand its build over.
            "refused": refused if host.get("exports", True) else [],
        }
    return {"hosts": out}
