"""Filters for the pytorch_env role, calling gpuenv.envplan (tested there)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

try:
    from gpuenv import envplan
except ImportError:  # ansible-playbook from a Python without gpuenv: use the repo's copy
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from gpuenv import envplan


def gpuenv_env_plan(settings: dict[str, Any]) -> dict[str, Any]:
    """The plan, or {"error": why} for the role's assert to show."""
    try:
        return {"error": None, **envplan.plan(**settings)}
    except envplan.EnvPlanError as exc:
        return {"error": str(exc)}


def gpuenv_lock_from_report(report: Any) -> str:
    return envplan.lock_from_report(report)


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"gpuenv_env_plan": gpuenv_env_plan, "gpuenv_lock_from_report": gpuenv_lock_from_report}
