"""Filters for the pytorch_env role, calling gpuenv.envplan and gpuenv.drift (tested there)."""

from __future__ import annotations

from typing import Any

from gpuenv import condaplan, drift, envplan


def gpuenv_env_plan(settings: dict[str, Any]) -> dict[str, Any]:
    """The plan, or {"error": why} for the role's assert to show."""
    try:
        return {"error": None, **envplan.plan(**settings)}
    except envplan.EnvPlanError as exc:
        return {"error": str(exc)}


def gpuenv_channel_urls(channels: list[str], named: dict[str, str]) -> dict[str, list[str]]:
    return condaplan.channel_urls(channels, named)


def gpuenv_lock_from_report(report: Any) -> str:
    return envplan.lock_from_report(report)


def gpuenv_pylock_from_report(report: Any, python: str) -> str:
    return envplan.pylock_from_report(report, python=python)


def gpuenv_lock_differences(freeze: str, lock: str) -> dict[str, list[str]]:
    """What the environment (`pip freeze --all`) holds beyond, short of or other than its lock."""
    return drift.lock_differences(lock, freeze)


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "gpuenv_env_plan": gpuenv_env_plan,
            "gpuenv_channel_urls": gpuenv_channel_urls,
            "gpuenv_lock_from_report": gpuenv_lock_from_report,
            "gpuenv_pylock_from_report": gpuenv_pylock_from_report,
            "gpuenv_lock_differences": gpuenv_lock_differences,
        }
