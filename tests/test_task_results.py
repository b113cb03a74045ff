"""What the roles' tasks say about their own results holds: a task that keeps its failure to itself
(`failed_when: false`) is never failed afterwards, so a later `is failed` (or `is succeeded`) on its
register is always false (true) and the check it guards can never fire. Such a task registers with
`ignore_errors: true` instead, which keeps the failure in the result."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]


def _tasks(node: Any) -> list[dict[str, Any]]:
    """Every task (a mapping with `register`) in a task file or playbook, however nested."""
    found: list[dict[str, Any]] = []
    if isinstance(node, list):
        for item in node:
            found += _tasks(item)
    elif isinstance(node, dict):
        if "register" in node:
            found.append(node)
        for value in node.values():
            found += _tasks(value)
    return found


def _silenced(path: Path) -> list[str]:
    """The registers of the tasks in path whose failure failed_when: false suppresses."""
    docs = yaml.safe_load(path.read_text())
    return [str(t["register"]) for t in _tasks(docs) if t.get("failed_when") is False]


def _judged_as_failed(register: str, files: list[Path]) -> list[str]:
    """Where a register's failure is tested, outside a retry's `until` (evaluated before failed_when)."""
    test = re.compile(rf"\b{re.escape(register)}\s+is\s+(not\s+)?(failed|succeeded|success)\b")
    return [
        f"{f.relative_to(REPO)}:{n}"
        for f in files
        for n, line in enumerate(f.read_text().splitlines(), 1)
        if test.search(line) and not line.strip().startswith("until:")
    ]


def test_no_task_judges_a_failure_that_failed_when_false_suppressed() -> None:
    found = []
    for role in sorted((REPO / "roles").iterdir()):
        files = sorted(role.rglob("*.yml"))
        for path in files:
            for register in _silenced(path):
                found += [f"{register} ({path.relative_to(REPO)}): {w}" for w in _judged_as_failed(register, files)]
    for path in sorted((REPO / "playbooks").rglob("*.yml")):
        for register in _silenced(path):
            found += [f"{register} ({path.relative_to(REPO)}): {w}" for w in _judged_as_failed(register, [path])]
    assert not found, "failed_when: false makes these checks always pass; register with ignore_errors:\n" + "\n".join(
        found
    )
