"""Action plugin gpuenv_preflight: the preflight's check and verdict in one task on the controller.

It judges the declared stack with what the host said of itself (gpuenv.preflight, the code of
`gpuenv check-spec`), refuses a stack the check failed with the check's report, or returns the
resolved stack (`resolved`, a CPU build's without CUDA) and prints the verdict; a set_fact
publishes it. Not as facts of this result: Ansible keeps an action's facts as host facts, which
inject_facts_as_vars = False hides from the roles (and ansible-core 2.20 deprecates reading them
as top-level names).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ansible.plugins.action import ActionBase

from gpuenv.preflight import check_host

# The roles whose vars files the OS check reads (rule os-role): this repository's.
ROLES_DIR = Path(__file__).resolve().parents[2] / "roles"

# The resolved stack of a CPU build (gpu_stack_torch_cpu): no CUDA in torch to match.
CPU_BUILD = {"torch_variant": "cpu", "torch_cuda": None, "torch_cudnn": None, "torch_min_driver": None}

ARGUMENT_SPEC = {
    "stack": {"type": "raw", "required": True},
    "cpu_build": {"type": "bool", "default": False},
    "nvidia_smi": {"type": "str", "default": ""},
    "lspci": {"type": "str", "default": ""},
    "host_gpus": {"type": "list", "elements": "dict", "default": []},
    "host_facts": {"type": "dict"},
    "os_facts": {"type": "dict"},
    "backend": {"type": "str"},
    "play_roles": {"type": "list", "elements": "str"},
    "settings": {"type": "dict", "default": {}},
}


def verdict(check: dict[str, Any]) -> dict[str, Any]:
    """The task's result for the check's result: failed with its report, or the resolved stack and
    the verdict (with the warnings under it, where there are any)."""
    lines = str(check.get("text") or "").split("\n")
    if not check.get("ok"):
        return {"failed": True, "msg": lines}
    stack = dict(check.get("stack") or {})
    head = str(check.get("verdict", ""))
    if stack:
        head += f": {stack.get('torch')}+{stack.get('torch_variant')}"
    return {"msg": [head, *(lines if check.get("warnings") else [])], "stack": stack}


class ActionModule(ActionBase):  # type: ignore[misc]  # Ansible's base class is untyped
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result: dict[str, Any] = super().run(tmp, task_vars)
        _, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        check = check_host(
            args["stack"],
            roles_dir=ROLES_DIR,
            nvidia_smi=args["nvidia_smi"],
            lspci=args["lspci"],
            host_gpus=args["host_gpus"],
            host_facts=args["host_facts"],
            os_facts=args["os_facts"],
            backend=args["backend"],
            play_roles=args["play_roles"],
            settings=args["settings"],
        )
        out = verdict(check)
        # The verdict prints at the default verbosity, as assert's success message did.
        result["_ansible_verbose_always"] = True
        if out.get("failed"):
            result.update(failed=True, msg=out["msg"])
            return result
        resolved = {**out["stack"], **(CPU_BUILD if args["cpu_build"] else {})}
        result.update(changed=False, msg=out["msg"], check=check, resolved=resolved)
        return result
