"""Inventory values written into files a shell sources or a parser reads: each
role refuses a value that would add a directive, a command or a key, before it changes anything."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuenv import inputs
from tests.conftest import REPO, run_tool

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB0W9Yd8n0w4xK1r8pVh9uYpI5xk1q0h2l6m3n4o5p6q alice@laptop"


@pytest.mark.parametrize(
    ("value", "form", "ok"),
    [
        (KEY, "ssh_key", True),
        ('from="10.0.0.0/8",no-agent-forwarding ' + KEY, "ssh_key", True),
        (KEY + "\nssh-rsa AAAAB3Nza mallory", "ssh_key", False),  # a second key
        (KEY + "\n", "ssh_key", False),
        ('command="sh" ssh-ed25519', "ssh_key", False),
        ("gpuenv", "account", True),
        ("ML-Team.2", "account", True),
        ("gpuenv'; touch /tmp/pwned; '", "account", False),
        ("gpuenv\n", "account", False),
        ("/opt/gpuenv/envs", "abs_path", True),
        ("/opt/$(id)/envs", "abs_path", False),
        ("/opt/../etc", "abs_path", False),
        ("https://download.pytorch.org/whl/{variant}", "url", True),
        ("http://10.199.0.1:3142/pypi/simple", "url", True),
        ("https://mirror/x\nTrusted: yes", "url", False),
        ("https://mirror/x Trusted", "url", False),
        ("ftp://mirror/x", "url", False),
    ],
)
def test_forms(value: str, form: str, ok: bool) -> None:
    assert (inputs.problem("v", value, form) is None) is ok


def test_a_list_is_checked_item_by_item_and_problems_name_the_variable() -> None:
    found = inputs.problems({"onboard_user_ssh_keys": [[KEY, KEY + "\nssh-rsa AAAA x"], "ssh_key"]})
    (sentence,) = found
    assert sentence.startswith("onboard_user_ssh_keys 'ssh-ed25519 AAAAC3NzaC1lZDI1NTE5")  # echoed, capped at 80
    assert sentence.endswith("...' is not one public key line: [options] key-type base64-key [comment]")


def _refusal(tmp_path: Path, venv_env: dict[str, str], role: str, *, settings: bool = True, **role_vars: Any) -> str:
    """The message of ROLE's refusal, run in check mode on the controller; a refusal of its settings
    (not of a missing preflight) says that nothing was changed."""
    host = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable, "test_role": role, **role_vars}
    inventory = tmp_path / "hosts.json"
    inventory.write_text(json.dumps({"all": {"hosts": {"controller": host}}}))
    env = {**venv_env, "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.oneline", "ANSIBLE_NOCOLOR": "1"}
    playbook = REPO / "tests/ansible/role_inputs_check.yml"
    run = run_tool("ansible-playbook", "--check", "-i", str(inventory), str(playbook), env=env, timeout=300)
    failed = [line for line in run.stdout.splitlines() if line.startswith("controller | FAILED! => ")]
    assert failed, run.stdout + run.stderr
    assert len(failed) == 1, run.stdout  # the role stopped at its refusal
    msg = str(json.loads(failed[0].split(" => ", 1)[1])["msg"])
    assert "nothing was changed" in msg or not settings
    return msg


@pytest.mark.ansible
def test_nvidia_driver_refuses_a_repository_url_that_adds_an_apt_directive(
    tmp_path: Path, venv_env: dict[str, str]
) -> None:
    msg = _refusal(
        tmp_path,
        venv_env,
        "nvidia_driver",
        nvidia_driver_version="550",
        nvidia_driver_reboot_policy="never",
        nvidia_driver_repo_url="https://mirror.example/cuda/\nTrusted: yes",
        nvidia_driver_mok_key='/var/lib/dkms/mok.key"; touch /tmp/pwned; "',
    )
    assert re.search(r"nvidia_driver_repo_url .* is not an http\(s\):// or file:// URL", msg)
    assert "nvidia_driver_mok_key" in msg


@pytest.mark.ansible
def test_nvidia_driver_without_the_preflight_says_to_run_it(tmp_path: Path, venv_env: dict[str, str]) -> None:
    # No gpu_stack_resolved and no nvidia_driver_version: the raw gpu_stack is not read in its stead.
    msg = _refusal(
        tmp_path, venv_env, "nvidia_driver", gpu_stack={"driver": "550"}, nvidia_driver_reboot_policy="never"
    )
    assert 'version ""' in msg
    assert "No resolved stack: the preflight role (gpu_stack) did not run" in msg
    assert "or set nvidia_driver_version" in msg


@pytest.mark.ansible
@pytest.mark.parametrize(
    ("role", "playbook"), [("cudnn", "cuda.yml"), ("cuda_toolkit", "cuda.yml"), ("fleet_upgrade", "upgrade.yml")]
)
def test_a_cuda_role_without_the_preflight_says_to_run_it(
    tmp_path: Path, venv_env: dict[str, str], role: str, playbook: str
) -> None:
    # Without gpu_stack_resolved, the role's defaults are empty rather than undefined, so that its
    # first assert speaks instead of Ansible's "'gpu_stack_resolved' is undefined".
    msg = _refusal(tmp_path, venv_env, role, settings=False, gpu_stack={"cuda": "12.4", "cudnn": "9.1.0"})
    assert f"{role} on controller: gpu_stack_resolved is not set, so the declared stack was not" in msg
    assert f"playbooks/{playbook}" in msg


@pytest.mark.ansible
def test_pytorch_env_refuses_a_group_that_would_run_in_every_login_shell(
    tmp_path: Path, venv_env: dict[str, str]
) -> None:
    msg = _refusal(
        tmp_path,
        venv_env,
        "pytorch_env",
        pytorch_env_python="3.11",
        pytorch_env_torch="2.5.1",
        pytorch_env_variant="cpu",
        pytorch_env_group="gpuenv'; chmod u+s /bin/bash; '",
    )
    assert "pytorch_env_group" in msg
    assert "is not a plain account or group name" in msg


@pytest.mark.ansible
def test_onboarding_refuses_a_key_line_that_adds_another_key(tmp_path: Path, venv_env: dict[str, str]) -> None:
    msg = _refusal(
        tmp_path,
        venv_env,
        "onboard_user",
        onboard_user_name="alice",
        onboard_user_ssh_keys=[KEY + "\nssh-ed25519 AAAAC3Nza mallory@elsewhere"],
    )
    assert "onboard_user_ssh_keys" in msg
    assert "is not one public key line" in msg


@pytest.mark.parametrize("path", ["/../etc", "/..", "/opt/..", "/opt/../etc"])
def test_no_dot_dot_anywhere_in_an_absolute_path(path: str) -> None:
    assert inputs.problem("p", path, "abs_path") is not None


@pytest.mark.ansible
def test_onboarding_refuses_a_name_with_a_trailing_newline(tmp_path: Path, venv_env: dict[str, str]) -> None:
    # Jinja's match test is re.match: '^...$' lets "alice\n" through, since $ matches before a final newline.
    msg = _refusal(tmp_path, venv_env, "onboard_user", onboard_user_name="alice\n", onboard_user_ssh_keys=[KEY])
    assert "must be a plain account name" in msg


def test_no_role_anchors_a_whole_value_match_with_a_dollar() -> None:
    """Every whole-value check in the roles ends its pattern with \\Z (or uses gpuenv_input_problems):
    '$' matches before a trailing newline, so 'alice\\n' or a checksum with a newline would pass."""
    found = []
    for path in sorted([*REPO.glob("roles/**/*.yml"), *REPO.glob("playbooks/*.yml")]):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"is (not )?match\('[^']*\$'\)", line):
                found.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert found == []
