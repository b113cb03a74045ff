"""Filters for the pull_mode role, calling gpuenv.pullmode (tested there)."""

from __future__ import annotations

from typing import Any

from gpuenv import pullmode


def gpuenv_pull_problems(settings: dict[str, Any]) -> list[str]:
    return pullmode.problems(dict(settings))


def gpuenv_systemd_quote(value: Any) -> str:
    return pullmode.systemd_quote(str(value))


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"gpuenv_pull_problems": gpuenv_pull_problems, "gpuenv_systemd_quote": gpuenv_systemd_quote}
