"""Filters for the fleet playbooks (drift.yml, upgrade.yml) and gpu_verify, calling gpuenv.drift,
gpuenv.stages and the report model, gpuenv.verify.model (tested in tests/test_drift.py and test_verify.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ansible.errors import AnsibleFilterError

from gpuenv import drift, stages
from gpuenv.verify import model


def gpuenv_verify_failed_report(  # noqa: PLR0917 - a Jinja filter takes its arguments by position
    host: str, summary: str, error: Any, hint: str, expect: Any = None, run: Any = None
) -> dict[str, Any]:
    """The verify report of a host verify could not check (a failing verify.run check carrying
    the error): the same model gpuenv verify writes, for the playbooks' stand-ins."""
    return model.failed_report(
        str(host), str(summary), str(error or ""), str(hint), dict(expect or {}), str(run) if run else None
    )


def gpuenv_verify_report(  # noqa: PLR0917 - a Jinja filter takes its arguments by position
    result: Any, host: str, summary: str, hint: str, expect: Any = None, run: Any = None
) -> dict[str, Any]:
    """The report a registered `gpuenv-verify --json -` command printed, or, where it printed none,
    the failing report that says so (summary, hint) with the command's exit status and stderr."""
    return model.from_command(
        dict(result or {}), str(host), str(summary), str(hint), dict(expect or {}), str(run) if run else None
    )


def gpuenv_stack_summary(resolved: dict[str, Any] | None) -> dict[str, str]:
    """The few versions a rollout summary shows of a resolved stack ({} when there is none)."""
    return drift.stack_summary(dict(resolved or {}))


def gpuenv_upgrade_changes(
    records_before: dict[str, Any] | None,
    records_after: dict[str, Any] | None,
    links_before: list[dict[str, Any]] | None = None,
    links_after: list[dict[str, Any]] | None = None,
) -> list[str]:
    """What an upgrade changed on a host (fleet_upgrade's summary): ansible_local before and after,
    and the results of ansible.builtin.stat over the switch points before and after."""

    def targets(results: list[dict[str, Any]] | None) -> dict[str, str | None]:
        return {r["item"]: (r.get("stat") or {}).get("lnk_target") for r in results or []}

    return drift.upgrade_changes(records_before, records_after, targets(links_before), targets(links_after))


def gpuenv_roles_with(roles_dir: str, relpath: str) -> list[str]:
    """The roles under roles_dir that have relpath (fleet_upgrade: those with tasks/switch_points.yml),
    sorted. Ansible's fileglob matches in one directory only, not roles/*/tasks/."""
    return sorted(p.parts[-1 - len(Path(relpath).parts)] for p in Path(roles_dir).glob(f"*/{relpath}"))


def gpuenv_stage_steps(playbooks_dir: str) -> list[dict[str, Any]]:
    """site.yml's steps for fleet_upgrade's loop (gpuenv.stages.stage_steps), a refusal as the task's error."""
    try:
        return stages.stage_steps(playbooks_dir)
    except stages.StagesError as exc:
        raise AnsibleFilterError(f"fleet_upgrade cannot run site.yml's stages: {exc}") from exc


def gpuenv_stage_roles(playbooks_dir: str) -> list[str]:
    """The roles whose settings count as a run's inputs (gpuenv.stages.stage_roles), for role converged."""
    try:
        return stages.stage_roles(playbooks_dir)
    except stages.StagesError as exc:
        raise AnsibleFilterError(f"converged cannot read site.yml's stages: {exc}") from exc


def gpuenv_stage_place_files(playbooks_dir: str) -> list[str]:
    """Each stage role's meta/places.yml (gpuenv.stages.stage_place_files), for role converged."""
    try:
        return stages.stage_place_files(playbooks_dir)
    except stages.StagesError as exc:
        raise AnsibleFilterError(f"converged cannot read site.yml's stages: {exc}") from exc


def gpuenv_places(rendered: list[str], files: list[str]) -> dict[str, list[str]]:
    """The stage roles' places merged (gpuenv.stages.merge_places), a bad file as the task's error."""
    try:
        return stages.merge_places(rendered, files)
    except stages.StagesError as exc:
        raise AnsibleFilterError(f"converged cannot read the places a stage writes: {exc}") from exc


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "gpuenv_roles_with": gpuenv_roles_with,
            "gpuenv_stack_summary": gpuenv_stack_summary,
            "gpuenv_stage_roles": gpuenv_stage_roles,
            "gpuenv_stage_place_files": gpuenv_stage_place_files,
            "gpuenv_places": gpuenv_places,
            "gpuenv_stage_steps": gpuenv_stage_steps,
            "gpuenv_upgrade_changes": gpuenv_upgrade_changes,
            "gpuenv_verify_failed_report": gpuenv_verify_failed_report,
            "gpuenv_verify_report": gpuenv_verify_report,
        }
