"""One entry point for judging a stack, shared by `gpuenv check-spec` and the Ansible preflight."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from gpuenv.compat import load
from gpuenv.report import invalid_dict, to_dict
from gpuenv.rules import check
from gpuenv.stack import SpecError, load_stack_file, parse_stack


def check_mapping(
    raw: Any,
    host_gpus: Iterable[Mapping[str, str]] = (),
    host_facts: Mapping[str, Any] | None = None,
    origin: str | None = None,
) -> dict[str, Any]:
    """Judge a `gpu_stack` mapping; the result is a JSON-able dict (see report.to_dict)."""
    if not isinstance(raw, Mapping):
        return invalid_dict([f"gpu_stack must be a mapping of keys to values, not {type(raw).__name__}."], origin)
    data = load()
    try:
        stack = parse_stack(dict(raw), data)
    except SpecError as exc:
        return invalid_dict(exc.problems, origin)
    return to_dict(check(stack, data, host_gpus, host_facts), data, origin)


def check_file(path: Path, gpu_override: list[str] | None = None) -> dict[str, Any]:
    try:
        raw = load_stack_file(path)
    except SpecError as exc:
        return invalid_dict(exc.problems, str(path))
    if gpu_override:
        raw = {**raw, "gpu": gpu_override}
    return check_mapping(raw, origin=str(path))
