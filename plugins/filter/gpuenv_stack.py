"""Filter plugin: the playbooks' preflight calls the same gpuenv code as `gpuenv check-spec`.

    {{ gpu_stack | gpuenv_check_stack(nvidia_smi=..., lspci=..., host_facts=ansible_facts) }}

returns the check result as a dict (verdict, ok, errors, warnings, the resolved stack) plus
`text`, the same report check-spec prints.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

try:
    from gpuenv.checkspec import check_mapping, cudnn_fetch_mode
    from gpuenv.hostparse import nvswitches
    from gpuenv.probes import parse_nvidia_smi_gpus
    from gpuenv.report import format_text
except ImportError:
    # ansible-playbook run from a Python without gpuenv installed (not the repo's .venv): the
    # package sits two levels above this file, so use that copy rather than fail the preflight.
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from gpuenv.checkspec import check_mapping, cudnn_fetch_mode
    from gpuenv.hostparse import nvswitches
    from gpuenv.probes import parse_nvidia_smi_gpus
    from gpuenv.report import format_text

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
) -> dict[str, Any]:
    """settings: the variables beside gpu_stack the rules read (cudnn_source, cudnn_tarball_url,
    cudnn_tarball_path, nvidia_driver_source, gpu_services_fabricmanager); lspci: `lspci -nn`
    of the host, for its NVSwitches."""
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
    )
    result["text"] = format_text(result, verbose_sources=False)
    return result


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"gpuenv_check_stack": gpuenv_check_stack}
