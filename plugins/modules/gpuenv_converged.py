#!/usr/bin/python
"""Ansible module gpuenv_converged: tell whether a host is as the last complete run of site.yml left
it, from one read of the places gpuenv writes, so that a re-run skips the stages that would change
nothing."""

from __future__ import annotations

import glob
import hashlib
import json
import os
import stat
from collections.abc import Callable, Iterable
from typing import Any

from ansible.module_utils.basic import AnsibleModule

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
    description: The digest of the run's inputs, from the controller (gpuenv_converged_inputs).
    type: str
    required: true
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
"""

EXAMPLES = r"""
- name: Compare the host with its last complete run
  gpuenv_converged:
    inputs: "{{ converged_inputs }}"
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
fingerprint:
  description: Each place's fingerprint, C(watch:PATH), C(walk:PATH), C(read:PATH), C(units).
  type: dict
"""

FORMAT = 1
SKIP_NAMES = frozenset({"__pycache__"})
# Watched files up to this size count by their content (dpkg's status file is a few MB).
CONTENT_LIMIT = 16 * 1024 * 1024


def _patterns(patterns: Iterable[str]) -> list[str]:
    """Each pattern's matches, sorted; a plain path stands for itself whether it exists or not."""
    paths: list[str] = []
    for pattern in patterns:
        if any(ch in pattern for ch in "*?["):
            paths += sorted(glob.glob(pattern))
        else:
            paths.append(pattern)
    return paths


def _sig(path: str, st: os.stat_result, *, times: bool = True) -> str:
    kind = stat.S_IFMT(st.st_mode)
    fields = [oct(st.st_mode), str(st.st_uid), str(st.st_gid)]
    if stat.S_ISLNK(st.st_mode):
        try:
            fields.append(os.readlink(path))
        except OSError:
            fields.append("?")
    elif kind != stat.S_IFDIR:
        fields.append(str(st.st_size))
        if times:
            fields.append(str(st.st_mtime_ns))
    return " ".join(fields)


def _lstat(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except OSError:
        return None


def _content_sig(path: str, st: os.stat_result) -> str:
    """A watched file: its content where small (a file written again with the same bytes, as a boot
    or a tool does with its settings, is no change), its size and time where large (a kernel)."""
    if stat.S_ISREG(st.st_mode) and st.st_size <= CONTENT_LIMIT:
        try:
            with open(path, "rb") as fh:
                return f"{oct(st.st_mode)} {st.st_uid} {st.st_gid} sha256:{hashlib.sha256(fh.read()).hexdigest()}"
        except OSError as exc:
            return f"unreadable {exc.errno}"
    return _sig(path, st)


def watch_fingerprint(path: str) -> str:
    """The path and its entries one level down (small files by their content, large ones by size and
    time, directories by their names)."""
    h = hashlib.sha256()
    st = _lstat(path)
    if st is None:
        return "absent"
    h.update(f". {_content_sig(path, st)}\n".encode())
    if stat.S_ISDIR(st.st_mode):
        try:
            names = sorted(os.listdir(path))
        except OSError as exc:
            return f"unreadable: {exc.strerror}"
        for name in names:
            child = os.path.join(path, name)
            cst = _lstat(child)
            h.update(f"{name} {_content_sig(child, cst) if cst else 'gone'}\n".encode())
    return h.hexdigest()


def walk_fingerprint(path: str) -> str:
    """Every entry below the directory: its name, type, mode, owner, size, time and link target;
    a directory by its entries (its own time changes with every file written and removed inside)."""
    st = _lstat(path)
    if st is None:
        return "absent"
    if not stat.S_ISDIR(st.st_mode):
        return watch_fingerprint(path)
    h = hashlib.sha256()
    h.update(f". {_sig(path, st, times=False)}\n".encode())
    stack = [path]
    while stack:
        top = stack.pop()
        rel = os.path.relpath(top, path)
        lines: list[str] = []
        try:
            with os.scandir(top) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            h.update(f"{rel} unreadable {exc.errno}\n".encode())
            continue
        for entry in entries:
            if entry.name in SKIP_NAMES:
                continue
            try:
                est = entry.stat(follow_symlinks=False)
            except OSError:
                lines.append(f"{entry.name} gone")
                continue
            mode = est.st_mode
            if stat.S_ISREG(mode):
                # The common case inline (an environment has tens of thousands of files).
                lines.append(f"{entry.name} {mode:o} {est.st_uid} {est.st_gid} {est.st_size} {est.st_mtime_ns}")
            else:
                lines.append(f"{entry.name} {_sig(entry.path, est)}")
                if stat.S_ISDIR(mode):
                    stack.append(entry.path)
        h.update(f"[{rel}]\n{chr(10).join(lines)}\n".encode())
    return h.hexdigest()


def read_fingerprint(path: str) -> str:
    try:
        with open(path, "rb") as fh:
            return hashlib.sha256(fh.read()).hexdigest()
    except FileNotFoundError:
        return "absent"
    except OSError as exc:
        return f"unreadable: {exc.strerror}"


Runner = Callable[[list[str]], tuple[int, str, str]]


def units_fingerprint(units: list[str], systemctl: str | None, run: Runner) -> str:
    """Each unit's ActiveState and UnitFileState, as `systemctl show` reports them: one block per
    unit, a unit that does not exist included (inactive, no file state). Not the symlinks under
    /etc/systemd/system: a clone's first boot applies the presets there, and the units' state is
    what the stages set."""
    if not units:
        return "none"
    if systemctl is None:
        return "no systemctl"
    _, out, _ = run([systemctl, "show", "--property=Id,ActiveState,UnitFileState", "--", *units])
    return hashlib.sha256(out.encode()).hexdigest()


def fingerprint(p: dict[str, Any], systemctl: str | None, run: Runner) -> dict[str, str]:
    """Each place of the parameters' watch, walk, read and units, with its fingerprint."""
    prints: dict[str, str] = {}
    for path in _patterns(p["watch"]):
        prints[f"watch:{path}"] = watch_fingerprint(path)
    for path in _patterns(p["walk"]):
        prints[f"walk:{path}"] = walk_fingerprint(path)
    for path in _patterns(p["read"]):
        prints[f"read:{path}"] = read_fingerprint(path)
    prints["units"] = units_fingerprint(p["units"], systemctl, run)
    return prints


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


def write_stamp(path: str, inputs: str, prints: dict[str, str]) -> bool:
    """Write the stamp when it differs (atomically: a rename); True when it was written."""
    body = json.dumps({"format": FORMAT, "inputs": inputs, "fingerprint": prints}, indent=1, sort_keys=True) + "\n"
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
            "watch": {"type": "list", "elements": "path", "default": []},
            "walk": {"type": "list", "elements": "path", "default": []},
            "read": {"type": "list", "elements": "path", "default": []},
            "units": {"type": "list", "elements": "str", "default": []},
            "pending": {"type": "list", "elements": "path", "default": []},
            "verify_report": {"type": "path"},
            "skip": {"type": "bool", "default": True},
        },
        supports_check_mode=True,
    )
    p = module.params
    module.exit_json(**run(p, module.check_mode, module.get_bin_path("systemctl"), module.run_command))


def run(p: dict[str, Any], check_mode: bool, systemctl: str | None, runner: Runner) -> dict[str, Any]:
    """The module's result for its parameters P."""
    prints = fingerprint(p, systemctl, runner)
    pending = [path for path in _patterns(p["pending"]) if os.path.lexists(path)]
    left = f"{', '.join(pending)} says the last run left work for the next"
    result: dict[str, Any] = {
        "changed": False,
        "stamped": False,
        "cleared": False,
        "differs": [],
        "fingerprint": prints,
    }
    if p["state"] == "stamp" and not pending:
        stamped = False if check_mode else write_stamp(p["path"], p["inputs"], prints)
        return {**result, "stamped": stamped, "converged": True, "why": "stamped"}
    if p["state"] == "stamp":
        converged, why = False, f"not stamped: {left}"
    else:
        converged, result["differs"], why = compare(load_stamp(p["path"]), p["inputs"], prints)
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
    return {**result, "converged": converged, "why": why}


if __name__ == "__main__":
    main()
