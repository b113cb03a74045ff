"""gpu_verify's install step and stack_record in check mode on the controller: the files they would
write, read from their diff (nothing is written). The host's record of its stack must be the JSON
verify reads; a newline escaped inside a folded Jinja expression once made it `}\\n` (two
characters), and every host's verify failed with "Extra data"."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import run_tool

pytestmark = pytest.mark.ansible

REPO = Path(__file__).resolve().parents[1]
RESOLVED = {"cuda": "12.4.1", "cudnn": "9.1.0.70", "torch": "2.5.1", "gpus": [{"label": "8.6", "cc": "8.6"}]}


def _check_mode(
    tmp_path: Path, venv_env: dict[str, str], role: str, tasks_from: str, play_vars: dict[str, object]
) -> str:
    """The output of ROLE's TASKS_FROM run in check mode with --diff on the controller."""
    play = [
        {
            "hosts": "localhost",
            "gather_facts": False,
            "vars": play_vars,
            "tasks": [{"name": "run", "ansible.builtin.include_role": {"name": role, "tasks_from": tasks_from}}],
        }
    ]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play, sort_keys=False))
    env = dict(
        venv_env,
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-tmp"),
        ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
    )
    out = run_tool(
        "ansible-playbook", "--check", "--diff", "-i", "localhost,", "-c", "local",
        "-e", json.dumps({"ansible_python_interpreter": sys.executable}), str(tmp_path / "play.yml"),
        env=env, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_the_record_it_would_write_is_the_json_of_the_declared_and_resolved_stack(
    tmp_path: Path, venv_env: dict[str, str]
) -> None:
    declared = {"profile": "torch-2.5-cu124", "os": "debian12"}
    play_vars = {
        "gpu_stack": declared,
        "gpu_stack_resolved": RESOLVED,
        "stack_record_facts_dir": str(tmp_path / "facts"),
    }
    output = _check_mode(tmp_path, venv_env, "stack_record", "main.yml", play_vars)
    record = _after(output, "/etc/gpuenv/stack.json")
    assert json.loads(record) == {"declared": declared, "resolved": RESOLVED}
    assert record.endswith("}\n")
    assert not (tmp_path / "facts").exists()  # check mode: nothing written


def test_the_command_it_would_install_runs_verify_against_the_record(tmp_path: Path, venv_env: dict[str, str]) -> None:
    play_vars = {"gpu_stack_resolved": RESOLVED, "gpu_verify_home": str(tmp_path / "home")}
    output = _check_mode(tmp_path, venv_env, "gpu_verify", "install.yml", play_vars)
    command = _after(output, "/usr/local/bin/gpuenv-verify")
    assert command.startswith("#!/bin/sh\n")
    assert "--stack /etc/gpuenv/stack.json" in command
    assert "+++ after: /etc/gpuenv/stack.json" not in output  # stack_record's, not gpu_verify's
    assert not (tmp_path / "home").exists()  # check mode: nothing written


def _after(output: str, path: str) -> str:
    """The text a unified diff in Ansible's output gives a file (the lines after '+++ after: PATH')."""
    lines = output.splitlines()
    start = lines.index(f"+++ after: {path}") + 2  # past the @@ line
    added: list[str] = []
    newline = True
    for line in lines[start:]:
        if line.startswith("+"):
            added.append(line[1:])
        elif line == "\\ No newline at end of file":
            newline = False
        else:
            break
    return "\n".join(added) + ("\n" if newline else "")
