#!/usr/bin/python
"""Ansible module gpuenv_env_cache: a fleet builds each PyTorch environment once."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.gpuenv_buildcache import (
    EXT,
    digest_key,
    escalated_user,
    extract_tar,
    host_actions,
    host_os_release,
    pack_tar,
    plan,
    prune,
    relative,
    remove_file,
    tree_size,
    work_dir,
)
from ansible.module_utils.gpuenv_cudnn_files import sha256_of

DOCUMENTATION = r"""
module: gpuenv_env_cache
short_description: Share a built PyTorch environment between identical hosts through the controller
description:
  - Identical hosts download and unpack the same gigabytes of wheels into the same content-named
    environment. The first host builds it and hands a tar of the environment and its locks to the
    controller's cache; the others unpack that instead of installing.
  - I(mode=facts) (on the host) gives the host's cache key, from the environment's id and directory,
    the installer, the Python interpreter a venv runs on (its sha256), the architecture, the OS
    release and the host's own lock of the environment, if it has one.
  - I(mode=plan) (on the controller, once for the play) reads the cache for every host's key, and
    says which host builds, which waits for an earlier host's build, and which restores. An entry
    whose file's sha256 is not the one recorded is refused, and its host builds instead. Entries
    beyond the newest I(keep) that no host of the plan uses are removed.
  - I(mode=pack) (on the host that built) writes the tar of the environment and its locks, hashing
    it as it is written, and its record, for the role to fetch.
  - I(mode=unpack) (on the host) hashes the copied tar and, only when its sha256 is the recorded
    one, extracts it into a new directory beside the environments and moves the environment into
    place. A refused copy leaves nothing, and the role builds instead.
options:
  mode:
    description: Which step.
    type: str
    choices: [facts, plan, pack, unpack]
    required: true
  root:
    description: The environments' root (pytorch_env_root); the tar's paths are relative to it.
    type: path
  env_dir:
    description: The environment's content-named directory under I(root).
    type: path
  locks:
    description: The environment's lock files under I(root) (those that exist are packed).
    type: list
    elements: path
    default: []
  env_id:
    description: The environment's id (facts), part of the key.
    type: str
  installer:
    description: What builds it, with its version (facts), part of the key.
    type: str
  python:
    description: >-
      The interpreter a venv is made from (facts: C(python3.11)); empty where the environment brings
      its own (conda).
    type: str
    default: ""
  host:
    description: This host's name, for the key (facts) and the record (pack).
    type: str
    default: ""
  key:
    description: pack, the key facts gave.
    type: str
  fields:
    description: pack, the key's fields facts gave.
    type: dict
  staging_dir:
    description: pack, where the tar and its record are written for the role to fetch.
    type: path
  cache_dir:
    description: The controller's cache (plan).
    type: path
  hosts:
    description: plan, each host in play order with its C(key) (facts' result).
    type: list
    elements: dict
  wait:
    description: >-
      plan, whether a host whose environment an earlier host builds waits for it; off for the waiting
      hosts' own second read, which restores what is there and builds otherwise.
    type: bool
    default: true
  keep:
    description: plan, how many entries the cache keeps besides those this plan uses (newest first).
    type: int
    default: 2
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
- name: Read this host's key to the fleet's cache of environments
  gpuenv_env_cache:
    mode: facts
    root: /opt/gpuenv/envs
    env_dir: /opt/gpuenv/envs/.store/default-0123abcd
    locks: [/opt/gpuenv/envs/.locks/default-0123abcd.txt]
    env_id: 0123abcd
    installer: venv-uv 0.13.9
    python: python3.11
"""

RETURN = r"""
key:
  description: facts, the host's key; empty when not shareable.
  type: str
fields:
  description: facts, what the key is made of.
  type: dict
shareable:
  description: facts, whether an environment built here is the same on any host with the same key.
  type: bool
exports:
  description: facts, whether its build can be handed to the controller (not through sudo or doas).
  type: bool
why:
  description: facts, why not, when not.
  type: str
hosts:
  description: plan, for each host C(restore), C(build), C(wait), C(wait_for) and C(notes).
  type: dict
pruned:
  description: plan, the entries removed (beyond I(keep), not used by this plan).
  type: list
tar:
  description: pack, the tar on the host.
  type: str
record:
  description: pack, its record on the host.
  type: str
restored:
  description: unpack, whether the environment is now in place.
  type: bool
refused:
  description: unpack, why the copy was not used (the role then builds).
  type: str
"""

# The fields of an environment's key, in the order the role's messages name them.
KEY_FIELDS = ("env_id", "env_dir", "installer", "python_sha256", "arch", "os", "lock_sha256")
OS_RELEASE = "/etc/os-release"


def facts(*, env_dir: str, locks: list[str], env_id: str, installer: str, python: str, host: str) -> dict[str, Any]:
    result: dict[str, Any] = {"changed": False, "host": host, "shareable": True, "why": "", "key": "", "fields": {}}
    # A host reached through sudo or doas cannot hand a tar of gigabytes over (escalated_user says
    # why): it restores, and builds for itself.
    escalated = escalated_user()
    result["exports"] = not escalated
    result["why_not_exports"] = (
        f"Ansible reaches it as {escalated} with privilege escalation, and its fetch would read the tar of the"
        " environment whole into memory; connect as root to share a build"
        if escalated
        else ""
    )
    interpreter = ""
    if python:
        found = shutil.which(python)
        if found is None:
            result.update(shareable=False, why=f"{python} is not installed on it, so the environment is built")
            return result
        interpreter = sha256_of(os.path.realpath(found))
    # A host's own lock (from an earlier build of this environment) is what it would install: it
    # shares only with hosts that have the same one, or none.
    lock_sha = hashlib.sha256()
    for lock in locks:
        if os.path.isfile(lock):
            lock_sha.update(os.path.basename(lock).encode() + b"\0" + sha256_of(lock).encode() + b"\0")
    fields = {
        "env_id": env_id,
        "env_dir": env_dir,
        "installer": installer,
        "python_sha256": interpreter,
        "arch": platform.machine(),
        "os": host_os_release(OS_RELEASE),
        "lock_sha256": lock_sha.hexdigest(),
    }
    result.update(key=digest_key(fields, KEY_FIELDS), fields=fields)
    return result


def plan_env(cache_dir: str, hosts: list[dict[str, Any]], wait: bool, keep: int) -> dict[str, Any]:
    items = [
        {
            "host": h["host"],
            "exports": h.get("exports", True),
            "items": [{"key": h["key"], "name": h["fields"]["env_dir"]}],
        }
        for h in hosts
    ]
    out = host_actions(plan(cache_dir, items, EXT, "environment", wait=wait))
    pruned = prune(cache_dir, keep, {str(h["key"]) for h in hosts})
    return {"hosts": out, "pruned": pruned}


def pack(
    module: AnsibleModule,
    *,
    root: str,
    env_dir: str,
    locks: list[str],
    key: str,
    fields: dict[str, Any],
    staging: str,
    host: str,
) -> dict[str, Any]:
    tar = module.get_bin_path("tar", required=True)
    if module.get_bin_path("zstd") is None:
        return {
            "changed": False,
            "tar": "",
            "record": "",
            "warnings": [f"zstd is not installed on {host}: its build of {env_dir} is not shared (apt install zstd)"],
        }
    members = [relative(root, env_dir)] + [relative(root, lock) for lock in locks if os.path.isfile(lock)]
    os.makedirs(staging, mode=0o700, exist_ok=True)
    dest = os.path.join(staging, key + EXT)
    packed = pack_tar(tar, root, members, dest)
    if packed["rc"] != 0:
        module.fail_json(
            msg=f"tar of {env_dir} failed (exit {packed['rc']}): {packed['error']}; the build stays on this host only"
        )
    record = {
        "key": key,
        "fields": fields,
        "sha256": packed["sha256"],
        "size": packed["size"],
        # What it takes unpacked: a restoring host checks its room for both first.
        "unpacked_size": sum(tree_size(os.path.join(root, m)) for m in members),
        "env": members[0],
        "locks": members[1:],
        "built_by": host,
    }
    record_path = os.path.join(staging, key + ".json")
    with open(record_path, "w") as handle:
        json.dump(record, handle, indent=1, sort_keys=True)
    return {"changed": True, "tar": dest, "record": record_path, "warnings": []}


def unpack(module: AnsibleModule, root: str, env_dir: str, entry: dict[str, Any], src: str) -> dict[str, Any]:
    """Extract src into a new directory beside the environments, then move the environment and its
    locks into place only when src's sha256 is the entry's. Removes src either way."""
    result: dict[str, Any] = {"changed": False, "restored": False, "refused": ""}
    env_rel = str(entry.get("env", ""))
    if env_rel != relative(root, env_dir):
        result["refused"] = f"the entry holds {env_rel or 'no environment'}, not {env_dir}"
        remove_file(src)
        return result
    tar = module.get_bin_path("tar", required=True)
    if module.get_bin_path("zstd") is None:
        result["refused"] = "zstd is not installed on this host (the role installs it with pytorch_env_build_cache on)"
        remove_file(src)
        return result
    work = work_dir(os.path.dirname(env_dir))
    try:
        extracted = extract_tar(tar, src, work, entry.get("sha256"))
        if extracted["sha256"] != entry.get("sha256"):
            result["refused"] = (
                f"its copy {src} has sha256 {extracted['sha256']}, not the {entry.get('sha256')} the cache recorded"
            )
            return result
        if extracted["rc"] != 0:
            result["refused"] = f"tar could not extract its copy {src} (exit {extracted['rc']}): {extracted['error']}"
            return result
        unpacked = os.path.join(work, env_rel)
        if not os.path.isfile(os.path.join(unpacked, ".gpuenv-env.json")):
            result["refused"] = f"it holds no finished environment ({env_rel}/.gpuenv-env.json)"
            return result
        # What an unfinished build left (no marker: main.yml looked) goes, as a build would remove it.
        if os.path.lexists(env_dir):
            shutil.rmtree(env_dir)
        for lock in entry.get("locks") or []:
            dest = os.path.join(root, str(lock))
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            os.replace(os.path.join(work, str(lock)), dest)
        os.rename(unpacked, env_dir)
        result.update(changed=True, restored=True)
        return result
    finally:
        shutil.rmtree(work, ignore_errors=True)
        remove_file(src)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "mode": {"type": "str", "required": True, "choices": ["facts", "plan", "pack", "unpack"]},
            "root": {"type": "path"},
            "env_dir": {"type": "path"},
            "locks": {"type": "list", "elements": "path", "default": []},
            "env_id": {"type": "str"},
            "installer": {"type": "str"},
            "python": {"type": "str", "default": ""},
            "host": {"type": "str", "default": ""},
            "key": {"type": "str", "no_log": False},
            "fields": {"type": "dict"},
            "staging_dir": {"type": "path"},
            "cache_dir": {"type": "path"},
            "hosts": {"type": "list", "elements": "dict"},
            "wait": {"type": "bool", "default": True},
            "keep": {"type": "int", "default": 2},
            "entry": {"type": "dict"},
            "src": {"type": "path"},
            # The action's (gpuenv.cacheaction), which copies it to src; here only to be documented.
            "copy_from": {"type": "path"},
        },
        required_if=[
            ("mode", "facts", ("env_dir", "env_id", "installer")),
            ("mode", "plan", ("cache_dir", "hosts")),
            ("mode", "pack", ("root", "env_dir", "key", "fields", "staging_dir")),
            ("mode", "unpack", ("root", "env_dir", "entry", "src")),
        ],
        supports_check_mode=True,
    )
    p = module.params
    mode = p["mode"]
    if mode == "facts":
        module.exit_json(
            **facts(
                env_dir=p["env_dir"],
                locks=p["locks"],
                env_id=p["env_id"],
                installer=p["installer"],
                python=p["python"],
                host=p["host"],
            )
        )
    if mode == "plan":
        os.makedirs(p["cache_dir"], mode=0o755, exist_ok=True)
        planned = plan_env(p["cache_dir"], p["hosts"], p["wait"], p["keep"])
        for note in sorted({n for h in planned["hosts"].values() for n in h["notes"]}):
            module.warn(note)
        module.exit_json(changed=bool(planned["pruned"]), **planned)
    if module.check_mode:
        module.exit_json(changed=True, msg="check mode: nothing written")
    if mode == "pack":
        packed = pack(
            module,
            root=p["root"],
            env_dir=p["env_dir"],
            locks=p["locks"],
            key=p["key"],
            fields=p["fields"],
            staging=p["staging_dir"],
            host=p["host"],
        )
        for warning in packed.pop("warnings"):
            module.warn(warning)
        module.exit_json(**packed)
    try:
        result = unpack(module, p["root"], p["env_dir"], p["entry"], p["src"])
    except OSError as err:
        module.fail_json(msg=f"the cached environment could not be put in place at {p['env_dir']}: {err}")
    if result["refused"]:
        module.warn(f"the cached environment is refused: {result['refused']}; this host builds it")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
