#!/usr/bin/python
"""Test fixture: report the given OS as this host's facts, so that a role's OS-specific plan can
be exercised in check mode on the controller for OSes the sandbox cannot boot (Ubuntu, RHEL)."""

from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: gpuenv_test_os_facts
short_description: Report the given OS as the host's distribution facts (tests only).
options:
  distribution: {type: str, required: true}
  version: {type: str, required: true}
  os_family: {type: str, required: true}
"""


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "distribution": {"type": "str", "required": True},
            "version": {"type": "str", "required": True},
            "os_family": {"type": "str", "required": True},
        },
        supports_check_mode=True,
    )
    version = module.params["version"]
    module.exit_json(
        changed=False,
        ansible_facts={
            "distribution": module.params["distribution"],
            "distribution_version": version,
            "distribution_major_version": version.split(".")[0],
            "os_family": module.params["os_family"],
            "architecture": "x86_64",
        },
    )


if __name__ == "__main__":
    main()
