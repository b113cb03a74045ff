"""A phase moved into a task file of its own is imported statically and as it is: an import that adds
a condition, tags or variables would change every task it brings in. (Files are split where the code
divides, not at a line count.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO

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
def test_imports_name_a_file_of_the_role_and_add_nothing(path: Path) -> None:
    for task in _imports(yaml.safe_load(path.read_text())):
        assert set(task) <= {"name", *IMPORT}, f"{path.name}: {task}"
        target = next(task[key] for key in IMPORT if key in task)
        assert (path.parent / target).is_file(), f"{path.name} imports {target}, which is not in tasks/"
