"""Filter plugin for the roles' OS vars files: the file names a role's first_found looks for on a
host (gpuenv.osvars.chain), the same chain the preflight's OS check reads (gpuenv/preflight.py)."""

from __future__ import annotations

from typing import Any

from gpuenv.osvars import chain


def gpuenv_os_vars_files(facts: dict[str, Any], prefix: str | None = None) -> list[str]:
    """The OS vars chain's file names for a role's first_found (gpuenv.osvars.chain)."""
    return chain(facts, prefix or None)


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"gpuenv_os_vars_files": gpuenv_os_vars_files}
