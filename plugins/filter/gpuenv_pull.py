"""Filters for the pull_mode role, calling gpuenv.pullmode (tested there)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

try:
    from gpuenv import pullmode
except ImportError:  # ansible-playbook from a Python without gpuenv: use the repo's copy
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from gpuenv import pullmode


def gpuenv_pull_problems(settings: dict[str, Any]) -> list[str]:
    return pullmode.problems(dict(settings))


def gpuenv_systemd_quote(value: Any) -> str:
    return pullmode.systemd_quote(str(value))


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"gpuenv_pull_problems": gpuenv_pull_problems, "gpuenv_systemd_quote": gpuenv_systemd_quote}
