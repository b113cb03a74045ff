#!/usr/bin/python
"""Ansible module gpuenv_files: a role's directories and small files, in one module run.

A role that made its directories with a looped file task and wrote its small files (a profile
script, a loader path, a stack file) with a looped copy task paid a module run per item: about
0.15 s each on a host, every run, for a no-op too. This makes them in one run, in the order given."""

from __future__ import annotations

import grp
import os
import pwd
import stat
import tempfile
from typing import Any

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: gpuenv_files
short_description: Make a role's directories and write its small files in one step
description:
  - Each entry is a directory (C(state=directory), made with its parents where missing) or a file
    whose whole I(content) is given (C(state=file)). Entries are handled in order, so a directory
    can come before the files in it.
  - A file is replaced atomically (a temporary file in the same directory, then a rename), so a
    reader never sees half of it; a link where a file should be is replaced by the file, never
    followed.
  - A change is reported only where an entry's content, mode, owner or group differs; in check mode
    nothing is written and the diff shows what would be.
options:
  paths:
    description: The entries, in order.
    type: list
    elements: dict
    required: true
    suboptions:
      path:
        description: Absolute path.
        type: path
        required: true
      state:
        description: directory or file.
        type: str
        choices: [directory, file]
        default: file
      content:
        description: The file's whole text (state=file).
        type: str
      mode:
        description: Octal mode as a string ("0644"); directories default to 0755, files to 0644.
        type: str
  owner:
    description: The owner of every entry.
    type: str
    default: root
  group:
    description: The group of every entry.
    type: str
    default: root
"""

EXAMPLES = r"""
- name: Create the directories, and write the command and its stack
  gpuenv_files:
    paths:
      - {path: /opt/gpuenv/verify, state: directory}
      - {path: /usr/local/bin/gpuenv-verify, content: "#!/bin/sh\n...", mode: "0755"}
"""

RETURN = r"""
changed_paths:
  description: The entries that were (in check mode, would be) created or changed, in order.
  type: list
  elements: str
"""


def _ids(module: AnsibleModule) -> tuple[int, int]:
    owner, group = module.params["owner"], module.params["group"]
    try:
        return pwd.getpwnam(owner).pw_uid, grp.getgrnam(group).gr_gid
    except KeyError:
        module.fail_json(msg=f"gpuenv_files: the owner {owner!r} or the group {group!r} does not exist on this host")
        raise  # unreachable: fail_json exits


def _mode(module: AnsibleModule, entry: dict[str, Any]) -> int:
    given = entry.get("mode")
    if given is None:
        return 0o755 if entry["state"] == "directory" else 0o644
    try:
        value = int(str(given), 8)
    except ValueError:
        value = -1
    if not 0 <= value <= 0o7777:
        module.fail_json(
            msg=f"gpuenv_files: {entry['path']}: mode {str(given)[:20]!r} is not an octal mode like '0644'"
        )
    return value


def plan(module: AnsibleModule) -> list[dict[str, Any]]:
    """What each entry needs: [{path, state, mode, content, create, write, fix_meta, before}]."""
    uid, gid = _ids(module)
    out = []
    for entry in module.params["paths"]:
        path = entry["path"]
        if not os.path.isabs(path):
            module.fail_json(msg=f"gpuenv_files: {path[:120]!r} is not an absolute path")
        mode = _mode(module, entry)
        if entry["state"] == "file" and entry.get("content") is None:
            module.fail_json(msg=f"gpuenv_files: {path}: a file needs its content")
        try:
            st: os.stat_result | None = os.lstat(path)
        except FileNotFoundError:
            st = None
        step: dict[str, Any] = {"path": path, "state": entry["state"], "mode": mode, "uid": uid, "gid": gid}
        if entry["state"] == "directory":
            if st is not None and stat.S_ISLNK(st.st_mode) and os.path.isdir(path):
                st = os.stat(path)  # a link to a directory is a directory, as Ansible's file module takes it
            if st is not None and not stat.S_ISDIR(st.st_mode):
                module.fail_json(msg=f"gpuenv_files: {path} exists and is not a directory; move it away")
            step["create"] = st is None
            step["write"] = False
        else:
            content = str(entry["content"])
            before = ""
            if st is not None and stat.S_ISREG(st.st_mode):
                with open(path, encoding="utf-8", errors="replace") as handle:
                    before = handle.read()
            elif st is not None and stat.S_ISDIR(st.st_mode):
                module.fail_json(msg=f"gpuenv_files: {path} is a directory where a file should be; move it away")
            step["content"] = content
            step["before"] = before
            # A link (or anything not a regular file) is replaced by the file, never written through.
            step["create"] = st is None or not stat.S_ISREG(st.st_mode)
            step["write"] = step["create"] or before != content
        step["before_mode"] = f"{stat.S_IMODE(st.st_mode):04o}" if st is not None else None
        step["fix_meta"] = (
            step["create"] or stat.S_IMODE(st.st_mode) != mode or st.st_uid != uid or st.st_gid != gid
            if st is not None
            else True
        )
        out.append(step)
    return out


def _diff(step: dict[str, Any]) -> dict[str, Any]:
    """A file's content before and after; for a directory, or a file whose content stays, what Ansible's
    file module shows: its state and mode."""
    path = step["path"]
    if step["state"] == "file" and step["write"]:
        return {"before_header": path, "after_header": path, "before": step["before"], "after": step["content"]}
    before = {"path": path, "state": "absent"} if step["create"] else {"path": path, "mode": step["before_mode"]}
    return {"before": before, "after": {"path": path, "state": step["state"], "mode": f"{step['mode']:04o}"}}


def apply(module: AnsibleModule, step: dict[str, Any]) -> None:
    path = step["path"]
    if step["state"] == "directory":
        if step["create"]:
            os.makedirs(path, mode=step["mode"], exist_ok=True)
    elif step["write"]:
        descriptor, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=os.path.dirname(path))
        try:
            with os.fdopen(descriptor, "w", encoding="utf-8") as out:
                out.write(step["content"])
                out.flush()
                os.fsync(out.fileno())
            os.chmod(tmp, step["mode"])
            os.chown(tmp, step["uid"], step["gid"])
            os.replace(tmp, path)
        except OSError as exc:
            if os.path.exists(tmp):
                os.unlink(tmp)
            module.fail_json(msg=f"gpuenv_files: could not write {path}: {exc}")
    os.chown(path, step["uid"], step["gid"])
    os.chmod(path, step["mode"])


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "paths": {
                "type": "list",
                "elements": "dict",
                "required": True,
                "options": {
                    "path": {"type": "path", "required": True},
                    "state": {"type": "str", "choices": ["directory", "file"], "default": "file"},
                    "content": {"type": "str"},
                    "mode": {"type": "str"},
                },
            },
            "owner": {"type": "str", "default": "root"},
            "group": {"type": "str", "default": "root"},
        },
        supports_check_mode=True,
    )
    steps = plan(module)
    changed = [s for s in steps if s["create"] or s["write"] or s["fix_meta"]]
    result: dict[str, Any] = {"changed": bool(changed), "changed_paths": [s["path"] for s in changed]}
    if module._diff:
        result["diff"] = [_diff(s) for s in changed]
    if not module.check_mode:
        for step in changed:
            # A directory this run makes in check mode does not exist for the entries after it; in a
            # real run it is made first, as the order of the entries says.
            apply(module, step)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
