#!/usr/bin/python
"""Ansible module gpuenv_cudnn_cache: a fleet unpacks each cuDNN tarball once."""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.gpuenv_buildcache import (
    EXT,
    digest_key,
    escalated_user,
    extract_tar,
    host_actions,
    pack_tar,
    plan,
    prune,
    remove_file,
    tree_size,
    work_dir,
)
from ansible.module_utils.gpuenv_cudnn_files import TreeError, checked_sha256, host_lock, unpacked_info

DOCUMENTATION = r"""
module: gpuenv_cudnn_cache
short_description: Share cuDNN's unpacked tarball between the hosts of a fleet through the controller
description:
  - Every host that gets a cuDNN tarball decompresses the same archive (xz, most of half a minute of
    one core for cuDNN 9) into the same directory named by the tarball's sha256. The first host
    unpacks it and hands a zstd tar of the unpacked copy to the controller's cache; the others copy
    that and unpack it in a few seconds instead. The trees are then built from the unpacked copy as
    always (gpuenv_cuda_tree).
  - I(mode=plan) (on the controller, once for the play) reads the cache for every host that must
    unpack, and says which host unpacks, which waits for an earlier host's unpack, and which
    restores. An entry whose file's sha256 is not the one recorded is refused, and its host unpacks
    the tarball instead. Entries beyond the newest I(keep) that no host of the plan uses are removed.
  - I(mode=pack) (on the host that unpacked) writes the tar of its unpacked copy, hashing it as it
    is written, and its record, for the role to fetch.
  - I(mode=unpack) (on the host) hashes the copied tar and, only when its sha256 is the recorded
    one, extracts it into a new directory beside the unpacked copies; only when every file is the
    one the unpack recorded does it move into place. A refused copy leaves nothing, and the
    role fetches the tarball and unpacks it.
options:
  mode:
    description: Which step.
    type: str
    choices: [plan, pack, unpack]
    required: true
  cache_dir:
    description: The controller's cache (plan).
    type: path
  hosts:
    description: >-
      plan, each host that must unpack, in play order: C(host), and the tarball's C(sha256) and
      C(version).
    type: list
    elements: dict
  wait:
    description: >-
      plan, whether a host whose cuDNN an earlier host unpacks waits for it; off for the waiting
      hosts' own second read, which restores what is there and unpacks otherwise.
    type: bool
    default: true
  keep:
    description: plan, how many entries the cache keeps besides those this plan uses (newest first).
    type: int
    default: 2
  unpack_dir:
    description: pack and unpack, the host's directory of unpacked tarballs (cudnn_download_dir).
    type: path
  sha256:
    description: pack, the tarball's sha256, which names its unpacked copy.
    type: str
  version:
    description: pack, the cuDNN's version, for the record.
    type: str
  key:
    description: pack, the key plan gave.
    type: str
  staging_dir:
    description: pack, where the tar and its record are written for the role to fetch.
    type: path
  host:
    description: pack, this host's name, for the record.
    type: str
    default: ""
  entry:
    description: unpack, the entry as plan gave it (its record).
    type: dict
  src:
    description: unpack, the copy of the entry's tar on the host; removed afterwards.
    type: path
  copy_from:
    description: >-
      unpack, the entry's tar on the controller: the task's action copies it to I(src) before the
      unpack (the unpack's sha256 is the copy's check). Without it, I(src) must be on the host already.
    type: path
"""

EXAMPLES = r"""
- name: Plan which host unpacks cuDNN 9.1.0.70 for the others
  gpuenv_cudnn_cache:
    mode: plan
    cache_dir: /var/cache/gpuenv/cudnn-unpacked
    hosts:
      - {host: ws1, sha256: "{{ cudnn_archive.sha256 }}", version: 9.1.0.70}
      - {host: ws2, sha256: "{{ cudnn_archive.sha256 }}", version: 9.1.0.70}
  run_once: true
  delegate_to: localhost
"""

RETURN = r"""
hosts:
  description: >-
    plan, for each host its C(action) (C(build): it unpacks the tarball; C(wait): an earlier host
    does, C(wait_for); C(restore): the C(entry) is in the cache), C(key), C(awaited) (hosts wait for
    its unpack), C(replaces) (its unpack replaces a refused entry) and C(notes).
  type: dict
pruned:
  description: plan, the entries removed (beyond I(keep), not used by this plan).
  type: list
tar:
  description: pack, the tar on the host; empty where nothing was packed (a warning says why).
  type: str
record:
  description: pack, its record on the host.
  type: str
restored:
  description: unpack, whether the unpacked copy is now in place.
  type: bool
refused:
  description: unpack, why the copy was not used (the role then unpacks the tarball).
  type: str
"""

# The fields of an entry's key. The unpacked copy is the tarball's content, laid out by this code's
# unpack (gpuenv_cudnn_files): FORMAT changes when that layout or its record does.
KEY_FIELDS = ("cudnn_sha256", "format")
FORMAT = "1"


def key_of(sha256: str) -> str:
    key: str = digest_key({"cudnn_sha256": checked_sha256(sha256, "sha256"), "format": FORMAT}, KEY_FIELDS)
    return key


def plan_unpacks(cache_dir: str, hosts: list[dict[str, Any]], wait: bool, keep: int) -> dict[str, Any]:
    items = [
        {"host": h["host"], "items": [{"key": key_of(str(h["sha256"])), "name": f"cuDNN {h['version']}"}]}
        for h in hosts
    ]
    out = host_actions(plan(cache_dir, items, EXT, "unpacked copy", wait=wait))
    keys = {str(i["host"]): str(i["items"][0]["key"]) for i in items}
    for name, mine in out.items():
        mine["key"] = keys[name]
    pruned = prune(cache_dir, keep, set(keys.values()))
    return {"hosts": out, "pruned": pruned}


def pack(
    module: AnsibleModule, *, unpack_dir: str, sha256: str, version: str, key: str, staging: str, host: str
) -> dict[str, Any]:
    nothing: dict[str, Any] = {"changed": False, "tar": "", "record": ""}
    escalated = escalated_user()
    if escalated:
        module.warn(
            f"{host} is reached as {escalated} with privilege escalation, and Ansible's fetch would read the tar"
            f" of cuDNN {version} whole into memory: the other hosts unpack the tarball themselves (connect as root"
            " to share it)"
        )
        return nothing
    tar = module.get_bin_path("tar", required=True)
    if module.get_bin_path("zstd") is None:
        module.warn(f"zstd is not installed on {host}: its unpacked cuDNN {version} is not shared (apt install zstd)")
        return nothing
    sha256 = checked_sha256(sha256, "sha256")
    if unpacked_info(unpack_dir, sha256) is None:
        module.warn(f"{host} has no complete unpacked copy of cuDNN {version} in {unpack_dir}/{sha256} to share")
        return nothing
    os.makedirs(staging, mode=0o700, exist_ok=True)
    dest = os.path.join(staging, key + EXT)
    packed = pack_tar(tar, unpack_dir, [sha256], dest)
    if packed["rc"] != 0:
        module.warn(f"tar of {unpack_dir}/{sha256} failed (exit {packed['rc']}): {packed['error']}; it is not shared")
        return nothing
    record = {
        "key": key,
        "cudnn_sha256": sha256,
        "version": version,
        "sha256": packed["sha256"],
        "size": packed["size"],
        # What it takes unpacked: a restoring host checks its room for both first.
        "unpacked_size": tree_size(os.path.join(unpack_dir, sha256)),
        "built_by": host,
    }
    record_path = os.path.join(staging, key + ".json")
    with open(record_path, "w") as handle:
        json.dump(record, handle, indent=1, sort_keys=True)
    return {"changed": True, "tar": dest, "record": record_path}


def unpack(module: AnsibleModule, unpack_dir: str, entry: dict[str, Any], src: str) -> dict[str, Any]:
    """Extract src into a new directory beside the unpacked copies, then move its copy into place only
    when src's sha256 is the entry's and every file is as its unpack recorded. Removes src either way."""
    result: dict[str, Any] = {"changed": False, "restored": False, "refused": ""}
    try:
        sha256 = checked_sha256(entry.get("cudnn_sha256"), "the entry's cudnn_sha256")
        tar = module.get_bin_path("tar", required=True)
        if module.get_bin_path("zstd") is None:
            raise TreeError("zstd is not installed on this host (the role installs it with cudnn_build_cache on)")
    except TreeError as err:
        result["refused"] = str(err)
        remove_file(src)
        return result
    # The placement's lock: a placement beside it (a rerun's, a pull timer's) reads this directory.
    with host_lock(unpack_dir):
        if unpacked_info(unpack_dir, sha256) is not None:
            remove_file(src)
            result["restored"] = True
            return result
        work = work_dir(unpack_dir)
        try:
            result["refused"] = _refusal(extract_tar(tar, src, work, entry.get("sha256")), entry, src, work, sha256)
            if not result["refused"]:
                dest = os.path.join(unpack_dir, sha256)
                # What an unpack that did not finish left (unpacked_info found no complete copy) goes.
                shutil.rmtree(dest, ignore_errors=True)
                os.rename(os.path.join(work, sha256), dest)
                result.update(changed=True, restored=True)
            return result
        finally:
            shutil.rmtree(work, ignore_errors=True)
            remove_file(src)


def _refusal(extracted: dict[str, Any], entry: dict[str, Any], src: str, work: str, sha256: str) -> str:
    """Why the extracted copy is not used, or ""."""
    if extracted["sha256"] != entry.get("sha256"):
        return f"its copy {src} has sha256 {extracted['sha256']}, not the {entry.get('sha256')} the cache recorded"
    if extracted["rc"] != 0:
        return f"tar could not extract its copy {src} (exit {extracted['rc']}): {extracted['error']}"
    if unpacked_info(work, sha256) is None:
        return f"it holds no complete unpacked copy of the tarball {sha256}"
    return ""


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "mode": {"type": "str", "required": True, "choices": ["plan", "pack", "unpack"]},
            "cache_dir": {"type": "path"},
            "hosts": {"type": "list", "elements": "dict"},
            "wait": {"type": "bool", "default": True},
            "keep": {"type": "int", "default": 2},
            "unpack_dir": {"type": "path"},
            "sha256": {"type": "str"},
            "version": {"type": "str"},
            "key": {"type": "str", "no_log": False},
            "staging_dir": {"type": "path"},
            "host": {"type": "str", "default": ""},
            "entry": {"type": "dict"},
            "src": {"type": "path"},
            # The action's (gpuenv.cacheaction), which copies it to src; here only to be documented.
            "copy_from": {"type": "path"},
        },
        required_if=[
            ("mode", "plan", ("cache_dir", "hosts")),
            ("mode", "pack", ("unpack_dir", "sha256", "version", "key", "staging_dir")),
            ("mode", "unpack", ("unpack_dir", "entry", "src")),
        ],
        supports_check_mode=True,
    )
    p = module.params
    mode = p["mode"]
    if mode == "plan":
        os.makedirs(p["cache_dir"], mode=0o755, exist_ok=True)
        try:
            planned = plan_unpacks(p["cache_dir"], p["hosts"], p["wait"], p["keep"])
        except (KeyError, ValueError, TreeError) as err:
            module.fail_json(msg=f"the hosts to plan are malformed: {err}")
        for note in sorted({n for h in planned["hosts"].values() for n in h["notes"]}):
            module.warn(note)
        module.exit_json(changed=bool(planned["pruned"]), **planned)
    if module.check_mode:
        module.exit_json(changed=True, msg="check mode: nothing written")
    if mode == "pack":
        module.exit_json(
            **pack(
                module,
                unpack_dir=p["unpack_dir"],
                sha256=p["sha256"],
                version=p["version"],
                key=p["key"],
                staging=p["staging_dir"],
                host=p["host"],
            )
        )
    try:
        result = unpack(module, p["unpack_dir"], p["entry"], p["src"])
    except OSError as err:
        module.fail_json(msg=f"the cached cuDNN could not be put in place in {p['unpack_dir']}: {err}")
    if result["refused"]:
        module.warn(f"the cached unpacked cuDNN is refused: {result['refused']}; this host unpacks the tarball")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
