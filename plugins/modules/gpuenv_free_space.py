#!/usr/bin/python
"""Ansible module gpuenv_free_space: refuse to start writing what will not fit."""

from __future__ import annotations

import os
from typing import Any

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: gpuenv_free_space
short_description: Fail before a build when the filesystem it writes to lacks the room
description:
  - A toolkit tree, a cuDNN or an environment that fills its disk half-way leaves a partial build
    to clean up and a host that may not log in. The roles call this module first with what they
    are about to write, and stop before anything changes, naming both figures and the variable that
    moves the build elsewhere.
  - I(path) need not exist yet; the filesystem of its nearest existing parent is measured.
  - Reads only; the same in check mode.
options:
  path:
    description: Where the build writes.
    type: path
    required: true
  need_mb:
    description: What the build writes there, in MiB (an estimate the role makes).
    type: int
    required: true
  what:
    description: What is about to be written, for the message (C(the CUDA 12.4.1 toolkit tree)).
    type: str
    required: true
  fix:
    description: How to make room, for the message (the variable that moves the build).
    type: str
    default: free space there
"""

EXAMPLES = r"""
- name: Check the room for the toolkit trees
  gpuenv_free_space:
    path: /opt/gpuenv/cuda
    need_mb: 900
    what: the CUDA 12.4.1 toolkit tree
    fix: free space there, or set cuda_toolkit_root to a bigger disk
"""

RETURN = r"""
free_mb:
  description: The free space, in MiB, for root, on the filesystem that holds I(path).
  type: int
measured:
  description: The existing directory that was measured.
  type: str
"""


def nearest_existing(path: str) -> str:
    path = os.path.abspath(path)
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def free_mb(path: str) -> int:
    st = os.statvfs(path)
    # f_bavail: what an unprivileged writer gets; root's builds should leave the reserve alone too.
    return st.f_bavail * st.f_frsize // (1024 * 1024)


def judge(path: str, need_mb: int, what: str, fix: str) -> dict[str, Any]:
    measured = nearest_existing(path)
    free = free_mb(measured)
    result: dict[str, Any] = {"changed": False, "free_mb": free, "measured": measured}
    if free < need_mb:
        result["failed"] = True
        result["msg"] = (
            f"{what} needs about {need_mb} MiB at {path}, and its filesystem has {free} MiB free "
            f"(measured at {measured}); nothing was changed. {fix[:1].upper()}{fix[1:]}."
        )
    return result


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "need_mb": {"type": "int", "required": True},
            "what": {"type": "str", "required": True},
            "fix": {"type": "str", "default": "free space there"},
        },
        supports_check_mode=True,
    )
    p = module.params
    result = judge(p["path"], p["need_mb"], p["what"], p["fix"])
    if result.get("failed"):
        module.fail_json(**{k: v for k, v in result.items() if k != "failed"})
    module.exit_json(**result)


if __name__ == "__main__":
    main()
