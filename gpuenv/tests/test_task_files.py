"""The roles' task files stay small (issue 18: none over 150 lines; no Python file over 400),
and a phase moved into a file of its own is imported statically and as it is: an import that adds a
condition, tags or variables would change every task it brings in."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpuenv.tests.conftest import REPO

TASK_FILES = sorted((REPO / "roles").glob("*/tasks/*.yml"))
IMPORT = ("ansible.builtin.import_tasks", "import_tasks")


def _imports(tasks: list[dict] | None) -> list[dict]:
    found = []
    for task in tasks or []:
        if any(key in task for key in IMPORT):
            found.append(task)
        for key in ("block", "rescue", "always"):
            found += _imports(task.get(key))
    return found


@pytest.mark.parametrize("path", TASK_FILES, ids=lambda p: str(p.relative_to(REPO / "roles")))
def test_no_task_file_is_over_150_lines(path: Path) -> None:
    assert len(path.read_text().splitlines()) <= 150


@pytest.mark.parametrize("path", TASK_FILES, ids=lambda p: str(p.relative_to(REPO / "roles")))
def test_imports_name_a_file_of_the_role_and_add_nothing(path: Path) -> None:
    for task in _imports(yaml.safe_load(path.read_text())):
        assert set(task) <= {"name", *IMPORT}, f"{path.name}: {task}"
        target = next(task[key] for key in IMPORT if key in task)
        assert (path.parent / target).is_file(), f"{path.name} imports {target}, which is not in tasks/"


PYTHON_FILES = sorted(
    p for top in ("gpuenv", "plugins", "bench", "scripts", "molecule") for p in (REPO / top).rglob("*.py")
)


def test_no_python_file_is_over_400_lines() -> None:
    # Issue 18: a file that grows past this mixes concerns; split it along its seams.
    long = {str(p.relative_to(REPO)): n for p in PYTHON_FILES if (n := len(p.read_text().splitlines())) > 400}
    assert PYTHON_FILES
    assert long == {}
