"""The OS vars chain (gpuenv.osvars): each role's vars file for a host, and the preflight's refusal
of an OS a role of the run cannot serve (rule os-role)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuenv import osvars
from gpuenv.preflight import check_host
from tests.conftest import run_tool
from tests.rule_cases import stack

REPO = Path(__file__).resolve().parents[1]
ROLES = REPO / "roles"


def _facts(distribution: str, version: str, family: str) -> dict[str, str]:
    return {
        "distribution": distribution,
        "distribution_major_version": version.split(".", maxsplit=1)[0],
        "distribution_version": version,
        "os_family": family,
    }


FACTS = {
    "debian12": _facts("Debian", "12.8", "Debian"),
    "debian13": _facts("Debian", "13.1", "Debian"),
    "ubuntu2404": _facts("Ubuntu", "24.04", "Debian"),
    "rocky9": _facts("Rocky", "9.5", "RedHat"),
    "rhel9": _facts("RedHat", "9.4", "RedHat"),
    "arch": _facts("Archlinux", "NA", "Archlinux"),
}


def test_the_chain_runs_from_the_release_to_the_default() -> None:
    assert osvars.chain(FACTS["rocky9"], "nvidia_repo") == [
        "nvidia_repo-Rocky-9.yml",
        "nvidia_repo-Rocky.yml",
        "nvidia_repo-RedHat.yml",
        "nvidia_repo-default.yml",
    ]
    # Debian is its own family: named once. A role with one way has no prefix.
    assert osvars.chain(FACTS["debian12"]) == ["Debian-12.yml", "Debian.yml", "default.yml"]
    # Facts not gathered: only the default is left, which then speaks for every OS.
    assert osvars.chain({}, "venv") == ["venv-default.yml"]


# Which OS each role serves, with each source: what the files in roles/*/vars say. Debian's own
# packages serve Debian only (Ubuntu is of the Debian family, and its own file refuses it); NVIDIA's
# archives serve any OS; NVIDIA's repositories serve what the role has tasks for.
SERVED = {
    ("nvidia_driver", "debian"): {"debian12", "debian13"},
    ("nvidia_driver", "nvidia_repo"): {"debian12", "debian13", "ubuntu2404"},
    ("gpu_services", "debian"): {"debian12", "debian13"},
    ("gpu_services", "nvidia_repo"): {"debian12", "debian13", "ubuntu2404"},
    ("gpu_services", "toolkit"): {"debian12", "debian13", "ubuntu2404"},
    ("cuda_toolkit", "redist"): set(FACTS),
    ("cuda_toolkit", "debian"): {"debian12", "debian13"},
    ("cuda_toolkit", "nvidia_repo"): {"debian12", "debian13", "ubuntu2404"},
    ("cudnn", "tarball"): set(FACTS),
    ("cudnn", "nvidia_repo"): {"debian12", "debian13", "ubuntu2404"},
    ("pytorch_env", "venv"): {"debian12", "debian13", "ubuntu2404"},
    ("pytorch_env", "conda"): {"debian12", "debian13", "ubuntu2404"},
    ("pull_mode", None): {"debian12", "debian13", "ubuntu2404"},
}


@pytest.mark.parametrize(("role", "source"), sorted(SERVED, key=str))
def test_each_role_serves_the_oses_its_files_name(role: str, source: str | None) -> None:
    served = {
        name for name, facts in FACTS.items() if osvars.unserved_by(ROLES / role / "vars", role, facts, source) is None
    }
    assert served == SERVED[(role, source)]


def test_a_refusal_gives_the_file_s_reason_and_the_file() -> None:
    why = osvars.unserved_by(ROLES / "nvidia_driver" / "vars", "nvidia_driver", FACTS["ubuntu2404"], "debian")
    assert why is not None
    assert "nvidia_driver_source: nvidia_repo" in why
    assert why.endswith("(roles/nvidia_driver/vars/debian-Ubuntu.yml)")


def test_no_file_at_all_names_what_was_looked_for(tmp_path: Path) -> None:
    why = osvars.unserved_by(tmp_path, "x", FACTS["rocky9"], "y")
    assert why is not None
    assert "y-Rocky-9.yml, y-Rocky.yml, y-RedHat.yml, y-default.yml" in why


def test_every_os_vars_file_is_plain_yaml_and_a_refusal_is_plain_text() -> None:
    files = [p for p in ROLES.glob("*/vars/*.yml") if p.name != "main.yml"]
    assert len(files) > 20
    for path in files:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
        assert isinstance(loaded, dict), path
        why = next((v for k, v in loaded.items() if k.endswith("_unserved")), None)
        if why is not None:
            # The preflight reads it as written: a template there would reach the user unrendered.
            assert isinstance(why, str), path
            assert "{{" not in why, path


def test_each_role_s_selector_is_read_from_its_argument_specs(tmp_path: Path) -> None:
    assert osvars.role_selectors(ROLES) == {
        "nvidia_driver": ("nvidia_driver_source", "debian", None),
        # Its defaults/main.yml: the driver's source, "debian" where that is not set either.
        "gpu_services": ("gpu_services_source", "debian", "nvidia_driver_source"),
        "cuda_toolkit": ("cuda_toolkit_source", "redist", None),
        "cudnn": ("cudnn_source", "tarball", None),
        "pytorch_env": ("pytorch_env_backend", "venv", None),
    }
    # A new role with two sources is found by its files and its specs alone, with no list to edit.
    role = tmp_path / "new_role"
    (role / "vars").mkdir(parents=True)
    (role / "meta").mkdir()
    for name in ("fast-default.yml", "slow-Debian.yml", "main.yml"):
        (role / "vars" / name).write_text("---\n")
    (role / "meta/argument_specs.yml").write_text(
        "argument_specs:\n  main:\n    options:\n      new_role_flag: {type: bool}\n"
        "      new_role_way: {type: str, choices: [fast, slow], default: fast}\n"
    )
    assert osvars.role_selectors(tmp_path) == {"new_role": ("new_role_way", "fast", None)}
    assert osvars.selections(tmp_path, {"new_role_way": "slow"}) == {"new_role": "slow"}
    # A second new role whose source follows the first's by default, as gpu_services' the driver's:
    # found from its defaults, with no code naming either role.
    other = tmp_path / "other_role"
    (other / "vars").mkdir(parents=True)
    (other / "meta").mkdir()
    (other / "defaults").mkdir()
    for name in ("fast-default.yml", "slow-default.yml"):
        (other / "vars" / name).write_text("---\n")
    (other / "meta/argument_specs.yml").write_text(
        "argument_specs:\n  main:\n    options:\n      other_role_way: {type: str, choices: [fast, slow]}\n"
    )
    (other / "defaults/main.yml").write_text("other_role_way: \"{{ new_role_way | default('fast') }}\"\n")
    osvars.role_selectors.cache_clear()
    assert osvars.role_selectors(tmp_path)["other_role"] == ("other_role_way", "fast", "new_role_way")
    assert osvars.selections(tmp_path, {"new_role_way": "slow"}) == {"new_role": "slow", "other_role": "slow"}
    assert osvars.selections(tmp_path, {}) == {"new_role": "fast", "other_role": "fast"}
    assert osvars.selections(tmp_path, {"other_role_way": "fast", "new_role_way": "slow"})["other_role"] == "fast"


def test_the_run_s_roles_are_the_play_s_or_else_every_stage() -> None:
    assert osvars.selections(ROLES, {}) == {
        "nvidia_driver": "debian",
        "gpu_services": "debian",
        "cuda_toolkit": "redist",
        "cudnn": "tarball",
        "pytorch_env": "venv",
    }
    # site.yml's preflight play has only gpu_stack: every stage counts.
    assert set(osvars.selections(ROLES, {}, ["gpu_stack"])) == set(osvars.role_selectors(ROLES))
    assert osvars.selections(ROLES, {"cudnn_source": "nvidia_repo"}, ["gpu_stack", "cuda_toolkit", "cudnn"]) == {
        "cuda_toolkit": "redist",
        "cudnn": "nvidia_repo",
    }
    # playbooks/verify.yml alone installs nothing.
    assert osvars.selections(ROLES, {}, ["gpu_verify", "gpu_stack"]) == {}
    picked = osvars.selections(ROLES, {"nvidia_driver_source": "nvidia_repo", "cuda_toolkit_source": "none"})
    assert picked["gpu_services"] == "nvidia_repo"
    assert "cuda_toolkit" not in picked
    assert "nvidia_driver" not in osvars.selections(ROLES, {"nvidia_driver_mode": "none"})


def _check(facts: dict[str, str], settings: dict[str, Any], play_roles: list[str] | None = None) -> dict[str, Any]:
    return check_host(stack(), roles_dir=ROLES, os_facts=facts, settings=settings, play_roles=play_roles)


def test_the_preflight_refuses_a_rocky_host_naming_each_role_that_cannot_serve_it() -> None:
    result = _check(FACTS["rocky9"], {})
    refused = [e for e in result["errors"] if e["rule"] == "os-role"]
    assert [e["message"] for e in refused] == [  # in the order site.yml runs them
        "the pytorch_env role cannot serve Rocky 9.5 with pytorch_env_backend: venv",
        "the nvidia_driver role cannot serve Rocky 9.5 with nvidia_driver_source: debian",
        "the gpu_services role cannot serve Rocky 9.5 with gpu_services_source: debian",
    ]
    assert result["verdict"] == "incompatible"
    assert "the nvidia_driver role cannot serve Rocky 9.5" in result["text"]
    # No RHEL-family path for the driver from NVIDIA's repository either (none could be tested here).
    result = _check(FACTS["rocky9"], {"nvidia_driver_source": "nvidia_repo"})
    assert [e["message"] for e in result["errors"] if e["rule"] == "os-role"] == [
        "the pytorch_env role cannot serve Rocky 9.5 with pytorch_env_backend: venv",
        "the nvidia_driver role cannot serve Rocky 9.5 with nvidia_driver_source: nvidia_repo",
        "the gpu_services role cannot serve Rocky 9.5 with gpu_services_source: nvidia_repo",
    ]
    # playbooks/cuda.yml alone: NVIDIA's archives serve any OS.
    assert _check(FACTS["rocky9"], {}, ["gpu_stack", "cuda_toolkit", "cudnn"])["errors"] == []


def test_debian_with_the_defaults_and_an_unchecked_host_are_not_refused() -> None:
    assert not [e for e in _check(FACTS["debian12"], {})["errors"] if e["rule"] == "os-role"]
    assert check_host(stack(), roles_dir=ROLES)["errors"] == []


@pytest.mark.ansible
def test_the_roles_first_found_picks_the_file_the_preflight_reads(tmp_path: Path, venv_env: dict[str, str]) -> None:
    """The roles load their file with Ansible's first_found over the filter's names; the preflight
    judges with osvars.first_found. Both must pick the same file."""
    cases = [
        {"role": role, "source": source, "os": os_name, "facts": facts}
        for (role, source) in SERVED
        for os_name, facts in FACTS.items()
    ]
    play = [
        {
            "hosts": "localhost",
            "gather_facts": False,
            "tasks": [
                {
                    "name": "pick",
                    "ansible.builtin.set_fact": {
                        "picked": "{{ picked | default([]) + [lookup('ansible.builtin.first_found', "
                        "{'files': item.facts | gpuenv_os_vars_files(item.source), "
                        "'paths': [roles_dir ~ '/' ~ item.role ~ '/vars']}, errors='ignore') | default('', true)] }}"
                    },
                    "loop": cases,
                },
                {
                    "name": "write",
                    "ansible.builtin.copy": {
                        "content": "{{ picked | to_json }}",
                        "dest": str(tmp_path / "picked.json"),
                        "mode": "0644",
                    },
                },
            ],
        }
    ]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play, sort_keys=False))
    env = dict(venv_env, ANSIBLE_NOCOLOR="1", ANSIBLE_FILTER_PLUGINS=str(REPO / "plugins" / "filter"))
    out = run_tool(
        "ansible-playbook", "-i", "localhost,", "-c", "local", str(tmp_path / "play.yml"),
        "-e", json.dumps({"roles_dir": str(ROLES), "ansible_python_interpreter": sys.executable}), env=env, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    picked = json.loads((tmp_path / "picked.json").read_text())
    want = [
        str(found) if (found := osvars.first_found(ROLES / c["role"] / "vars", c["facts"], c["source"])) else ""
        for c in cases
    ]
    assert picked == want


@pytest.mark.ansible
def test_the_os_vars_role_loads_the_including_role_s_file_or_refuses_with_its_reason(
    tmp_path: Path, venv_env: dict[str, str]
) -> None:
    """roles/os_vars, run by include_role from a role of its own with no facts gathered: it gathers
    them, loads the file from the including role's vars/, and refuses with the file's reason."""
    role = tmp_path / "roles" / "fake_role"
    (role / "vars").mkdir(parents=True)
    (role / "tasks").mkdir()
    (role / "vars" / "served-default.yml").write_text("fake_role_packages: [from-served-default]\n")
    (role / "vars" / "refused-default.yml").write_text('__fake_role_unserved: "this source has no packages here"\n')
    tasks = [
        {
            "name": "Load the OS vars",
            "ansible.builtin.include_role": {"name": "os_vars"},
            "vars": {
                "os_vars_source": "{{ fake_source }}",
                "os_vars_subject": "fake_role_source {{ fake_source }}",
                "os_vars_remedy": "Use fake_role_source: served.",
            },
        },
        {
            "name": "Write what was loaded",
            "ansible.builtin.copy": {
                "content": "{{ fake_role_packages | to_json }}",
                "dest": "{{ out }}",
                "mode": "0644",
            },
        },
    ]
    (role / "tasks" / "main.yml").write_text(yaml.safe_dump(tasks, sort_keys=False))
    (tmp_path / "play.yml").write_text(
        yaml.safe_dump([{"hosts": "localhost", "gather_facts": False, "roles": ["fake_role"]}], sort_keys=False)
    )
    env = dict(
        venv_env,
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_FILTER_PLUGINS=str(REPO / "plugins" / "filter"),
        ANSIBLE_ROLES_PATH=f"{tmp_path / 'roles'}:{ROLES}",
    )

    def play(source: str) -> Any:
        extra = {
            "fake_source": source,
            "out": str(tmp_path / f"{source}.json"),
            "ansible_python_interpreter": sys.executable,
        }
        return run_tool(
            "ansible-playbook", "-i", "localhost,", "-c", "local", str(tmp_path / "play.yml"), "-e", json.dumps(extra),
            env=env, timeout=120,
        )  # fmt: skip

    served = play("served")
    assert served.returncode == 0, served.stdout + served.stderr
    assert json.loads((tmp_path / "served.json").read_text()) == ["from-served-default"]
    refused = play("refused")
    assert refused.returncode != 0
    assert not (tmp_path / "refused.json").exists()
    # The distribution and its version come from the facts the role gathered (none were).
    assert re.search(
        r"fake_role_source refused cannot serve localhost \(\w+ [\w.]+\): this source has no packages here\. "
        r"Use fake_role_source: served\. Nothing was changed\.",
        " ".join(refused.stdout.split()),
    ), refused.stdout
