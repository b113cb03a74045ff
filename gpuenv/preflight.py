"""The preflight's check of one host: the declared stack judged by the same code as
`gpuenv check-spec`, with what the host said of itself (its GPUs from nvidia-smi, its NVSwitches
from lspci, its OS facts) and the settings beside the stack that rules read. The action plugin
gpuenv_preflight (role gpu_stack) calls it on the controller and publishes the resolved stack."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gpuenv.checkspec import check_mapping, cudnn_fetch_mode
from gpuenv.module_utils.gpuenv_hostparse import nvswitches
from gpuenv.osvars import selections, unserved
from gpuenv.probes import parse_nvidia_smi_gpus
from gpuenv.report import format_text

# The variables beside gpu_stack that rule fabric-manager reads.
SERVICES_SETTINGS = ("nvidia_driver_source", "gpu_services_fabricmanager")


def check_host(
    stack: Any,
    *,
    roles_dir: Path | None = None,
    nvidia_smi: str | None = None,
    host_gpus: Sequence[Mapping[str, str]] | None = None,
    host_facts: Mapping[str, Any] | None = None,
    backend: str | None = None,
    settings: Mapping[str, Any] | None = None,
    lspci: str | None = None,
    os_facts: Mapping[str, Any] | None = None,
    play_roles: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The check's result (verdict, ok, errors, warnings, the resolved stack) and `text`, the report
    check-spec prints. host_facts: the facts gpu_stack.os is checked against (None: not checked);
    settings: the variables beside gpu_stack the rules read (cudnn_source, cudnn_tarball_url,
    cudnn_tarball_path, nvidia_driver_source, gpu_services_fabricmanager, and each role's source for
    the OS check); lspci: `lspci -nn` of the host, for its NVSwitches; os_facts: the host's facts for
    the roles' OS check (rule os-role) against the vars files under roles_dir; play_roles: the
    play's roles (ansible_play_role_names), the roles of the run for that check."""
    gpus = [dict(g) for g in host_gpus or []]
    if nvidia_smi:
        gpus.extend(parse_nvidia_smi_gpus(str(nvidia_smi)))
    given = dict(settings or {})
    result = check_mapping(
        stack,
        host_gpus=gpus,
        host_facts={str(k): v for k, v in host_facts.items()} if host_facts else None,
        backend=str(backend) if backend else None,
        cudnn_fetch=cudnn_fetch_mode(given),
        nvswitches=nvswitches(str(lspci)) if lspci else (),
        services_settings={k: given.get(k) for k in SERVICES_SETTINGS},
        unserved=(
            unserved(roles_dir, dict(os_facts), selections(roles_dir, given, play_roles))
            if os_facts and roles_dir
            else ()
        ),
    )
    result["text"] = format_text(result, verbose_sources=False)
    return result
