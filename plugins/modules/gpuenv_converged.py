#!/usr/bin/python
"""Ansible module gpuenv_converged: tell whether a host is as the last complete run of site.yml left
it, from one read of the places gpuenv writes, so that a re-run skips the stages that would change
nothing."""

from __future__ import annotations

import json
import os
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.gpuenv_fingerprint import Runner, fingerprint, patterns

DOCUMENTATION = r"""
module: gpuenv_converged
short_description: Compare a host with the stamp its last complete site.yml run left, or write one
description:
  - A re-run of site.yml on a host nothing touched asks every stage again what it already knows,
    about 120 tasks and 20 s for one host, 8 of the controller's CPU seconds. The stamp is what
    the last complete, verified run left, a digest of its inputs (gpuenv's code and every setting
    of the stage roles, computed on the controller) and a fingerprint of every place the stages
    write (package database, apt sources and pins, kernels and their module trees, DKMS, the
    loaded driver's version, modprobe and loader settings, systemd units and their state, the
    CUDA trees and links, the environments, the records). When both match, the stages have
    nothing to do and site.yml skips them; any difference, or no stamp, runs every stage.
  - I(state=check) reads and compares. A stamp that no longer matches is removed (not in check
    mode), so that a run which then stops half-way leaves none behind.
  - I(state=stamp) writes the stamp from the host as it is now; site.yml does so after verify
    passed. The file is rewritten only when it differs.
  - The stamp is gpuenv's bookkeeping, not part of the stack. Writing or removing it reports
    C(stamped) or C(cleared), not C(changed), so that a re-run that left the stack alone still
    reports 0 changed.
  - What a fingerprint holds. For I(watch), each path's type, mode, owner and link target, and the
    same of each entry one level down, with a file's content (its size and mtime above 16 MiB);
    for I(walk), the type, mode, owner, size, mtime and link target of every entry
    below (directories by their entries, not their times; C(__pycache__) left out, which Python
    writes on import); for I(read), the file's content; for I(units), their active and enabled
    states.
    A file of a walked tree whose content changed in place with its size and time kept is not
    seen; gpuenv verify, which runs on every run, is the check of what the files do.
options:
  state:
    description: C(check) compares with the stamp; C(stamp) writes it.
    type: str
    choices: [check, stamp]
    default: check
  path:
    description: The stamp.
    type: path
    default: /var/lib/gpuenv/converged.json
  inputs:
    description: The digest of the run's inputs, computed on the controller (the gpuenv_digest filter).
    type: str
    required: true
  places:
    description:
      - The places the stages declare (each stage role's C(meta/places.yml)), read as the options of
        the same names are; I(watch), I(walk), I(read), I(units) and I(pending) add to them.
    type: dict
    default: {}
    suboptions:
      watch: {description: As I(watch)., type: list, elements: path, default: []}
      walk: {description: As I(walk)., type: list, elements: path, default: []}
      read: {description: As I(read)., type: list, elements: path, default: []}
      units: {description: As I(units)., type: list, elements: str, default: []}
      pending: {description: As I(pending)., type: list, elements: path, default: []}
  watch:
    description: Paths (globs allowed) read with their entries one level down.
    type: list
    elements: path
    default: []
  walk:
    description: Directories (globs allowed) read with every entry below them.
    type: list
    elements: path
    default: []
  read:
    description: Small files (globs allowed) whose content counts.
    type: list
    elements: path
    default: []
  units:
    description: systemd units whose active and enabled states count (C(systemctl show)).
    type: list
    elements: str
    default: []
  pending:
    description:
      - Files whose presence means the last run left work for the next (a reboot the driver needs
        that the policy did not allow). While one exists the host is never converged and no stamp
        is written.
    type: list
    elements: path
    default: []
  verify_report:
    description:
      - gpuenv verify's JSON report on the host. Unless it exists and says verify passed
        (C(exit_code) 0), the host is not converged, so that a run after a failed verify runs every
        stage again rather than skip to the same failure.
    type: path
  skip:
    description: With false, I(state=check) reports the host not converged whatever it finds (and clears the stamp).
    type: bool
    default: true
  keep:
    description:
      - With I(state=stamp), what the run worked out that a converged re-run needs again without
        working it out (the driver's package names, which the stage reads from the host's OS and
        GPUs); I(state=check) returns it as C(kept) when the host is converged.
    type: dict
    default: {}
"""

EXAMPLES = r"""
- name: Compare the host with its last complete run
  gpuenv_converged:
    inputs: "{{ {'code': code_digest, 'stack': gpu_stack_resolved} | gpuenv_digest }}"
    watch: [/usr/local, /var/lib/dpkg/status, /etc/apt/sources.list.d]
    walk: [/opt/gpuenv/cuda, /opt/gpuenv/envs]
    read: [/sys/module/nvidia/version]
    units: [nvidia-persistenced]
  register: converged_register_check
"""

RETURN = r"""
converged:
  description: Whether the stamp matches the inputs and every fingerprint (state=check).
  type: bool
why:
  description: Why the stages run (or that they are skipped), in one sentence.
  type: str
differs:
  description: The places whose fingerprint differs from the stamp's (C(inputs) for the inputs).
  type: list
  elements: str
stamped:
  description: Whether the stamp was written (state=stamp; not in check mode).
  type: bool
cleared:
  description: Whether a stamp that no longer matched was removed (state=check; not in check mode).
  type: bool
kept:
  description: The stamp's I(keep) when the host is converged (state=check), else empty.
  type: dict
inputs:
  description: The I(inputs) given, for the stamp written at the end of the run.
  type: str
fingerprint:
  description: Each place's fingerprint, C(watch:PATH), C(walk:PATH), C(read:PATH), C(units).
  type: dict
"""

FORMAT = 1
# The kinds of place, each an option of its own and a key of I(places), with its elements' type.
KINDS = ("watch", "walk", "read", "units", "pending")
ELEMENTS = {"watch": "path", "walk": "path", "read": "path", "units": "str", "pending": "path"}


def merge_places(params: dict[str, Any]) -> dict[str, Any]:
    """The parameters with each kind's places from I(places) and the option of its name, each once."""
    declared = params.get("places") or {}
    merged = {k: list(dict.fromkeys([*(declared.get(k) or []), *(params.get(k) or [])])) for k in KINDS}
    return {**params, **merged}


def load_stamp(path: str) -> dict[str, Any] | None:
    try:
        with open(path) as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("format") == FORMAT else None


def compare(stamp: dict[str, Any] | None, inputs: str, prints: dict[str, str]) -> tuple[bool, list[str], str]:
    """(converged, what differs, why) for a stamp against this run's inputs and the host's prints."""
    if stamp is None:
        return False, [], "no stamp of a complete run (the first run, or the last one did not finish): every stage runs"
    differs = [] if stamp.get("inputs") == inputs else ["inputs"]
    old = stamp.get("fingerprint") or {}
    differs += sorted(k for k in set(old) | set(prints) if old.get(k) != prints.get(k))
    if not differs:
        return True, [], "as the last complete run left it: the stages are skipped, verify runs"
    parts = []
    if "inputs" in differs:
        parts.append("the declared settings or gpuenv's code changed")
    places = [k.split(":", 1)[-1] for k in differs if k != "inputs"]
    if places:
        shown = ", ".join(places[:4]) + (f" and {len(places) - 4} more" if len(places) > 4 else "")
        parts.append(f"changed on the host since: {shown}")
    return False, differs, "; ".join(parts) + ": every stage runs"


def verify_failed(path: str | None) -> str | None:
    """Why the last gpuenv verify on the host does not vouch for it (None when it passed)."""
    if not path:
        return None
    try:
        with open(path) as fh:
            report = json.load(fh)
    except FileNotFoundError:
        return f"no gpuenv verify report at {path}"
    except (OSError, ValueError) as exc:
        return f"the gpuenv verify report {path} cannot be read ({exc})"
    code = report.get("exit_code") if isinstance(report, dict) else None
    return None if code == 0 else f"the last gpuenv verify on the host failed (exit {code})"


def write_stamp(path: str, inputs: str, prints: dict[str, str], keep: dict[str, Any]) -> bool:
    """Write the stamp when it differs (atomically: a rename); True when it was written."""
    stamp = {"format": FORMAT, "inputs": inputs, "fingerprint": prints, "kept": keep}
    body = json.dumps(stamp, indent=1, sort_keys=True) + "\n"
    try:
        with open(path) as fh:
            if fh.read() == body:
                return False
    except OSError:
        pass
    os.makedirs(os.path.dirname(path) or ".", mode=0o755, exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as fh:
        fh.write(body)
        fh.flush()
        os.fsync(fh.fileno())
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    return True


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "state": {"type": "str", "choices": ["check", "stamp"], "default": "check"},
            "path": {"type": "path", "default": "/var/lib/gpuenv/converged.json"},
            "inputs": {"type": "str", "required": True},
            "places": {
                "type": "dict",
                "default": {},
                "options": {kind: {"type": "list", "elements": ELEMENTS[kind], "default": []} for kind in KINDS},
            },
            "watch": {"type": "list", "elements": "path", "default": []},
            "walk": {"type": "list", "elements": "path", "default": []},
            "read": {"type": "list", "elements": "path", "default": []},
            "units": {"type": "list", "elements": "str", "default": []},
            "pending": {"type": "list", "elements": "path", "default": []},
            "verify_report": {"type": "path"},
            "skip": {"type": "bool", "default": True},
            "keep": {"type": "dict", "default": {}},
        },
        supports_check_mode=True,
    )
    p = merge_places(module.params)
    module.exit_json(**run(p, module.check_mode, module.get_bin_path("systemctl"), module.run_command))


def run(p: dict[str, Any], check_mode: bool, systemctl: str | None, runner: Runner) -> dict[str, Any]:
    """The module's result for its parameters P."""
    prints = fingerprint(p, systemctl, runner)
    pending = [path for path in patterns(p["pending"]) if os.path.lexists(path)]
    left = f"{', '.join(pending)} says the last run left work for the next"
    result: dict[str, Any] = {
        "changed": False,
        "stamped": False,
        "cleared": False,
        "differs": [],
        "kept": {},
        "inputs": p["inputs"],
        "fingerprint": prints,
    }
    stamp: dict[str, Any] | None = None
    if p["state"] == "stamp" and not pending:
        stamped = False if check_mode else write_stamp(p["path"], p["inputs"], prints, p.get("keep") or {})
        return {**result, "stamped": stamped, "converged": True, "why": "stamped"}
    if p["state"] == "stamp":
        converged, why = False, f"not stamped: {left}"
    else:
        stamp = load_stamp(p["path"])
        converged, result["differs"], why = compare(stamp, p["inputs"], prints)
        failed = verify_failed(p.get("verify_report"))
        if converged and failed:
            converged, why = False, f"{failed}: every stage runs"
        if converged and pending:
            converged, why = False, f"{left}: every stage runs"
        if converged and not p["skip"]:
            converged, why = False, "converged_skip is false: every stage runs"
    if not converged and not check_mode and os.path.lexists(p["path"]):
        # A stamp that no longer holds goes now: a run that stops half-way must not leave one.
        os.unlink(p["path"])
        result["cleared"] = True
    if converged and stamp:
        result["kept"] = stamp.get("kept") or {}
    return {**result, "converged": converged, "why": why}


if __name__ == "__main__":
    main()
