"""Action plugin gpuenv_preflight: the preflight's verdict in one task on the controller.

The check itself is the gpuenv_check_stack filter, templated in the task's `check` argument. This
plugin refuses a stack the check failed, with the check's report, or returns the resolved stack
(`resolved`, a CPU build's without CUDA) and prints the verdict; a set_fact publishes it. Not as
facts of this result: Ansible keeps an action's facts as host facts, which
inject_facts_as_vars = False hides from the roles (and ansible-core 2.20 deprecates reading them
as top-level names). Before, that was an assert and two set_fact tasks, each a worker per host on
the controller: on a no-op re-run of a fleet the preflight is what every host pays.
"""

from __future__ import annotations

from typing import Any

from ansible.plugins.action import ActionBase

# The resolved stack of a CPU build (gpu_stack_torch_cpu): no CUDA in torch to match.
CPU_BUILD = {"torch_variant": "cpu", "torch_cuda": None, "torch_cudnn": None, "torch_min_driver": None}

ARGUMENT_SPEC = {
    "check": {"type": "dict", "required": True},
    "cpu_build": {"type": "bool", "default": False},
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
        check = args["check"]
        out = verdict(check)
        # The verdict prints at the default verbosity, as assert's success message did.
        result["_ansible_verbose_always"] = True
        if out.get("failed"):
            result.update(failed=True, msg=out["msg"])
            return result
        resolved = {**out["stack"], **(CPU_BUILD if args["cpu_build"] else {})}
        result.update(changed=False, msg=out["msg"], check=check, resolved=resolved)
        return result
