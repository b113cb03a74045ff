"""roles/fleet_upgrade: each install role names its own switch points (tasks/switch_points.yml),
and the rollout summary judges an upgrade from the records before and after, not the links alone."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.errors import AnsibleFilterError

from gpuenv import drift
from tests.conftest import REPO, run_tool

sys.path.insert(0, str(REPO / "plugins/filter"))
from gpuenv_fleet import gpuenv_roles_with, gpuenv_stage_steps, gpuenv_upgrade_changes

DRIVER_535 = {"nvidia_driver": {"version": "535.216.01"}, "cudnn": {"version": "9.1.0.70"}}
LINKS = {"/usr/local/cuda": "/usr/local/cuda-12.4", "/opt/gpuenv/envs/default": "/opt/gpuenv/envs/default-abc"}


def test_a_driver_only_upgrade_moves_no_link_and_is_an_upgrade() -> None:
    after = {**DRIVER_535, "nvidia_driver": {"version": "550.163.01"}}
    assert drift.upgrade_changes(DRIVER_535, after, LINKS, LINKS) == ["the nvidia_driver record"]


def test_a_cudnn_only_upgrade_is_an_upgrade_and_the_same_stack_is_unchanged() -> None:
    after = {**DRIVER_535, "cudnn": {"version": "9.1.1.17"}}
    assert drift.upgrade_changes(DRIVER_535, after, LINKS, LINKS) == ["the cudnn record"]
    assert drift.upgrade_changes(DRIVER_535, dict(DRIVER_535), LINKS, dict(LINKS)) == []


def test_a_moved_link_and_a_new_record_are_both_named() -> None:
    moved = {**LINKS, "/usr/local/cuda": "/usr/local/cuda-12.1"}
    assert drift.upgrade_changes({}, {"pytorch_env": {"lock": "x"}}, LINKS, moved) == [
        "the pytorch_env record",
        "/usr/local/cuda -> /usr/local/cuda-12.1",
    ]


def test_the_filter_reads_stat_results_as_the_role_registers_them() -> None:
    def stat(path: str, target: str | None) -> dict[str, object]:
        return {"item": path, "stat": {"exists": target is not None, "islnk": bool(target), "lnk_target": target}}

    before = [stat("/usr/local/cuda", "/usr/local/cuda-12.4"), stat("/usr/local/cuda-12.4", None)]
    after = [stat("/usr/local/cuda", "/usr/local/cuda-12.4"), stat("/usr/local/cuda-12.4", "/opt/cuda/t-1")]
    assert gpuenv_upgrade_changes(DRIVER_535, DRIVER_535, before, after) == ["/usr/local/cuda-12.4 -> /opt/cuda/t-1"]
    assert gpuenv_upgrade_changes(DRIVER_535, DRIVER_535, before, before) == []


def _play_on_controller(
    tmp_path: Path,
    venv_env: dict[str, str],
    playbook: str,
    host_vars: dict[str, object],
    path_prefix: Path | None = None,
) -> dict[str, Any]:
    """Run tests/ansible/PLAYBOOK on the controller (a local connection) with HOST_VARS;
    what it wrote to test_out. PATH_PREFIX goes first on PATH (stand-in commands)."""
    host = {
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
        "test_out": str(tmp_path / "out.json"),
        **host_vars,
    }
    inventory = tmp_path / "hosts.json"
    inventory.write_text(json.dumps({"all": {"hosts": {"controller": host}}}))
    env = {**venv_env, "ANSIBLE_NOCOLOR": "1"}
    if path_prefix is not None:
        env["PATH"] = f"{path_prefix}:{venv_env.get('PATH', '/usr/bin:/bin')}"
    run = run_tool(
        "ansible-playbook", "-i", str(inventory), str(REPO / "tests/ansible" / playbook), env=env, timeout=300
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    got: dict[str, Any] = json.loads((tmp_path / "out.json").read_text())
    return got


@pytest.mark.ansible
def test_each_role_names_its_switch_points_and_fleet_upgrade_lists_none(
    tmp_path: Path, venv_env: dict[str, str]
) -> None:
    envs = tmp_path / "envs"
    envs.mkdir()
    (envs / "team").symlink_to(envs / "team-abc")
    got = _play_on_controller(
        tmp_path,
        venv_env,
        "fleet_upgrade_save.yml",
        {
            "gpu_stack_resolved": {"cuda_tree": "/usr/local/cuda-12.4"},
            "pytorch_env_root": str(envs),
            "pytorch_env_name": "team",
        },
    )
    assert sorted(got["points"]["links"]) == sorted(["/usr/local/cuda", "/usr/local/cuda-12.4", f"{envs}/team"])
    assert got["links"] == got["points"]["links"]  # every one of them read
    assert sorted(got["points"]["records"]) == sorted(
        [
            "/etc/gpuenv/stack.json",
            "/etc/ansible/facts.d/cuda_toolkit.fact",
            "/etc/profile.d/gpuenv-cuda.sh",
            "/etc/ansible/facts.d/cudnn.fact",
            "/etc/ansible/facts.d/pytorch_env.fact",
            "/etc/profile.d/gpuenv-env-team.sh",
        ]
    )
    # gpu_verify checks the environment where pytorch_env built it, pytorch_env_root included.
    assert got["python"] == f"{envs}/team/bin/python"


def test_the_roles_with_switch_points_are_found_by_their_file(tmp_path: Path) -> None:
    for role in ("b_role", "a_role", "other"):
        (tmp_path / role / "tasks").mkdir(parents=True)
    for role in ("b_role", "a_role"):
        (tmp_path / role / "tasks/switch_points.yml").write_text("---\n")
    assert gpuenv_roles_with(str(tmp_path), "tasks/switch_points.yml") == ["a_role", "b_role"]
    assert gpuenv_roles_with(str(REPO / "roles"), "tasks/switch_points.yml") == [
        "cuda_toolkit",
        "cudnn",
        "pytorch_env",
        "stack_record",
    ]


def test_a_rollout_runs_site_yml_s_steps_in_its_order() -> None:
    # The stage playbooks are where the order lives; fleet_upgrade's loop reads them (gpuenv_stage_steps).
    steps = gpuenv_stage_steps(str(REPO / "playbooks"))
    assert [(s["role"], s["tasks_from"]) for s in steps] == [
        ("stack_record", "main"),
        ("pytorch_env", "packages"),
        ("nvidia_driver", "main"),
        ("cuda_toolkit", "main"),
        ("cudnn", "main"),
        ("pytorch_env", "main"),
        ("cudnn", "join"),
        ("cuda_toolkit", "environment"),
        ("cudnn", "finish"),
        ("nvidia_driver", "join"),
        ("gpu_services", "main"),
        ("gpu_verify", "main"),
    ]
    assert list(steps[2]["vars"]) == ["nvidia_driver_background"]  # its value: test_driver_join.py
    assert steps[2]["file"] == "playbooks/driver_start.yml"
    assert steps[3]["vars"] == {"cuda_toolkit_switch_default": False}
    assert steps[3]["file"] == steps[4]["file"] == "playbooks/cuda_build.yml"
    assert steps[4]["vars"] == {"cudnn_background": True}
    assert steps[6]["file"] == "playbooks/cuda_finish.yml"
    assert steps[8]["file"] == "playbooks/cuda_finish.yml"
    assert steps[9]["file"] == "playbooks/driver_finish.yml"


@pytest.mark.ansible
def test_a_rollout_step_runs_its_role_with_the_vars_its_stage_playbook_gives(
    tmp_path: Path, venv_env: dict[str, str]
) -> None:
    """fleet_upgrade's step (tasks/step.yml) on the controller: a role of a test stage, run with what
    its playbook gives it over what the inventory says, and the vars kept for the stage's next step."""
    role = tmp_path / "roles/probe/tasks"
    role.mkdir(parents=True)
    (role / "main.yml").write_text(
        '- ansible.builtin.copy:\n    content: \'{{ {"x": probe_x, "y": probe_y} | to_json }}\'\n'
        "    dest: '{{ test_out }}'\n    mode: '0644'\n"
    )
    (role / "later.yml").write_text(
        "- ansible.builtin.copy:\n    content: '{{ probe_x | to_json }}'\n    dest: '{{ test_out }}.later'\n"
        "    mode: '0644'\n"
    )
    steps = [
        {"role": "probe", "tasks_from": "main", "vars": {"probe_x": True, "probe_y": [1, "a"]}, "file": "s.yml"},
        {"role": "probe", "tasks_from": "later", "vars": {}, "file": "s.yml"},
    ]
    play = [
        {
            "hosts": "controller",
            "gather_facts": False,
            "tasks": [
                {
                    "ansible.builtin.include_role": {"name": "fleet_upgrade", "tasks_from": "step.yml"},
                    "loop": steps,
                    "loop_control": {"loop_var": "fleet_upgrade_step"},
                }
            ],
        }
    ]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    out = tmp_path / "out.json"
    host = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable, "test_out": str(out)}
    inventory = tmp_path / "hosts.json"
    inventory.write_text(json.dumps({"all": {"hosts": {"controller": {**host, "probe_x": False, "probe_y": 0}}}}))
    env = {**venv_env, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_ROLES_PATH": f"{tmp_path / 'roles'}:{REPO / 'roles'}"}
    run = run_tool("ansible-playbook", "-i", str(inventory), str(tmp_path / "play.yml"), env=env, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert json.loads(out.read_text()) == {"x": True, "y": [1, "a"]}  # the playbook's, over the inventory's
    assert json.loads((tmp_path / "out.json.later").read_text()) is True  # kept for the stage's next step


def test_a_stage_playbook_the_rollout_cannot_follow_is_an_ansible_error_that_says_so(tmp_path: Path) -> None:
    (tmp_path / "site.yml").write_text("- ansible.builtin.import_playbook: s.yml\n")
    (tmp_path / "s.yml").write_text("- name: S\n  hosts: gpu_hosts\n  roles:\n    - {role: one, when: false}\n")
    with pytest.raises(AnsibleFilterError, match=r"fleet_upgrade cannot run site\.yml's stages: .*gives role one"):
        gpuenv_stage_steps(str(tmp_path))


def _busy_step(tmp_path: Path, venv_env: dict[str, str], smi: str, extra: dict[str, object]) -> dict[str, Any]:
    """fleet_upgrade's busy step on the controller, with SMI as the nvidia-smi it finds."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "nvidia-smi").write_text(smi)
    (bin_dir / "nvidia-smi").chmod(0o755)
    return _play_on_controller(tmp_path, venv_env, "fleet_upgrade_busy.yml", extra, path_prefix=bin_dir)


TRAINING = '#!/bin/sh\necho "4242, python3 train.py, 1024 MiB"\n'


@pytest.mark.ansible
@pytest.mark.parametrize(
    "extra",
    [{}, {"fleet_upgrade_busy": "wait", "fleet_upgrade_wait_timeout": 2, "fleet_upgrade_wait_interval": 1}],
    ids=["refuse", "wait-runs-out"],
)
def test_a_busy_host_is_refused_with_its_processes_named(
    tmp_path: Path, venv_env: dict[str, str], extra: dict[str, object]
) -> None:
    # A wait that runs out is a refusal too, not Ansible's "Unknown error" of an `until` that ran out
    # (the fleet test saw sb4 'failed' instead of 'refused').
    got = _busy_step(tmp_path, venv_env, TRAINING, extra)
    assert got["passed"] is False
    assert got["task"] == "Stop, nothing changed"
    assert got["outcome"]["state"] == "refused"
    assert got["outcome"]["note"] == "GPU processes running: 4242, python3 train.py, 1024 MiB"
    assert "fleet_upgrade_busy: wait" in got["msg"]


@pytest.mark.ansible
def test_a_host_whose_gpus_are_idle_or_driverless_goes_on(tmp_path: Path, venv_env: dict[str, str]) -> None:
    for smi in ("#!/bin/sh\nexit 0\n", "#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n"):
        got = _busy_step(tmp_path, venv_env, smi, {})
        assert got == {"passed": True, "outcome": {"state": "in progress"}}


@pytest.mark.ansible
def test_an_nvidia_smi_that_fails_stops_the_host_with_its_error(tmp_path: Path, venv_env: dict[str, str]) -> None:
    got = _busy_step(tmp_path, venv_env, "#!/bin/sh\necho 'Insufficient Permissions' >&2\nexit 4\n", {})
    assert got["passed"] is False
    assert got["task"].startswith("Look for processes on the GPUs")
    assert "nvidia-smi could not list the GPUs' processes (exit 4): Insufficient Permissions" in got["msg"]
