from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run_tool(name: str, *args: str, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    """Run one of the venv's commands (ansible, ansible-playbook, ...) from the repo root, output captured."""
    return subprocess.run(
        [str(Path(sys.executable).parent / name), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
    )


@pytest.fixture
def repo() -> Path:
    return REPO


@pytest.fixture
def gpuenv_cmd() -> list[str]:
    """The gpuenv command as a user runs it (the console script when installed)."""
    script = Path(sys.executable).parent / "gpuenv"
    return [str(script)] if script.exists() else [sys.executable, "-m", "gpuenv"]


@pytest.fixture(scope="session")
def venv_env() -> dict[str, str]:
    """The environment for the venv's Ansible commands (tests copy it before changing it)."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["ANSIBLE_CONFIG"] = str(REPO / "ansible.cfg")
    env.pop("ANSIBLE_INVENTORY", None)
    return env
