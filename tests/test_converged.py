"""A re-run of site.yml skips the stages on a host as its last complete run left it (the
10-second no-op): the controller's digest of a run's inputs (plugins/filter/gpuenv_digest.py), the
role and its plays in site.yml, and the rollout, which runs every stage whatever the stamp says.
The module's fingerprints and stamp are tested in tests/test_converged_module.py, a
sandbox host in tests/fleet/test_2_operations.py."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import yaml

from gpuenv.stages import stage_roles, stage_steps
from tests.conftest import REPO, load_plugin, run_tool

filters = load_plugin("plugins/filter/gpuenv_digest.py")


# The controller's digest of a run's inputs.


def test_the_code_digest_follows_gpuenv_s_code_and_not_its_tests_or_caches(tmp_path: Path) -> None:
    for d in ("roles/x/defaults", "plugins/modules", "playbooks", "tests", "gpuenv/__pycache__"):
        (tmp_path / d).mkdir(parents=True)
    (tmp_path / "roles/x/defaults/main.yml").write_text("x_a: 1\n")
    (tmp_path / "tests/test_x.py").write_text("")
    (tmp_path / "ansible.cfg").write_text("[defaults]\n")
    first = filters.gpuenv_code_digest(str(tmp_path))
    (tmp_path / "tests/test_x.py").write_text("assert 1\n")
    (tmp_path / "gpuenv/__pycache__/m.cpython-311.pyc").write_bytes(b"1")
    (tmp_path / "README.md").write_text("docs\n")
    (tmp_path / "roles/x/README.md").write_text("docs\n")
    assert filters.gpuenv_code_digest(str(tmp_path)) == first
    (tmp_path / "roles/x/defaults/main.yml").write_text("x_a: 2\n")
    second = filters.gpuenv_code_digest(str(tmp_path))
    assert second != first
    (tmp_path / "roles/x/defaults/main.yml").rename(tmp_path / "roles/x/defaults/other.yml")
    assert filters.gpuenv_code_digest(str(tmp_path)) != second  # a file's name counts too
    (tmp_path / "ansible.cfg").write_text("[defaults]\nforks = 5\n")
    assert len({first, second, filters.gpuenv_code_digest(str(tmp_path))}) == 3


def test_every_setting_of_a_stage_role_counts_as_an_input(tmp_path: Path) -> None:
    # Read from site.yml's stages: the preflight's role, then each stage's roles once, in order.
    roles = stage_roles(REPO / "playbooks")
    assert roles == [
        "gpu_stack",
        "stack_record",
        "pytorch_env",
        "nvidia_driver",
        "cuda_toolkit",
        "cudnn",
        "gpu_services",
        "gpu_verify",
    ]
    # A stage added to site.yml counts with no list to edit; a stage's vars need no rollout here.
    (tmp_path / "site.yml").write_text(
        "- ansible.builtin.import_playbook: pre.yml\n- ansible.builtin.import_playbook: new.yml\n"
    )
    (tmp_path / "pre.yml").write_text("- name: Preflight\n  hosts: gpu_hosts\n  roles: [gpu_stack]\n")
    (tmp_path / "new.yml").write_text(
        "- name: New\n  hosts: gpu_hosts\n  roles:\n    - role: new_stage\n      vars: {new_stage_x: 1}\n"
    )
    assert stage_roles(tmp_path) == ["gpu_stack", "new_stage"]
    names = set(filters.gpuenv_role_options(str(REPO / "roles"), roles))
    for role in roles:
        defaults = yaml.safe_load((REPO / f"roles/{role}/defaults/main.yml").read_text()) or {}
        # Every setting but the fleet's build caches, which change where a build comes from only.
        assert {n for n in set(defaults) - names if "_build_cache" not in n} == set(), (role, set(defaults) - names)
    assert {"nvidia_driver_mode", "pytorch_env_installer", "cudnn_background"} <= names
    assert not {"nvidia_driver_build_cache_dir", "pytorch_env_build_cache_dir", "pytorch_env_build_cache"} & names
    assert filters.gpuenv_digest({"b": [1], "a": None}) == filters.gpuenv_digest({"a": None, "b": [1]})
    assert filters.gpuenv_digest({"a": 1}) != filters.gpuenv_digest({"a": "1"})


PLAYBOOK = """
- name: Compare each host with its last complete run
  hosts: all
  gather_facts: false
  roles:
    - role: converged
- name: A stage
  hosts: all
  gather_facts: false
  pre_tasks:
    - name: Start the stage as every stage playbook does
      ansible.builtin.import_tasks: {start}
      tags: [always]
  tasks:
    - name: The stage's work
      ansible.builtin.debug:
        msg: STAGE-RAN {{ inventory_hostname }}
- name: Stamp
  hosts: all
  gather_facts: false
  tasks:
    - name: Stamp the host as this run left it
      ansible.builtin.include_role:
        name: converged
        tasks_from: stamp.yml
"""


def test_the_role_skips_a_stage_on_the_second_run_and_not_after_a_change(
    tmp_path: Path, venv_env: dict[str, str]
) -> None:
    """The plays as site.yml has them, on two local hosts: the inputs digested by the role's own
    tasks (the settings read through the vars lookup), a stage skipped by playbooks/tasks/stage_start.yml,
    with which every stage playbook starts."""
    (tmp_path / "site.yml").write_text(PLAYBOOK.replace("{start}", str(REPO / "playbooks/tasks/stage_start.yml")))
    (tmp_path / "tree").mkdir()
    hosts = {}
    for h in ("h1", "h2"):
        hosts[h] = {
            "ansible_connection": "local",
            "ansible_python_interpreter": sys.executable,
            "converged_stamp": str(tmp_path / f"{h}.json"),
            "converged_places": {},
            "converged_walk": [str(tmp_path / "tree")],
            "converged_verify_report": "",
            "gpu_stack_resolved": {"driver": "535"},
            "pytorch_env_installer": "uv",
        }
    inventory = tmp_path / "hosts.yml"

    def play(*extra: str) -> str:
        inventory.write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
        out = run_tool(
            "ansible-playbook", "-i", str(inventory), str(tmp_path / "site.yml"), *extra, env=venv_env, timeout=300
        )
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
        return out.stdout

    def ran(stdout: str) -> set[str]:
        return {h for h in hosts if f"STAGE-RAN {h}" in stdout}

    assert ran(play()) == {"h1", "h2"}  # no stamps yet
    assert ran(play()) == set()
    hosts["h2"]["pytorch_env_installer"] = "pip"  # a setting of a stage role
    assert ran(play()) == {"h2"}
    (tmp_path / "tree/new").write_text("")  # a change on the hosts
    assert ran(play()) == {"h1", "h2"}
    assert ran(play("-e", "converged_skip=false")) == {"h1", "h2"}
    assert ran(play("--tags", "all,never")) == set()  # stamped by the run before
    shutil.rmtree(tmp_path / "tree")
    assert ran(play("--skip-tags", "nothing")) == {"h1", "h2"}  # a partial run stamps nothing
    assert ran(play()) == {"h1", "h2"}
    assert ran(play()) == set()


def test_each_stage_role_declares_the_places_it_writes_read_with_the_host_s_settings(
    tmp_path: Path, venv_env: dict[str, str]
) -> None:
    """converged_places is every stage role's meta/places.yml, rendered with the host's variables
    (a toolkit root set in the inventory is walked instead of the default), and the module reads
    each, with the places a site adds: a new stage declares what it writes in its own role."""
    (tmp_path / "play.yml").write_text(
        "- name: Read the places\n  hosts: all\n  gather_facts: false\n  tasks:\n"
        "    - name: Compare them\n      ansible.builtin.include_role:\n        name: converged\n"
        "        tasks_from: places.yml\n"
        "    - name: Keep what was read\n      ansible.builtin.copy:\n"
        f"        dest: {tmp_path / 'prints.json'}\n        mode: '0644'\n"
        "        content: '{{ converged_register_places.fingerprint | to_json }}'\n"
    )
    host = {
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
        "converged_stamp": str(tmp_path / "stamp.json"),
        "cuda_toolkit_root": str(tmp_path / "cuda"),
        "converged_walk": [str(tmp_path / "site")],
    }
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": {"h1": host}}}))
    out = run_tool(
        "ansible-playbook",
        "-i",
        str(tmp_path / "hosts.yml"),
        str(tmp_path / "play.yml"),
        env=venv_env,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    prints = json.loads((tmp_path / "prints.json").read_text())
    assert {f"walk:{tmp_path / 'cuda'}", f"walk:{tmp_path / 'site'}"} <= set(prints)
    assert "walk:/opt/gpuenv/cuda" not in prints
    for place in ("walk:/var/lib/dkms", "walk:/opt/gpuenv/envs", "walk:/opt/gpuenv/verify", "read:/etc/ld.so.cache"):
        assert place in prints
    for place in ("/var/lib/dpkg/status", "/etc/gpuenv", "/etc/ansible/facts.d", "/etc/cdi", "/usr/local/bin"):
        assert f"watch:{place}" in prints
    assert prints["units"] != "none"  # gpu_services' daemons


# site.yml and the rollout.


def _plays() -> list[dict[str, Any]]:
    plays: list[dict[str, Any]] = []
    for entry in yaml.safe_load((REPO / "playbooks/site.yml").read_text()):
        plays += yaml.safe_load((REPO / "playbooks" / entry["ansible.builtin.import_playbook"]).read_text())
    return plays


def test_site_yml_compares_after_the_preflight_skips_each_stage_and_verifies_and_stamps_every_host() -> None:
    plays = _plays()
    names = [p.get("name") or p.get("ansible.builtin.import_playbook") for p in plays]
    assert names[:3] == [
        "Preflight of the declared GPU stack",
        "Compare each host with its last complete run",
        "Record the checked stack on each host",
    ]
    assert names[-1] == "Stamp each verified host for the next run"
    check_at = names.index("Compare each host with its last complete run")
    verify_at = names.index("Verify each host")

    def start(play: dict[str, Any]) -> dict[str, Any]:
        (task,) = [t for t in play.get("pre_tasks") or [] if "stage_start" in json.dumps(t)]
        assert task["tags"] == ["always"], play["name"]
        return dict(task.get("vars") or {})

    # Every stage between the comparison and verify skips a converged host (the driver's, when its
    # pinned driver is the one installed); verify runs on every host.
    for play in plays[check_at + 1 : verify_at]:
        assert start(play).get("stage_start_skip_converged", True) is not False, play["name"]
    assert start(plays[verify_at]) == {"stage_start_skip_converged": False}


def test_a_rollout_runs_every_stage_and_neither_compares_nor_stamps() -> None:
    steps = stage_steps(REPO / "playbooks")
    assert "converged" not in {step["role"] for step in steps}
    assert [step["role"] for step in steps][:3] == ["stack_record", "pytorch_env", "nvidia_driver"]
