#!/usr/bin/python
"""Ansible module gpuenv_dkms_cache: a fleet builds each DKMS driver module once."""

from __future__ import annotations

import glob
import json
import os
import platform
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.gpuenv_buildcache import host_os_release
from ansible.module_utils.gpuenv_cudnn_files import sha256_of
from ansible.module_utils.gpuenv_dkms import (
    check_tarball,
    host_keys,
    merge_tarballs,
    plan,
    postinst_module,
)

DOCUMENTATION = r"""
module: gpuenv_dkms_cache
short_description: Share the driver's DKMS-built module between identical hosts through the controller
description:
  - Identical hosts compile the same module for the same kernel, minutes of CPU each. The first
    host builds it and hands DKMS's own binaries-only tarball to the controller's cache; the others
    get it where the package's postinst loads one from, and install without compiling.
  - I(mode=facts) (on the host) gives each installed kernel's cache key, from the package, the
    kernel's package version and config, the architecture, the OS release and the signing certificate.
  - I(mode=plan) (on the controller, once for the play) reads the cache for every host's keys, and
    says what each restores, builds, or waits for an earlier host to build. An entry whose tarball's
    sha256 is not the one recorded is refused, and its host builds instead.
  - I(mode=restore) (on the host) checks each staged tarball's sha256 again and puts one tarball
    with every restored kernel where the postinst looks for it.
  - I(mode=export) (on the host, after its install) runs C(dkms mktarball --binaries-only) for each
    kernel it built and writes the entry's record beside it, for the role to fetch.
options:
  mode:
    description: Which step.
    type: str
    choices: [facts, plan, restore, export]
    required: true
  package:
    description: The driver's package whose version the pin picks (facts), part of the key.
    type: str
  module:
    description: >-
      The DKMS module, C(name) and C(version) as DKMS knows it (C(nvidia-current), C(550.163.01)):
      facts leaves out the kernels it is built for already; export packs it.
    type: dict
  version:
    description: Its version to be installed (facts).
    type: str
  kernels:
    description: >-
      facts: each installed kernel release and its package's version; export: the keys to export
      (items of facts' C(kernels)).
    type: raw
  signer_cert:
    description: The certificate DKMS signs with (facts); empty where DKMS is not told to sign.
    type: str
    default: ""
  cache_dir:
    description: The controller's cache (plan).
    type: path
  hosts:
    description: Each host, in play order, with its keys (plan).
    type: list
    elements: dict
  entries:
    description: The entries to restore (restore), as plan gave them.
    type: list
    elements: dict
  staging_dir:
    description: >-
      Where restore finds the copies (C(<key>.tar.gz)) and export writes the entries for the role to
      fetch.
    type: path
  host:
    description: This host's name, for the entry's record (export) and its keys (facts).
    type: str
    default: ""
  wait:
    description: >-
      plan, whether a host whose every missing module an earlier host builds waits for it; off for
      the waiting hosts' own second read, which restores what is there and builds the rest.
    type: bool
    default: true
"""

EXAMPLES = r"""
- name: Read this host's cache keys
  gpuenv_dkms_cache:
    mode: facts
    package: nvidia-kernel-dkms
    version: 550.163.01-2
    kernels: {6.12.48+deb13-amd64: 6.12.48-1}
"""

RETURN = r"""
kernels:
  description: facts, each kernel's C(kernel), C(key) and C(fields).
  type: list
shareable:
  description: facts, whether the module built here is the same on any host with the same key.
  type: bool
why:
  description: facts, why not, when not.
  type: str
hosts:
  description: plan, for each host C(restore), C(build), C(wait), C(wait_for) and C(notes).
  type: dict
restored:
  description: restore, the kernels whose module the install loads from the tarball.
  type: list
refused:
  description: restore, the kernels refused and why (their module is built instead).
  type: list
tarball:
  description: restore, where the tarball was put (remove it after the install).
  type: str
entries:
  description: export, each entry's C(key), C(tarball) and C(record) on the host.
  type: list
"""

# Where the host keeps them (the tests point them elsewhere).
DPKG_INFO = "/var/lib/dpkg/info"
DKMS_TREE = "/var/lib/dkms"
BOOT = "/boot"
OS_RELEASE = "/etc/os-release"


def _read(path: str) -> str | None:
    try:
        with open(path, errors="replace") as handle:
            return handle.read()
    except OSError:
        return None


def facts(
    package: str, version: str, kernels: dict[str, str], signer_cert: str, module: dict[str, str]
) -> dict[str, Any]:
    arch = platform.machine()
    # A kernel DKMS has already built this module for has nothing to build or restore.
    built = {
        k
        for k in kernels
        if os.path.isdir(os.path.join(DKMS_TREE, module["name"], module["version"], k, arch, "module"))
    }
    kernels = {k: v for k, v in kernels.items() if k not in built}
    configs = {k: sha256_of(f"{BOOT}/config-{k}") for k in kernels if os.path.isfile(f"{BOOT}/config-{k}")}
    result: dict[str, Any] = {"changed": False, "shareable": True, "why": ""}
    signer = ""
    if signer_cert:
        if not os.path.isfile(signer_cert):
            # DKMS then makes a key of its own for this host: no other host's module carries it.
            result.update(
                shareable=False,
                why=f"DKMS signs with {signer_cert}, which this host lacks: DKMS makes a key of its own for it,"
                " which no other host has. Put the fleet's enrolled key and certificate there to share the module",
            )
        else:
            signer = sha256_of(signer_cert)
    os_id = host_os_release(OS_RELEASE)
    result["built"] = sorted(built)
    result["kernels"] = host_keys(
        package=package,
        version=version,
        kernels=kernels,
        config_sha256=configs,
        arch=arch,
        os_id=os_id,
        signer=signer,
    )
    return result


def restore(entries: list[dict[str, Any]], staging: str) -> dict[str, Any]:
    good: list[dict[str, Any]] = []
    refused = []
    for entry in entries:
        kernel = str(entry["kernel"])
        src = str(entry.get("src") or os.path.join(staging, f"{entry['key']}.tar.gz"))
        actual = sha256_of(src) if os.path.isfile(src) else None
        why = None
        if actual != entry["sha256"]:
            why = f"its copy {src} has sha256 {actual}, not the {entry['sha256']} the cache recorded"
        else:
            why = check_tarball(src, kernel, str(entry["fields"]["arch"]))
        if why:
            refused.append({"kernel": kernel, "why": why})
        else:
            good.append({**entry, "src": src})
    result: dict[str, Any] = {"changed": False, "restored": [], "refused": refused, "tarball": ""}
    if good:
        names = {(e["dkms_name"], e["dkms_version"], e["tarball_dir"]) for e in good}
        if len(names) > 1:
            raise ValueError(f"entries for more than one module: {sorted(names)}")
        name, version, where = names.pop()
        os.makedirs(where, exist_ok=True)
        dest = os.path.join(where, f"{name}-{version}.dkms.tar.gz")
        merge_tarballs([str(e["src"]) for e in good], dest)
        result.update(changed=True, restored=[e["kernel"] for e in good], tarball=dest)
    return result


def installed_module(name: str, version: str) -> dict[str, str] | None:
    """Where the postinst of the package that installed DKMS module name/version loads a tarball
    from: the dh_dkms postinst among dpkg's that names them; None when no installed package's does."""
    for path in sorted(glob.glob(os.path.join(DPKG_INFO, "*.postinst"))):
        found: dict[str, str] | None = postinst_module(_read(path) or "")
        if found and found["dkms_name"] == name and found["dkms_version"] == version:
            return found
    return None


def export(
    module: AnsibleModule, dkms_module: dict[str, str], kernels: list[dict[str, Any]], staging: str, host: str
) -> dict[str, Any]:
    where = installed_module(dkms_module["name"], dkms_module["version"])
    result: dict[str, Any] = {"changed": False, "entries": [], "warnings": []}
    if where is None:
        result["warnings"].append(
            f"no installed package's postinst (dh_dkms) installs DKMS module {dkms_module['name']}"
            f" {dkms_module['version']}: its build cannot be shared"
        )
        return result
    dkms = module.get_bin_path("dkms")
    os.makedirs(staging, mode=0o755, exist_ok=True)
    for item in kernels:
        kernel, key, fields = str(item["kernel"]), str(item["key"]), item["fields"]
        built = os.path.join(DKMS_TREE, where["dkms_name"], where["dkms_version"], kernel, fields["arch"], "module")
        files = sorted(f for f in os.listdir(built) if ".ko" in f) if os.path.isdir(built) else []
        if not files or dkms is None:
            result["warnings"].append(f"no module DKMS built for kernel {kernel} in {built}: nothing to share")
            continue
        tarball = os.path.join(staging, key + ".tar.gz")
        argv = [dkms, "mktarball", "-m", where["dkms_name"], "-v", where["dkms_version"], "-k", kernel]
        rc, out, err = module.run_command([*argv, "--binaries-only", "--archive", tarball])
        if rc != 0:
            result["warnings"].append(
                f"dkms mktarball failed for kernel {kernel} (exit {rc}): {(err or out).strip()[-300:]}; not shared"
            )
            continue
        record = {
            "key": key,
            "fields": fields,
            "sha256": sha256_of(tarball),
            "modules": {f: sha256_of(os.path.join(built, f)) for f in files},
            "built_by": host,
            **where,
        }
        record_path = os.path.join(staging, key + ".json")
        with open(record_path, "w") as handle:
            json.dump(record, handle, indent=1, sort_keys=True)
        result["entries"].append({"key": key, "tarball": tarball, "record": record_path})
        result["changed"] = True
    return result


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "mode": {"type": "str", "required": True, "choices": ["facts", "plan", "restore", "export"]},
            "package": {"type": "str"},
            "module": {"type": "dict"},
            "version": {"type": "str"},
            "kernels": {"type": "raw"},
            "signer_cert": {"type": "str", "default": ""},
            "cache_dir": {"type": "path"},
            "hosts": {"type": "list", "elements": "dict"},
            "entries": {"type": "list", "elements": "dict"},
            "staging_dir": {"type": "path"},
            "host": {"type": "str", "default": ""},
            "wait": {"type": "bool", "default": True},
        },
        required_if=[
            ("mode", "facts", ("package", "version", "kernels", "module")),
            ("mode", "plan", ("cache_dir", "hosts")),
            ("mode", "restore", ("entries", "staging_dir")),
            ("mode", "export", ("module", "kernels", "staging_dir")),
        ],
        supports_check_mode=True,
    )
    p = module.params
    mode = p["mode"]
    if mode == "facts":
        found = facts(p["package"], p["version"], dict(p["kernels"] or {}), p["signer_cert"], p["module"])
        module.exit_json(host=p["host"], **found)
    if mode == "plan":
        os.makedirs(p["cache_dir"], mode=0o755, exist_ok=True)
        planned = plan(p["cache_dir"], p["hosts"], wait=p["wait"])
        for note in sorted({n for h in planned["hosts"].values() for n in h["notes"]}):
            module.warn(note)
        module.exit_json(changed=False, **planned)
    if module.check_mode:
        module.exit_json(changed=bool(p["entries"] or p["kernels"]), msg="check mode: nothing written")
    if mode == "restore":
        try:
            result = restore(p["entries"], p["staging_dir"] or "")
        except (OSError, ValueError) as err:
            module.fail_json(msg=f"the cached module could not be put in place: {err}")
        for refused in result["refused"]:
            module.warn(
                f"the cached module for kernel {refused['kernel']} is refused: {refused['why']}; the install builds it"
            )
        module.exit_json(**result)
    result = export(module, p["module"], list(p["kernels"] or []), p["staging_dir"], p["host"])
    warnings = result.pop("warnings")
    for warning in warnings:
        module.warn(warning)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
