#!/usr/bin/python
"""Ansible module gpuenv_host_state: one read of what a host has that gpuenv's roles decide from
(files, commands, gpuenv's records, Secure Boot, NVIDIA devices on the PCI bus, dpkg's state of some
packages, the processes on the GPUs), instead of a stat, slurp, find or command task for each."""

from __future__ import annotations

import glob
import json
import os
import shutil
import stat

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.gpuenv_hostparse import (
    DPKG_QUERY_FORMAT,
    ld_library_path,
    parse_dpkg_query,
    parse_ldconfig,
    secure_boot_on,
)

DOCUMENTATION = r"""
module: gpuenv_host_state
short_description: Read in one round trip what gpuenv's roles decide from on a host
description:
  - Each role used to probe a host task by task (stat this, slurp that, find the EFI variable, ask
    dpkg); every task is a round trip and a place to read an output differently. This module reads
    all that a role asks for at once and changes nothing, in check mode as in a real run.
  - Files that do not exist, commands not on the PATH and packages dpkg does not know are reported
    as absent, never as a failure. Only a dpkg-query or nvidia-smi that fails in a way that means
    something is broken fails the module, with its output.
options:
  paths:
    description: Paths to report on (whether each exists, and its type), without reading them.
    type: list
    elements: path
    default: []
  read:
    description:
      - Small text files to read (at most 64 KiB each, such as C(/proc/driver/nvidia/version) or
        C(/etc/machine-id)); one that does not exist reads as null.
    type: list
    elements: path
    default: []
  resolve:
    description: Paths to resolve to their real path (links followed); one that does not exist resolves to null.
    type: list
    elements: path
    default: []
  loader:
    description:
      - Shared-object names (C(libcudnn.so.9)) to look up in the loader's cache (C(ldconfig -p)),
        each as the paths it lists in the loader's order, resolved to their real paths.
    type: list
    elements: str
    default: []
  ld_library_path:
    description:
      - Shell scripts or C(/etc/environment) files (globs allowed) to read for what they put on
        C(LD_LIBRARY_PATH), as gpuenv doctor reads them - the lines that set it, not comments that name it.
    type: list
    elements: path
    default: []
  commands:
    description: Command names to look for on the PATH (C(/usr/sbin) and C(/sbin) included).
    type: list
    elements: str
    default: []
  local_facts:
    description:
      - Read gpuenv's records, the JSON C(*.fact) files in I(facts_dir), as Ansible's local facts
        would (C(ansible_local)); a file that is not JSON is reported under C(local_errors).
    type: bool
    default: false
  facts_dir:
    description: Where the records are.
    type: path
    default: /etc/ansible/facts.d
  secure_boot:
    description: Read UEFI Secure Boot's state from efivarfs.
    type: bool
    default: false
  nvidia_pci:
    description: Count the NVIDIA devices (vendor 0x10de) on the PCI bus, from sysfs.
    type: bool
    default: false
  dpkg:
    description: Package names to ask dpkg about (selection, state and version); empty asks nothing.
    type: list
    elements: str
    default: []
  gpu_listing:
    description:
      - List the host's GPUs as the preflight reads them, where the tools are installed - C(nvidia-smi
        --query-gpu=name,compute_cap), or names alone from an nvidia-smi too old for that field (its
        exit code 2) - and the NVIDIA devices on the PCI bus with C(lspci -nn -d 10de:) (NVSwitches
        show there before any driver). nvidia-smi's exit codes 6, 9 and 12 and lspci's 1 (a bus it
        cannot read, as in some containers) mean nothing to list.
    type: bool
    default: false
  gpu_processes:
    description:
      - Ask nvidia-smi, where it is installed, which processes run on the GPUs. Its exit codes 6 (no
        GPU), 9 (no driver loaded) and 12 (no NVML) mean none can run.
    type: bool
    default: false
  gather_subset:
    description:
      - Gather these subsets of Ansible's facts (C(distribution), C(platform)) with Ansible's own
        collectors, as C(ansible.builtin.setup) would, and return them as facts, in the same round
        trip as the rest; empty gathers none. Only the subsets named, not C(min).
    type: list
    elements: str
    default: []
"""

EXAMPLES = r"""
- name: Read what the driver role decides from
  gpuenv_host_state:
    read: [/proc/driver/nvidia/version]
    commands: [nvidia-smi, update-initramfs, dracut]
    secure_boot: true
    nvidia_pci: true
  register: state
"""

RETURN = r"""
paths:
  description: For each of I(paths), C(exists) and C(type) (file, directory, link, other or null).
  type: dict
files:
  description: For each of I(read), its text, or null where it does not exist.
  type: dict
resolved:
  description: For each of I(resolve), its real path, or null where it does not exist.
  type: dict
loader:
  description: For each of I(loader), the real paths of the libraries C(ldconfig -p) lists, in its order.
  type: dict
ld_library_path:
  description: For each file of I(ld_library_path) that sets C(LD_LIBRARY_PATH) to directories, those directories.
  type: dict
commands:
  description: For each of I(commands), its path, or null where it is not on the PATH.
  type: dict
local:
  description: gpuenv's records by name (the file name without C(.fact)), when I(local_facts).
  type: dict
local_errors:
  description: Records that could not be read as JSON, with why.
  type: dict
secure_boot:
  description: C(present) (the host boots through UEFI with a Secure Boot variable) and C(on).
  type: dict
nvidia_pci:
  description: How many NVIDIA devices the PCI bus has (GPUs, NVSwitches and their audio functions).
  type: int
packages:
  description: For each package dpkg knows of I(dpkg), C(want) (h is held), C(state) (i is installed) and C(version).
  type: dict
gpu_listing:
  description: C(nvidia_smi) and C(lspci), the text each printed, empty where there is nothing to list.
  type: dict
gpu_processes:
  description: C(rc) of nvidia-smi (null where it is not installed) and C(lines), one per process.
  type: dict
"""

# Fixed system places, module-level so that the tests can point them at a tree of their own.
EFIVARS = "/sys/firmware/efi/efivars"
PCI_DEVICES = "/sys/bus/pci/devices"
READ_LIMIT = 64 * 1024
# Where root's commands live, whatever the PATH of the connection (sshd's for a non-login shell
# may lack the sbin directories).
EXTRA_PATH = ["/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"]
# nvidia-smi: no GPU, no driver loaded, no NVML. Nothing can run on a GPU then.
SMI_NOTHING = {6, 9, 12}
# nvidia-smi's "invalid argument": a driver older than the compute_cap field.
SMI_OLD_FIELD = 2


def path_type(path: str) -> str | None:
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return None
    if stat.S_ISLNK(mode):
        return "link"
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISREG(mode):
        return "file"
    return "other"


def read_text(path: str) -> str | None:
    try:
        with open(path, "rb") as handle:
            return handle.read(READ_LIMIT).decode("utf-8", "replace")
    except (FileNotFoundError, NotADirectoryError):
        return None


def real_path(path: str) -> str | None:
    return os.path.realpath(path) if os.path.exists(path) else None


def find_command(name: str) -> str | None:
    search = os.pathsep.join(os.environ.get("PATH", "").split(os.pathsep) + EXTRA_PATH)
    return shutil.which(name, path=search)


def local_records(facts_dir: str) -> tuple[dict[str, object], dict[str, str]]:
    records: dict[str, object] = {}
    errors: dict[str, str] = {}
    for path in sorted(glob.glob(os.path.join(facts_dir, "*.fact"))):
        name = os.path.basename(path)[: -len(".fact")]
        try:
            with open(path, encoding="utf-8") as handle:
                records[name] = json.load(handle)
        except (OSError, ValueError) as err:
            errors[name] = f"{path}: {err}"
    return records, errors


def secure_boot_state() -> dict[str, bool]:
    variables = sorted(glob.glob(os.path.join(EFIVARS, "SecureBoot-*")))
    if not variables:
        return {"present": False, "on": False}
    try:
        with open(variables[0], "rb") as handle:
            data = handle.read(16)
    except OSError:
        return {"present": True, "on": False}
    return {"present": True, "on": secure_boot_on(data)}


def nvidia_pci_count() -> int:
    count = 0
    for vendor in glob.glob(os.path.join(PCI_DEVICES, "*", "vendor")):
        try:
            with open(vendor, encoding="ascii", errors="replace") as handle:
                if handle.read().strip().lower() == "0x10de":
                    count += 1
        except OSError:
            continue
    return count


def run_listing(module: AnsibleModule, argv: list[str], quiet: set[int]) -> str:
    """What a listing command printed: empty for an exit code that means nothing to list, a
    failure of the module for any other."""
    rc, out, err = module.run_command(argv)
    if rc == 0:
        return str(out)
    if rc in quiet:
        return ""
    module.fail_json(
        msg=f"{' '.join(argv)} failed on this host (exit {rc}): {(err or out).strip()[-600:]}. "
        "Run it by hand to see why; the preflight cannot judge the stack against GPUs it cannot list."
    )
    raise AssertionError("fail_json returned")  # pragma: no cover - fail_json exits


def gpu_listing(module: AnsibleModule) -> dict[str, str]:
    listing = {"nvidia_smi": "", "lspci": ""}
    smi = find_command("nvidia-smi")
    if smi is not None:
        fmt = "--format=csv,noheader"
        rc, out, err = module.run_command([smi, "--query-gpu=name,compute_cap", fmt])
        if rc == 0:
            listing["nvidia_smi"] = out
        elif rc == SMI_OLD_FIELD:
            listing["nvidia_smi"] = run_listing(module, [smi, "--query-gpu=name", fmt], SMI_NOTHING)
        elif rc not in SMI_NOTHING:
            module.fail_json(
                msg=f"nvidia-smi could not list the GPUs (exit {rc}): {(err or out).strip()[-600:]}. "
                "Run it by hand to see why; the preflight cannot judge the stack against GPUs it cannot list."
            )
    lspci = find_command("lspci")
    if lspci is not None:
        listing["lspci"] = run_listing(module, [lspci, "-nn", "-d", "10de:"], {1})
    return listing


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "paths": {"type": "list", "elements": "path", "default": []},
            "read": {"type": "list", "elements": "path", "default": []},
            "commands": {"type": "list", "elements": "str", "default": []},
            "resolve": {"type": "list", "elements": "path", "default": []},
            "loader": {"type": "list", "elements": "str", "default": []},
            "ld_library_path": {"type": "list", "elements": "path", "default": []},
            "local_facts": {"type": "bool", "default": False},
            "facts_dir": {"type": "path", "default": "/etc/ansible/facts.d"},
            "secure_boot": {"type": "bool", "default": False},
            "nvidia_pci": {"type": "bool", "default": False},
            "dpkg": {"type": "list", "elements": "str", "default": []},
            "gpu_listing": {"type": "bool", "default": False},
            "gpu_processes": {"type": "bool", "default": False},
            "gather_subset": {"type": "list", "elements": "str", "default": []},
        },
        supports_check_mode=True,
    )
    p = module.params
    result: dict[str, object] = {"changed": False}
    kinds = {path: path_type(path) for path in p["paths"]}
    result["paths"] = {path: {"exists": kind is not None, "type": kind} for path, kind in kinds.items()}
    result["files"] = {path: read_text(path) for path in p["read"]}
    result["commands"] = {name: find_command(name) for name in p["commands"]}
    result["resolved"] = {path: real_path(path) for path in p["resolve"]}
    if p["loader"]:
        ldconfig = find_command("ldconfig")
        if ldconfig is None:
            module.fail_json(msg="ldconfig is not on this host: install libc-bin, which the loader needs", **result)
        rc, out, err = module.run_command([ldconfig, "-p"])
        if rc != 0:
            module.fail_json(msg=f"ldconfig -p failed on this host (exit {rc}): {err.strip()[-600:]}", **result)
        cache = parse_ldconfig(out)
        result["loader"] = {name: [real_path(path) or path for path in cache.get(name, [])] for name in p["loader"]}
    if p["ld_library_path"]:
        files = sorted({f for pattern in p["ld_library_path"] for f in glob.glob(pattern) if os.path.isfile(f)})
        sets = {f: ld_library_path(read_text(f) or "", "$HOME") for f in files}
        result["ld_library_path"] = {f: dirs for f, dirs in sets.items() if dirs}
    if p["local_facts"]:
        result["local"], result["local_errors"] = local_records(p["facts_dir"])
    if p["secure_boot"]:
        result["secure_boot"] = secure_boot_state()
    if p["nvidia_pci"]:
        result["nvidia_pci"] = nvidia_pci_count()
    if p["dpkg"]:
        dpkg_query = find_command("dpkg-query")
        if dpkg_query is None:
            result["packages"] = {}
        else:
            # rc 1 with "no packages found matching" on stderr is a name dpkg does not know: absent.
            rc, out, err = module.run_command([dpkg_query, "-W", "-f", DPKG_QUERY_FORMAT, *p["dpkg"]])
            if rc not in (0, 1):
                module.fail_json(msg=f"dpkg-query failed on this host (exit {rc}): {err.strip()[-600:]}", **result)
            result["packages"] = parse_dpkg_query(out)
    if p["gpu_listing"]:
        result["gpu_listing"] = gpu_listing(module)
    if p["gpu_processes"]:
        smi = find_command("nvidia-smi")
        if smi is None:
            result["gpu_processes"] = {"rc": None, "lines": []}
        else:
            argv = [smi, "--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader"]
            rc, out, err = module.run_command(argv)
            if rc != 0 and rc not in SMI_NOTHING:
                module.fail_json(
                    msg=f"nvidia-smi could not list the GPUs' processes (exit {rc}): {(err or out).strip()[-600:]}. "
                    "Run it by hand on the host to see why; gpuenv will not change a driver it cannot see.",
                    **result,
                )
            lines = [line.strip() for line in out.splitlines() if line.strip()] if rc == 0 else []
            result["gpu_processes"] = {"rc": rc, "lines": lines}
    if p["gather_subset"]:
        result["ansible_facts"] = gather_facts(module, p["gather_subset"])
    module.exit_json(**result)


def gather_facts(module: AnsibleModule, subsets: list[str]) -> dict[str, object]:
    """Ansible's facts of these subsets, collected as the setup module collects them (its collectors,
    its names: ansible_distribution and so on), and no others."""
    # Imported here, so that only a gathering run loads the collectors on the host. Ansible ships
    # them with every run of this module all the same (its packager finds imports anywhere).
    from ansible.module_utils.facts import ansible_collector, default_collectors  # noqa: PLC0415
    from ansible.module_utils.facts.namespace import PrefixFactNamespace  # noqa: PLC0415

    collector = ansible_collector.get_ansible_collector(
        all_collector_classes=default_collectors.collectors,
        namespace=PrefixFactNamespace(namespace_name="ansible", prefix="ansible_"),
        gather_subset=["!all", "!min", *subsets],
        minimal_gather_subset=frozenset(),
    )
    facts: dict[str, object] = collector.collect(module=module)
    return facts


if __name__ == "__main__":
    main()
