"""Filters for the cuda_toolkit and cudnn roles, calling gpuenv.redist (tested there)."""

from __future__ import annotations

from typing import Any

from gpuenv import redist
from gpuenv.module_utils import gpuenv_hostparse as hostparse


def gpuenv_redist_archives(manifest: Any, components: list[str], variant: str | None = None) -> dict[str, Any]:
    """{"archives": [...], "id": tree id, "error": None} or {"archives": [], "id": None, "error": why}."""
    try:
        found = redist.archives(manifest, [str(c) for c in components], variant=variant)
    except (redist.RedistError, ValueError, KeyError, TypeError) as exc:
        return {"archives": [], "id": None, "error": str(exc)}
    return {"archives": found, "id": redist.tree_id(found), "error": None}


def gpuenv_tool_version(text: str) -> dict[str, str] | None:
    return hostparse.tool_version(str(text))


def gpuenv_debian_toolkit_release(debian_version: str) -> str | None:
    return redist.debian_toolkit_release(str(debian_version))


def gpuenv_fetch_failures(results: list[dict[str, Any]], base_url: str) -> list[str]:
    return redist.fetch_failures(list(results or []), str(base_url))


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "gpuenv_redist_archives": gpuenv_redist_archives,
            "gpuenv_tool_version": gpuenv_tool_version,
            "gpuenv_debian_toolkit_release": gpuenv_debian_toolkit_release,
            "gpuenv_fetch_failures": gpuenv_fetch_failures,
        }
