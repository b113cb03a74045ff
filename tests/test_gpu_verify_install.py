"""gpu_verify's install step in check mode on the controller: the files it would write, read from
its diff (nothing is written). The stack file must be the JSON verify reads; a newline escaped
inside a folded Jinja expression once made it `}\\n` (two characters), and every host's verify
failed with "Extra data"."""

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


def test_the_stack_file_it_would_write_is_the_json_of_the_resolved_stack(
    tmp_path: Path, venv_env: dict[str, str]
) -> None:
    play = [
        {
            "hosts": "localhost",
            "gather_facts": False,
            "vars": {"gpu_stack_resolved": RESOLVED, "gpu_verify_home": str(tmp_path / "home")},
            "tasks": [
                {
                    "name": "install",
                    "ansible.builtin.include_role": {"name": "gpu_verify", "tasks_from": "install.yml"},
                }
            ],
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
    stack = _after(out.stdout, "/etc/gpuenv/stack.json")
    assert json.loads(stack) == RESOLVED
    assert stack.endswith("}\n")
    assert _after(out.stdout, "/usr/local/bin/gpuenv-verify").startswith("#!/bin/sh\n")
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
