"""Filters for the gpu_services role, calling gpuenv.services (tested in tests/test_services.py)."""

from __future__ import annotations

from typing import Any

from gpuenv import services


def gpuenv_services_plan(
    resolved: Any,
    modes: Any,
    *,
    found_runtimes: Any = None,
    declared_runtimes: Any = None,
    docker_install: Any = False,
    target: Any = None,
    record: Any = None,
) -> dict[str, Any]:
    """What the host gets: {persistenced, fabricmanager, container_toolkit: {wanted, why, ...},
    driver: the driver they must match}. modes: the three gpu_services_* switches."""
    resolved = dict(resolved or {})
    modes = dict(modes or {})
    return {
        "persistenced": services.plan_persistenced(str(modes["persistenced"]), list(resolved.get("gpus") or [])),
        "fabricmanager": services.plan_fabricmanager(
            str(modes["fabricmanager"]), list(resolved.get("nvswitches") or [])
        ),
        "container_toolkit": services.plan_container_toolkit(
            str(modes["container_toolkit"]),
            [str(r) for r in found_runtimes or []],
            [str(r) for r in declared_runtimes or []],
            docker_install=bool(docker_install),
        ),
        "driver": services.driver_in_use(target, record, resolved.get("driver")),
    }


def gpuenv_services_mode(value: Any) -> str:
    """off, on or auto from what the inventory gave (YAML's unquoted on and off are booleans)."""
    return services.mode_of(value)


def gpuenv_services_pick(madison: Any, names: Any, version: Any = None) -> dict[str, Any]:
    return services.pick_package(dict(madison or {}), [str(n) for n in names], str(version) if version else None)


def gpuenv_services_can_start(proc_version: Any, driver_version: Any) -> dict[str, Any]:
    return services.can_start(str(proc_version) if proc_version else None, str(driver_version or "") or None)


def gpuenv_services_docker_config(current: Any, default_runtime: Any, path: Any) -> dict[str, Any]:
    return services.docker_daemon_config(
        str(current) if current is not None else None, default_runtime=bool(default_runtime), path=str(path)
    )


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "gpuenv_services_plan": gpuenv_services_plan,
            "gpuenv_services_mode": gpuenv_services_mode,
            "gpuenv_services_pick": gpuenv_services_pick,
            "gpuenv_services_can_start": gpuenv_services_can_start,
            "gpuenv_services_docker_config": gpuenv_services_docker_config,
        }
