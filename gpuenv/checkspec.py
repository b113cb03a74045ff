"""One entry point for judging a stack, shared by `gpuenv check-spec` and the Ansible preflight."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from gpuenv.compat import load
from gpuenv.report import invalid_dict, to_dict
from gpuenv.rules import check
from gpuenv.stack import TOP_KEY, SpecError, load_stack_document, parse_stack


def check_mapping(
    raw: Any,
    host_gpus: Iterable[Mapping[str, str]] = (),
    host_facts: Mapping[str, Any] | None = None,
    origin: str | None = None,
    backend: str | None = None,
) -> dict[str, Any]:
    """Judge a `gpu_stack` mapping; the result is a JSON-able dict (see report.to_dict). `backend`
    is the environment's (pytorch_env_backend: venv by default, conda)."""
    if not isinstance(raw, Mapping):
        return invalid_dict([f"gpu_stack must be a mapping of keys to values, not {type(raw).__name__}."], origin)
    data = load()
    try:
        stack = parse_stack(dict(raw), data)
    except SpecError as exc:
        return invalid_dict(exc.problems, origin)
    return to_dict(check(stack, data, host_gpus, host_facts, backend), data, origin)


def check_file(path: Path, gpu_override: list[str] | None = None) -> dict[str, Any]:
    try:
        document = load_stack_document(path)
    except SpecError as exc:
        return invalid_dict(exc.problems, str(path))
    raw = document[TOP_KEY]
    if gpu_override:
        raw = {**raw, "gpu": gpu_override}
    backend = document.get("pytorch_env_backend")
    return check_mapping(raw, origin=str(path), backend=str(backend) if isinstance(backend, str) else None)
