"""The tests' own helpers, where a fault of theirs failed a run that had nothing wrong."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.conftest import run_tool


@pytest.fixture
def shared_stdin_made_non_blocking() -> Iterator[None]:
    """The test process's stdin, made non-blocking as ssh makes the stdin it inherits: the flag belongs
    to the open file, so every process that inherited the same stdin sees it."""
    read, write = os.pipe()
    saved = os.dup(0)
    os.dup2(read, 0)
    os.set_blocking(0, False)
    try:
        yield
    finally:
        os.dup2(saved, 0)
        for fd in (saved, read, write):
            os.close(fd)


@pytest.mark.usefixtures("shared_stdin_made_non_blocking")
def test_a_tool_the_tests_run_gets_a_blocking_stdin_of_its_own() -> None:
    # A cold run's fleet test failed so: an ansible-playbook started while a side-by-side check's ssh
    # ran said "Ansible requires blocking IO on stdin/stdout/stderr" and did nothing.
    probe = "import os, sys; sys.exit(0 if os.get_blocking(0) else 3)"
    done = run_tool("python", "-c", probe, env=dict(os.environ), timeout=60)
    assert done.returncode == 0, "the tool inherited the test's non-blocking stdin"
