#!/usr/bin/python
"""Ansible module gpuenv_record: write a role's record of what it installed, the JSON local fact
that verify, drift, doctor, suggest --inventory and fleet_upgrade read, in one step (the facts
directory made where missing, the file replaced atomically, a diff in check mode)."""

from __future__ import annotations

import json
import os
import tempfile

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: gpuenv_record
short_description: Write a role's record as the local fact I(name) (/etc/ansible/facts.d/NAME.fact)
description:
  - Each role records what it installed as a JSON local fact, which Ansible reads as
    C(ansible_local.NAME). This writes it the way each role did with a directory task and a copy
    task, as one task - the directory C(0755), the file C(0644), both root's - and reports a change
    only when the record's content or the file's mode differs.
  - The file is replaced atomically, so that a reader never sees half a record.
options:
  name:
    description: The record's name, a plain word (the role's name); the file is NAME.fact.
    type: str
    required: true
  record:
    description: What to record (a mapping, written as sorted JSON).
    type: dict
    required: true
  facts_dir:
    description: Where the records go.
    type: path
    default: /etc/ansible/facts.d
"""

EXAMPLES = r"""
- name: Record what the role installed
  gpuenv_record:
    name: cudnn
    record: {source: tarball, version: 9.1.0.70}
"""

RETURN = r"""
path:
  description: The record's file.
  type: str
record:
  description: The record as written.
  type: dict
"""


def render(record: dict[str, object]) -> str:
    """The record's text, as to_nice_json(sort_keys=true) writes it, with a final newline."""
    return json.dumps(record, indent=4, sort_keys=True, ensure_ascii=False) + "\n"


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "name": {"type": "str", "required": True},
            "record": {"type": "dict", "required": True},
            "facts_dir": {"type": "path", "default": "/etc/ansible/facts.d"},
        },
        supports_check_mode=True,
    )
    name = module.params["name"]
    if not name.replace("_", "").isalnum() or not name.isascii():
        module.fail_json(msg=f"gpuenv_record: the name {name[:40]!r} must be a plain word (letters, digits, _)")
    facts_dir = module.params["facts_dir"]
    path = os.path.join(facts_dir, f"{name}.fact")
    text = render(module.params["record"])
    try:
        with open(path, encoding="utf-8") as handle:
            before = handle.read()
        mode = os.stat(path).st_mode & 0o7777
    except FileNotFoundError:
        before, mode = "", None
    changed = before != text or mode != 0o644 or not os.path.isdir(facts_dir)
    result: dict[str, object] = {"changed": changed, "path": path, "record": module.params["record"]}
    if module._diff:
        result["diff"] = {"before": before, "after": text, "before_header": path, "after_header": path}
    if changed and not module.check_mode:
        os.makedirs(facts_dir, mode=0o755, exist_ok=True)
        descriptor, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=facts_dir)
        with os.fdopen(descriptor, "w", encoding="utf-8") as out:
            out.write(text)
        # atomic_move gives the new file the old one's mode; the record's mode is set after it.
        module.atomic_move(tmp, path)
        os.chmod(path, 0o644)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
