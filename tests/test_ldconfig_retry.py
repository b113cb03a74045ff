"""The roles' ldconfig tasks run again where another ldconfig beside them renamed their temporary
cache file away (dpkg's trigger in the driver's background install), and only then: each task runs
as written in its role, on localhost, with a stand-in ldconfig first on PATH that fails as told."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import run_tool

REPO = Path(__file__).resolve().parents[1]
RACE = "ldconfig: Renaming of /etc/ld.so.cache~ to /etc/ld.so.cache failed: No such file or directory"
TASKS = {
    "cuda_toolkit handler": ("roles/cuda_toolkit/handlers/main.yml", "Refresh the loader's cache"),
    "cudnn loader": (
        "roles/cudnn/tasks/loader_packages.yml",
        "Rebuild the loader's cache, which lacks the packages' cuDNN",
    ),
}


def _task(path: str, name: str) -> dict[str, Any]:
    task = next(t for t in yaml.safe_load((REPO / path).read_text()) if t.get("name") == name)
    task = {k: v for k, v in task.items() if k not in ("listen", "when")}
    task["delay"] = 0
    return task


def _run(tmp_path: Path, venv_env: dict[str, str], task: dict[str, Any], failures: list[str]) -> tuple[int, int]:
    """Run task with an ldconfig that fails with each of failures in turn, then succeeds: the play's
    exit status and how often ldconfig ran."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    count = tmp_path / "count"
    count.write_text("0")
    lines = "\n".join(f'[ "$n" = {i + 1} ] && {{ echo "{msg}" >&2; exit 1; }}' for i, msg in enumerate(failures))
    fake = bin_dir / "ldconfig"
    fake.write_text(f"#!/bin/sh\nn=$(( $(cat {count}) + 1 ))\necho $n > {count}\n{lines}\nexit 0\n")
    fake.chmod(0o755)
    play = [
        {
            "hosts": "localhost",
            "connection": "local",
            "gather_facts": False,
            # The module's Python is named: the PATH below is the task's, where discovery would look.
            "vars": {"ansible_python_interpreter": sys.executable},
            "environment": {"PATH": f"{bin_dir}:/usr/sbin:/usr/bin:/sbin:/bin"},
            "tasks": [task],
        }
    ]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play, sort_keys=False))
    out = run_tool("ansible-playbook", "-i", "localhost,", str(tmp_path / "play.yml"), env=venv_env, timeout=300)
    return out.returncode, int(count.read_text())


@pytest.mark.parametrize("which", sorted(TASKS))
def test_ldconfig_that_lost_the_race_runs_again(tmp_path: Path, venv_env: dict[str, str], which: str) -> None:
    rc, runs = _run(tmp_path, venv_env, _task(*TASKS[which]), [RACE, RACE])
    assert (rc, runs) == (0, 3)


@pytest.mark.parametrize("which", sorted(TASKS))
def test_ldconfig_failing_otherwise_fails_at_once(tmp_path: Path, venv_env: dict[str, str], which: str) -> None:
    rc, runs = _run(tmp_path, venv_env, _task(*TASKS[which]), ["ldconfig: /etc/ld.so.conf.d/x.conf: Permission denied"])
    assert rc != 0
    assert runs == 1
