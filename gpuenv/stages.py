"""site.yml's stages, keyed by identifiers, each named by the playbooks whose plays make it up.

site.yml imports one playbook per step (verify.yml brings two plays); a stage is what a person or a
chart calls a group of them: the services beside the driver (persistence daemon, Fabric Manager,
container toolkit) count with the driver, the record of the stack with the preflight. The
benchmarks (bench/) sum play times per stage, the timing callback records each play's stage, and
the progress callback (gpuenv_progress) shows a host's stage; all read this table through the
play's file (Ansible's play.get_path()), so a play may be renamed freely. A playbook of site.yml
not named here is a stage of its own, named by its file.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

STAGES: dict[str, tuple[str, ...]] = {
    "preflight": ("preflight.yml", "converged.yml", "record.yml"),
    # The driver's two plays; site.yml runs the CUDA and environment stages between them (the
    # install in the background), so its time is the sum of the two, the wait for the install
    # included, not the install's own time.
    "driver": ("driver_start.yml", "driver_finish.yml", "services.yml"),
    # The CUDA stage's two plays; site.yml runs the environment's between them (cuDNN's unpack in the
    # background), so its time is the sum of the two.
    "cuda": ("cuda_build.yml", "cuda_finish.yml"),
    "env": ("env_packages.yml", "env.yml"),
    "verify": ("verify.yml", "stamp.yml"),
}

_BY_FILE = {playbook: stage for stage, playbooks in STAGES.items() for playbook in playbooks}
# The playbooks that run site.yml's stages for other ends (a rollout, drift, onboarding, reports):
# their plays belong to no stage.
_PLAYBOOKS = Path(__file__).resolve().parents[1] / "playbooks"


def stage_of(play_path: str) -> str | None:
    """The stage of a play of site.yml, from where the play is written (Ansible's play.get_path():
    ".../playbooks/cuda_build.yml:3"); None for a play of another playbook. A stage playbook that
    STAGES does not name is a stage of its own, named by its file."""
    name = Path(play_path.rsplit(":", 1)[0]).name if play_path else ""
    if name in _BY_FILE:
        return _BY_FILE[name]
    return Path(name).stem if name and name in _site_playbooks() else None


@functools.cache
def _site_playbooks() -> frozenset[str]:
    """The files of site.yml's plays (read once: the callbacks ask for every play)."""
    try:
        return frozenset(Path(where).name for _, where in _plays(_PLAYBOOKS, "site.yml", ()))
    except StagesError:
        return frozenset()


def stage_times(record: Mapping[str, Any]) -> dict[str, float]:
    """Seconds per stage, every stage of STAGES present, from a timing callback record
    (GPUENV_TIMING_FILE), by the stage it gave each play."""
    totals = dict.fromkeys(STAGES, 0.0)
    for play in record["plays"]:
        stage = play.get("stage")
        if stage is not None:
            totals[stage] = totals.get(stage, 0.0) + play["wall_s"]
    return {stage: round(total, 1) for stage, total in totals.items()}


class StagesError(ValueError):
    """A stage playbook holds something a rollout could not run as site.yml does."""


# What a stage playbook may hold for fleet_upgrade to run its roles the same way: anything else
# (a `when`, play vars, post_tasks, a plain task) would be dropped by the rollout without a word, so
# it is refused by name instead.
_IMPORT = ("ansible.builtin.import_playbook", "import_playbook")
_INCLUDE = ("ansible.builtin.include_role", "include_role", "ansible.builtin.import_role", "import_role")
_PLAY_KEYS = {"name", "hosts", "gather_facts", "any_errors_fatal", "roles", "pre_tasks", "tasks"}
_ROLE_KEYS = {"role", "name", "tags", "vars"}
_TASK_KEYS = {"name", "tags", "vars"}
_INCLUDE_KEYS = {"name", "tasks_from", "apply"}
# The one host group the stages run on; the plays on localhost write reports and change no host.
_HOSTS = "gpu_hosts"
_CONTROLLER = "localhost"
# The preflight's role: the rollout has run it for the whole fleet before the first batch.
_PREFLIGHT_ROLE = "gpu_stack"
# The start of every stage play (skip a converged host, the preflight where the run has none):
# nothing a rollout runs, since it runs every stage in full after the fleet's preflight.
_START_TASKS = "tasks/stage_start.yml"
_IMPORT_TASKS = ("ansible.builtin.import_tasks", "import_tasks")
# The role that lets site.yml skip a host as its last complete run left it: a rollout runs every
# stage in full, so it neither compares nor stamps (the next site.yml run stamps), and the stage
# plays' first tasks that skip such a host (their `when` reads this result) are not its steps.
_CONVERGED_ROLE = "converged"
_CONVERGED_RESULT = "converged_register_check"


def stage_steps(playbooks_dir: str | Path) -> list[dict[str, Any]]:
    """The roles site.yml runs on a host, in its order: {play, file, role, tasks_from, vars} per step,
    vars being what the stage playbook gives the role.

    fleet_upgrade runs these one by one inside its rescue block, each with its vars, so a stage
    added to site.yml is part of the next rollout with no edit in fleet_upgrade. What a rollout could
    not run as site.yml does is refused, naming the playbook (StagesError).
    """
    return _steps(Path(playbooks_dir))


def stage_roles(playbooks_dir: str | Path) -> list[str]:
    """The preflight's role and every role site.yml's stages run on a host, each once, in site.yml's
    order: whose settings count as a run's inputs (role converged), so that a stage added to site.yml
    counts with no list to edit."""
    return list(dict.fromkeys([_PREFLIGHT_ROLE, *(step["role"] for step in _steps(Path(playbooks_dir)))]))


# What a stage role's meta/places.yml may name (plugins/modules/gpuenv_converged.py's options).
PLACE_KINDS = ("watch", "walk", "read", "units", "pending")
PLACES_FILE = "meta/places.yml"


def stage_place_files(playbooks_dir: str | Path) -> list[str]:
    """Each stage role's meta/places.yml, in site.yml's order (roles beside playbooks_dir): the places
    the role writes, which the converged stamp fingerprints, so that a new stage declares them in
    its own role. A role that writes nothing of its own has none."""
    roles = Path(playbooks_dir).resolve().parent / "roles"
    files = (roles / role / PLACES_FILE for role in stage_roles(playbooks_dir))
    return [str(f) for f in files if f.is_file()]


def merge_places(rendered: list[str], files: list[str]) -> dict[str, list[str]]:
    """The places of every stage role, from each role's meta/places.yml as rendered with the host's
    variables (RENDERED, in the order of FILES): each kind's entries once, in order."""
    merged: dict[str, list[str]] = {kind: [] for kind in PLACE_KINDS}
    for text, name in zip(rendered, files, strict=True):
        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            raise StagesError(f"{name} is not YAML once rendered: {exc}") from exc
        unknown = sorted(set(data) - set(PLACE_KINDS)) if isinstance(data, dict) else ["(not a mapping)"]
        if unknown:
            raise StagesError(f"{name} names {', '.join(map(str, unknown))}; its keys are {', '.join(PLACE_KINDS)}")
        for kind, entries in data.items():
            if not isinstance(entries, list) or not all(isinstance(e, str) and e for e in entries):
                raise StagesError(f"{name}: {kind} must be a list of paths (units: of unit names)")
            merged[kind] += [e for e in entries if e not in merged[kind]]
    return merged


def _steps(base: Path) -> list[dict[str, Any]]:
    # Read once per state of the playbooks: the converged role asks for the stage roles and their
    # places in every task that compares or stamps, on every host, in every run's no-op.
    state = tuple(sorted((p.name, st.st_mtime_ns, st.st_size) for p in base.glob("*.yml") for st in [p.stat()]))
    return copy.deepcopy(_read_steps(base.resolve(), state))


@functools.lru_cache(maxsize=8)
def _read_steps(base: Path, state: tuple[tuple[str, int, int], ...]) -> list[dict[str, Any]]:
    del state  # the cache's key only
    steps: list[dict[str, Any]] = []
    for play, where in _plays(base, "site.yml", ()):
        steps += _play_steps(play, where)
    return steps


def _load(path: Path) -> list[Any]:
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise StagesError(f"cannot read the stage playbook {path}: {exc}") from exc
    if not isinstance(data, list):
        raise StagesError(f"{path} is not a list of plays")
    return data


def _plays(base: Path, name: str, seen: tuple[str, ...]) -> list[tuple[dict[str, Any], str]]:
    if name in seen:
        raise StagesError(f"playbooks/{name} imports itself (through {' -> '.join(seen)})")
    plays: list[tuple[dict[str, Any], str]] = []
    for entry in _load(base / name):
        if not isinstance(entry, dict):
            raise StagesError(f"playbooks/{name} holds {entry!r}, not a play")
        imported = next((entry[k] for k in _IMPORT if k in entry), None)
        if imported is not None:
            extra = sorted(set(entry) - {"name", *_IMPORT})
            if extra:
                raise StagesError(f"playbooks/{name} imports {imported} with {extra}, which a rollout cannot carry")
            plays += _plays(base, str(imported), (*seen, name))
        else:
            plays.append((entry, f"playbooks/{name}"))
    return plays


def _play_steps(play: dict[str, Any], where: str) -> list[dict[str, Any]]:
    title = f"{where} (play {play.get('name', '?')!r})"
    hosts = play.get("hosts")
    if hosts == _CONTROLLER:
        return []
    if hosts != _HOSTS:
        raise StagesError(
            f"{title} runs on hosts {hosts!r}; a stage runs on {_HOSTS!r} (or on {_CONTROLLER!r} for what changes "
            "no host), since a rollout runs it host by host on the hosts of its batch"
        )
    extra = set(play) - _PLAY_KEYS
    if extra:
        raise StagesError(f"{title} has {sorted(extra)}, which a rollout would not run; move it into the stage's role")
    roles = [_role_step(entry, title) for entry in play.get("roles") or []]
    if [step["role"] for step in roles] == [_PREFLIGHT_ROLE]:
        return []  # the preflight itself: a rollout runs it for the fleet before the first batch
    for task in play.get("pre_tasks") or []:
        if not (_is_stage_start(task) or _is_converged_guard(task)):
            raise StagesError(
                f"{title} has a pre_task {task.get('name', task)!r}; only the import of {_START_TASKS} (and a"
                " look at a host as its last complete run left it) is allowed there: move the task into a role"
            )
    steps = roles + [_task_step(task, title) for task in play.get("tasks") or []]
    if steps and all(step["role"] == _CONVERGED_ROLE for step in steps):
        return []
    for step in steps:
        if step["role"] == _PREFLIGHT_ROLE:
            raise StagesError(
                f"{title} runs the preflight's role {_PREFLIGHT_ROLE} beside others; give it its own play"
            )
        step.update(play=str(play.get("name", "")), file=where)
    return steps


def _role_step(entry: Any, title: str) -> dict[str, Any]:
    if isinstance(entry, str):
        return {"role": entry, "tasks_from": "main", "vars": {}}
    extra = set(entry) - _ROLE_KEYS
    if extra:
        raise StagesError(
            f"{title} gives role {entry.get('role', entry.get('name'))} {sorted(extra)}, which a rollout would drop"
        )
    return {"role": entry.get("role", entry.get("name")), "tasks_from": "main", "vars": dict(entry.get("vars") or {})}


def _include(task: dict[str, Any]) -> dict[str, Any] | None:
    args = next((task[k] for k in _INCLUDE if k in task), None)
    return args if isinstance(args, dict) else None


def _is_stage_start(task: dict[str, Any]) -> bool:
    return any(str(task.get(key, "")).endswith(_START_TASKS) for key in _IMPORT_TASKS)


def _is_converged_guard(task: dict[str, Any]) -> bool:
    return _CONVERGED_RESULT in str(task.get("when", ""))


def _task_step(task: dict[str, Any], title: str) -> dict[str, Any]:
    args = _include(task)
    if args is None:
        raise StagesError(
            f"{title} has the task {task.get('name', task)!r}, which is not a role's; a rollout runs roles only, "
            "so move it into one"
        )
    extra = (
        (set(task) - _TASK_KEYS - set(_INCLUDE))
        | (set(args) - _INCLUDE_KEYS)
        | (set(args.get("apply") or {}) - {"tags"})
    )
    if extra:
        raise StagesError(f"{title} includes role {args.get('name')} with {sorted(extra)}, which a rollout would drop")
    return {
        "role": args["name"],
        "tasks_from": str(args.get("tasks_from", "main")).removesuffix(".yml"),
        "vars": dict(task.get("vars") or {}),
    }
