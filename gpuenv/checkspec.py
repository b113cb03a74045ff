"""One entry point for judging a stack, shared by `gpuenv check-spec` and the Ansible preflight."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from gpuenv.compat import load
from gpuenv.osvars import Unserved
from gpuenv.report import invalid_dict, to_dict
from gpuenv.rules import check
from gpuenv.stack import TOP_KEY, SpecError, load_stack_document, parse_stack


def cudnn_fetch_mode(settings: Mapping[str, Any]) -> str:
    """How the cudnn role gets its tarball, from the variables beside gpu_stack: "packages"
    (cudnn_source nvidia_repo or none: no tarball), "tarball" (cudnn_tarball_url or
    cudnn_tarball_path given), or "manifest" (NVIDIA's redist manifest names it)."""
    if str(settings.get("cudnn_source") or "tarball") in ("nvidia_repo", "none"):
        return "packages"
    if settings.get("cudnn_tarball_url") or settings.get("cudnn_tarball_path"):
        return "tarball"
    return "manifest"


def check_mapping(
    raw: Any,
    host_gpus: Iterable[Mapping[str, str]] = (),
    host_facts: Mapping[str, Any] | None = None,
    origin: str | None = None,
    backend: str | None = None,
    *,
    cudnn_fetch: str = "manifest",
    nvswitches: Iterable[Mapping[str, str]] = (),
    services_settings: Mapping[str, Any] | None = None,
    unserved: Iterable[Unserved] = (),
) -> dict[str, Any]:
    """Judge a `gpu_stack` mapping; the result is a JSON-able dict (see report.to_dict). `backend`
    is the environment's (pytorch_env_backend: venv by default, conda), `cudnn_fetch` how the
    cudnn role gets its tarball (cudnn_fetch_mode), `nvswitches` the host's NVSwitch chips
    (hostparse.nvswitches) and `services_settings` nvidia_driver_source and
    gpu_services_fabricmanager beside the stack (rule fabric-manager), `unserved` the roles of the
    run that cannot serve the host's OS (gpuenv.osvars.unserved, rule os-role)."""
    if not isinstance(raw, Mapping):
        return invalid_dict([f"gpu_stack must be a mapping of keys to values, not {type(raw).__name__}."], origin)
    data = load()
    try:
        stack = parse_stack(dict(raw), data)
    except SpecError as exc:
        return invalid_dict(exc.problems, origin)
    report = check(
        stack,
        data,
        host_gpus,
        host_facts,
        backend,
        cudnn_fetch=cudnn_fetch,
        nvswitches=nvswitches,
        services_settings=services_settings,
        unserved=unserved,
    )
    return to_dict(report, data, origin)


def check_file(path: Path, gpu_override: list[str] | None = None) -> dict[str, Any]:
    try:
        document = load_stack_document(path)
    except SpecError as exc:
        return invalid_dict(exc.problems, str(path))
    raw = document[TOP_KEY]
    if gpu_override:
        raw = {**raw, "gpu": gpu_override}
    backend = document.get("pytorch_env_backend")
    return check_mapping(
        raw,
        origin=str(path),
        backend=str(backend) if isinstance(backend, str) else None,
        cudnn_fetch=cudnn_fetch_mode(document),
    )
