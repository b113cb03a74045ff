"""Filter plugin: the playbooks' preflight calls the same gpuenv code as `gpuenv check-spec`.

    {{ gpu_stack | gpuenv_check_stack(nvidia_smi=..., lspci=..., host_facts=ansible_facts) }}

returns the check result as a dict (verdict, ok, errors, warnings, the resolved stack) plus
`text`, the same report check-spec prints.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpuenv.checkspec import check_mapping, cudnn_fetch_mode
from gpuenv.module_utils.gpuenv_hostparse import nvswitches
from gpuenv.osvars import chain, selections, unserved
from gpuenv.probes import parse_nvidia_smi_gpus
from gpuenv.report import format_text

# The roles the preflight checks the host's OS against (gpuenv.osvars): this repository's.
ROLES_DIR = Path(__file__).resolve().parents[2] / "roles"

# The variables beside gpu_stack that rule fabric-manager reads.
SERVICES_SETTINGS = ("nvidia_driver_source", "gpu_services_fabricmanager")


def gpuenv_check_stack(
    stack: Any,
    nvidia_smi: str | None = None,
    host_gpus: list[dict[str, str]] | None = None,
    host_facts: dict[str, Any] | None = None,
    backend: str | None = None,
    *,
    settings: dict[str, Any] | None = None,
    lspci: str | None = None,
    os_facts: dict[str, Any] | None = None,
    play_roles: list[str] | None = None,
) -> dict[str, Any]:
    """settings: the variables beside gpu_stack the rules read (cudnn_source, cudnn_tarball_url,
    cudnn_tarball_path, nvidia_driver_source, gpu_services_fabricmanager, and each role's source for
    the OS check); lspci: `lspci -nn` of the host, for its NVSwitches; os_facts: the host's facts
    for the roles' OS check (rule os-role), whether or not host_facts checks gpu_stack.os;
    play_roles: the play's roles (ansible_play_role_names), the roles of the run for that check."""
    gpus = list(host_gpus or [])
    if nvidia_smi:
        gpus.extend(parse_nvidia_smi_gpus(str(nvidia_smi)))
    facts = {str(k): v for k, v in host_facts.items()} if host_facts else None
    result = check_mapping(
        stack,
        host_gpus=gpus,
        host_facts=facts,
        backend=str(backend) if backend else None,
        cudnn_fetch=cudnn_fetch_mode(settings or {}),
        nvswitches=nvswitches(str(lspci)) if lspci else (),
        services_settings={k: (settings or {}).get(k) for k in SERVICES_SETTINGS},
        unserved=unserved(ROLES_DIR, os_facts, selections(settings or {}, play_roles)) if os_facts else (),
    )
    result["text"] = format_text(result, verbose_sources=False)
    return result


def gpuenv_os_vars_files(facts: dict[str, Any], prefix: str | None = None) -> list[str]:
    """The OS vars chain's file names for a role's first_found (gpuenv.osvars.chain)."""
    return chain(facts, prefix or None)


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"gpuenv_check_stack": gpuenv_check_stack, "gpuenv_os_vars_files": gpuenv_os_vars_files}
