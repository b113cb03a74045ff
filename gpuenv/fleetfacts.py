"""The GPUs an inventory's hosts have, read on the controller from what gpuenv recorded on them.

Each provisioned host carries the local fact `gpuenv` (/etc/ansible/facts.d/gpuenv.fact, role
stack_record: a link to the host's record of its stack, /etc/gpuenv/stack.json): the stack the
preflight checked, whose `resolved.gpus` lists the GPUs the stack file declared and those
nvidia-smi found on the host (origin "detected"). The controller has no copy of
it after a run (ansible.cfg keeps no fact cache), so the hosts' local facts are saved with Ansible's
own ad-hoc setup module, one JSON file per host (the `--tree` output):

    ansible gpu_hosts -i inventory/<site> -m ansible.builtin.setup -a 'gather_subset=!all,!min,local' \
        --tree reports/facts

The inventory gives the hosts (`ansible-inventory --list`: gpu_hosts and its child groups) and what
each declares (gpu_stack.gpu), so a host without a record is named and its declared GPUs are used,
never silently left out. Per host, in this order: the GPUs the preflight detected; else those its
record declares (the preflight ran before a driver could list them); else the inventory's.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuenv import versions
from gpuenv.compat import CompatData
from gpuenv.rules import gpu_cc
from gpuenv.suggest.inputs import GpuSpec, gpu_spec

GROUP = "gpu_hosts"
SAVE_COMMAND = (
    "ansible gpu_hosts -i {inventory} -m ansible.builtin.setup -a 'gather_subset=!all,!min,local' --tree {facts}"
)
# A tree file is one host's setup result: a few kB. Anything much larger is not one.
_MAX_BYTES = 1 << 22


class InventoryError(Exception):
    """The inventory cannot be read (suggest exit 2)."""


@dataclass
class Fleet:
    gpus: list[GpuSpec]
    notes: list[str] = field(default_factory=list)
    os: str | None = None  # the OS every recorded host runs, when they agree
    driver_branch: str | None = None  # the driver branch every recorded host runs, when they agree


def inventory_hosts(inventory: Path) -> dict[str, dict[str, Any]]:
    """host -> its variables, for the hosts in gpu_hosts and its child groups (as the playbooks see them)."""
    if not inventory.exists():
        raise InventoryError(
            f"--inventory {inventory}: no such file or directory; give an inventory such as inventory/<site>"
        )
    if not (inventory.is_file() or inventory.is_dir()):
        # A FIFO or a device would hang ansible-inventory, or feed it whatever it streams.
        raise InventoryError(
            f"--inventory {inventory}: not a regular file or a directory; give an inventory such as inventory/<site>"
        )
    sibling = Path(sys.executable).parent / "ansible-inventory"
    command = str(sibling) if sibling.exists() else shutil.which("ansible-inventory")
    if command is None:
        raise InventoryError("--inventory needs ansible-inventory (ansible-core): run ./scripts/setup and use .venv")
    try:
        done = subprocess.run(  # noqa: S603 - a fixed command; the path is an argument, not a shell word
            [command, "-i", str(inventory), "--list"], capture_output=True, text=True, timeout=120, check=False
        )
    except subprocess.TimeoutExpired:
        raise InventoryError(f"ansible-inventory -i {inventory} --list did not answer within 120 s") from None
    if done.returncode != 0:
        raise InventoryError(f"ansible-inventory -i {inventory} --list failed: {done.stderr.strip()[-400:]}")
    try:
        listing = json.loads(done.stdout)
    except json.JSONDecodeError:
        raise InventoryError(f"ansible-inventory -i {inventory} --list printed no JSON") from None
    hostvars = listing.get("_meta", {}).get("hostvars", {})
    hosts: list[str] = []
    pending, seen = [GROUP], set()
    while pending:
        group = pending.pop()
        if group in seen:
            continue
        seen.add(group)
        hosts.extend(h for h in listing.get(group, {}).get("hosts", []) if h not in hosts)
        pending.extend(listing.get(group, {}).get("children", []))
    if not hosts:
        raise InventoryError(
            f"inventory {inventory} has no hosts in {GROUP} (or its child groups), which the "
            "playbooks act on; list your GPU hosts there"
        )
    return {h: hostvars.get(h, {}) for h in hosts}


def read_tree(directory: Path) -> dict[str, dict[str, Any]]:
    """host -> its setup result, from a `--tree` directory (a file per host, named by the host)."""
    out: dict[str, dict[str, Any]] = {}
    if not directory.is_dir():
        return out
    for path in sorted(directory.iterdir()):
        if not path.is_file() or path.stat().st_size > _MAX_BYTES:
            continue
        try:
            entry = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            continue  # not a setup result (a README, an editor's backup): no host of this name is read
        if isinstance(entry, dict):
            out[path.name] = entry
    return out


def _declared(value: Any) -> list[str]:
    labels = value if isinstance(value, list) else [value] if value else []
    return [str(v) for v in labels if isinstance(v, str | int | float) and "{{" not in str(v)]


def _from_record(host: str, entry: dict[str, Any] | None) -> tuple[list[tuple[str, str]], str, dict[str, Any]]:
    """(label, cc) pairs from a host's saved facts, what they are, and its local facts."""
    if entry is None:
        return [], "no saved facts", {}
    if entry.get("unreachable") or entry.get("failed"):
        why = str(entry.get("msg", "")).strip()[:160]
        return [], f"unreachable when the facts were saved ({why})", {}
    local = (entry.get("ansible_facts") or {}).get("ansible_local") or {}
    record = local.get("gpuenv")
    if not isinstance(record, dict):
        return [], "no gpuenv record (site.yml has not run there)", local
    gpus = [g for g in (record.get("resolved") or {}).get("gpus") or [] if isinstance(g, dict)]
    detected = [(str(g.get("label")), str(g.get("cc"))) for g in gpus if g.get("origin") == "detected"]
    if detected:
        return detected, "detected by the preflight", local
    declared = [(str(g.get("label")), str(g.get("cc"))) for g in gpus if g.get("origin") == "declared"]
    return declared, "declared in its record (the preflight found no GPU to list: no driver yet)", local


def read(inventory: Path, facts: Path, data: CompatData) -> Fleet:
    hosts = inventory_hosts(inventory)
    tree = read_tree(facts)
    fleet = Fleet(gpus=[])
    if not tree:
        fleet.notes.append(
            f"no saved facts in {facts}: the GPUs the inventory declares are used; save the hosts' "
            f"records first: {SAVE_COMMAND.format(inventory=inventory, facts=facts)}"
        )
    by_label: dict[str, tuple[str, list[str]]] = {}
    oses, branches = set(), set()
    for host, hostvars in hosts.items():
        pairs, how, local = _from_record(host, tree.get(host))
        if not pairs:
            stack = hostvars.get("gpu_stack") if isinstance(hostvars.get("gpu_stack"), dict) else {}
            labels = _declared((stack or {}).get("gpu"))
            pairs = [(label, cc) for label in labels if (cc := gpu_cc(label, data)) is not None]
            if not pairs:
                fleet.notes.append(f"{host}: {how}, and the inventory declares no GPU for it: left out")
            elif tree:
                fleet.notes.append(
                    f"{host}: {how}; the GPUs the inventory declares for it are used ({', '.join(labels)})"
                )
        for label, cc in pairs:
            if not versions.is_dotted(cc):
                continue
            # The model's name when gpuenv knows it (check-spec reads it), else its compute capability.
            key = label if gpu_cc(label, data) == versions.fmt(versions.parse(cc)) else cc
            by_label.setdefault(key, (cc, []))[1].append(host)
        record = (local.get("gpuenv") or {}).get("resolved") or {}
        if record.get("host_os") or record.get("os"):
            oses.add(str(record.get("host_os") or record.get("os")))
        driver = (local.get("nvidia_driver") or {}).get("version")
        if isinstance(driver, str) and versions.is_dotted(driver):
            branches.add(str(versions.driver_branch(driver)))
    fleet.gpus = [gpu_spec(label, cc, data, tuple(names)) for label, (cc, names) in by_label.items()]
    if not fleet.gpus:
        raise InventoryError(f"no host in {inventory} has a GPU recorded or declared; give them with --gpu")
    if len(oses) == 1 and next(iter(oses)) in data.os:
        fleet.os = next(iter(oses))
    elif len(oses) > 1:
        fleet.notes.append(f"the hosts run {', '.join(sorted(oses))}: give --os, or one suggestion per OS group")
    if len(branches) == 1:
        fleet.driver_branch = next(iter(branches))
    return fleet
